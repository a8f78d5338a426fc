//! What a route attaches to: Services (GAMMA: group `""` or `core`, kind `Service`, optionally
//! one port) and EgressNetworks; other parents (Gateways) are someone else's.

use super::checks::{invalid, port};
use super::crd;
use crate::meta::{Invalid, NsName};

/// How a route names an EgressNetwork parent or backend (the kind itself is
/// [`crate::egress`]'s, which comes after routes).
pub const EGRESS_NETWORK_GROUP: &str = "policy.cnimesh.io";
pub const EGRESS_NETWORK_KIND: &str = "EgressNetwork";

/// A Service parent; `port: None` attaches to every port of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    pub service: NsName,
    pub port: Option<u16>,
}

/// An EgressNetwork parent (`group: policy.cnimesh.io`, `kind: EgressNetwork`); `port: None`
/// attaches to every port of the destinations it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressParent {
    pub network: NsName,
    pub port: Option<u16>,
}

pub(super) fn parents(refs: &[crd::ParentReference], route: &NsName) -> Result<Vec<Parent>, Invalid> {
    let mut parents = Vec::new();
    for r in refs {
        let core = matches!(r.group.as_deref(), Some("" | "core"));
        if !(core && r.kind.as_deref() == Some("Service")) {
            continue; // A Gateway or another implementation's parent: not ours to serve.
        }
        if let Some(section) = &r.section_name {
            // A port name would narrow the route; ignoring it would widen it. Refuse instead.
            return invalid(format!(
                "parentRef Service {}: sectionName {section:?} is not supported, use port",
                r.name
            ));
        }
        let port = r.port.map(|p| port(p, "parentRef port")).transpose()?;
        let namespace = r.namespace.clone().unwrap_or_else(|| route.namespace.clone());
        parents.push(Parent { service: NsName::new(namespace, &r.name), port });
    }
    Ok(parents)
}

/// The EgressNetwork parents of a route. An EgressNetwork lives beside its routes:
/// a parentRef to another namespace's is refused, as Linkerd refuses it.
pub fn egress_parents(refs: &[crd::ParentReference], route: &NsName) -> Result<Vec<EgressParent>, Invalid> {
    let mut parents = Vec::new();
    for r in refs.iter().filter(|r| is_egress_network(r.group.as_deref(), r.kind.as_deref())) {
        if let Some(section) = &r.section_name {
            return invalid(format!(
                "parentRef EgressNetwork {}: sectionName {section:?} is not supported, use port",
                r.name
            ));
        }
        if r.namespace.as_deref().is_some_and(|ns| ns != route.namespace) {
            return invalid(format!(
                "parentRef EgressNetwork {}: an EgressNetwork parent must be in the route's namespace {}",
                r.name, route.namespace
            ));
        }
        let port = r.port.map(|p| port(p, "parentRef port")).transpose()?;
        parents.push(EgressParent { network: NsName::new(&route.namespace, &r.name), port });
    }
    Ok(parents)
}

/// Whether a reference's group and kind name an EgressNetwork.
pub fn is_egress_network(group: Option<&str>, kind: Option<&str>) -> bool {
    group == Some(EGRESS_NETWORK_GROUP) && kind == Some(EGRESS_NETWORK_KIND)
}
