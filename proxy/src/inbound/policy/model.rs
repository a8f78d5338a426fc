//! An inbound port's policy as the proxy enforces it: the control plane's
//! `io.linkerd.proxy.inbound.Server` checked once, when it arrives, into plain structures, so
//! that the per-connection and per-request checks ([`super::authorize`]) only compare. A Server
//! that cannot be enforced as sent is refused whole (the caller keeps the last good one): a
//! half-understood policy would allow what it meant to deny.

use std::sync::Arc;

use ipnet::IpNet;
use linkerd2_proxy_api::http_route as api_route;
use linkerd2_proxy_api::inbound as api;
use linkerd2_proxy_api::meta;

pub use super::metrics::Resource;
pub use super::ratelimit::{Limiter, RateLimit};
/// The rules themselves (authorizations, routes, their matches) are the shared crate's, so the
/// CLI explains exactly what the proxy enforces.
pub use cnimesh_policy_rules::{
    AUDIT_KIND, Authn, Authz, Network, PROBE_ROUTE, PathMatch, Route, RouteMatch, is_probe_route,
};

/// How the port's bytes are read. gRPC is HTTP/2 to the proxy; TLS passthrough is opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortProtocol {
    Detect,
    Http1,
    Http2,
    Opaque,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortPolicy {
    pub protocol: PortProtocol,
    pub server: Resource,
    /// Connection-level authorizations (opaque), and those of routes that carry none.
    pub authorizations: Vec<Authz>,
    /// HTTP routes in order; empty means one default route with the server's authorizations
    /// (as linkerd2-proxy builds it).
    pub routes: Vec<Route>,
    /// The Server's HTTPLocalRateLimitPolicy and the buckets enforcing it (HTTP only).
    pub rate_limit: Option<Limited>,
}

/// A rate limit with its buckets. Two are equal when their limits are: the buckets are state,
/// carried from one policy version to the next ([`PortPolicy::carry_rate_limit_from`]).
#[derive(Debug, Clone)]
pub struct Limited {
    pub limit: RateLimit,
    pub limiter: Arc<Limiter>,
}

impl PartialEq for Limited {
    fn eq(&self, other: &Self) -> bool {
        self.limit == other.limit
    }
}

impl Eq for Limited {}

/// The cluster default for ports the control plane has not answered for (yet), as
/// `config.cnimesh.io/default-inbound-policy` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultPolicy {
    AllUnauthenticated,
    AllAuthenticated,
    ClusterAuthenticated,
    Deny,
    /// Everyone, each request counted and logged as a would-be denial.
    Audit,
}

impl std::str::FromStr for DefaultPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all-unauthenticated" => Ok(Self::AllUnauthenticated),
            "all-authenticated" => Ok(Self::AllAuthenticated),
            "cluster-authenticated" => Ok(Self::ClusterAuthenticated),
            "deny" => Ok(Self::Deny),
            "audit" => Ok(Self::Audit),
            _ => Err(format!(
                "{s:?}: expected all-unauthenticated, all-authenticated, cluster-authenticated, deny or audit"
            )),
        }
    }
}

impl DefaultPolicy {
    pub fn name(self) -> &'static str {
        match self {
            Self::AllUnauthenticated => "all-unauthenticated",
            Self::AllAuthenticated => "all-authenticated",
            Self::ClusterAuthenticated => "cluster-authenticated",
            Self::Deny => "deny",
            Self::Audit => "audit",
        }
    }

    /// The policy this default stands for, with protocol detection and no routes.
    pub fn policy(self, cluster_networks: &[IpNet]) -> PortPolicy {
        let meta = Resource::new("", "default", self.name());
        let everywhere = || {
            ["0.0.0.0/0", "::/0"]
                .iter()
                .map(|n| Network { net: n.parse().expect("valid"), except: Vec::new() })
                .collect::<Vec<_>>()
        };
        let any_identity = Authn::MeshTls { identities: Vec::new(), suffixes: vec!["".into()] };
        let authz = |networks, authn| vec![Authz { meta: meta.clone(), networks, authn }];
        let authorizations = match self {
            Self::AllUnauthenticated => authz(everywhere(), Authn::Unauthenticated),
            Self::AllAuthenticated => authz(everywhere(), any_identity),
            Self::ClusterAuthenticated => {
                authz(cluster_networks.iter().map(|&net| Network { net, except: Vec::new() }).collect(), any_identity)
            }
            Self::Deny => Vec::new(),
            Self::Audit => vec![Authz {
                meta: Resource::new("", AUDIT_KIND, "audit"),
                networks: everywhere(),
                authn: Authn::Unauthenticated,
            }],
        };
        PortPolicy {
            protocol: PortProtocol::Detect,
            server: meta.clone(),
            authorizations,
            routes: Vec::new(),
            rate_limit: None,
        }
    }
}

impl PortPolicy {
    /// The Server as sent, or why it cannot be enforced.
    pub fn from_api(server: api::Server) -> Result<Self, String> {
        use api::proxy_protocol::Kind;
        let kind = server.protocol.and_then(|p| p.kind).ok_or("the server has no protocol")?;
        let (protocol, routes, limit) = match kind {
            Kind::Detect(d) => (PortProtocol::Detect, d.http_routes, d.http_local_rate_limit),
            Kind::Http1(h) => (PortProtocol::Http1, h.routes, h.local_rate_limit),
            Kind::Http2(h) => (PortProtocol::Http2, h.routes, h.local_rate_limit),
            Kind::Grpc(g) => {
                // gRPC routes are not served by cnimesh-control; one that comes is refused rather
                // than enforced as "no routes" (which would apply only the server's authzs).
                if !g.routes.is_empty() {
                    return Err("gRPC routes are not supported by this proxy".into());
                }
                (PortProtocol::Http2, Vec::new(), None)
            }
            Kind::Opaque(_) | Kind::Tls(_) => (PortProtocol::Opaque, Vec::new(), None),
        };
        let rate_limit =
            limit.map(rate_limit).transpose()?.map(|limit| Limited { limiter: Arc::new(Limiter::new(&limit)), limit });
        let server_meta = labels_resource(&server.labels, "server")?;
        Ok(Self {
            protocol,
            authorizations: authorizations(server.authorizations)?,
            routes: routes.into_iter().map(route).collect::<Result<_, _>>()?,
            server: server_meta,
            rate_limit,
        })
    }

    /// Takes `previous`'s buckets, set to this version's limits, so a policy update does not
    /// hand every client a fresh burst.
    pub fn carry_rate_limit_from(&mut self, previous: &PortPolicy) {
        if let (Some(new), Some(old)) = (self.rate_limit.as_mut(), previous.rate_limit.as_ref()) {
            old.limiter.configure(&new.limit);
            new.limiter = old.limiter.clone();
        }
    }
}

/// The rate limit as sent: at least one rate, none zero (a zero rate would refuse everything,
/// which no policy means).
fn rate_limit(r: api::HttpLocalRateLimit) -> Result<RateLimit, String> {
    let meta = metadata(r.metadata, &Default::default()).map_err(|_| "the rate limit has no metadata".to_string())?;
    let what = |why: &str| format!("rate limit {}: {why}", meta.name);
    let rate = |l: api::http_local_rate_limit::Limit| match l.requests_per_second {
        0 => Err(what("a rate of 0 requests per second")),
        n => Ok(n),
    };
    let total = r.total.map(rate).transpose()?;
    let identity = r.identity.map(rate).transpose()?;
    let overrides = r
        .overrides
        .into_iter()
        .map(|o| {
            let rps = rate(o.limit.ok_or_else(|| what("an override without a limit"))?)?;
            let ids: Vec<Arc<str>> =
                o.clients.into_iter().flat_map(|c| c.identities).map(|i| Arc::from(i.name)).collect();
            if ids.is_empty() {
                return Err(what("an override without clients"));
            }
            Ok((rps, ids))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(RateLimit { meta, total, identity, overrides })
}

/// The server's labels (`group`/`kind`/`name`), which the control plane sets on every answer.
fn labels_resource(labels: &std::collections::HashMap<String, String>, what: &str) -> Result<Resource, String> {
    let get = |k: &str| labels.get(k).map_or("", String::as_str);
    if get("name").is_empty() {
        return Err(format!("the {what} has no name label"));
    }
    Ok(Resource::new(get("group"), get("kind"), get("name")))
}

fn metadata(m: Option<meta::Metadata>, labels: &std::collections::HashMap<String, String>) -> Result<Resource, String> {
    match m.and_then(|m| m.kind) {
        Some(meta::metadata::Kind::Default(name)) if name == "audit" => Ok(Resource::new("", AUDIT_KIND, &name)),
        Some(meta::metadata::Kind::Default(name)) => Ok(Resource::new("", "default", &name)),
        Some(meta::metadata::Kind::Resource(r)) => Ok(Resource::new(&r.group, &r.kind, &r.name)),
        None => labels_resource(labels, "authorization"),
    }
}

fn authorizations(list: Vec<api::Authz>) -> Result<Vec<Authz>, String> {
    list.into_iter().map(authz).collect()
}

fn authz(a: api::Authz) -> Result<Authz, String> {
    use api::authn::Permit;
    use api::authn::permit_mesh_tls::Clients;
    let meta = metadata(a.metadata, &a.labels)?;
    let what = |why: &str| format!("authorization {}: {why}", meta.name);
    if a.networks.is_empty() {
        return Err(what("no networks"));
    }
    let net = |n: linkerd2_proxy_api::net::IpNetwork| IpNet::try_from(n).map_err(|e| what(&format!("network: {e}")));
    let networks = a
        .networks
        .into_iter()
        .map(|n| {
            Ok(Network {
                net: net(n.net.ok_or_else(|| what("a network without an address"))?)?,
                except: n.except.into_iter().map(net).collect::<Result<_, _>>()?,
            })
        })
        .collect::<Result<_, String>>()?;
    let permit = a.authentication.and_then(|a| a.permit).ok_or_else(|| what("no authentication"))?;
    let authn = match permit {
        Permit::Unauthenticated(_) => Authn::Unauthenticated,
        Permit::MeshTls(m) => match m.clients.ok_or_else(|| what("meshTLS without clients"))? {
            // "Unauthenticated" here means any TLS client, identified or not; only identified
            // clients reach us over mTLS, so any identity.
            Clients::Unauthenticated(_) => Authn::MeshTls { identities: Vec::new(), suffixes: vec!["".into()] },
            Clients::Identities(ids) => Authn::MeshTls {
                identities: ids.identities.into_iter().map(|i| Arc::from(i.name)).collect(),
                suffixes: ids.suffixes.into_iter().map(|s| cnimesh_policy_rules::suffix(&s.parts)).collect(),
            },
        },
    };
    Ok(Authz { meta, networks, authn })
}

fn route(r: api::HttpRoute) -> Result<Route, String> {
    let meta = metadata(r.metadata, &Default::default())?;
    if !r.hosts.is_empty() {
        return Err(format!("route {}: host matches are not supported by this proxy", meta.name));
    }
    let mut matches = Vec::new();
    for rule in r.rules {
        if rule.matches.is_empty() {
            matches.push(RouteMatch { path: PathMatch::Any, method: None });
        }
        for m in rule.matches {
            matches.push(route_match(m).map_err(|why| format!("route {}: {why}", meta.name))?);
        }
    }
    Ok(Route { authorizations: authorizations(r.authorizations)?, matches, meta })
}

/// What cnimesh-control sends (path exact/prefix, method); header and query matches are refused.
fn route_match(m: api_route::HttpRouteMatch) -> Result<RouteMatch, String> {
    use api_route::path_match::Kind;
    if !m.headers.is_empty() || !m.query_params.is_empty() {
        return Err("header and query matches are not supported".into());
    }
    let path = match m.path.and_then(|p| p.kind) {
        None => PathMatch::Any,
        Some(Kind::Exact(p)) => PathMatch::Exact(p.into()),
        Some(Kind::Prefix(p)) if p.is_empty() || p == "/" => PathMatch::Any,
        Some(Kind::Prefix(p)) => PathMatch::Prefix(p.into()),
        Some(Kind::Regex(_)) => return Err("regex path matches are not supported".into()),
    };
    let method = m.method.map(http::Method::try_from).transpose().map_err(|e| format!("method: {e}"))?;
    Ok(RouteMatch { path, method })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use linkerd2_proxy_api::inbound::proxy_protocol::{Detect, Kind};
    use linkerd2_proxy_api::inbound::{Authn as ApiAuthn, authn};
    use linkerd2_proxy_api::net::IpNetwork;

    use super::*;

    fn labels(kind: &str, name: &str) -> HashMap<String, String> {
        [("group", ""), ("kind", kind), ("name", name)].into_iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    fn everywhere() -> Vec<api::Network> {
        vec![api::Network {
            net: Some(IpNetwork { ip: Some("0.0.0.0".parse::<std::net::IpAddr>().unwrap().into()), prefix_len: 0 }),
            except: vec![],
        }]
    }

    fn probe_authz() -> api::Authz {
        api::Authz {
            networks: everywhere(),
            authentication: Some(ApiAuthn {
                permit: Some(authn::Permit::Unauthenticated(authn::PermitUnauthenticated {})),
            }),
            labels: HashMap::new(),
            metadata: Some(meta::Metadata { kind: Some(meta::metadata::Kind::Default("probe".into())) }),
        }
    }

    /// What cnimesh-control sends for a pod with a probe under `deny`: a probe route with its
    /// own authorization, then the default route carrying none.
    #[test]
    fn a_control_plane_answer_with_probe_routes() {
        let route =
            |name: &str, path: api_route::path_match::Kind, method: Option<http::Method>, authz| api::HttpRoute {
                metadata: Some(meta::Metadata { kind: Some(meta::metadata::Kind::Default(name.into())) }),
                hosts: vec![],
                authorizations: authz,
                rules: vec![api::http_route::Rule {
                    matches: vec![api_route::HttpRouteMatch {
                        path: Some(api_route::PathMatch { kind: Some(path) }),
                        method: method.map(Into::into),
                        ..Default::default()
                    }],
                    filters: vec![],
                }],
            };
        let server = api::Server {
            protocol: Some(api::ProxyProtocol {
                kind: Some(Kind::Detect(Detect {
                    timeout: None,
                    http_routes: vec![
                        route(
                            "probe",
                            api_route::path_match::Kind::Exact("/ready".into()),
                            Some(http::Method::GET),
                            vec![probe_authz()],
                        ),
                        route("default", api_route::path_match::Kind::Prefix("/".into()), None, vec![]),
                    ],
                    http_local_rate_limit: None,
                })),
            }),
            server_ips: vec![],
            authorizations: vec![],
            labels: labels("default", "deny"),
        };
        let p = PortPolicy::from_api(server).unwrap();
        assert_eq!(p.protocol, PortProtocol::Detect);
        assert_eq!(&*p.server.name, "deny");
        assert!(p.authorizations.is_empty());
        assert_eq!(p.routes.len(), 2);
        assert_eq!(
            p.routes[0].matches,
            [RouteMatch { path: PathMatch::Exact("/ready".into()), method: Some(http::Method::GET) }]
        );
        assert_eq!(p.routes[0].authorizations[0].authn, Authn::Unauthenticated);
        assert_eq!(p.routes[1].matches, [RouteMatch { path: PathMatch::Any, method: None }]);
    }

    #[test]
    fn what_cannot_be_enforced_is_refused() {
        let server = |protocol: Option<Kind>, authorizations, labels| api::Server {
            protocol: protocol.map(|k| api::ProxyProtocol { kind: Some(k) }),
            server_ips: vec![],
            authorizations,
            labels,
        };
        let opaque = || Some(Kind::Opaque(api::proxy_protocol::Opaque {}));
        assert!(PortPolicy::from_api(server(None, vec![], labels("server", "s"))).unwrap_err().contains("no protocol"));
        assert!(PortPolicy::from_api(server(opaque(), vec![], HashMap::new())).unwrap_err().contains("no name"));
        let no_networks = api::Authz { networks: vec![], ..probe_authz() };
        let e = PortPolicy::from_api(server(opaque(), vec![no_networks], labels("server", "s"))).unwrap_err();
        assert!(e.contains("no networks"), "{e}");
        let no_authn = api::Authz { authentication: None, ..probe_authz() };
        let e = PortPolicy::from_api(server(opaque(), vec![no_authn], labels("server", "s"))).unwrap_err();
        assert!(e.contains("no authentication"), "{e}");
        let ok = PortPolicy::from_api(server(opaque(), vec![probe_authz()], labels("server", "s"))).unwrap();
        assert_eq!((ok.protocol, ok.authorizations.len()), (PortProtocol::Opaque, 1));
    }
}
