//! What a rule's matches compare: HTTP paths, methods, headers and query parameters, gRPC
//! services and methods.

use super::checks::{absolute_path, header_name, invalid, regex};
use super::crd;
use crate::meta::Invalid;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matches {
    Http(Vec<HttpMatch>),
    Grpc(Vec<GrpcMatch>),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpMatch {
    pub path: Option<PathMatch>,
    pub headers: Vec<ValueMatch>,
    pub query_params: Vec<ValueMatch>,
    pub method: Option<http::Method>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
    Regex(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueMatch {
    pub name: String,
    pub value: MatchValue,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchValue {
    Exact(String),
    Regex(String),
}

/// An RPC match; both parts empty matches every RPC.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrpcMatch {
    pub service: Option<String>,
    pub method: Option<String>,
    pub headers: Vec<ValueMatch>,
}

pub(super) fn http_match(m: &crd::HttpRouteMatch) -> Result<HttpMatch, Invalid> {
    let path = match &m.path {
        None => None,
        Some(p) => {
            let value = p.value.clone().unwrap_or_else(|| "/".into());
            Some(match p.kind.as_deref().unwrap_or("PathPrefix") {
                "Exact" => PathMatch::Exact(absolute_path(value)?),
                "PathPrefix" => PathMatch::Prefix(absolute_path(value)?),
                "RegularExpression" => PathMatch::Regex(regex(value, "path")?),
                other => {
                    return invalid(format!("path match type {other:?} is not Exact, PathPrefix or RegularExpression"));
                }
            })
        }
    };
    let method = m
        .method
        .as_deref()
        .map(|method| {
            const METHODS: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];
            METHODS
                .contains(&method)
                .then(|| http::Method::from_bytes(method.as_bytes()).ok())
                .flatten()
                .ok_or_else(|| Invalid(format!("method {method:?} is not one of {}", METHODS.join(", "))))
        })
        .transpose()?;
    Ok(HttpMatch {
        path,
        headers: value_matches(&m.headers, "header", header_name)?,
        query_params: value_matches(&m.query_params, "query parameter", |n| Ok(n.to_string()))?,
        method,
    })
}

pub(super) fn value_matches(
    matches: &[crd::ValueMatch],
    what: &str,
    name: impl Fn(&str) -> Result<String, Invalid>,
) -> Result<Vec<ValueMatch>, Invalid> {
    matches
        .iter()
        .map(|m| {
            let value = match m.kind.as_deref().unwrap_or("Exact") {
                "Exact" => MatchValue::Exact(m.value.clone()),
                "RegularExpression" => MatchValue::Regex(regex(m.value.clone(), what)?),
                other => return invalid(format!("{what} match type {other:?} is not Exact or RegularExpression")),
            };
            Ok(ValueMatch { name: name(&m.name)?, value })
        })
        .collect()
}

pub(super) fn grpc_match(m: &crd::GrpcRouteMatch) -> Result<GrpcMatch, Invalid> {
    let (service, method) = match &m.method {
        None => (None, None),
        Some(method) => {
            if method.kind.as_deref().unwrap_or("Exact") != "Exact" {
                // linkerd2-proxy-api's GrpcRpcMatch holds exact names only.
                return invalid(format!(
                    "method match type {:?}: only Exact can be served (linkerd2-proxy-api matches exact service and method names)",
                    method.kind.as_deref().unwrap_or_default()
                ));
            }
            if method.service.is_none() && method.method.is_none() {
                return invalid("a method match needs a service or a method");
            }
            (method.service.clone(), method.method.clone())
        }
    };
    Ok(GrpcMatch { service, method, headers: value_matches(&m.headers, "header", header_name)? })
}
