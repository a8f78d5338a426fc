//! The executor of one client connection's requests. Each request is decided by its
//! direction's request path ([`crate::inbound::http`], [`crate::outbound::http`]) before
//! anything is sent; the decision is run here: the proxy's own answer, or the exchange with a
//! client ([`exchange`]). Around it, wrappers of their own: metrics ([`measure`]), tap
//! ([`tapped`]) and the request's span ([`span`]). A response is classified, counted and its
//! span ended when its body ends.
//!
//! ```text
//! request → span::start → decide ─┬─ Answer  → measure · span · tap → the proxy's answer
//!                                 └─ Forward → measure · tap → exchange → measure · span · tap (at the body's end)
//! ```

mod exchange;
mod measure;
mod span;
mod tapped;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::client::discovery::balance::Load;
use crate::client::targets::Target;
use crate::http::Body;
use crate::http::classify::{Classification, Classified, OnEnd};
use crate::http::decision::{Answer, Decision};
use crate::http::error::error_response;
use crate::http::headers::{authority_of, strip_h2c_upgrade};
use crate::http::tap;
use crate::inbound::http::InboundHttp;
use crate::inbound::policy::enforce::ConnPolicy;
use crate::outbound::egress::EgressLabels;
use crate::outbound::http::OutboundHttp;
use crate::serve::metrics::{Direction, OpenConnection, TlsLabel};
use crate::serve::shared::Shared;
use crate::serve::spans::ConnInfo;
use exchange::WentTo;
use measure::{Handles, Measure};
use span::{RequestSpan, SpanEnd, service_of};
use tapped::TapConn;

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
    /// The connection's request metrics.
    measure: Measure,
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

/// Counts a response when its body ends; its endpoint load ends with it, and so does the
/// request's span (if it is traced), so that a failure in the trailers is in the span.
struct End {
    handles: Arc<Handles>,
    status: StatusCode,
    load: Option<Load>,
    span: Option<SpanEnd>,
}

impl OnEnd for End {
    fn end(self: Box<Self>, classification: Classification) {
        let End { handles, status, load, span } = *self;
        // The endpoint's failure accrual hears the same verdict as the metrics.
        if let Some(load) = &load {
            load.outcome(classification == Classification::Failure);
        }
        handles.count_response(status, classification);
        if let Some(span) = span {
            span.end(status, classification);
        }
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
        let measure = Measure::new(direction, addr, false, shared.metrics.clone());
        let side = match direction {
            Direction::inbound => {
                let own = shared.identity.as_ref().map(|id| &id.name);
                Side::Inbound(InboundHttp::new(&tls, None, own))
            }
            Direction::outbound => Side::Outbound(OutboundHttp::new(target.clone(), addr)),
        };
        Self { direction, peer, addr, target, tls, shared, h2_upgrade, open, measure, side, egress: None }
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
            Side::Inbound(inbound) => Side::Inbound(inbound.with_policy(policy)),
            outbound => outbound,
        };
        Self { side, ..self }
    }

    pub fn with_egress(self, egress: Option<EgressLabels>) -> Self {
        let measure = self.measure.for_egress(egress.is_some());
        Self { egress, measure, ..self }
    }

    /// What a request's span reports of the connection.
    fn conn_info(&self) -> ConnInfo<'_> {
        let gateway_client = match &self.side {
            Side::Outbound(o) => o.gateway_client.as_ref().and_then(|client| client.to_str().ok()),
            Side::Inbound(_) => None,
        };
        ConnInfo {
            direction: self.direction,
            peer: self.peer,
            tls: &self.tls,
            service: service_of(&self.target),
            gateway_client,
        }
    }

    /// What a tap event reports of the connection.
    fn tap_conn(&self) -> TapConn<'_> {
        TapConn {
            direction: self.direction,
            peer: self.peer,
            addr: self.addr,
            tls: &self.tls,
            own: self.shared.identity.as_ref().map(|id| id.name.as_str()),
            target: &self.target,
            egress: self.egress.as_ref(),
        }
    }

    /// One request, end to end: its direction's decision ([`crate::http::decision`]), then the
    /// proxy's own answer or the exchange with a client, inside the metrics, tap and span
    /// wrappers.
    pub async fn handle(self: Arc<Self>, mut req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
        let start = Instant::now();
        let handles = self.measure.handles(authority_of(&req), &self.tls, &self.target.cluster);
        let mut span = match &self.shared.tracer {
            Some(tracer) => RequestSpan::start(tracer, &mut req, &self.conn_info()),
            None => RequestSpan::off(),
        };
        // Never switched to h2c: the requests after the switch would pass no check of ours.
        strip_h2c_upgrade(req.headers_mut());
        let decision = match &self.side {
            Side::Inbound(inbound) => inbound.decide(&mut req).map(|a| (a.forwarded, None, None)),
            Side::Outbound(outbound) => {
                outbound.decide(&mut req, &self.shared.outbound).await.map(|d| (None, d.routed, d.service))
            }
        };
        let handles = self.measure.seen_as(&req, handles);
        let (forwarded, routed, service) = match decision {
            Decision::Forward(forward) => forward,
            Decision::Answer(answer) => return Ok(self.answer(answer, &handles, span, &req, start)),
        };
        if let Some(routed) = &routed {
            span.routed(routed);
        }
        // A route may send the request to another Service (a canary), and in ingress mode the
        // request may name one: its requests are labelled with that target's TLS and server
        // identity, not the connection's.
        let sent_to = routed.as_ref().map(|r| &r.target).or(service.as_ref());
        let handles = match sent_to {
            Some(t) => self.measure.relabelled(handles, &t.tls, &t.cluster),
            None => handles,
        };
        // A federated Service's request is counted once its endpoint is known, under that
        // endpoint's cluster (Linkerd labels outbound requests per endpoint); every other
        // request is counted here, before it is sent.
        let per_endpoint = sent_to.unwrap_or(&self.target).route.spans_clusters();
        if !per_endpoint {
            handles.request();
        }
        let tapped = tapped::offer(&self.shared.taps, &self.tap_conn(), &req, routed.as_ref(), start);
        let result = self.exchange(req, forwarded, (routed.as_ref(), service.as_ref()), span.traced()).await;
        // An answer from an endpoint outside its target's cluster label (a federated Service's)
        // is counted under that endpoint's cluster; any other answer names none.
        let handles = match result.as_ref().ok().and_then(|(response, _)| response.extensions().get::<WentTo>()) {
            Some(WentTo(cluster)) => self.measure.in_cluster(handles, cluster),
            None => handles,
        };
        if per_endpoint {
            handles.request();
        }
        handles.latency(start);
        if let Some(routed) = &routed {
            routed.handles.duration.observe(start.elapsed().as_secs_f64());
            match &result {
                Ok((response, _)) => routed.handles.answered(response.status().as_u16(), false),
                Err(e) => routed.handles.answered(e.status().as_u16(), true),
            }
        }
        match result {
            Ok((response, load)) => {
                let (parts, inner) = response.into_parts();
                let span = span.at_end(&parts.headers);
                let end = Box::new(End { handles, status: parts.status, load, span });
                // The head too: a trailers-only gRPC response carries its status in the headers.
                let body = Classified::new(inner, parts.status, &parts.headers, end).boxed_unsync();
                Ok(tap::respond(tapped, Response::from_parts(parts, body)))
            }
            Err(e) => {
                tracing::warn!(direction = ?self.direction, target = %self.addr, status = e.status().as_u16(), "{e}");
                if let Some(tapped) = tapped {
                    tapped.failed();
                }
                handles.answered(e.status(), &HeaderMap::new());
                span.failed(&e);
                Ok(error_response(&e))
            }
        }
    }

    /// The proxy's own answer to a request (a refusal, a route's injected fault): counted,
    /// ended in its span and offered to tap, as every answer is.
    fn answer<B>(
        &self,
        Answer { kind, response }: Answer,
        handles: &Handles,
        span: RequestSpan,
        req: &Request<B>,
        start: Instant,
    ) -> Response<Body> {
        tracing::trace!(?kind, status = response.status().as_u16(), "answered by the proxy");
        handles.request();
        // A route's injected gRPC error is an HTTP 200 with a failing `grpc-status`.
        handles.answered(response.status(), response.headers());
        span.answered(&response);
        tap::respond(tapped::offer(&self.shared.taps, &self.tap_conn(), req, None, start), response)
    }
}

#[cfg(test)]
mod tests;
