//! Where a target's requests go: one fixed upstream (the original destination, with the
//! identity it is known to have), or a discovered service's endpoints, balanced per request
//! (HTTP) or per connection (opaque). Each endpoint's [`Upstream`] is built once and kept here.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;

use crate::client::discovery::accrual::{Accruing, Admission, ConsecutiveFailures};
use crate::client::discovery::balance::{self, Load};
/// Whether a service's endpoints span clusters is a property of its endpoint set, worked out by
/// discovery; routes read it from there.
pub use crate::client::discovery::spans_clusters;
use crate::client::discovery::{Endpoint, Endpoints, cluster_of};
use crate::client::upstream::{self, RequestBody, SendError, Unsent, Upstream};
use crate::transport::identity::Identity;
use crate::transport::labels::TlsLabel;
use crate::transport::tls::{self, UpstreamTls};

/// Other endpoints a request is tried on, once each, when no connection to the one picked could
/// be made (nothing of it was sent). Bounded, so that a service whose endpoints all refuse
/// answers at once rather than after a walk through every one of them.
pub const CONNECT_FAILOVER: usize = 2;

pub enum Route {
    Fixed(Arc<Upstream>),
    Balanced(Balanced),
}

/// A service's live endpoints and a client per endpoint.
pub struct Balanced {
    pub service: String,
    endpoints: watch::Receiver<Arc<Endpoints>>,
    identity: Option<Arc<Identity>>,
    connect_timeout: Duration,
    upstreams: Mutex<HashMap<SocketAddr, Arc<Upstream>>>,
}

/// A chosen upstream; `load` counts it as in flight on its endpoint until dropped.
pub struct Picked {
    pub upstream: Arc<Upstream>,
    pub load: Option<Load>,
    /// The linked cluster of the endpoint picked ([`cluster_of`]), so that a
    /// federated Service's requests are labelled with the cluster each one went to.
    pub cluster: Option<Arc<str>>,
}

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("service {0} has no endpoints")]
    NoEndpoints(String),
    #[error("{0}")]
    NoIdentity(&'static str),
}

impl Route {
    pub fn fixed(addr: SocketAddr, tls: Option<UpstreamTls>, connect_timeout: Duration) -> Self {
        Route::Fixed(Arc::new(Upstream::new(addr, tls, connect_timeout)))
    }

    pub fn balanced(
        service: String,
        endpoints: watch::Receiver<Arc<Endpoints>>,
        identity: Option<Arc<Identity>>,
        connect_timeout: Duration,
    ) -> Self {
        Route::Balanced(Balanced { service, endpoints, identity, connect_timeout, upstreams: Mutex::default() })
    }

    /// An upstream for one request or connection. `accrual`, the Service's failure accrual
    /// (HTTP requests whose outbound policy has one), keeps failed endpoints out of the pick.
    pub fn pick(&self, accrual: Option<&ConsecutiveFailures>) -> Result<Picked, RouteError> {
        match self {
            Route::Fixed(upstream) => Ok(Picked { upstream: upstream.clone(), load: None, cluster: None }),
            Route::Balanced(b) => b.pick(accrual),
        }
    }

    /// Sends `req` to `picked`'s endpoint. When no connection to it could be made
    /// ([`upstream::establishment_failed`]: not a byte of the request was written), a
    /// balanced service's request goes, as it is, to another endpoint that takes the same
    /// form of request (up to [`CONNECT_FAILOVER`] others, each once; counted in
    /// `outbound_connect_retries_total`): an endpoint going away is refused by its clients
    /// until they hear that it is gone. Returns the endpoint last tried, with its answer; the
    /// caller's timeout bounds the whole.
    pub async fn send(
        &self,
        mut picked: Picked,
        mut req: Request<RequestBody>,
    ) -> (Picked, Result<Response<Incoming>, SendError>) {
        let mut tried = Vec::new();
        loop {
            let error = match picked.upstream.try_send(req).await {
                Ok(response) => return (picked, Ok(response)),
                Err(Unsent::NotConnected(error, back)) => {
                    req = *back;
                    error
                }
                Err(failed) => return (picked, Err(failed.into_error())),
            };
            let next = match self {
                Route::Balanced(b) if tried.len() < CONNECT_FAILOVER && upstream::establishment_failed(&error) => {
                    tried.push(picked.upstream.addr);
                    b.other_than(&picked.upstream, &tried)
                }
                _ => None,
            };
            let Some((next, retries)) = next else { return (picked, Err(SendError::Connect(error))) };
            if let Some(load) = &picked.load {
                load.fail();
            }
            retries.inc();
            tracing::debug!(
                from = %picked.upstream.addr,
                to = %next.upstream.addr,
                %error,
                "no connection to the endpoint; sending the request to another"
            );
            picked = next;
        }
    }

    /// Whether the control plane says, now, that the service exists (a fixed route:
    /// always). A cached target outlives its Service: a gateway checks this for every
    /// connection, so a Service unexported (or deleted) stops being reachable at once.
    pub fn routable(&self) -> bool {
        match self {
            Route::Fixed(_) => true,
            Route::Balanced(b) => b.endpoints.borrow().routable(),
        }
    }

    /// `target_cluster_name` of a service whose endpoints are all in one linked
    /// cluster (a mirror); `None` for the cluster's own (its series keep their label set) and
    /// for one spanning clusters (a federated Service), whose requests are labelled per endpoint
    /// instead ([`Picked::cluster`]).
    pub fn target_cluster(&self) -> Option<Arc<str>> {
        let Route::Balanced(Balanced { endpoints, .. }) = self else { return None };
        let set = endpoints.borrow();
        let first = cluster_of(set.list.first()?)?.clone();
        set.list.iter().all(|e| cluster_of(e).map(|c| &**c) == Some(&*first)).then_some(first)
    }

    /// Whether Destination says, now, that every endpoint takes this port as opaque (and there
    /// is one); a fixed route: never known. A multicluster gateway forwards opaque sessions only
    /// to such a target: on any other port the target's proxy may read HTTP from the bytes,
    /// and believe headers in them no proxy set.
    pub fn declared_opaque(&self) -> bool {
        let Route::Balanced(b) = self else { return false };
        let set = b.endpoints.borrow();
        !set.list.is_empty() && set.list.iter().all(|e| e.opaque)
    }

    /// Whether its requests are labelled per endpoint (a federated Service spanning
    /// clusters); read per request, so it follows the endpoints as they change.
    pub fn spans_clusters(&self) -> bool {
        matches!(self, Route::Balanced(b) if b.endpoints.borrow().spans_clusters)
    }

    /// The connection's TLS label: for a service, `tls="true"` when every endpoint is meshed,
    /// with `server_id` when they share one identity.
    pub fn tls_label(&self) -> TlsLabel {
        match self {
            Route::Fixed(u) => u.tls.as_ref().map_or_else(TlsLabel::plaintext, UpstreamTls::label),
            Route::Balanced(Balanced { endpoints, identity, .. }) => {
                let set = endpoints.borrow();
                let ids: Vec<_> = set.list.iter().map(|e| e.identity.as_ref()).collect();
                if identity.is_none() || ids.is_empty() || ids.iter().any(Option::is_none) {
                    return TlsLabel::plaintext();
                }
                let first = ids[0];
                let server_id = ids.iter().all(|i| *i == first).then(|| first.map(ToString::to_string)).flatten();
                TlsLabel { tls: true, client_id: None, server_id }
            }
        }
    }
}

impl Balanced {
    fn pick(&self, accrual: Option<&ConsecutiveFailures>) -> Result<Picked, RouteError> {
        let set = self.endpoints.borrow().clone();
        let no_endpoints = || RouteError::NoEndpoints(self.service.clone());
        let Some(policy) = accrual else {
            let (endpoint, other) = balance::pick(&set.list, |e| &e.stats).ok_or_else(no_endpoints)?;
            return self.picked(endpoint, other, &set, None);
        };
        // The clock is read only when an endpoint is out (a healthy service's requests never).
        let clock = std::cell::OnceCell::new();
        let now = || *clock.get_or_init(Instant::now);
        let eligible = |e: &Arc<Endpoint>| e.stats.health.is_available() || e.stats.health.eligible(now());
        let admit = |e: &Arc<Endpoint>| {
            if e.stats.health.is_available() { Some(Admission::Normal) } else { e.stats.health.admit(now()) }
        };
        // An endpoint may stop being eligible between the pick and its admission (another
        // request took its one probe): pick again once, then fall back.
        for _ in 0..2 {
            let Some((endpoint, other)) = balance::pick_where(&set.list, |e| &e.stats, eligible) else {
                break;
            };
            if let Some(admission) = admit(endpoint) {
                let accruing = Accruing::new(*policy, admission, set.accrual.clone(), endpoint.addr);
                return self.picked(endpoint, other, &set, Some(accruing));
            }
        }
        // Every endpoint is out: tried anyway, as if none were (no blackout of the service).
        let (endpoint, other) = balance::pick(&set.list, |e| &e.stats).ok_or_else(no_endpoints)?;
        let admission = admit(endpoint).unwrap_or(Admission::Fallback);
        let accruing = Accruing::new(*policy, admission, set.accrual.clone(), endpoint.addr);
        self.picked(endpoint, other, &set, Some(accruing))
    }

    /// Another endpoint than those `tried`, taking the request as it was made for `failed`
    /// (plaintext or mTLS alike, the same gateway or none), available to failure accrual;
    /// with the service's `outbound_connect_retries_total`.
    fn other_than(&self, failed: &Upstream, tried: &[SocketAddr]) -> Option<(Picked, Counter)> {
        let set = self.endpoints.borrow().clone();
        let eligible = |e: &Arc<Endpoint>| {
            !tried.contains(&e.addr) && e.gateway == failed.gateway && e.stats.health.is_available()
        };
        let (endpoint, other) = balance::pick_where(&set.list, |e| &e.stats, eligible)?;
        let picked = self.picked(endpoint, other, &set, None).ok()?;
        (picked.upstream.tls.is_some() == failed.tls.is_some()).then(|| (picked, set.connect_retries.clone()))
    }

    fn picked(
        &self,
        endpoint: &Arc<Endpoint>,
        other: Option<&Arc<Endpoint>>,
        set: &Endpoints,
        accruing: Option<Accruing>,
    ) -> Result<Picked, RouteError> {
        // The load first: an error below still ends it (and frees a probe's slot).
        let load = Load::accruing(endpoint.stats.clone(), accruing);
        let upstream = self.upstream(endpoint, set)?;
        if let Some(other) = other {
            other.stats.passed_over();
        }
        Ok(Picked { upstream, load: Some(load), cluster: cluster_of(endpoint).cloned() })
    }

    /// The endpoint's client, built on first use (again if its identity changed).
    fn upstream(&self, endpoint: &Endpoint, set: &Endpoints) -> Result<Arc<Upstream>, RouteError> {
        let mut upstreams = self.upstreams.lock();
        if let Some(u) = upstreams.get(&endpoint.addr)
            && u.tls.as_ref().map(|t| &t.server_id) == endpoint.identity.as_ref()
            && u.gateway == endpoint.gateway
        {
            return Ok(u.clone());
        }
        let tls = tls::outbound(self.identity.as_deref(), endpoint.identity.clone()).map_err(RouteError::NoIdentity)?;
        // A gateway is only ever reached over mTLS (the transport header tells it
        // where to go; in plaintext anyone could read or forge it).
        if endpoint.gateway.is_some() && tls.is_none() {
            return Err(RouteError::NoIdentity("no identity of our own for mTLS to a multicluster gateway"));
        }
        let upstream =
            Arc::new(Upstream::new(endpoint.addr, tls, self.connect_timeout).with_gateway(endpoint.gateway.clone()));
        // Endpoints that left the set take their connections with them.
        if upstreams.len() >= set.list.len() + 8 {
            upstreams.retain(|addr, _| set.list.iter().any(|e| e.addr == *addr));
        }
        upstreams.insert(endpoint.addr, upstream.clone());
        Ok(upstream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{Either, Full};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn endpoint(addr: SocketAddr) -> Arc<Endpoint> {
        Arc::new(Endpoint::plaintext(addr, Default::default()))
    }

    /// A port nothing listens on any more: bound, then closed.
    async fn refusing() -> SocketAddr {
        TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap()
    }

    /// An endpoint that reads each request's head, then answers it (`answer`) or hangs up.
    async fn serving(answer: bool) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    if answer {
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
                    }
                });
            }
        });
        addr
    }

    fn route(list: Vec<Arc<Endpoint>>) -> (Route, Counter) {
        let set = Endpoints { list, known: true, exists: true, ..Default::default() };
        let retries = set.connect_retries.clone();
        let (tx, rx) = watch::channel(Arc::new(set));
        // The route keeps its receiver; the sender may go.
        drop(tx);
        (Route::balanced("web.shop.svc.cluster.local:80".into(), rx, None, Duration::from_secs(5)), retries)
    }

    fn first(addr: SocketAddr) -> Picked {
        Picked { upstream: Arc::new(Upstream::new(addr, None, Duration::from_secs(5))), load: None, cluster: None }
    }

    fn request() -> Request<RequestBody> {
        Request::get("/").body(Either::Right(Full::new(Bytes::new()))).unwrap()
    }

    #[tokio::test]
    async fn a_request_refused_at_connect_goes_to_another_endpoint_and_is_counted() {
        let (refused, live) = (refusing().await, serving(true).await);
        let (route, retries) = route(vec![endpoint(refused), endpoint(live)]);
        let (picked, result) = route.send(first(refused), request()).await;
        assert_eq!(picked.upstream.addr, live, "answered by the live endpoint");
        assert_eq!(result.unwrap().status(), 200);
        assert_eq!(retries.get(), 1);
    }

    #[tokio::test]
    async fn a_refusal_with_no_other_endpoint_is_the_answer_and_nothing_is_retried() {
        let refused = refusing().await;
        let (route, retries) = route(vec![endpoint(refused)]);
        let (picked, result) = route.send(first(refused), request()).await;
        assert_eq!(picked.upstream.addr, refused);
        let Err(SendError::Connect(error)) = result else { panic!("a connect error") };
        assert_eq!(error.kind(), std::io::ErrorKind::ConnectionRefused);
        assert_eq!(retries.get(), 0);
        // A fixed address has nowhere else to go either.
        let (_, result) = Route::fixed(refused, None, Duration::from_secs(5)).send(first(refused), request()).await;
        assert!(matches!(result, Err(SendError::Connect(_))));
    }

    #[tokio::test]
    async fn a_request_already_written_is_never_sent_again() {
        let (hangs_up, live) = (serving(false).await, serving(true).await);
        let (route, retries) = route(vec![endpoint(hangs_up), endpoint(live)]);
        let (picked, result) = route.send(first(hangs_up), request()).await;
        assert_eq!(picked.upstream.addr, hangs_up);
        assert!(matches!(result, Err(SendError::Http(_))), "the endpoint's failure is the answer");
        assert_eq!(retries.get(), 0);
    }

    #[tokio::test]
    async fn failover_is_bounded_when_every_endpoint_refuses() {
        let mut list = Vec::new();
        for _ in 0..CONNECT_FAILOVER + 3 {
            list.push(endpoint(refusing().await));
        }
        let start = list[0].addr;
        let (route, retries) = route(list);
        let (_, result) = route.send(first(start), request()).await;
        assert!(matches!(result, Err(SendError::Connect(_))));
        assert_eq!(retries.get(), CONNECT_FAILOVER as u64);
    }
}
