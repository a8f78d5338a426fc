//! The tracing wrapper around the executor: a request's span, when tracing is on and the
//! request is sampled ([`crate::serve::spans`]); off, one `Option` check per request. It is told
//! where the request went (its route, a Service its authority named) and ends with the answer:
//! the proxy's own, an error, or (with the response) when the response body ends.

use std::sync::Arc;

use http::{HeaderMap, Request, Response};

use crate::client::target::Route;
use crate::client::targets::Target;
use crate::http::Body;
use crate::http::classify::{Classification, classify};
use crate::http::error::ProxyError;
use crate::http::trace::Traced;
use crate::outbound::http::routed::Routed;
use crate::serve::spans::{self, ConnInfo, Tracer};

/// A request's span, if it is traced.
pub(super) struct RequestSpan(Option<Box<Traced>>);

/// The Service a target balances over, if it is one.
pub(super) fn service_of(target: &Target) -> Option<&str> {
    match &target.route {
        Route::Balanced(b) => Some(b.service.as_str()),
        Route::Fixed(_) => None,
    }
}

impl RequestSpan {
    /// The span of a request, if `tracer`'s sampling picks it.
    pub(super) fn start<B>(tracer: &Arc<Tracer>, req: &mut Request<B>, conn: &ConnInfo<'_>) -> Self {
        Self(spans::start(tracer, req, crate::http::headers::authority_of, conn))
    }

    /// No span: tracing is off.
    pub(super) fn off() -> Self {
        Self(None)
    }

    /// The traced request, for the exchange's tries.
    pub(super) fn traced(&mut self) -> Option<&mut Traced> {
        self.0.as_deref_mut()
    }

    /// A route took the request: its name, and its backend when that is another target.
    pub(super) fn routed(&mut self, routed: &Routed) {
        if let Some(traced) = self.0.as_deref_mut() {
            traced.routed(&routed.route, service_of(&routed.target), &routed.target.tls);
        }
    }

    /// Ends the span with an answer the proxy made itself (a refusal, a route's injected fault).
    pub(super) fn answered(self, answer: &Response<Body>) {
        if let Some(traced) = self.0 {
            let grpc = answer.headers().get(&crate::http::headers::GRPC_STATUS).and_then(|v| v.to_str().ok());
            let failed = classify(answer.status(), answer.headers()) == Classification::Failure;
            traced.finish(Some(answer.status()), grpc, failed, None);
        }
    }

    /// Ends the span with the proxy's error.
    pub(super) fn failed(self, e: &ProxyError) {
        if let Some(traced) = self.0 {
            traced.finish(Some(e.status()), None, true, Some(e.to_string()));
        }
    }

    /// The span, to end when the response body with `headers` does (a trailers-only gRPC
    /// answer's status is in its head).
    pub(super) fn at_end(self, headers: &HeaderMap) -> Option<SpanEnd> {
        let traced = self.0?;
        let grpc = headers.get(&crate::http::headers::GRPC_STATUS).and_then(|v| v.to_str().ok()).map(str::to_string);
        Some(SpanEnd { traced, grpc })
    }
}

/// A traced response's span, ended with its classification when its body ends.
pub(super) struct SpanEnd {
    traced: Box<Traced>,
    grpc: Option<String>,
}

impl SpanEnd {
    pub(super) fn end(self, status: http::StatusCode, classification: Classification) {
        let failed = classification == Classification::Failure;
        self.traced.finish(Some(status), self.grpc.as_deref(), failed, None);
    }
}
