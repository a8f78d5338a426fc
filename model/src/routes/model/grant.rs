//! ReferenceGrants, as far as routes are concerned.

use super::crd;
use super::kind::RouteKind;

/// A ReferenceGrant: which routes from which namespaces may send to which Services of the
/// grant's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// (route kind, namespace).
    pub from: Vec<(RouteKind, String)>,
    /// Service names; `None` allows every Service of the namespace.
    pub to: Vec<Option<String>>,
}

impl Grant {
    /// Entries for other kinds (Gateways, Secrets) are someone else's and ignored.
    pub fn from_crd(grant: &crd::ReferenceGrant) -> Self {
        let from = grant
            .spec
            .from
            .iter()
            .filter(|f| f.group == crd::GROUP)
            .filter_map(|f| {
                let kind = match f.kind.as_str() {
                    "HTTPRoute" => RouteKind::Http,
                    "GRPCRoute" => RouteKind::Grpc,
                    _ => return None,
                };
                Some((kind, f.namespace.clone()))
            })
            .collect();
        let to = grant
            .spec
            .to
            .iter()
            .filter(|t| matches!(t.group.as_str(), "" | "core") && t.kind == "Service")
            .map(|t| t.name.clone())
            .collect();
        Self { from, to }
    }

    pub fn permits(&self, kind: RouteKind, from_namespace: &str, service: &str) -> bool {
        self.from.iter().any(|(k, ns)| *k == kind && ns == from_namespace)
            && self.to.iter().any(|name| name.as_deref().is_none_or(|n| n == service))
    }
}
