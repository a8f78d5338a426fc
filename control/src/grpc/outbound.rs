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
//!   traffic uses), and `http1` and `http2`, each with one default route. A port whose
//!   `appProtocol` declares its protocol ([`cnimesh_model::destination::app_protocol`]) gets `opaque`,
//!   `http1` or `http2` instead of `detect`. `failure_accrual` ("If empty, circuit breaking is not
//!   performed") carries the Service's `balancer.cnimesh.io/failure-accrual…` annotations
//!   ([`cnimesh_model::destination::accrual`]) in every HTTP protocol of the policy.
//! - Without routes, every route ("Must have at least one rule") has metadata (`default: http` /
//!   `opaq`), no host matches ("If empty, the host value is ignored"), one rule matching every
//!   request (HTTP: prefix `/`) whose `backends` is `first_available` with one backend; the
//!   HTTP default route carries the Service's `retry.cnimesh.io/*` and
//!   `timeout.cnimesh.io/request` annotations (Linkerd reads its `retry.linkerd.io/*` ones the
//!   same way), which also fill what attached routes leave unset.
//! - With Gateway API routes attached to the Service port (GAMMA; [`cnimesh_model::routes`]), as
//!   Linkerd's policy controller answers: GRPCRoutes give protocol `grpc` with those routes;
//!   HTTPRoutes give `detect` whose `http1` and `http2` carry those routes (and `opaque` the
//!   default opaque route). Routes keep the controller's order (oldest first, then by
//!   namespace/name); the proxy picks the most specific match among them. What each route holds
//!   is described in [`routes`]. Opaque ports ignore routes. Producer routes (in the Service's
//!   namespace) apply to every client; consumer routes (in another namespace) apply only to
//!   clients of their own namespace (`TrafficSpec.source_workload`, `<ns>:<pod>` or
//!   `{"ns":…,"pod":…}`) and, for those, replace the producer routes (GAMMA).
//! - The backend: the Service as metadata, a `queue` (capacity 100, failfast 3 s: Linkerd's
//!   defaults; the proxy requires a queue), and a `balancer`: P2C with `peak_ewma` load
//!   (default RTT 30 ms, decay 10 s, Linkerd's) and `discovery` via Destination `Get` of
//!   `<svc>.<ns>.svc.<cluster domain>:<port>`, which this control plane serves.
//!
//! Targets: `addr` (a ClusterIP and port) or `authority` (`<svc>.<ns>[.svc[.<domain>]]:<port>`).
//! Route changes (the outbound index's channel of the Service parent) reach open `Watch` streams like
//! Service changes do. The first answer waits until Services and routes are loaded, not for the
//! policy resources.
//! Anything that is not a Service port is NotFound, which a stock proxy takes as "no policy here"
//! and forwards as before; IPs of pods are answered that way too for now.
//!
//! Routes and egress come from one index, the outbound index
//! ([`cnimesh_model::outbound`], [`OutboundService::with_outbound`]), keyed by parent: a
//! Service's routes, and the EgressNetworks.
//!
//! Egress ([`egress`]): with an outbound index, an
//! address outside the cluster networks that an EgressNetwork holds (for the asking client's
//! namespace) is answered with the EgressNetwork's policy, and followed as EgressNetworks and
//! their routes change; one no EgressNetwork holds is NotFound, as before.
//!
//! Layer: gRPC.

pub mod egress;
mod routes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::{self, BoxStream};
use linkerd2_proxy_api::meta::{Metadata, Resource, metadata};
use linkerd2_proxy_api::outbound::outbound_policies_server::{OutboundPolicies, OutboundPoliciesServer};
use linkerd2_proxy_api::outbound::{
    Backend, ExponentialBackoff, FailureAccrual as ApiFailureAccrual, HttpRoute, OpaqueRoute, OutboundPolicy,
    ProxyProtocol, Queue, TrafficSpec, backend, opaque_route, proxy_protocol, traffic_spec,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::inbound::DETECT_TIMEOUT;
use cnimesh_model::destination::accrual::FailureAccrual;
use cnimesh_model::destination::app_protocol::AppProtocol;
use cnimesh_model::destination::index::{Index, IpView, ServiceView};
use cnimesh_model::destination::path::{self, Target};
use cnimesh_model::destination::{Config, ServiceRecord};
use cnimesh_model::meta::NsName;
use cnimesh_model::outbound::{self, Parent};
use cnimesh_model::routes::model::{
    HttpMatch, Matches, PathMatch as RoutePath, RouteDefaults, Rule, ServiceDefaults, Timeouts,
};
use cnimesh_model::routes::{Route, RouteKind, ServiceRoutes};

const QUEUE_CAPACITY: u32 = 100;
const FAILFAST_TIMEOUT: Duration = Duration::from_secs(3);
const EWMA_DEFAULT_RTT: Duration = Duration::from_millis(30);
const EWMA_DECAY: Duration = Duration::from_secs(10);

/// Serves `Get` and `Watch` from the Destination [`Index`]. Cheap to clone.
#[derive(Clone)]
pub struct OutboundService {
    index: Index,
    config: Arc<Config>,
    /// Where routes and EgressNetworks come from; without it every Service gets the default
    /// routes and egress addresses are NotFound.
    outbound: Option<outbound::Index>,
}

/// What a policy is computed from: the Service (if the target is one) and the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub key: NsName,
    pub port: u16,
    pub opaque: bool,
    /// The Service's retry and timeout annotations.
    pub defaults: ServiceDefaults,
    /// The Service's failure accrual annotations ([`cnimesh_model::destination::accrual`]).
    pub failure_accrual: Option<FailureAccrual>,
    /// What the port's `appProtocol` declares ([`cnimesh_model::destination::app_protocol`]).
    pub app_protocol: Option<AppProtocol>,
}

impl OutboundService {
    pub fn new(index: Index, config: Config) -> Self {
        Self { index, config: Arc::new(config), outbound: None }
    }

    /// Serves the routes attached to each Service, and EgressNetworks and their routes for
    /// addresses outside the cluster networks, from the outbound index.
    pub fn with_outbound(mut self, outbound: outbound::Index) -> Self {
        self.outbound = Some(outbound);
        self
    }

    /// The live stream of an egress address's policy; NotFound when no EgressNetwork holds it
    /// now (see [`egress`]).
    async fn follow_egress(
        egress: &cnimesh_model::egress::Index,
        addr: SocketAddr,
        client_namespace: Option<String>,
    ) -> Result<BoxStream<'static, Result<OutboundPolicy, Status>>, Status> {
        egress.ready().await;
        let mut rx = egress.watch();
        let config = egress.config().clone();
        let first = {
            let snapshot = rx.borrow_and_update().clone();
            egress::policy_of(&snapshot, addr, client_namespace.as_deref(), &config)
        };
        let Some(first) = first else {
            return Err(Status::not_found("not a Service port, nor an address an EgressNetwork holds"));
        };
        let last = Some(first.clone());
        let updates = stream::unfold((rx, last), move |(mut rx, mut last)| {
            let (config, client_namespace) = (config.clone(), client_namespace.clone());
            async move {
                loop {
                    rx.changed().await.ok()?;
                    let snapshot = rx.borrow_and_update().clone();
                    let next = egress::policy_of(&snapshot, addr, client_namespace.as_deref(), &config)
                        .unwrap_or_else(|| egress::uncovered(addr));
                    if let Some(policy) = dedup(Some(next), &mut last).pop() {
                        return Some((Ok(policy), (rx, last)));
                    }
                }
            }
        });
        Ok(stream::iter([Ok(first)]).chain(updates).boxed())
    }

    pub fn into_server(self) -> OutboundPoliciesServer<Self> {
        OutboundPoliciesServer::new(self).max_decoding_message_size(crate::grpc::limits::MAX_REQUEST_LEN)
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
        // A workload we cannot read is a client of no namespace: producer routes only.
        let client_namespace =
            super::inbound::parse_workload(&spec.source_workload).ok().map(|w| w.namespace).filter(|n| !n.is_empty());
        if let (Target::Addr(addr), Some(outbound)) = (&target, &self.outbound)
            && !outbound.egress().config().cluster_networks.iter().any(|n| n.contains(&addr.ip()))
        {
            return Self::follow_egress(outbound.egress(), *addr, client_namespace).await;
        }
        self.index.ready().await;
        if let Some(outbound) = &self.outbound {
            outbound.ready().await;
        }
        let target = match target {
            Target::Addr(addr) => Watched::Addr(self.index.watch_ip(addr.ip()), addr.port()),
            Target::Service { key, port } => Watched::Service(self.index.watch_service(&key), port),
        };
        let mut follower = Follower {
            target,
            routes_index: self.outbound.clone(),
            routes: None,
            client_namespace,
            config: self.config.clone(),
            last: None,
        };
        let Some(first) = follower.current() else {
            return Err(Status::not_found("not a Service port known to the control plane"));
        };
        let first = stream::iter([Ok(first)]);
        let updates = stream::unfold(follower, |mut f| async move {
            loop {
                f.changed().await?;
                if let Some(policy) = f.current() {
                    return Some((Ok(policy), f));
                }
            }
        });
        Ok(first.chain(updates).boxed())
    }
}

/// The destination channel a stream follows.
enum Watched {
    Addr(watch::Receiver<IpView>, u16),
    Service(watch::Receiver<ServiceView>, u16),
}

/// One `Watch` stream's state: the target's channel, the routes channel of the Service it
/// currently is (re-subscribed if an address comes to belong to another Service), and what was
/// sent last. No task of its own: polled by the server's stream task.
struct Follower {
    target: Watched,
    routes_index: Option<outbound::Index>,
    routes: Option<(NsName, watch::Receiver<ServiceRoutes>)>,
    client_namespace: Option<String>,
    config: Arc<Config>,
    last: Option<OutboundPolicy>,
}

impl Follower {
    /// The policy to send now, if it differs from the last one sent; `None` also while the
    /// target is no Service port (the last policy stays with the proxy, as on a lost connection).
    fn current(&mut self) -> Option<OutboundPolicy> {
        let service = match &mut self.target {
            Watched::Addr(rx, port) => service_of_ip(&rx.borrow_and_update(), *port),
            Watched::Service(rx, port) => service_port(&rx.borrow_and_update(), *port),
        }?;
        let attached = match &self.routes_index {
            None => Arc::new(Vec::new()),
            Some(index) => {
                if self.routes.as_ref().is_none_or(|(key, _)| *key != service.key) {
                    self.routes = Some((service.key.clone(), index.watch(&Parent::Service(service.key.clone()))));
                }
                let (_, rx) = self.routes.as_mut().expect("just set");
                rx.borrow_and_update().clone()
            }
        };
        let selected = selected_routes(&attached, &service, self.client_namespace.as_deref());
        let next = policy(&service, &selected, &self.config);
        dedup(Some(next), &mut self.last).pop()
    }

    /// Waits for either channel to change; `None` once the index dropped one (it ends the stream).
    async fn changed(&mut self) -> Option<()> {
        let target = async {
            match &mut self.target {
                Watched::Addr(rx, _) => rx.changed().await,
                Watched::Service(rx, _) => rx.changed().await,
            }
        };
        match &mut self.routes {
            None => target.await.ok(),
            Some((_, routes)) => tokio::select! {
                changed = target => changed.ok(),
                changed = routes.changed() => changed.ok(),
            },
        }
    }
}

/// The routes a client gets for a Service port (GAMMA): consumer routes of the client's own
/// namespace when there are any, else the producer routes of the Service's namespace.
fn selected_routes(attached: &[Arc<Route>], service: &ServicePort, client: Option<&str>) -> Vec<Arc<Route>> {
    let on_port = || attached.iter().filter(|r| r.attaches_to(&service.key, service.port));
    let consumer: Vec<Arc<Route>> = match client {
        Some(ns) if ns != service.key.namespace => on_port().filter(|r| r.key.namespace == ns).cloned().collect(),
        _ => Vec::new(),
    };
    if !consumer.is_empty() {
        return consumer;
    }
    on_port().filter(|r| r.key.namespace == service.key.namespace).cloned().collect()
}

fn service_of_ip(view: &IpView, port: u16) -> Option<ServicePort> {
    match view {
        IpView::Service(key, svc) => svc.ports.iter().any(|p| p.port == port).then(|| sp(key, port, svc)),
        _ => None,
    }
}

fn service_port(view: &ServiceView, port: u16) -> Option<ServicePort> {
    let snapshot = view.as_ref()?;
    let svc = &snapshot.service;
    svc.ports.iter().any(|p| p.port == port).then(|| sp(&snapshot.key, port, svc))
}

fn sp(key: &NsName, port: u16, svc: &ServiceRecord) -> ServicePort {
    ServicePort {
        key: key.clone(),
        port,
        opaque: svc.opaque_ports.contains(port),
        defaults: svc.route_defaults.clone(),
        failure_accrual: svc.failure_accrual,
        app_protocol: svc.app_protocol(port),
    }
}

/// The proto's form of a Service's failure accrual.
fn failure_accrual(accrual: Option<FailureAccrual>) -> Option<ApiFailureAccrual> {
    use linkerd2_proxy_api::outbound::failure_accrual::{ConsecutiveFailures, Kind};
    let a = accrual?;
    Some(ApiFailureAccrual {
        kind: Some(Kind::ConsecutiveFailures(ConsecutiveFailures {
            max_failures: a.max_failures,
            backoff: Some(ExponentialBackoff {
                min_backoff: Some(duration(a.min_penalty)),
                max_backoff: Some(duration(a.max_penalty)),
                jitter_ratio: a.jitter_ratio,
                ..Default::default()
            }),
        })),
        ..Default::default()
    })
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

/// Durations here are constants or Gateway API durations (at most 4 × 99999 h): they fit.
fn duration(d: Duration) -> prost_types::Duration {
    d.try_into().expect("a duration prost can hold")
}

fn service_meta(key: &NsName, port: u16) -> Metadata {
    Metadata {
        kind: Some(metadata::Kind::Resource(Resource {
            group: "core".into(),
            kind: "Service".into(),
            name: key.name.clone(),
            namespace: key.namespace.clone(),
            section: String::new(),
            port: u32::from(port),
        })),
    }
}

fn default_meta(name: &str) -> Metadata {
    Metadata { kind: Some(metadata::Kind::Default(name.into())) }
}

/// The backend of a Service port: P2C over the endpoints Destination gives for it.
fn service_backend(key: &NsName, port: u16, config: &Config) -> Backend {
    Backend {
        metadata: Some(service_meta(key, port)),
        queue: Some(Queue { capacity: QUEUE_CAPACITY, failfast_timeout: Some(duration(FAILFAST_TIMEOUT)) }),
        kind: Some(backend::Kind::Balancer(backend::BalanceP2c {
            discovery: Some(backend::EndpointDiscovery {
                kind: Some(backend::endpoint_discovery::Kind::Dst(backend::endpoint_discovery::DestinationGet {
                    path: format!("{}.{}.svc.{}:{}", key.name, key.namespace, config.cluster_domain, port),
                })),
            }),
            load: Some(backend::balance_p2c::Load::PeakEwma(backend::balance_p2c::PeakEwma {
                default_rtt: Some(duration(EWMA_DEFAULT_RTT)),
                decay: Some(duration(EWMA_DECAY)),
            })),
        })),
    }
}

/// The policy of a Service port with the routes selected for the client (see the module docs
/// for each field).
pub fn policy(s: &ServicePort, selected: &[Arc<Route>], config: &Config) -> OutboundPolicy {
    let backend = service_backend(&s.key, s.port, config);
    let backend_of = |key: &NsName, port: u16| service_backend(key, port, config);
    let opaque = proxy_protocol::Opaque { routes: vec![opaque_route(&backend)] };
    let accrual = failure_accrual(s.failure_accrual);
    let kind = match routes::served_kind(selected) {
        _ if s.opaque || s.app_protocol == Some(AppProtocol::Opaque) => proxy_protocol::Kind::Opaque(opaque),
        Some(RouteKind::Grpc) => proxy_protocol::Kind::Grpc(proxy_protocol::Grpc {
            routes: selected
                .iter()
                .filter(|r| r.kind == RouteKind::Grpc)
                .map(|r| routes::grpc_route(r, &backend, &backend_of, &s.defaults.grpc))
                .collect(),
            failure_accrual: accrual,
        }),
        kind => {
            let http_routes: Vec<HttpRoute> = match kind {
                Some(_) => {
                    selected.iter().map(|r| routes::http_route(r, &backend, &backend_of, &s.defaults.http)).collect()
                }
                None => vec![default_http_route(&backend, &backend_of, &s.defaults.http)],
            };
            // A declared protocol is served without detection (Linkerd 2.18's appProtocol).
            match s.app_protocol {
                Some(AppProtocol::Http1) => {
                    proxy_protocol::Kind::Http1(proxy_protocol::Http1 { routes: http_routes, failure_accrual: accrual })
                }
                Some(AppProtocol::Http2) => {
                    proxy_protocol::Kind::Http2(proxy_protocol::Http2 { routes: http_routes, failure_accrual: accrual })
                }
                _ => proxy_protocol::Kind::Detect(proxy_protocol::Detect {
                    timeout: Some(duration(DETECT_TIMEOUT)),
                    opaque: Some(opaque),
                    http1: Some(proxy_protocol::Http1 { routes: http_routes.clone(), failure_accrual: accrual }),
                    http2: Some(proxy_protocol::Http2 { routes: http_routes, failure_accrual: accrual }),
                }),
            }
        }
    };
    OutboundPolicy { protocol: Some(ProxyProtocol { kind: Some(kind) }), metadata: Some(service_meta(&s.key, s.port)) }
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

/// The route of a Service without HTTPRoutes: every request to the Service itself, with the
/// Service's own retry and timeout annotations.
fn default_http_route(backend: &Backend, backend_of: routes::BackendOf<'_>, defaults: &RouteDefaults) -> HttpRoute {
    let rule = Rule {
        matches: Matches::Http(vec![HttpMatch { path: Some(RoutePath::Prefix("/".into())), ..HttpMatch::default() }]),
        filters: Vec::new(),
        backends: Vec::new(),
        timeouts: Timeouts { request: defaults.request_timeout, backend_request: None },
        retry: defaults.retry.clone(),
    };
    HttpRoute {
        metadata: Some(default_meta("http")),
        hosts: Vec::new(),
        rules: vec![routes::http_rule(&rule, backend, backend_of)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(app_protocol: Option<AppProtocol>, failure_accrual: Option<FailureAccrual>) -> ServicePort {
        ServicePort {
            key: NsName::new("shop", "web"),
            port: 80,
            opaque: false,
            defaults: ServiceDefaults::default(),
            failure_accrual,
            app_protocol,
        }
    }

    #[test]
    fn a_declared_app_protocol_is_served_instead_of_detect_with_the_services_failure_accrual() {
        let accrual = FailureAccrual {
            max_failures: 3,
            min_penalty: Duration::from_millis(500),
            max_penalty: Duration::from_secs(10),
            jitter_ratio: 0.25,
        };
        let kind = |p: &ServicePort| policy(p, &[], &Config::default()).protocol.and_then(|p| p.kind).unwrap();
        let served = |a: &Option<ApiFailureAccrual>| {
            let Some(linkerd2_proxy_api::outbound::failure_accrual::Kind::ConsecutiveFailures(c)) =
                a.as_ref().and_then(|a| a.kind)
            else {
                panic!("no consecutive failures: {a:?}")
            };
            let backoff = c.backoff.unwrap();
            (
                c.max_failures,
                backoff.min_backoff.unwrap().nanos,
                backoff.max_backoff.unwrap().seconds,
                backoff.jitter_ratio,
            )
        };
        match kind(&port(Some(AppProtocol::Http1), Some(accrual))) {
            proxy_protocol::Kind::Http1(h) => {
                assert_eq!(h.routes.len(), 1, "the default route");
                assert_eq!(served(&h.failure_accrual), (3, 500_000_000, 10, 0.25));
            }
            other => panic!("http: {other:?}"),
        }
        assert!(
            matches!(kind(&port(Some(AppProtocol::Http2), None)), proxy_protocol::Kind::Http2(h) if h.failure_accrual.is_none())
        );
        assert!(matches!(kind(&port(Some(AppProtocol::Opaque), Some(accrual))), proxy_protocol::Kind::Opaque(_)));
        match kind(&port(None, Some(accrual))) {
            proxy_protocol::Kind::Detect(d) => {
                assert_eq!(served(&d.http1.unwrap().failure_accrual).0, 3);
                assert_eq!(served(&d.http2.unwrap().failure_accrual).0, 3);
            }
            other => panic!("undeclared: {other:?}"),
        }
        match kind(&port(None, None)) {
            proxy_protocol::Kind::Detect(d) => {
                assert!(d.http1.unwrap().failure_accrual.is_none(), "no annotation: none")
            }
            other => panic!("undeclared: {other:?}"),
        }
    }
}
