//! A rule's backends: Service ports with weights.

use super::checks::{invalid, port};
use super::crd;
use super::filters::{Filter, filters};
use super::kind::RouteKind;
use super::parents::is_egress_network;
use crate::meta::{Invalid, NsName};

/// Gateway API's ceiling for a backendRef weight.
const MAX_WEIGHT: i32 = 1_000_000;

/// A Service port receiving a share of a rule's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub service: NsName,
    pub port: u16,
    pub weight: u32,
    pub filters: Vec<Filter>,
}

pub(super) fn backends(refs: &[crd::HttpBackendRef], route: &NsName, kind: RouteKind) -> Result<Vec<Backend>, Invalid> {
    refs.iter()
        // A backendRef to an EgressNetwork (egress routes) is "the parent itself": the
        // connection's original destination, as a rule without backends.
        .filter(|b| !is_egress_network(b.group.as_deref(), b.kind.as_deref()))
        .map(|b| {
            let core = b.group.as_deref().is_none_or(|g| g.is_empty() || g == "core");
            if !(core && b.kind.as_deref().is_none_or(|k| k == "Service")) {
                return invalid(format!(
                    "backendRef {}: only Services are supported (group {:?}, kind {:?})",
                    b.name,
                    b.group.as_deref().unwrap_or_default(),
                    b.kind.as_deref().unwrap_or("Service")
                ));
            }
            let port =
                port(b.port.ok_or_else(|| Invalid(format!("backendRef {} has no port", b.name)))?, "backendRef port")?;
            let weight = b.weight.unwrap_or(1);
            if !(0..=MAX_WEIGHT).contains(&weight) {
                return invalid(format!("backendRef {} weight {weight} is not 0-{MAX_WEIGHT}", b.name));
            }
            Ok(Backend {
                service: NsName::new(b.namespace.as_deref().unwrap_or(&route.namespace), &b.name),
                port,
                weight: weight as u32,
                filters: filters(&b.filters, kind)?,
            })
        })
        .collect()
}
