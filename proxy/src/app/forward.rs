//! One client connection's requests, forwarded: metrics per request (handles resolved once per
//! authority, not per request), Linkerd's HTTP/1-over-HTTP/2 undone inbound and optionally done
//! outbound, a service named in the authority followed, the request sent on its target's
//! endpoint client, and the response classified when its body ends. Upgrades and CONNECT are
//! spliced on a connection of their own.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::HOST;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Either};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use tower::retry::budget::Budget as _;

use crate::app::metrics::{
    Direction, DstKind, Metrics, OpenConnection, RequestLabels, ResponseLabels, TargetCluster, TlsLabel,
};
use crate::app::shared::Shared;
use crate::app::spans::{self, ConnInfo, Traced};
use crate::client::discovery::accrual::ConsecutiveFailures;
use crate::client::discovery::balance::Load;
use crate::client::target::{Picked, Route, RouteError};
use crate::client::targets::Target;
use crate::client::upstream::RequestBody;
use crate::http::Body;
use crate::http::classify::{Classification, Classified, OnEnd, classify};
use crate::http::decision::{Answer, Decision};
use crate::http::error::{ProxyError, error_response, upstream_error};
use crate::http::headers::{GATEWAY_CLIENT_ID, strip_h2c_upgrade, strip_hop_by_hop, wants_upgrade};
use crate::http::orig_proto;
use crate::http::tap;
use crate::inbound::http::InboundHttp;
use crate::inbound::policy::enforce::ConnPolicy;
use crate::outbound::egress::{EgressLabels, SeenAs};
use crate::outbound::http::OutboundHttp;
use crate::outbound::routes::model::Retry;
use crate::outbound::routes::retry;
use crate::outbound::routes::routed::Routed;

/// Everything a connection's requests need.
pub struct HttpProxy {
    direction: Direction,
    /// The client (tap events).
    peer: SocketAddr,
    /// The connection's original destination (metrics, messages).
    addr: SocketAddr,
    target: Arc<Target>,
    tls: TlsLabel,
    shared: Arc<Shared>,
    /// Outbound: carry HTTP/1 to meshed endpoints over HTTP/2 (`l5d-orig-proto`).
    h2_upgrade: bool,
    /// This connection in `tcp_open_connections`; an upgraded tunnel keeps it open.
    open: Arc<OpenConnection>,
    /// Metric handles for the last few (authority, TLS) pairs seen: a connection's requests
    /// nearly always share one (a route splitting over Services adds one per backend), so the
    /// common case builds no label strings and takes no family lock.
    handles: Mutex<Vec<Arc<Handles>>>,
    /// The direction's request path: what decides each request.
    side: Side,
    /// Outbound to an EgressNetwork's destination (its network, the connection's hostname):
    /// metrics say `dst_kind="egress"`, tap events carry the request's hostname.
    egress: Option<EgressLabels>,
}

/// The request path of a connection's direction.
enum Side {
    Inbound(InboundHttp),
    Outbound(OutboundHttp),
}

/// issue 28: on a response whose endpoint's `target_cluster_name` is not its target's (a
/// federated Service spans clusters: its target has none), the endpoint's; the request is
/// counted under it.
#[derive(Clone)]
struct WentTo(TargetCluster);

/// (authority, TLS) pairs whose metric handles a connection keeps.
const MAX_CACHED_HANDLES: usize = 4;

/// The metric handles of one (connection, authority, peer TLS).
struct Handles {
    authority: String,
    labels: RequestLabels,
    requests: Counter,
    latency: Histogram,
    metrics: Arc<Metrics>,
    responses: Mutex<Vec<(u16, Classification, Counter)>>,
}

impl Handles {
    fn count_response(&self, status: StatusCode, classification: Classification) {
        let code = status.as_u16();
        let mut responses = self.responses.lock();
        if let Some((_, _, counter)) = responses.iter().find(|(c, k, _)| *c == code && *k == classification) {
            counter.inc();
            return;
        }
        let labels = ResponseLabels {
            direction: self.labels.direction,
            target_addr: self.labels.target_addr.clone(),
            dst_kind: self.labels.dst_kind,
            target_cluster: self.labels.target_cluster.clone(),
            authority: self.labels.authority.clone(),
            tls: self.labels.tls.clone(),
            status_code: code.to_string(),
            classification: classification.as_str().into(),
        };
        let counter = self.metrics.response_total.get_or_create(&labels).clone();
        counter.inc();
        // A handful of (status, classification) pairs per authority at most.
        if responses.len() < 16 {
            responses.push((code, classification, counter));
        }
    }
}

/// Counts a response when its body ends; its endpoint load ends with it, and so does the
/// request's span (if it is traced), so that a failure in the trailers is in the span.
struct End {
    handles: Arc<Handles>,
    status: StatusCode,
    _load: Option<Load>,
    /// The request's span and the response head's `grpc-status` (a trailers-only answer).
    trace: Option<(Box<Traced>, Option<String>)>,
}

impl OnEnd for End {
    fn end(self: Box<Self>, classification: Classification) {
        // The endpoint's failure accrual hears the same verdict as the metrics.
        if let Some(load) = &self._load {
            load.outcome(classification == Classification::Failure);
        }
        self.handles.count_response(self.status, classification);
        if let Some((traced, grpc)) = self.trace {
            traced.finish(Some(self.status), grpc.as_deref(), classification == Classification::Failure, None);
        }
    }
}

/// Ends a traced request's span with an answer the proxy made itself (a refusal, a route's
/// injected fault).
fn finish_answer(traced: Option<Box<Traced>>, answer: &Response<Body>) {
    if let Some(traced) = traced {
        let grpc = answer.headers().get("grpc-status").and_then(|v| v.to_str().ok());
        let failed = classify(answer.status(), answer.headers()) == Classification::Failure;
        traced.finish(Some(answer.status()), grpc, failed, None);
    }
}

/// The authority a request is for, as the client named it.
fn authority_of<B>(req: &Request<B>) -> &str {
    match req.uri().authority() {
        Some(a) => a.as_str(),
        None => req.headers().get(HOST).and_then(|h| h.to_str().ok()).unwrap_or(""),
    }
}

fn route_error(e: RouteError) -> ProxyError {
    match e {
        RouteError::NoEndpoints(service) => ProxyError::NoEndpoints(service),
        RouteError::NoIdentity(why) => ProxyError::NoIdentity(why),
    }
}

impl HttpProxy {
    pub fn new(
        direction: Direction,
        peer: SocketAddr,
        addr: SocketAddr,
        target: Arc<Target>,
        tls: TlsLabel,
        open: Arc<OpenConnection>,
        shared: Arc<Shared>,
    ) -> Self {
        let h2_upgrade = direction == Direction::outbound && shared.config.outbound_h2_upgrade;
        let side = match direction {
            Direction::inbound => {
                let own = shared.identity.as_ref().map(|id| &id.name);
                Side::Inbound(InboundHttp::new(&tls, None, own))
            }
            Direction::outbound => Side::Outbound(OutboundHttp::new(target.clone(), addr)),
        };
        Self {
            direction,
            peer,
            addr,
            target,
            tls,
            shared,
            h2_upgrade,
            open,
            handles: Mutex::default(),
            side,
            egress: None,
        }
    }

    /// A gateway's connection: pinned to its target (`pinned`), every request carrying
    /// `client` there.
    pub fn for_gateway(self, pinned: bool, client: Option<&cnimesh_identity::Name>) -> Self {
        let side = match self.side {
            Side::Outbound(outbound) => Side::Outbound(outbound.for_gateway(pinned, client)),
            inbound => inbound,
        };
        Self { side, ..self }
    }

    /// Inbound: the port's policy for this connection, each request authorized under it.
    pub fn with_policy(self, policy: Option<Arc<ConnPolicy>>) -> Self {
        let side = match self.side {
            Side::Inbound(_) => {
                let own = self.shared.identity.as_ref().map(|id| &id.name);
                Side::Inbound(InboundHttp::new(&self.tls, policy, own))
            }
            outbound => outbound,
        };
        Self { side, ..self }
    }

    pub fn with_egress(self, egress: Option<EgressLabels>) -> Self {
        Self { egress, ..self }
    }

    /// The metric handles for `authority` to a peer secured as `tls`, created on first use.
    fn handles(&self, authority: &str, tls: &TlsLabel, cluster: &TargetCluster) -> Arc<Handles> {
        let mut cached = self.handles.lock();
        if let Some(h) = cached
            .iter()
            .find(|h| h.authority == authority && h.labels.tls == *tls && h.labels.target_cluster == *cluster)
        {
            return h.clone();
        }
        let metrics = &self.shared.metrics;
        let labels = RequestLabels {
            direction: self.direction,
            target_addr: metrics.target_label(self.direction, self.addr),
            dst_kind: DstKind::egress(self.egress.is_some()),
            target_cluster: cluster.clone(),
            authority: metrics.authority_label(self.direction, authority),
            tls: tls.clone(),
        };
        let handles = Arc::new(Handles {
            authority: authority.to_string(),
            requests: metrics.request_total.get_or_create(&labels).clone(),
            latency: metrics.response_latency_ms.get_or_create(&labels).clone(),
            metrics: metrics.clone(),
            responses: Mutex::default(),
            labels,
        });
        if cached.len() >= MAX_CACHED_HANDLES {
            cached.remove(0);
        }
        cached.push(handles.clone());
        handles
    }

    /// An egress request whose Host is not bound to its destination is counted under the
    /// destination's address, never under the name it claimed.
    fn egress_handles<B>(&self, req: &Request<B>, handles: Arc<Handles>) -> Arc<Handles> {
        match req.extensions().get::<SeenAs>() {
            Some(seen) if seen.unbound => {
                self.handles(&self.addr.to_string(), &handles.labels.tls, &handles.labels.target_cluster)
            }
            _ => handles,
        }
    }

    /// The request's span, when tracing is on and the request is sampled. Off, this is the
    /// one check tracing costs a request.
    fn trace<B>(&self, req: &mut Request<B>) -> Option<Box<Traced>> {
        let tracer = self.shared.tracer.as_ref()?;
        let service = match &self.target.route {
            Route::Balanced(b) => Some(b.service.as_str()),
            Route::Fixed(_) => None,
        };
        let conn = ConnInfo { direction: self.direction, peer: self.peer, tls: &self.tls, service };
        Traced::start(tracer, req, authority_of, &conn)
    }

    /// One request, end to end, with its metrics: its direction's decision
    /// ([`crate::http::decision`]), then the proxy's own answer or the exchange with a client.
    pub async fn handle(self: Arc<Self>, mut req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
        let start = Instant::now();
        let handles = self.handles(authority_of(&req), &self.tls, &self.target.cluster);
        let mut traced = self.trace(&mut req);
        // Never switched to h2c: the requests after the switch would pass no check of ours.
        strip_h2c_upgrade(req.headers_mut());
        let decision = match &self.side {
            Side::Inbound(inbound) => inbound.decide(&mut req).map(|a| (a.forwarded, None)),
            Side::Outbound(outbound) => outbound.decide(&mut req, &self.shared.outbound).await.map(|r| (None, r)),
        };
        let handles = match &self.egress {
            Some(_) => self.egress_handles(&req, handles),
            None => handles,
        };
        let (forwarded, routed) = match decision {
            Decision::Forward(forward) => forward,
            Decision::Answer(Answer { kind, response }) => {
                tracing::trace!(?kind, status = response.status().as_u16(), "answered by the proxy");
                handles.requests.inc();
                // A route's injected gRPC error is an HTTP 200 with a failing `grpc-status`.
                handles.count_response(response.status(), classify(response.status(), response.headers()));
                finish_answer(traced, &response);
                return Ok(tap::respond(self.tap(&req, None, start), response));
            }
        };
        if let (Some(traced), Some(routed)) = (traced.as_deref_mut(), &routed) {
            let backend = match &routed.target.route {
                Route::Balanced(b) => Some(b.service.as_str()),
                Route::Fixed(_) => None,
            };
            traced.routed(&routed.route, backend, &routed.target.tls);
        }
        // A route may send the request to another Service (a canary): its requests are labelled
        // with that backend's TLS and server identity, not the connection's.
        let handles = match &routed {
            Some(r) if r.target.tls != handles.labels.tls || r.target.cluster != handles.labels.target_cluster => {
                self.handles(&handles.authority, &r.target.tls, &r.target.cluster)
            }
            _ => handles,
        };
        // issue 28: a federated Service's request is counted once its endpoint is known, under
        // that endpoint's cluster (Linkerd labels outbound requests per endpoint); every other
        // request is counted here, before it is sent, as always.
        let per_endpoint = routed.as_ref().map_or(&self.target, |r| &r.target).route.spans_clusters();
        if !per_endpoint {
            handles.requests.inc();
        }
        let tapped = self.tap(&req, routed.as_ref(), start);
        // Only the inbound speaks to apps, so only it undoes a peer proxy's upgrade.
        let downgraded = match self.direction {
            Direction::inbound => orig_proto::downgrade_request(&mut req),
            Direction::outbound => Ok(false),
        };
        let result = match downgraded {
            Err(e) => Err(e),
            Ok(false) if req.version() != Version::HTTP_2 && wants_upgrade(&req) => {
                self.upgrade(req, forwarded, traced.as_deref_mut()).await.map(|r| (r, None))
            }
            Ok(downgraded) => self.forward(req, downgraded, routed.as_ref(), traced.as_deref_mut()).await.map(
                |(mut response, load)| {
                    if downgraded {
                        orig_proto::mark_response(&mut response);
                    }
                    (response, load)
                },
            ),
        };
        // issue 28: an answer from an endpoint outside its target's cluster label (a federated
        // Service's) is counted under that endpoint's cluster; any other answer names none.
        let went = result.as_ref().ok().and_then(|(response, _)| response.extensions().get::<WentTo>());
        let handles = match went {
            Some(WentTo(cluster)) if *cluster != handles.labels.target_cluster => {
                self.handles(&handles.authority, &handles.labels.tls, cluster)
            }
            _ => handles,
        };
        if per_endpoint {
            handles.requests.inc();
        }
        handles.latency.observe(start.elapsed().as_secs_f64() * 1e3);
        if let Some(routed) = &routed {
            routed.handles.duration.observe(start.elapsed().as_secs_f64());
        }
        match result {
            Ok((response, load)) => {
                let (parts, inner) = response.into_parts();
                let trace = traced.map(|t| {
                    let grpc = parts.headers.get("grpc-status").and_then(|v| v.to_str().ok()).map(str::to_string);
                    (t, grpc)
                });
                let end = Box::new(End { handles, status: parts.status, _load: load, trace });
                // The head too: a trailers-only gRPC response carries its status in the headers.
                let body = Classified::new(inner, parts.status, &parts.headers, end).boxed_unsync();
                Ok(tap::respond(tapped, Response::from_parts(parts, body)))
            }
            Err(e) => {
                tracing::warn!(direction = ?self.direction, target = %self.addr, status = e.status().as_u16(), "{e}");
                if let Some(tapped) = tapped {
                    tapped.failed();
                }
                handles.count_response(e.status(), classify(e.status(), &http::HeaderMap::new()));
                if let Some(traced) = traced {
                    traced.finish(Some(e.status()), None, true, Some(e.to_string()));
                }
                Ok(error_response(&e))
            }
        }
    }

    /// A gateway's request: whatever its client sent as [`GATEWAY_CLIENT_ID`] is replaced by the
    /// identity its certificate proved. Done after hop-by-hop stripping, so a client's
    /// `Connection: cnimesh-gateway-client-id` cannot take the header off again.
    fn stamp_gateway_client(&self, headers: &mut http::HeaderMap) {
        if let Side::Outbound(OutboundHttp { gateway_client: Some(client), .. }) = &self.side {
            headers.insert(GATEWAY_CLIENT_ID, client.clone());
        }
    }

    /// Offers the request to open tap sessions: with none open, one relaxed load and nothing
    /// else. `routed` is the route that took it, if any.
    fn tap<B>(&self, req: &Request<B>, routed: Option<&Routed>, started: Instant) -> Option<tap::Tapped> {
        if !self.shared.taps.active() {
            return None;
        }
        let meta = match self.direction {
            Direction::inbound => {
                let own = self.shared.identity.as_ref().map(|id| id.name.as_str());
                tap::Meta::inbound(self.peer, self.addr, &self.tls, own)
            }
            Direction::outbound => {
                let target = routed.map_or(&self.target, |r| &r.target);
                let service = match &target.route {
                    Route::Balanced(b) => Some(b.service.as_str()),
                    Route::Fixed(_) => None,
                };
                let meta = tap::Meta::outbound(self.peer, self.addr, &target.tls, service, routed.map(|r| &*r.route));
                match &self.egress {
                    // What the request was seen as (its Host when bound to the
                    // destination, else the IP), else the connection's.
                    Some(egress) => {
                        let hostname = req.extensions().get::<SeenAs>().map(|s| s.hostname.clone());
                        meta.egress(&egress.egress_network, &hostname.unwrap_or_else(|| egress.dst_hostname.clone()))
                    }
                    None => meta,
                }
            }
        };
        self.shared.taps.request(req, authority_of(req), meta, started)
    }

    async fn forward(
        &self,
        req: Request<Incoming>,
        downgraded: bool,
        routed: Option<&Routed>,
        mut traced: Option<&mut Traced>,
    ) -> Result<(Response<Incoming>, Option<Load>), ProxyError> {
        let named = match routed {
            Some(_) => None,
            None => match &self.side {
                Side::Outbound(outbound) => outbound.named_target(authority_of(&req), &self.shared.outbound).await,
                Side::Inbound(_) => None,
            },
        };
        if let (Some(traced), Some(Route::Balanced(b))) = (traced.as_deref_mut(), named.as_ref().map(|t| &t.route)) {
            traced.set_service(&b.service);
        }
        let target = routed.map(|r| &r.target).or(named.as_ref()).unwrap_or(&self.target);
        // The connection's Service's failure accrual applies to its balancers (the backends of
        // its routes too, as in Linkerd); a Service a request names has no policy of ours.
        let policy = match named {
            Some(_) => None,
            None => crate::outbound::policy_of(&self.target).and_then(|p| p.current()),
        };
        let accrual = policy.as_deref().and_then(|p| p.accrual(req.version())).copied();
        let route_timeout = routed.and_then(|r| r.timeout.map(|t| (t, &r.route)));
        let exchange = async {
            match routed.and_then(|r| Some((r, r.retry()?))) {
                Some((routed, retry)) if retry::bufferable(&req, retry) => {
                    self.with_retries(target, req, downgraded, (routed, retry), accrual, traced.as_deref_mut()).await
                }
                _ => {
                    let b3 = traced.as_deref().and_then(Traced::b3);
                    let span = traced.as_deref_mut().map(|t| &mut t.span);
                    self.send(target, req.map(Either::Left), (downgraded, accrual), None, span, b3).await
                }
            }
        };
        let mut result = match route_timeout {
            Some((timeout, route)) => match tokio::time::timeout(timeout, exchange).await {
                Ok(result) => result,
                Err(_) => {
                    if let Some(traced) = traced {
                        spans::timeout_event(&mut traced.span, "route", timeout);
                    }
                    return Err(ProxyError::RouteTimeout { route: route.to_string(), after: timeout });
                }
            },
            None => exchange.await,
        };
        if let (Some(routed), Ok((response, _))) = (routed, &mut result) {
            routed.response_headers(response.headers_mut());
        }
        result
    }

    /// A request of a rule with retries, its body buffered: sent again while its answer is one the
    /// rule retries (a response whose status the rule names, or a failure of the upstream
    /// itself, [`ProxyError::retryable`]), up to the rule's limit and as far as the target's
    /// retry budget allows.
    async fn with_retries(
        &self,
        target: &Arc<Target>,
        req: Request<Incoming>,
        downgraded: bool,
        (routed, retry): (&Routed, &Retry),
        accrual: Option<ConsecutiveFailures>,
        mut traced: Option<&mut Traced>,
    ) -> Result<(Response<Incoming>, Option<Load>), ProxyError> {
        let budget = target.retry_budget();
        budget.deposit();
        let (parts, body) = req.into_parts();
        let body = retry::buffer(body, retry).await?;
        let mut attempt = 0;
        loop {
            let req = retry::request(&parts, body.clone());
            // Traced: each try is a child span of the request's, and the next hop's parent.
            let mut try_span = traced.as_deref().map(|t| t.attempt(attempt));
            let b3 = traced.as_deref().and_then(Traced::b3);
            let result = self.send(target, req, (downgraded, accrual), retry.timeout, try_span.as_mut(), b3).await;
            let again = match &result {
                Ok((response, _)) => retry.retries(response.status(), response.headers()),
                // By kind, not by status: the proxy's own 502 (no identity yet) would fail again.
                Err(e) => e.retryable(),
            };
            if let (Some(traced), Some(mut span)) = (traced.as_deref_mut(), try_span) {
                let why = match &result {
                    Ok((response, _)) => {
                        let grpc = response.headers().get("grpc-status").and_then(|v| v.to_str().ok());
                        spans::end(&mut span, Some(response.status()), grpc, again, None);
                        response.status().as_u16().to_string()
                    }
                    Err(e) => {
                        spans::end(&mut span, Some(e.status()), None, true, Some(e.to_string()));
                        e.to_string()
                    }
                };
                traced.record(span);
                if again && attempt < retry.max_retries {
                    traced.retry_event(attempt + 1, why);
                }
            }
            if !again || attempt >= retry.max_retries {
                return result;
            }
            if !budget.withdraw() {
                routed.handles.retry_overflow.inc();
                return result;
            }
            drop(result);
            attempt += 1;
            routed.handles.retries.inc();
            if let Some(wait) = retry::backoff(retry, attempt) {
                tokio::time::sleep(wait).await;
            }
        }
    }

    /// One attempt: an endpoint of `target`, the request in the form it needs, its answer.
    /// `span`, when traced, is the span of this try: it names the endpoint and is the next
    /// hop's parent (with B3 in `b3`'s form too).
    async fn send(
        &self,
        target: &Arc<Target>,
        mut req: Request<RequestBody>,
        (downgraded, accrual): (bool, Option<ConsecutiveFailures>),
        timeout: Option<std::time::Duration>,
        mut span: Option<&mut cnimesh_trace::Span>,
        b3: Option<cnimesh_trace::B3Form>,
    ) -> Result<(Response<Incoming>, Option<Load>), ProxyError> {
        let Picked { upstream, load, cluster } = target.route.pick(accrual.as_ref()).map_err(route_error)?;
        if let Some(span) = span.as_deref_mut() {
            // A CLIENT span's peer is the endpoint; a SERVER span's stays the client.
            if self.direction == Direction::outbound {
                spans::peer(span, upstream.addr);
            }
            spans::propagate(req.headers_mut(), span, b3);
        }
        strip_hop_by_hop(req.headers_mut(), false);
        self.stamp_gateway_client(req.headers_mut());
        if let Some(gateway) = &upstream.gateway {
            override_authority(&mut req, &gateway.authority)?;
        }
        let upgraded = self.h2_upgrade && req.version() != Version::HTTP_2 && upstream.tls.is_some();
        if upgraded {
            orig_proto::upgrade_request(&mut req, &self.addr.to_string())?;
        } else if req.version() != Version::HTTP_2 {
            // HTTP/1.0 stays HTTP/1.0 only when a downgrade named it; otherwise HTTP/1 goes as 1.1.
            if !(downgraded && req.version() == Version::HTTP_10) {
                *req.version_mut() = Version::HTTP_11;
            }
            to_origin_form(&mut req, self.addr)?;
        }
        let result = match timeout {
            Some(timeout) => match tokio::time::timeout(timeout, upstream.send(req)).await {
                Ok(result) => result,
                Err(_) => {
                    if let Some(span) = span {
                        spans::timeout_event(span, "try", timeout);
                    }
                    return Err(ProxyError::ResponseTimeout { addr: upstream.addr, after: timeout });
                }
            },
            None => upstream.send(req).await,
        };
        if let Some(load) = &load {
            match &result {
                Ok(response) => {
                    load.observe();
                    // A failing head (5xx, a trailers-only gRPC error) counts even when the
                    // response is retried and never reaches its end.
                    if accrual.is_some() && classify(response.status(), response.headers()) == Classification::Failure {
                        load.outcome(true);
                    }
                }
                Err(_) => load.fail(),
            }
        }
        let mut response = result.map_err(|e| gateway_error(&upstream, upstream_error(upstream.addr, &e)))?;
        strip_hop_by_hop(response.headers_mut(), false);
        // issue 28: only an endpoint outside its target's cluster label (a federated Service's)
        // says where it was; every other response carries nothing more.
        if cluster != target.cluster.0 {
            response.extensions_mut().insert(WentTo(TargetCluster(cluster)));
        }
        if upgraded {
            orig_proto::downgrade_response(&mut response);
        }
        Ok((response, load))
    }

    /// HTTP/1 `Upgrade` (e.g. WebSocket) and `CONNECT`: the handshake goes upstream on a fresh
    /// connection, and on success both upgraded connections are spliced together.
    async fn upgrade(
        &self,
        mut req: Request<Incoming>,
        forwarded: Option<Arc<ConnPolicy>>,
        traced: Option<&mut Traced>,
    ) -> Result<Response<Incoming>, ProxyError> {
        let Picked { upstream, load, .. } = self.target.route.pick(None).map_err(route_error)?;
        let target = upstream.addr;
        if let Some(traced) = traced {
            let b3 = traced.b3();
            if self.direction == Direction::outbound {
                spans::peer(&mut traced.span, target);
            }
            spans::propagate(req.headers_mut(), &traced.span, b3);
        }
        if let Some(gateway) = &upstream.gateway {
            override_authority(&mut req, &gateway.authority)?;
        }
        let io = upstream
            .connect_for(Some(crate::transport::header::SessionProtocol::Http1))
            .await
            .map_err(|e| upstream_error(target, &e))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(|e| upstream_error(target, &e))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream upgrade connection ended");
            }
        });
        let server_side = hyper::upgrade::on(&mut req);
        let is_connect = req.method() == Method::CONNECT;
        strip_hop_by_hop(req.headers_mut(), !is_connect);
        self.stamp_gateway_client(req.headers_mut());
        let mut response = sender.send_request(req).await.map_err(|e| upstream_error(target, &e))?;
        let switched =
            response.status() == StatusCode::SWITCHING_PROTOCOLS || (is_connect && response.status().is_success());
        if switched {
            let client_side = hyper::upgrade::on(&mut response);
            // The tunnel counts as load on its endpoint for as long as it lasts.
            let held = (self.shared.drain.guard(), self.open.clone(), load);
            // A tunnel is not re-checked per request: it ends when its authorization does (a
            // gateway's remote workload's, for a request the gateway forwarded).
            let policy = forwarded.or_else(|| match &self.side {
                Side::Inbound(inbound) => inbound.policy().cloned(),
                Side::Outbound(_) => None,
            });
            let revoked = async move {
                match policy {
                    Some(policy) => policy.revoked().await,
                    None => std::future::pending().await,
                }
            };
            tokio::spawn(crate::http::upgrade::splice(server_side, client_side, target, held, revoked));
        } else {
            strip_hop_by_hop(response.headers_mut(), false);
        }
        Ok(response)
    }
}

/// issue 28: a failure to reach a multicluster gateway says so (the client's operator then
/// knows to look at the linked cluster's gateway, not at a pod of their own); 502 as any
/// upstream failure.
fn gateway_error(upstream: &crate::client::upstream::Upstream, e: ProxyError) -> ProxyError {
    match &upstream.gateway {
        Some(gateway) => ProxyError::Upstream {
            addr: upstream.addr,
            why: format!("multicluster gateway unreachable for {}:{}: {e}", gateway.name, gateway.port),
        },
        None => e,
    }
}

/// issue 28: a request to a multicluster gateway names the remote Service (the endpoint's
/// authority override) as its `Host` and, when it has one, its URI's authority; the gateway
/// and the remote server see that name, not the mirror's.
fn override_authority<B>(req: &mut Request<B>, authority: &HeaderValue) -> Result<(), ProxyError> {
    req.headers_mut().insert(HOST, authority.clone());
    if req.uri().authority().is_some() {
        let mut parts = req.uri().clone().into_parts();
        parts.authority = Some(
            http::uri::Authority::try_from(authority.as_bytes())
                .map_err(|e| ProxyError::BadRequest(format!("invalid authority override: {e}")))?,
        );
        *req.uri_mut() =
            Uri::from_parts(parts).map_err(|e| ProxyError::BadRequest(format!("invalid authority override: {e}")))?;
    }
    Ok(())
}

/// An HTTP/1 request goes upstream in origin form (`GET /path`) with a `Host`: an absolute-form
/// target (a client that thinks we are its proxy) is rewritten, nothing else is touched.
fn to_origin_form<B>(req: &mut Request<B>, addr: SocketAddr) -> Result<(), ProxyError> {
    let invalid = |e: &dyn std::fmt::Display| ProxyError::BadRequest(format!("invalid request target: {e}"));
    if let Some(authority) = req.uri().authority() {
        if !req.headers().contains_key(HOST) {
            let host = HeaderValue::from_str(authority.as_str()).map_err(|e| invalid(&e))?;
            req.headers_mut().insert(HOST, host);
        }
        let path = req.uri().path_and_query().cloned();
        let mut parts = http::uri::Parts::default();
        parts.path_and_query = Some(path.unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")));
        *req.uri_mut() = Uri::from_parts(parts).map_err(|e| invalid(&e))?;
    } else if !req.headers().contains_key(HOST) {
        let host = HeaderValue::from_str(&addr.to_string()).map_err(|e| invalid(&e))?;
        req.headers_mut().insert(HOST, host);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
