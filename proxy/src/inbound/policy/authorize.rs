//! The authorization decision, pure: which of a policy's authorizations admits a client (its
//! address, and its mTLS identity when it proved one), and which route a request takes. No
//! allocation: identities are compared as `&str`, networks by prefix.

use std::net::IpAddr;

use super::model::{Authn, Authz, Network, PathMatch, Route, RouteMatch};
use crate::http::path_prefix::segment_prefix;

/// What the proxy knows of a client: its address, and the identity its mTLS certificate proved
/// (none for plaintext).
#[derive(Debug, Clone, Copy)]
pub struct Client<'a> {
    pub ip: IpAddr,
    pub identity: Option<&'a str>,
}

/// The first authorization that admits `client`, if any (an empty list admits nobody).
pub fn authorized<'p>(authzs: &'p [Authz], client: Client<'_>) -> Option<&'p Authz> {
    authzs.iter().find(|a| a.networks.iter().any(|n| n.contains(client.ip)) && a.authn.permits(client.identity))
}

impl Network {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.net.contains(&ip) && !self.except.iter().any(|e| e.contains(&ip))
    }
}

/// An IPv4 client seen through an IPv6 socket (`::ffff:a.b.c.d`) is matched as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl Authn {
    pub fn permits(&self, identity: Option<&str>) -> bool {
        match self {
            Self::Unauthenticated => true,
            Self::MeshTls { identities, suffixes } => identity.is_some_and(|id| {
                identities.iter().any(|i| **i == *id)
                    || suffixes.iter().any(|s| s.is_empty() || id.ends_with(&**s) || id == &s[1..])
            }),
        }
    }
}

/// The index of the first route of `routes` that `method` and `path` match.
pub fn route_for(routes: &[Route], method: &http::Method, path: &str) -> Option<usize> {
    routes.iter().position(|r| r.matches.iter().any(|m| m.matches(method, path)))
}

impl RouteMatch {
    fn matches(&self, method: &http::Method, path: &str) -> bool {
        self.method.as_ref().is_none_or(|m| m == method) && self.path.matches(path)
    }
}

impl PathMatch {
    fn matches(&self, path: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(p) => **p == *path,
            Self::Prefix(p) => segment_prefix(p, path),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::inbound::policy::model::{DefaultPolicy, Resource};

    fn authz(name: &str, nets: &[&str], except: &[&str], authn: Authn) -> Authz {
        Authz {
            meta: Resource::new("policy.cnimesh.io", "authorizationpolicy", name),
            networks: nets
                .iter()
                .map(|n| Network {
                    net: n.parse().unwrap(),
                    except: except.iter().map(|e| e.parse().unwrap()).collect(),
                })
                .collect(),
            authn,
        }
    }

    fn ids(list: &[&str], suffixes: &[&str]) -> Authn {
        Authn::MeshTls {
            identities: list.iter().map(|s| Arc::from(*s)).collect(),
            suffixes: suffixes.iter().map(|s| Arc::from(*s)).collect(),
        }
    }

    fn client<'a>(ip: &str, identity: Option<&'a str>) -> Client<'a> {
        Client { ip: ip.parse().unwrap(), identity }
    }

    const WEB: &str = "web.shop.serviceaccount.identity.cnimesh.cluster.local";
    const OTHER: &str = "other.shop.serviceaccount.identity.cnimesh.cluster.local";

    #[test]
    fn identities_networks_and_exceptions() {
        let list = vec![
            authz("web-only", &["0.0.0.0/0", "::/0"], &[], ids(&[WEB], &[])),
            authz("office", &["10.1.0.0/16"], &["10.1.9.0/24"], Authn::Unauthenticated),
        ];
        let name = |c| authorized(&list, c).map(|a| &*a.meta.name);
        assert_eq!(name(client("10.2.0.1", Some(WEB))), Some("web-only"));
        assert_eq!(name(client("10.2.0.1", Some(OTHER))), None, "another identity");
        assert_eq!(name(client("10.2.0.1", None)), None, "plaintext");
        assert_eq!(name(client("10.1.2.3", None)), Some("office"), "the CIDR admits plaintext");
        assert_eq!(name(client("::ffff:10.1.2.3", None)), Some("office"), "IPv4-mapped");
        assert_eq!(name(client("10.1.9.3", Some(OTHER))), None, "except");
        assert_eq!(authorized(&[], client("10.1.2.3", Some(WEB))).map(|a| &*a.meta.name), None, "empty: deny");
    }

    #[test]
    fn suffixes() {
        let any = ids(&[], &[""]);
        assert!(any.permits(Some(OTHER)));
        assert!(!any.permits(None), "any identity is still an identity");
        let shop = ids(&[], &[".shop.serviceaccount.identity.cnimesh.cluster.local"]);
        assert!(shop.permits(Some(WEB)));
        assert!(!shop.permits(Some("web.shopx.serviceaccount.identity.cnimesh.cluster.local")));
        assert!(!shop.permits(Some("evil-shop.serviceaccount.identity.cnimesh.cluster.local")));
    }

    #[test]
    fn defaults() {
        let cluster = ["10.0.0.0/8".parse().unwrap()];
        let check = |d: DefaultPolicy, c| authorized(&d.policy(&cluster).authorizations, c).is_some();
        assert!(check(DefaultPolicy::AllUnauthenticated, client("192.0.2.1", None)));
        assert!(!check(DefaultPolicy::AllAuthenticated, client("10.0.0.1", None)));
        assert!(check(DefaultPolicy::AllAuthenticated, client("192.0.2.1", Some(WEB))));
        assert!(check(DefaultPolicy::ClusterAuthenticated, client("10.0.0.1", Some(WEB))));
        assert!(!check(DefaultPolicy::ClusterAuthenticated, client("192.0.2.1", Some(WEB))));
        assert!(!check(DefaultPolicy::Deny, client("10.0.0.1", Some(WEB))));
    }

    #[test]
    fn routes_by_path_and_method() {
        let route = |name: &str, path: PathMatch, method: Option<http::Method>| Route {
            meta: Resource::new("", "default", name),
            matches: vec![RouteMatch { path, method }],
            authorizations: Vec::new(),
        };
        let routes = vec![
            route("probe", PathMatch::Exact("/ready".into()), Some(http::Method::GET)),
            route("api", PathMatch::Prefix("/api/".into()), None),
            route("default", PathMatch::Any, None),
        ];
        let get = http::Method::GET;
        assert_eq!(route_for(&routes, &get, "/ready"), Some(0));
        assert_eq!(route_for(&routes, &http::Method::POST, "/ready"), Some(2), "method");
        assert_eq!(route_for(&routes, &get, "/ready/x"), Some(2), "exact");
        assert_eq!(route_for(&routes, &get, "/api"), Some(1));
        assert_eq!(route_for(&routes, &get, "/api/v1"), Some(1));
        assert_eq!(route_for(&routes, &get, "/apix"), Some(2), "whole segments");
        assert_eq!(route_for(&routes[..2], &get, "/x"), None);
    }
}
