//! Outbound policy for an address outside the cluster networks that an EgressNetwork holds,
//! filled as Linkerd 2.18's policy controller fills egress answers:
//! - `metadata`: the EgressNetwork as a resource (`group: policy.cnimesh.io`,
//!   `kind: EgressNetwork`, its namespace and name, the port asked for): what the proxy labels
//!   egress traffic with;
//! - the backend of every route: `forward` to the original destination (the address asked for),
//!   with the EgressNetwork as its metadata, and the usual queue;
//! - the protocol, by the kinds of routes attached to the EgressNetwork on the port: TLSRoutes →
//!   `tls` (routes by SNI), else TCPRoutes → `opaque`, else GRPCRoutes → `grpc`, else `detect`
//!   with the HTTPRoutes for `http1`/`http2` and the fallback opaque route;
//! - after the attached routes, a fallback route per protocol (metadata `default: egress`)
//!   carrying the `trafficPolicy`: `Allow` forwards, `Deny` refuses: HTTP with a failure injector
//!   (403, `egress denied by EgressNetwork <ns>/<name>`, which the proxy answers as its own
//!   `EgressDenied` error), gRPC with `PERMISSION_DENIED`, TLS and opaque with the `Forbidden`
//!   filter (the proxy closes the connection).
//!
//! An address that stops being covered gets the plain `Allow` answer with `default: egress`
//! metadata (it is forwarded, as with no EgressNetwork at all), so a deleted Deny network stops
//! denying on open streams.
//!
//! Layer: gRPC (conversion only).

use std::net::SocketAddr;
use std::sync::Arc;

use linkerd2_proxy_api::destination::WeightedAddr;
use linkerd2_proxy_api::meta::{Metadata, Resource, metadata};
use linkerd2_proxy_api::opaque_route as opaque_api;
use linkerd2_proxy_api::outbound::{
    Backend, GrpcRoute, HttpRoute, OpaqueRoute, OutboundPolicy, ProxyProtocol, Queue, TlsRoute, backend, grpc_route,
    http_route, opaque_route, proxy_protocol, tls_route,
};
use linkerd2_proxy_api::{grpc_route as grpc_api, http_route as http_api, tls_route as tls_sni};

use super::{DETECT_TIMEOUT, FAILFAST_TIMEOUT, QUEUE_CAPACITY, duration, routes};
use cnimesh_model::egress::Snapshot;
use cnimesh_model::egress::crd::TrafficPolicy;
use cnimesh_model::egress::model::{EgressNetwork, StreamKind, StreamRoute};
use cnimesh_model::routes::RouteKind;
use cnimesh_model::routes::model::{HostMatch, RouteDefaults};

/// The fallback routes' name.
const FALLBACK: &str = "egress";
/// gRPC `PERMISSION_DENIED`.
const GRPC_PERMISSION_DENIED: u32 = 7;

/// The message a denied HTTP request is answered with (`cnimesh-proxy-error`).
pub fn denied_message(network: &EgressNetwork) -> String {
    format!("egress denied by EgressNetwork {}", network.name())
}

/// The policy of `addr` for a client of `client_namespace`, or `None` when no EgressNetwork
/// holds it.
pub fn policy_of(
    snapshot: &Snapshot,
    addr: SocketAddr,
    client_namespace: Option<&str>,
    config: &cnimesh_model::egress::Config,
) -> Option<OutboundPolicy> {
    let network = snapshot.select(addr.ip(), client_namespace, config)?;
    let routes = snapshot.routes_of(&network.key, addr.port());
    let streams = snapshot.streams_of(&network.key, addr.port());
    Some(policy(network, addr, &routes, &streams))
}

/// The answer for an address no EgressNetwork holds (any more): forwarded, as without egress.
pub fn uncovered(addr: SocketAddr) -> OutboundPolicy {
    let backend = forward(addr, default_meta());
    let opaque = proxy_protocol::Opaque { routes: vec![opaque_fallback(&backend, None)] };
    let http = vec![http_fallback(&backend, None)];
    OutboundPolicy {
        metadata: Some(default_meta()),
        protocol: Some(ProxyProtocol {
            kind: Some(proxy_protocol::Kind::Detect(proxy_protocol::Detect {
                timeout: Some(duration(DETECT_TIMEOUT)),
                opaque: Some(opaque),
                http1: Some(proxy_protocol::Http1 { routes: http.clone(), failure_accrual: None }),
                http2: Some(proxy_protocol::Http2 { routes: http, failure_accrual: None }),
            })),
        }),
    }
}

fn policy(
    network: &EgressNetwork,
    addr: SocketAddr,
    routes: &[Arc<cnimesh_model::routes::Route>],
    streams: &[Arc<StreamRoute>],
) -> OutboundPolicy {
    let meta = network_meta(network, addr.port());
    let backend = forward(addr, meta.clone());
    let denied = (network.traffic_policy == TrafficPolicy::Deny).then_some(network);
    let backend_of = |_: &cnimesh_model::meta::NsName, _: u16| backend.clone();
    let defaults = RouteDefaults::default();
    let tls: Vec<&StreamRoute> = streams.iter().filter(|r| r.kind == StreamKind::Tls).map(|r| &**r).collect();
    let tcp = streams.iter().any(|r| r.kind == StreamKind::Tcp);
    let kind = if !tls.is_empty() {
        let mut routes: Vec<TlsRoute> = tls.iter().map(|r| tls_route(r, &backend)).collect();
        routes.push(tls_fallback(&backend, denied));
        proxy_protocol::Kind::Tls(proxy_protocol::Tls { routes })
    } else if tcp {
        // A TCPRoute on the port allows its connections whatever the trafficPolicy.
        proxy_protocol::Kind::Opaque(proxy_protocol::Opaque { routes: vec![opaque_fallback(&backend, None)] })
    } else if routes.iter().any(|r| r.kind == RouteKind::Grpc) {
        let mut grpc: Vec<GrpcRoute> = routes
            .iter()
            .filter(|r| r.kind == RouteKind::Grpc)
            .map(|r| routes::grpc_route(r, &backend, &backend_of, &defaults))
            .collect();
        grpc.push(grpc_fallback(&backend, denied));
        proxy_protocol::Kind::Grpc(proxy_protocol::Grpc { routes: grpc, failure_accrual: None })
    } else {
        let mut http: Vec<HttpRoute> =
            routes.iter().map(|r| routes::http_route(r, &backend, &backend_of, &defaults)).collect();
        http.push(http_fallback(&backend, denied));
        proxy_protocol::Kind::Detect(proxy_protocol::Detect {
            timeout: Some(duration(DETECT_TIMEOUT)),
            opaque: Some(proxy_protocol::Opaque { routes: vec![opaque_fallback(&backend, denied)] }),
            http1: Some(proxy_protocol::Http1 { routes: http.clone(), failure_accrual: None }),
            http2: Some(proxy_protocol::Http2 { routes: http, failure_accrual: None }),
        })
    };
    OutboundPolicy { metadata: Some(meta), protocol: Some(ProxyProtocol { kind: Some(kind) }) }
}

fn network_meta(network: &EgressNetwork, port: u16) -> Metadata {
    Metadata {
        kind: Some(metadata::Kind::Resource(Resource {
            group: cnimesh_model::egress::crd::GROUP.into(),
            kind: cnimesh_model::egress::crd::KIND.into(),
            name: network.key.name.clone(),
            namespace: network.key.namespace.clone(),
            section: String::new(),
            port: u32::from(port),
        })),
    }
}

fn default_meta() -> Metadata {
    Metadata { kind: Some(metadata::Kind::Default(FALLBACK.into())) }
}

/// The original destination.
fn forward(addr: SocketAddr, meta: Metadata) -> Backend {
    Backend {
        metadata: Some(meta),
        queue: Some(Queue { capacity: QUEUE_CAPACITY, failfast_timeout: Some(duration(FAILFAST_TIMEOUT)) }),
        kind: Some(backend::Kind::Forward(WeightedAddr { addr: Some(addr.into()), weight: 1, ..Default::default() })),
    }
}

fn http_fallback(backend: &Backend, denied: Option<&EgressNetwork>) -> HttpRoute {
    let filters = denied
        .map(|n| http_route::Filter {
            kind: Some(http_route::filter::Kind::FailureInjector(http_api::HttpFailureInjector {
                status: 403,
                message: denied_message(n),
                ratio: None,
            })),
        })
        .into_iter()
        .collect();
    let every = http_api::HttpRouteMatch {
        path: Some(http_api::PathMatch { kind: Some(http_api::path_match::Kind::Prefix("/".into())) }),
        ..Default::default()
    };
    HttpRoute {
        metadata: Some(default_meta()),
        hosts: Vec::new(),
        rules: vec![http_route::Rule {
            matches: vec![every],
            filters,
            backends: Some(http_route::Distribution {
                kind: Some(http_route::distribution::Kind::FirstAvailable(http_route::distribution::FirstAvailable {
                    backends: vec![http_route::RouteBackend {
                        backend: Some(backend.clone()),
                        filters: Vec::new(),
                        ..Default::default()
                    }],
                })),
            }),
            ..Default::default()
        }],
    }
}

fn grpc_fallback(backend: &Backend, denied: Option<&EgressNetwork>) -> GrpcRoute {
    let filters = denied
        .map(|n| grpc_route::Filter {
            kind: Some(grpc_route::filter::Kind::FailureInjector(grpc_api::GrpcFailureInjector {
                code: GRPC_PERMISSION_DENIED,
                message: denied_message(n),
                ratio: None,
            })),
        })
        .into_iter()
        .collect();
    GrpcRoute {
        metadata: Some(default_meta()),
        hosts: Vec::new(),
        rules: vec![grpc_route::Rule {
            matches: Vec::new(),
            filters,
            backends: Some(grpc_route::Distribution {
                kind: Some(grpc_route::distribution::Kind::FirstAvailable(grpc_route::distribution::FirstAvailable {
                    backends: vec![grpc_route::RouteBackend {
                        backend: Some(backend.clone()),
                        filters: Vec::new(),
                        ..Default::default()
                    }],
                })),
            }),
            ..Default::default()
        }],
    }
}

fn forbidden(denied: Option<&EgressNetwork>) -> Vec<opaque_route::Filter> {
    denied
        .map(|_| opaque_route::Filter { kind: Some(opaque_route::filter::Kind::Forbidden(opaque_api::Forbidden {})) })
        .into_iter()
        .collect()
}

fn opaque_fallback(backend: &Backend, denied: Option<&EgressNetwork>) -> OpaqueRoute {
    OpaqueRoute {
        metadata: Some(default_meta()),
        rules: vec![opaque_route::Rule {
            backends: Some(opaque_route::Distribution {
                kind: Some(opaque_route::distribution::Kind::FirstAvailable(
                    opaque_route::distribution::FirstAvailable {
                        backends: vec![opaque_route::RouteBackend {
                            backend: Some(backend.clone()),
                            filters: Vec::new(),
                        }],
                    },
                )),
            }),
            filters: forbidden(denied),
        }],
    }
}

fn tls_rule(backend: &Backend, denied: Option<&EgressNetwork>) -> tls_route::Rule {
    let filters = denied
        .map(|_| tls_route::Filter { kind: Some(tls_route::filter::Kind::Forbidden(opaque_api::Forbidden {})) })
        .into_iter()
        .collect();
    tls_route::Rule {
        backends: Some(tls_route::Distribution {
            kind: Some(tls_route::distribution::Kind::FirstAvailable(tls_route::distribution::FirstAvailable {
                backends: vec![tls_route::RouteBackend { backend: Some(backend.clone()), filters: Vec::new() }],
            })),
        }),
        filters,
    }
}

fn tls_route(route: &StreamRoute, backend: &Backend) -> TlsRoute {
    let snis = route
        .hostnames
        .iter()
        .map(|h| tls_sni::SniMatch {
            r#match: Some(match h {
                HostMatch::Exact(name) => tls_sni::sni_match::Match::Exact(name.clone()),
                HostMatch::Suffix(suffix) => tls_sni::sni_match::Match::Suffix(tls_sni::sni_match::Suffix {
                    reverse_labels: suffix.rsplit('.').map(str::to_string).collect(),
                }),
            }),
        })
        .collect();
    TlsRoute {
        metadata: Some(Metadata {
            kind: Some(metadata::Kind::Resource(Resource {
                group: cnimesh_model::routes::crd::GROUP.into(),
                kind: route.kind.as_str().into(),
                name: route.key.name.clone(),
                namespace: route.key.namespace.clone(),
                section: String::new(),
                port: 0,
            })),
        }),
        snis,
        rules: vec![tls_rule(backend, None)],
    }
}

fn tls_fallback(backend: &Backend, denied: Option<&EgressNetwork>) -> TlsRoute {
    TlsRoute { metadata: Some(default_meta()), snis: Vec::new(), rules: vec![tls_rule(backend, denied)] }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnimesh_model::egress::{Change, Config, Index, Object};

    fn index(docs: &[&str]) -> Index {
        let index = Index::new(Config::new(vec!["10.0.0.0/8".parse().unwrap()]));
        let objects = docs.iter().map(|d| {
            let v: serde_json::Value = serde_saphyr::from_str(d).unwrap();
            match v["kind"].as_str().unwrap() {
                "EgressNetwork" => {
                    Object::from(serde_json::from_value::<cnimesh_model::egress::crd::EgressNetwork>(v).unwrap())
                }
                "HTTPRoute" => {
                    Object::from(serde_json::from_value::<cnimesh_model::routes::crd::HttpRoute>(v).unwrap())
                }
                "TLSRoute" => Object::from(serde_json::from_value::<cnimesh_model::routes::crd::TlsRoute>(v).unwrap()),
                k => panic!("{k}"),
            }
        });
        index.apply(objects.map(Change::Upsert));
        index
    }

    const DENY: &str = "apiVersion: policy.cnimesh.io/v1alpha1\nkind: EgressNetwork\nmetadata: {name: world, namespace: shop}\nspec: {trafficPolicy: Deny}\n";
    const OK_ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: ok, namespace: shop}\nspec:\n  parentRefs: [{group: policy.cnimesh.io, kind: EgressNetwork, name: world, port: 80}]\n  hostnames: [api.example.test]\n  rules: [{matches: [{path: {type: PathPrefix, value: /ok}}]}]\n";
    const SNI_ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TLSRoute\nmetadata: {name: sni, namespace: shop}\nspec:\n  parentRefs: [{group: policy.cnimesh.io, kind: EgressNetwork, name: world, port: 8443}]\n  hostnames: [api.example.test]\n  rules: [{backendRefs: [{group: policy.cnimesh.io, kind: EgressNetwork, name: world}]}]\n";

    fn answer(index: &Index, addr: &str, ns: Option<&str>) -> Option<OutboundPolicy> {
        let snap = index.watch().borrow().clone();
        policy_of(&snap, addr.parse().unwrap(), ns, index.config())
    }

    #[test]
    fn a_deny_network_serves_its_routes_then_a_fallback_that_refuses() {
        let index = index(&[DENY, OK_ROUTE, SNI_ROUTE]);
        assert!(answer(&index, "203.0.113.7:80", Some("web")).is_none(), "another namespace's network");
        assert!(answer(&index, "10.0.0.7:80", Some("shop")).is_none(), "a cluster address");
        let p = answer(&index, "203.0.113.7:80", Some("shop")).unwrap();
        let Some(metadata::Kind::Resource(r)) = p.metadata.unwrap().kind else { panic!() };
        assert_eq!((&*r.kind, &*r.namespace, &*r.name, r.port), ("EgressNetwork", "shop", "world", 80));
        let Some(proxy_protocol::Kind::Detect(d)) = p.protocol.unwrap().kind else { panic!("detect") };
        let http = d.http1.unwrap().routes;
        assert_eq!(http.len(), 2, "the HTTPRoute, then the fallback");
        assert!(http[0].rules[0].filters.is_empty(), "the route allows");
        let Some(http_route::filter::Kind::FailureInjector(f)) = &http[1].rules[0].filters[0].kind else { panic!() };
        assert_eq!((f.status, &*f.message), (403, "egress denied by EgressNetwork shop/world"));
        let Some(backend::Kind::Forward(to)) = http[0].rules[0].backends.clone().unwrap().kind.and_then(|k| match k {
            http_route::distribution::Kind::FirstAvailable(f) => f.backends[0].backend.clone()?.kind,
            _ => None,
        }) else {
            panic!("forwarded to the original destination")
        };
        assert_eq!(SocketAddr::try_from(to.addr.unwrap()).unwrap(), "203.0.113.7:80".parse::<SocketAddr>().unwrap());
        let opaque = &d.opaque.unwrap().routes[0].rules[0].filters;
        assert!(matches!(opaque[0].kind, Some(opaque_route::filter::Kind::Forbidden(_))));
        let tls = answer(&index, "203.0.113.7:8443", Some("shop")).unwrap();
        let Some(proxy_protocol::Kind::Tls(t)) = tls.protocol.unwrap().kind else { panic!("tls") };
        assert_eq!(t.routes.len(), 2);
        assert_eq!(t.routes[0].snis[0].r#match, Some(tls_sni::sni_match::Match::Exact("api.example.test".into())));
        assert!(t.routes[0].rules[0].filters.is_empty());
        assert!(matches!(t.routes[1].rules[0].filters[0].kind, Some(tls_route::filter::Kind::Forbidden(_))));
    }
}
