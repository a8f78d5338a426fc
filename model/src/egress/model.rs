//! EgressNetworks and the routes attached to them, read once into validated records. What
//! cannot be carried out is refused here with the reason ([`Invalid`]); the index logs it with
//! the object's kind and name and keeps its last good version.
//!
//! - An [`EgressNetwork`]'s CIDRs must parse, and each `except` must lie inside its `cidr`.
//! - A route attached to an EgressNetwork forwards to the connection's original destination:
//!   its rules have no backendRefs, or backendRefs naming the EgressNetwork itself (Linkerd's
//!   way to say "where it was going"). A Service backend (Linkerd lets an egress route send
//!   traffic back into the cluster) is refused: not supported here yet.
//! - TLSRoute and TCPRoute are read only for their EgressNetwork parents; with a Service parent
//!   (or any other) they are not served at all (their GAMMA semantics are out of scope).
//!
//! Layer: model/index (pure).

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::crd::{self, TrafficPolicy};
use crate::meta::{Invalid, NsName, key_of};
use crate::routes::crd as gateway;
use crate::routes::model::{EgressParent, HostMatch, egress_parents, hostnames};
use crate::routes::{Route, RouteKind};

/// A validated EgressNetwork.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressNetwork {
    pub key: NsName,
    pub created: Option<Time>,
    /// Empty: every address outside the cluster networks.
    pub networks: Vec<Network>,
    pub traffic_policy: TrafficPolicy,
}

/// A CIDR minus its exceptions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    pub cidr: IpNet,
    pub except: Vec<IpNet>,
}

impl EgressNetwork {
    pub fn from_crd(o: &crd::EgressNetwork) -> Result<Self, Invalid> {
        let networks = o
            .spec
            .networks
            .iter()
            .flatten()
            .map(|n| -> Result<Network, Invalid> {
                let cidr = cidr(&n.cidr)?;
                let except = n
                    .except
                    .iter()
                    .flatten()
                    .map(|e| -> Result<IpNet, Invalid> {
                        let e = self::cidr(e)?;
                        if !cidr.contains(&e) {
                            return Err(Invalid(format!("except {e} is not inside cidr {cidr}")));
                        }
                        Ok(e)
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Network { cidr, except })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            key: key_of(&o.metadata),
            created: o.metadata.creation_timestamp.clone(),
            networks,
            traffic_policy: o.spec.traffic_policy,
        })
    }

    /// How specifically this EgressNetwork covers `ip` (the prefix length of the narrowest of
    /// its networks that holds it; 0 for "everything outside the cluster"), or `None` when it
    /// does not. Addresses in the cluster networks are never egress.
    pub fn covers(&self, ip: IpAddr, cluster_networks: &[IpNet]) -> Option<u8> {
        if cluster_networks.iter().any(|n| n.contains(&ip)) {
            return None;
        }
        if self.networks.is_empty() {
            return Some(0);
        }
        self.networks
            .iter()
            .filter(|n| n.cidr.contains(&ip) && !n.except.iter().any(|e| e.contains(&ip)))
            .map(|n| n.cidr.prefix_len())
            .max()
    }

    /// `<namespace>/<name>`, as errors and metrics name it.
    pub fn name(&self) -> String {
        self.key.to_string()
    }
}

/// A CIDR, or a bare address as one host.
fn cidr(text: &str) -> Result<IpNet, Invalid> {
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| Invalid(format!("cidr {text:?} is not an IPv4 or IPv6 network (e.g. 203.0.113.0/24)")))
}

/// TLSRoute (by SNI) or TCPRoute (by port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StreamKind {
    Tls,
    Tcp,
}

impl StreamKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::Tls => "TLSRoute",
            StreamKind::Tcp => "TCPRoute",
        }
    }
}

/// A validated TLSRoute or TCPRoute with EgressNetwork parents: connections it describes go to
/// their original destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRoute {
    pub kind: StreamKind,
    pub key: NsName,
    pub created: Option<Time>,
    pub parents: Vec<EgressParent>,
    /// TLSRoute: the SNI names it allows (empty: any). TCPRoute: always empty.
    pub hostnames: Vec<HostMatch>,
}

impl StreamRoute {
    pub fn from_tls(o: &gateway::TlsRoute) -> Result<Self, Invalid> {
        Self::read(StreamKind::Tls, &o.metadata, &o.spec.parent_refs, &o.spec.hostnames, &o.spec.rules)
    }

    pub fn from_tcp(o: &gateway::TcpRoute) -> Result<Self, Invalid> {
        Self::read(StreamKind::Tcp, &o.metadata, &o.spec.parent_refs, &[], &o.spec.rules)
    }

    fn read(
        kind: StreamKind,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        parent_refs: &[gateway::ParentReference],
        names: &[String],
        rules: &[gateway::StreamRouteRule],
    ) -> Result<Self, Invalid> {
        let key = key_of(meta);
        for (i, rule) in rules.iter().enumerate() {
            if let Some(b) = rule.backend_refs.iter().find(|b| !names_egress_network(b)) {
                return Err(Invalid(format!("rules[{i}]: {}", service_backend_refused(&b.name))));
            }
        }
        Ok(Self {
            kind,
            created: meta.creation_timestamp.clone(),
            parents: egress_parents(parent_refs, &key)?,
            hostnames: hostnames(names)?,
            key,
        })
    }

    /// Whether it attaches to this EgressNetwork on this port.
    pub fn attaches_to(&self, network: &NsName, port: u16) -> bool {
        attaches(&self.parents, network, port)
    }
}

fn names_egress_network(b: &gateway::HttpBackendRef) -> bool {
    crate::routes::model::is_egress_network(b.group.as_deref(), b.kind.as_deref())
}

fn service_backend_refused(name: &str) -> String {
    format!(
        "backendRef {name}: an egress route forwards to the original destination only (no backendRefs, or the EgressNetwork itself); Service backends are not supported"
    )
}

pub(crate) fn attaches(parents: &[EgressParent], network: &NsName, port: u16) -> bool {
    parents.iter().any(|p| p.network == *network && p.port.is_none_or(|p| p == port))
}

/// An HTTPRoute or GRPCRoute with EgressNetwork parents, checked for what egress serves:
/// `Ok(None)` when it has none (not an egress route).
pub fn egress_route(route: Result<Route, Invalid>) -> Result<Option<Arc<Route>>, Invalid> {
    let route = route?;
    if route.egress_parents.is_empty() {
        return Ok(None);
    }
    for (i, rule) in route.rules.iter().enumerate() {
        if let Some(b) = rule.backends.first() {
            return Err(Invalid(format!("rules[{i}]: {}", service_backend_refused(&b.service.name))));
        }
    }
    debug_assert!(matches!(route.kind, RouteKind::Http | RouteKind::Grpc));
    Ok(Some(Arc::new(route)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network(spec: &str) -> Result<EgressNetwork, Invalid> {
        let text = format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: EgressNetwork\nmetadata: {{name: n, namespace: shop}}\nspec: {spec}\n"
        );
        EgressNetwork::from_crd(&serde_saphyr::from_str(&text).unwrap())
    }

    #[test]
    fn networks_cover_addresses_outside_the_cluster_most_specific_first() {
        let cluster: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let all = network("{trafficPolicy: Allow}").unwrap();
        assert_eq!(all.covers("203.0.113.7".parse().unwrap(), &cluster), Some(0));
        assert_eq!(all.covers("10.1.2.3".parse().unwrap(), &cluster), None, "cluster addresses are never egress");
        let some =
            network("{trafficPolicy: Deny, networks: [{cidr: 203.0.113.0/24, except: [203.0.113.128/25]}, {cidr: 198.51.100.9}]}")
                .unwrap();
        assert_eq!(some.traffic_policy, TrafficPolicy::Deny);
        assert_eq!(some.covers("203.0.113.7".parse().unwrap(), &cluster), Some(24));
        assert_eq!(some.covers("203.0.113.200".parse().unwrap(), &cluster), None);
        assert_eq!(some.covers("198.51.100.9".parse().unwrap(), &cluster), Some(32));
        assert_eq!(some.covers("192.0.2.1".parse().unwrap(), &cluster), None);
    }

    #[test]
    fn bad_networks_are_refused_with_the_value() {
        let e = network("{trafficPolicy: Allow, networks: [{cidr: 203.0.113.0/33}]}").unwrap_err();
        assert!(e.0.contains("\"203.0.113.0/33\""), "{e}");
        let e =
            network("{trafficPolicy: Allow, networks: [{cidr: 203.0.113.0/24, except: [10.0.0.0/8]}]}").unwrap_err();
        assert_eq!(e.0, "except 10.0.0.0/8 is not inside cidr 203.0.113.0/24");
        let missing = serde_saphyr::from_str::<crd::EgressNetwork>(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: EgressNetwork\nmetadata: {name: n}\nspec: {}\n",
        );
        assert!(missing.unwrap_err().to_string().contains("trafficPolicy"));
    }

    #[test]
    fn egress_routes_forward_to_the_original_destination_only() {
        let tls: gateway::TlsRoute = serde_saphyr::from_str(
            "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TLSRoute\nmetadata: {name: t, namespace: shop}\nspec:\n  parentRefs: [{group: policy.cnimesh.io, kind: EgressNetwork, name: n, port: 8443}]\n  hostnames: [api.example.test]\n  rules: [{backendRefs: [{group: policy.cnimesh.io, kind: EgressNetwork, name: n}]}]\n",
        )
        .unwrap();
        let route = StreamRoute::from_tls(&tls).unwrap();
        assert!(route.attaches_to(&NsName::new("shop", "n"), 8443));
        assert!(!route.attaches_to(&NsName::new("shop", "n"), 443));
        assert_eq!(route.hostnames, [HostMatch::Exact("api.example.test".into())]);
        let mut to_service = tls.clone();
        to_service.spec.rules[0].backend_refs[0].kind = Some("Service".into());
        to_service.spec.rules[0].backend_refs[0].group = None;
        let e = StreamRoute::from_tls(&to_service).unwrap_err();
        assert!(e.0.starts_with("rules[0]: backendRef n: an egress route forwards"), "{e}");
        let http: gateway::HttpRoute = serde_saphyr::from_str(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: h, namespace: shop}\nspec:\n  parentRefs: [{group: policy.cnimesh.io, kind: EgressNetwork, name: n}]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n",
        )
        .unwrap();
        assert!(egress_route(Route::from_http(&http)).is_err());
    }
}
