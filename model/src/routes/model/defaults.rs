//! Retry and timeout annotations, of a route or of its Service, for the rules that set none.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::kind::RouteKind;
use super::retry::{
    DEFAULT_RETRY_LIMIT, GrpcConditions, Retry, RetryConditions, duration, grpc_conditions, http_conditions,
};
use crate::meta::Invalid;

pub const RETRY_HTTP_ANNOTATION: &str = "retry.cnimesh.io/http";
pub const RETRY_GRPC_ANNOTATION: &str = "retry.cnimesh.io/grpc";
pub const RETRY_LIMIT_ANNOTATION: &str = "retry.cnimesh.io/limit";
pub const RETRY_TIMEOUT_ANNOTATION: &str = "retry.cnimesh.io/timeout";
pub const REQUEST_TIMEOUT_ANNOTATION: &str = "timeout.cnimesh.io/request";

/// What a route's (or its parent Service's) annotations say for every rule that does not say
/// otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteDefaults {
    pub retry: Option<Retry>,
    pub request_timeout: Option<Duration>,
}

/// A Service's retry and timeout annotations (the same as a route's), for its default route
/// and for every rule of its routes that neither the rule nor its route configures: a route's
/// own retry or timeout wins over the Service's, as in Linkerd.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceDefaults {
    /// For the default route and HTTPRoutes (`retry.cnimesh.io/http`).
    pub http: RouteDefaults,
    /// For GRPCRoutes (`retry.cnimesh.io/grpc`).
    pub grpc: RouteDefaults,
}

impl ServiceDefaults {
    pub fn from_annotations(meta: &ObjectMeta) -> Result<Self, Invalid> {
        Ok(Self {
            http: RouteDefaults::from_annotations(meta, RouteKind::Http)?,
            grpc: RouteDefaults::from_annotations(meta, RouteKind::Grpc)?,
        })
    }

    /// What applies to routes of `kind`.
    pub fn of(&self, kind: RouteKind) -> &RouteDefaults {
        match kind {
            RouteKind::Http => &self.http,
            RouteKind::Grpc => &self.grpc,
        }
    }
}

impl RouteDefaults {
    pub(super) fn from_annotations(meta: &ObjectMeta, kind: RouteKind) -> Result<Self, Invalid> {
        let empty = BTreeMap::new();
        let annotations = meta.annotations.as_ref().unwrap_or(&empty);
        let get = |name: &str| annotations.get(name).map(|v| v.trim());
        let named = |name: &str, error: Invalid| Invalid(format!("annotation {name}: {}", error.0));
        let conditions_annotation = match kind {
            RouteKind::Http => RETRY_HTTP_ANNOTATION,
            RouteKind::Grpc => RETRY_GRPC_ANNOTATION,
        };
        let conditions = get(conditions_annotation)
            .map(|v| match kind {
                RouteKind::Http => http_conditions(v),
                RouteKind::Grpc => grpc_conditions(v),
            })
            .transpose()
            .map_err(|e| named(conditions_annotation, e))?;
        let limit = get(RETRY_LIMIT_ANNOTATION)
            .map(|v| v.parse::<u32>().map_err(|e| Invalid(format!("{v:?}: {e}"))))
            .transpose()
            .map_err(|e| named(RETRY_LIMIT_ANNOTATION, e))?;
        let timeout = get(RETRY_TIMEOUT_ANNOTATION)
            .map(duration)
            .transpose()
            .map_err(|e| named(RETRY_TIMEOUT_ANNOTATION, e))?
            .flatten();
        let request_timeout = get(REQUEST_TIMEOUT_ANNOTATION)
            .map(duration)
            .transpose()
            .map_err(|e| named(REQUEST_TIMEOUT_ANNOTATION, e))?
            .flatten();
        let retry = (conditions.is_some() || limit.is_some() || timeout.is_some()).then(|| Retry {
            limit: limit.unwrap_or(DEFAULT_RETRY_LIMIT),
            conditions: conditions.unwrap_or_else(|| match kind {
                RouteKind::Http => RetryConditions::Http(vec![500..=599]),
                RouteKind::Grpc => RetryConditions::Grpc(GrpcConditions::default()),
            }),
            timeout,
            backoff: None,
        });
        Ok(Self { retry, request_timeout })
    }
}
