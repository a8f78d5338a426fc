//! The gRPC face of outbound policy: `io.linkerd.proxy.outbound.OutboundPolicies` (`Get`,
//! `Watch`) for Services, read from the Destination index: it already knows every Service's
//! ClusterIPs, ports and `config.cnimesh.io/opaque-ports`, and its watch channels push changes.
//!
//! What is filled in each `OutboundPolicy`, and why (proto: linkerd2-proxy-api 0.20
//! `outbound.proto`; what a stock linkerd2-proxy refuses: its `client-policy` crate):
//! - `metadata`: the Service as a resource (`group: core`, `kind: Service`, name, namespace,
//!   `port`): "Describes the resource for which outbound policy has been discovered".
//! - `protocol`: "set to Opaque if the target has been marked as opaque and will be Discover
//!   otherwise". Opaque ports (the Service's opaque-ports annotation) get `opaque` with one route;
//!   others get `detect` with `timeout` (10 s, required by the proxy), `opaque` (what undetected
//!   traffic uses), and `http1` and `http2`, each with one default route. No failure accrual ("If
//!   empty, circuit breaking is not performed").
//! - Every route ("Must have at least one rule") has metadata (`default: http` / `opaq`), no host
//!   matches ("If empty, the host value is ignored"), one rule matching every request (HTTP:
//!   prefix `/`) whose `backends` is `first_available` with one backend. No timeouts, retries or
//!   filters yet (routes come with HTTPRoute support).
//! - The backend: the Service as metadata, a `queue` (capacity 100, failfast 3 s: Linkerd's
//!   defaults; the proxy requires a queue), and a `balancer`: P2C with `peak_ewma` load
//!   (default RTT 30 ms, decay 10 s, Linkerd's) and `discovery` via Destination `Get` of
//!   `<svc>.<ns>.svc.<cluster domain>:<port>`, which this control plane serves.
//!
//! Targets: `addr` (a ClusterIP and port) or `authority` (`<svc>.<ns>[.svc[.<domain>]]:<port>`).
//! Anything that is not a Service port is NotFound, which a stock proxy takes as "no policy here"
//! and forwards as before; IPs of pods are answered that way too for now.
//!
//! Layer: gRPC.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use linkerd2_proxy_api::http_route::{HttpRouteMatch, PathMatch, path_match};
use linkerd2_proxy_api::meta::{Metadata, Resource, metadata};
use linkerd2_proxy_api::outbound::outbound_policies_server::{OutboundPolicies, OutboundPoliciesServer};
use linkerd2_proxy_api::outbound::{
    Backend, HttpRoute, OpaqueRoute, OutboundPolicy, ProxyProtocol, Queue, TrafficSpec, backend, http_route,
    opaque_route, proxy_protocol, traffic_spec,
};
use tonic::{Request, Response, Status};

use super::inbound::DETECT_TIMEOUT;
use crate::destination::index::{Index, IpView, ServiceView};
use crate::destination::path::{self, Target};
use crate::destination::{Config, NsName, PortSet};

const QUEUE_CAPACITY: u32 = 100;
const FAILFAST_TIMEOUT: Duration = Duration::from_secs(3);
const EWMA_DEFAULT_RTT: Duration = Duration::from_millis(30);
const EWMA_DECAY: Duration = Duration::from_secs(10);

/// Serves `Get` and `Watch` from the Destination [`Index`]. Cheap to clone.
#[derive(Clone)]
pub struct OutboundService {
    index: Index,
    config: Arc<Config>,
}

/// What a policy is computed from: the Service (if the target is one) and the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub key: NsName,
    pub port: u16,
    pub opaque: bool,
}

impl OutboundService {
    pub fn new(index: Index, config: Config) -> Self {
        Self { index, config: Arc::new(config) }
    }

    pub fn into_server(self) -> OutboundPoliciesServer<Self> {
        OutboundPoliciesServer::new(self)
    }

    /// The live stream of policies for a target; NotFound when it is not a Service port now.
    async fn follow(&self, spec: &TrafficSpec) -> Result<BoxStream<'static, Result<OutboundPolicy, Status>>, Status> {
        let target = match &spec.target {
            Some(traffic_spec::Target::Addr(addr)) => {
                let addr = SocketAddr::try_from(*addr)
                    .map_err(|e| Status::invalid_argument(format!("target address: {e}")))?;
                Target::Addr(addr)
            }
            Some(traffic_spec::Target::Authority(authority)) => path::parse(authority, &self.config.cluster_domain)
                .map_err(|e| Status::invalid_argument(e.to_string()))?,
            None => return Err(Status::invalid_argument("no target: expected addr or authority")),
        };
        self.index.ready().await;
        let config = self.config.clone();
        let mut last = None;
        let (first, stream) = match target {
            Target::Addr(addr) => {
                let rx = self.index.watch_ip(addr.ip());
                let port = addr.port();
                let first = service_of_ip(&rx.borrow(), port);
                let stream = super::destination::follow(rx, move |view| {
                    dedup(service_of_ip(view, port).map(|s| policy(&s, &config)), &mut last)
                });
                (first, stream)
            }
            Target::Service { key, port } => {
                let rx = self.index.watch_service(&key);
                let first = service_port(&rx.borrow(), port);
                let stream = super::destination::follow(rx, move |view| {
                    dedup(service_port(view, port).map(|s| policy(&s, &config)), &mut last)
                });
                (first, stream)
            }
        };
        match first {
            Some(_) => Ok(stream),
            None => Err(Status::not_found("not a Service port known to the control plane")),
        }
    }
}

fn service_of_ip(view: &IpView, port: u16) -> Option<ServicePort> {
    match view {
        IpView::Service(key, svc) => svc.ports.iter().any(|p| p.port == port).then(|| sp(key, port, &svc.opaque_ports)),
        _ => None,
    }
}

fn service_port(view: &ServiceView, port: u16) -> Option<ServicePort> {
    let snapshot = view.as_ref()?;
    let svc = &snapshot.service;
    svc.ports.iter().any(|p| p.port == port).then(|| sp(&snapshot.key, port, &svc.opaque_ports))
}

fn sp(key: &NsName, port: u16, opaque: &PortSet) -> ServicePort {
    ServicePort { key: key.clone(), port, opaque: opaque.contains(port) }
}

/// Sends a policy only when it differs from the last one sent; a target that stops being a
/// Service port sends nothing (the last policy stays with the proxy, as on a lost connection).
fn dedup(next: Option<OutboundPolicy>, last: &mut Option<OutboundPolicy>) -> Vec<OutboundPolicy> {
    match next {
        Some(next) if last.as_ref() != Some(&next) => {
            *last = Some(next.clone());
            vec![next]
        }
        _ => Vec::new(),
    }
}

#[tonic::async_trait]
impl OutboundPolicies for OutboundService {
    type WatchStream = BoxStream<'static, Result<OutboundPolicy, Status>>;

    async fn get(&self, request: Request<TrafficSpec>) -> Result<Response<OutboundPolicy>, Status> {
        let mut stream = self.follow(request.get_ref()).await?;
        match stream.next().await {
            Some(policy) => Ok(Response::new(policy?)),
            None => Err(Status::unavailable("the index went away")),
        }
    }

    async fn watch(&self, request: Request<TrafficSpec>) -> Result<Response<Self::WatchStream>, Status> {
        Ok(Response::new(self.follow(request.get_ref()).await?))
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    d.try_into().expect("a small constant")
}

fn service_meta(s: &ServicePort) -> Metadata {
    Metadata {
        kind: Some(metadata::Kind::Resource(Resource {
            group: "core".into(),
            kind: "Service".into(),
            name: s.key.name.clone(),
            namespace: s.key.namespace.clone(),
            section: String::new(),
            port: u32::from(s.port),
        })),
    }
}

fn default_meta(name: &str) -> Metadata {
    Metadata { kind: Some(metadata::Kind::Default(name.into())) }
}

/// The policy of a Service port (see the module docs for each field).
pub fn policy(s: &ServicePort, config: &Config) -> OutboundPolicy {
    let backend = Backend {
        metadata: Some(service_meta(s)),
        queue: Some(Queue { capacity: QUEUE_CAPACITY, failfast_timeout: Some(duration(FAILFAST_TIMEOUT)) }),
        kind: Some(backend::Kind::Balancer(backend::BalanceP2c {
            discovery: Some(backend::EndpointDiscovery {
                kind: Some(backend::endpoint_discovery::Kind::Dst(backend::endpoint_discovery::DestinationGet {
                    path: format!("{}.{}.svc.{}:{}", s.key.name, s.key.namespace, config.cluster_domain, s.port),
                })),
            }),
            load: Some(backend::balance_p2c::Load::PeakEwma(backend::balance_p2c::PeakEwma {
                default_rtt: Some(duration(EWMA_DEFAULT_RTT)),
                decay: Some(duration(EWMA_DECAY)),
            })),
        })),
    };
    let opaque = proxy_protocol::Opaque { routes: vec![opaque_route(&backend)] };
    let kind = if s.opaque {
        proxy_protocol::Kind::Opaque(opaque)
    } else {
        let route = http_route(&backend);
        proxy_protocol::Kind::Detect(proxy_protocol::Detect {
            timeout: Some(duration(DETECT_TIMEOUT)),
            opaque: Some(opaque),
            http1: Some(proxy_protocol::Http1 { routes: vec![route.clone()], failure_accrual: None }),
            http2: Some(proxy_protocol::Http2 { routes: vec![route], failure_accrual: None }),
        })
    };
    OutboundPolicy { protocol: Some(ProxyProtocol { kind: Some(kind) }), metadata: Some(service_meta(s)) }
}

fn opaque_route(backend: &Backend) -> OpaqueRoute {
    let backends = opaque_route::Distribution {
        kind: Some(opaque_route::distribution::Kind::FirstAvailable(opaque_route::distribution::FirstAvailable {
            backends: vec![opaque_route::RouteBackend { backend: Some(backend.clone()), filters: Vec::new() }],
        })),
    };
    OpaqueRoute {
        metadata: Some(default_meta("opaq")),
        rules: vec![opaque_route::Rule { backends: Some(backends), filters: Vec::new() }],
    }
}

fn http_route(backend: &Backend) -> HttpRoute {
    let backends = http_route::Distribution {
        kind: Some(http_route::distribution::Kind::FirstAvailable(http_route::distribution::FirstAvailable {
            backends: vec![http_route::RouteBackend {
                backend: Some(backend.clone()),
                filters: Vec::new(),
                ..Default::default()
            }],
        })),
    };
    HttpRoute {
        metadata: Some(default_meta("http")),
        hosts: Vec::new(),
        rules: vec![http_route::Rule {
            matches: vec![HttpRouteMatch {
                path: Some(PathMatch { kind: Some(path_match::Kind::Prefix("/".into())) }),
                ..HttpRouteMatch::default()
            }],
            backends: Some(backends),
            ..Default::default()
        }],
    }
}
