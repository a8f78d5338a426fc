//! A traced request's span ([`Traced`]), as the request path tells it where the request went
//! and how it ended, and the context it forwards to the next hop. Which requests are traced,
//! and the attributes a span starts with, are the serving layer's ([`crate::serve::spans`]).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

use cnimesh_trace::context::{self, B3Form};
use cnimesh_trace::{Exporter, Span, SpanKind, Status};
use http::{HeaderMap, StatusCode};

use crate::transport::labels::TlsLabel;

/// A traced request: its span and the B3 form to forward alongside W3C.
pub struct Traced {
    pub span: Span,
    b3: Option<B3Form>,
    exporter: Arc<Exporter>,
}

impl Traced {
    /// A traced request's span, exported to `exporter` when it ends (or is dropped).
    pub fn new(span: Span, b3: Option<B3Form>, exporter: Arc<Exporter>) -> Box<Traced> {
        Box::new(Traced { span, b3, exporter })
    }

    /// A route took the request: its name, and the backend it chose when that is another target.
    pub fn routed(&mut self, route: &str, backend: Option<&str>, backend_tls: &TlsLabel) {
        self.span.name = Cow::Owned(format!("{} {route}", self.span.name));
        self.span.set("http.route", route.to_string());
        if let Some(service) = backend {
            self.set_service(service);
        }
        replace(&mut self.span, "cnimesh.tls", backend_tls.tls);
        if let Some(id) = &backend_tls.server_id {
            replace(&mut self.span, "cnimesh.server.identity", id.clone());
        }
    }

    /// The request went to `service` (a route's backend, or a Service its authority named).
    pub fn set_service(&mut self, service: &str) {
        replace(&mut self.span, "cnimesh.target.service", service.to_string());
    }

    /// A child CLIENT span for try `attempt` (0 = the first) of a retried request.
    pub fn attempt(&self, attempt: u32) -> Span {
        let mut span = self.span.child(self.span.name.clone(), SpanKind::Client);
        if attempt > 0 {
            span.set("http.request.resend_count", i64::from(attempt));
        }
        span
    }

    /// A retry is about to be sent, because the last try answered `why`.
    pub fn retry_event(&mut self, attempt: u32, why: String) {
        self.span.event(
            "retry",
            vec![
                ("http.request.resend_count".into(), i64::from(attempt).into()),
                ("cnimesh.retry.reason".into(), why.into()),
            ],
        );
    }

    /// The B3 form to forward, for [`propagate`].
    pub fn b3(&self) -> Option<B3Form> {
        self.b3
    }

    /// Records the finished try span.
    pub fn record(&self, span: Span) {
        self.exporter.record(span);
    }

    /// Ends the request's span with its answer (`status` and the gRPC status, if any) and exports
    /// it; `error` marks it failed with the proxy's error text.
    pub fn finish(
        mut self: Box<Self>,
        status: Option<StatusCode>,
        grpc: Option<&str>,
        failed: bool,
        error: Option<String>,
    ) {
        end(&mut self.span, status, grpc, failed, error);
        // Dropping records it.
    }
}

/// A traced request's span is exported however the request ends: a request whose future is
/// dropped before its answer (the client reset the stream or went away, e.g. the peer proxy's
/// route timeout) is ended here as cancelled, so the server side of a timed-out hop still shows.
impl Drop for Traced {
    fn drop(&mut self) {
        let s = &mut self.span;
        if s.end.is_none() {
            s.set("error.type", "cancelled");
            s.status = Status::Error("cancelled: the request was abandoned before its answer".into());
            s.end();
        }
        let span = Span {
            trace_id: s.trace_id,
            span_id: s.span_id,
            parent: s.parent,
            trace_state: std::mem::take(&mut s.trace_state),
            name: std::mem::take(&mut s.name),
            kind: s.kind,
            start: s.start,
            end: s.end,
            attributes: std::mem::take(&mut s.attributes),
            events: std::mem::take(&mut s.events),
            status: std::mem::take(&mut s.status),
        };
        self.exporter.record(span);
    }
}

/// Writes `span`'s context as the next hop's parent (W3C, and B3 in `b3`'s form).
pub fn propagate(headers: &mut HeaderMap, span: &Span, b3: Option<B3Form>) {
    context::inject(headers, &span.context(), b3);
}

/// The endpoint a try (or an untried request) went to.
pub fn peer(span: &mut Span, addr: SocketAddr) {
    replace(span, "network.peer.address", addr.ip().to_string());
    replace(span, "network.peer.port", i64::from(addr.port()));
}

/// A timeout ended the exchange: `what` is `route` or `try`.
pub fn timeout_event(span: &mut Span, what: &'static str, after: std::time::Duration) {
    let ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
    span.event("timeout", vec![("cnimesh.timeout".into(), what.into()), ("cnimesh.timeout.ms".into(), ms.into())]);
}

/// Ends `span` with an answer: status attributes, and failure as OTel's HTTP conventions say
/// for its kind: on a CLIENT span any 4xx is an error too (the request as sent did not work: a
/// policy's 403 shows in the trace as the failure it is to the caller), on a SERVER span only a
/// failed 5xx is (a 4xx is the caller's doing); and a failing gRPC status or the proxy's own error.
pub fn end(span: &mut Span, status: Option<StatusCode>, grpc: Option<&str>, failed: bool, error: Option<String>) {
    if let Some(status) = status {
        span.set("http.response.status_code", status.as_u16());
    }
    if let Some(grpc) = grpc.and_then(|g| g.parse::<i64>().ok()) {
        span.set("rpc.grpc.status_code", grpc);
    }
    match error {
        Some(error) => {
            span.set("error.type", status.map_or_else(|| "proxy".to_string(), |s| s.as_u16().to_string()));
            span.status = Status::Error(error);
        }
        None => {
            let client = span.kind == SpanKind::Client;
            let http_error = status.filter(|s| (failed && s.is_server_error()) || (client && s.is_client_error()));
            match http_error {
                Some(status) => {
                    span.set("error.type", status.as_u16().to_string());
                    span.status = Status::Error(format!("HTTP {}", status.as_u16()));
                }
                None if failed => {
                    span.set("error.type", "failure");
                    span.status = Status::Error("a gRPC status other than OK, or a response body cut short".into());
                }
                None => {}
            }
        }
    }
    span.end();
}

fn replace(span: &mut Span, key: &'static str, value: impl Into<cnimesh_trace::Value>) {
    let value = value.into();
    match span.attributes.iter_mut().find(|(k, _)| k == key) {
        Some((_, v)) => *v = value,
        None => span.attributes.push((key.into(), value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_answer_marks_the_span_an_error_with_its_status() {
        let mut span = Span::start("GET", SpanKind::Client, cnimesh_trace::Parent::Root);
        end(&mut span, Some(StatusCode::SERVICE_UNAVAILABLE), None, true, None);
        assert_eq!(span.status, Status::Error("HTTP 503".into()));
        assert!(span.end.is_some());
        let mut grpc = Span::start("POST", SpanKind::Server, cnimesh_trace::Parent::Root);
        end(&mut grpc, Some(StatusCode::OK), Some("14"), true, None);
        assert!(
            grpc.attributes.iter().any(|(k, v)| k == "rpc.grpc.status_code" && *v == cnimesh_trace::Value::Int(14))
        );
    }

    #[test]
    fn a_403_is_an_error_on_a_client_span_and_not_on_a_server_span() {
        let error_type = |span: &Span| span.attributes.iter().find(|(k, _)| k == "error.type").map(|(_, v)| v.clone());
        // A policy's refusal is not a failure to the classifier (it does not count against the
        // endpoint), yet the caller's request did not work.
        let mut client = Span::start("GET", SpanKind::Client, cnimesh_trace::Parent::Root);
        end(&mut client, Some(StatusCode::FORBIDDEN), None, false, None);
        assert_eq!(client.status, Status::Error("HTTP 403".into()));
        assert_eq!(error_type(&client), Some("403".to_string().into()));
        let mut server = Span::start("GET", SpanKind::Server, cnimesh_trace::Parent::Root);
        end(&mut server, Some(StatusCode::FORBIDDEN), None, false, None);
        assert_eq!(server.status, Status::Unset);
        assert_eq!(error_type(&server), None);
        let mut ok = Span::start("GET", SpanKind::Client, cnimesh_trace::Parent::Root);
        end(&mut ok, Some(StatusCode::NOT_MODIFIED), None, false, None);
        assert_eq!(ok.status, Status::Unset, "a 3xx is no error");
    }
}
