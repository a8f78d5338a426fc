//! The open tap sessions and the requests they observe. With no session open, a request costs
//! one relaxed atomic load ([`Taps::active`]); only then are its addresses, labels and HTTP
//! head looked at. Events go to each session through a bounded channel with `try_send`: a slow
//! tap client loses events (counted), never slows a request.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use linkerd2_proxy_api::http_types::HttpMethod;
use linkerd2_proxy_api::tap::tap_event::http::{Event, RequestInit, ResponseEnd, ResponseInit, StreamId};
use linkerd2_proxy_api::tap::{Eos, TapEvent, eos};
use parking_lot::RwLock;
use tokio::sync::mpsc;

use super::events::{self, Meta};
use super::matcher::{Match, Subject};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

/// Events a session may have queued for its client before further ones are dropped.
const SESSION_BUFFER: usize = 1024;

/// The registry's metrics, handles into the app's registry: `tap_sessions_open` and
/// `tap_events_dropped_total`.
#[derive(Clone)]
pub struct TapMetrics {
    pub sessions_open: Gauge,
    pub events_dropped: Counter,
}

/// Every open tap session of this proxy.
pub struct Taps {
    open: AtomicUsize,
    sessions: RwLock<Vec<Weak<Session>>>,
    /// The base of the next session's stream ids.
    next_base: AtomicU32,
    metrics: TapMetrics,
}

/// One Observe call: what it matches, how many requests it may still take, where events go.
/// Its client's response stream holds it; requests it tapped hold only a sender, so the stream
/// ends once the limit is reached and the last tapped response has ended.
pub struct Session {
    base: u32,
    limit: usize,
    tapped: AtomicUsize,
    matcher: Match,
    headers: bool,
    tx: mpsc::Sender<TapEvent>,
    taps: Arc<Taps>,
}

impl Session {
    pub fn under_limit(&self) -> bool {
        self.tapped.load(Ordering::Relaxed) < self.limit
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.taps.open.fetch_sub(1, Ordering::Relaxed);
        self.taps.metrics.sessions_open.dec();
    }
}

impl Taps {
    pub fn new(metrics: TapMetrics) -> Self {
        Self { open: AtomicUsize::new(0), sessions: RwLock::default(), next_base: AtomicU32::new(1), metrics }
    }

    /// Whether any session is open: the whole cost of tap to a request when none is.
    #[inline]
    pub fn active(&self) -> bool {
        self.open.load(Ordering::Relaxed) > 0
    }

    /// Opens a session taking up to `limit` requests that `matcher` matches; its events arrive
    /// on the receiver. The session lasts as long as the returned handle.
    pub fn open(
        self: &Arc<Self>,
        limit: usize,
        matcher: Match,
        headers: bool,
    ) -> (Arc<Session>, mpsc::Receiver<TapEvent>) {
        let (tx, rx) = mpsc::channel(SESSION_BUFFER);
        let base = self.next_base.fetch_add(1, Ordering::Relaxed);
        let session =
            Arc::new(Session { base, limit, tapped: AtomicUsize::new(0), matcher, headers, tx, taps: self.clone() });
        let mut sessions = self.sessions.write();
        sessions.retain(|s| s.strong_count() > 0);
        sessions.push(Arc::downgrade(&session));
        self.open.fetch_add(1, Ordering::Relaxed);
        self.metrics.sessions_open.inc();
        (session, rx)
    }

    /// Offers a request to the open sessions; those that match it and are under their limit
    /// get its `RequestInit` now and its response's events through the returned handle.
    /// `started` is when the proxy received it.
    pub fn request<B>(&self, req: &http::Request<B>, authority: &str, meta: Meta, started: Instant) -> Option<Tapped> {
        let subject = Subject {
            method: req.method(),
            scheme: req.uri().scheme_str(),
            authority,
            path: req.uri().path(),
            source: meta.source,
            destination: meta.destination,
            destination_labels: &meta.destination_labels,
            route_labels: meta.route_labels.as_ref(),
        };
        let mut sinks = Vec::new();
        for session in self.sessions.read().iter().filter_map(Weak::upgrade) {
            if !session.under_limit() || !session.matcher.matches(&subject) {
                continue;
            }
            let n = session.tapped.fetch_add(1, Ordering::Relaxed);
            if n < session.limit {
                let id = StreamId { base: session.base, stream: n as u64 };
                sinks.push(Sink { id, tx: session.tx.clone(), headers: session.headers });
            }
        }
        if sinks.is_empty() {
            return None;
        }
        let mut tapped = Tapped {
            base: meta.base_event(),
            sinks,
            started,
            response_init: None,
            response_bytes: 0,
            grpc_status: None,
            metrics: self.metrics.clone(),
        };
        tapped.request_init(req, authority);
        Some(tapped)
    }
}

/// A session's share of one request.
struct Sink {
    id: StreamId,
    tx: mpsc::Sender<TapEvent>,
    headers: bool,
}

/// A request some sessions observe, until its response has ended. Dropped before that (the
/// client went away mid-request), it ends as reset.
pub struct Tapped {
    base: TapEvent,
    sinks: Vec<Sink>,
    started: Instant,
    response_init: Option<Instant>,
    response_bytes: u64,
    /// From the response headers: a trailers-only gRPC answer carries its status there.
    grpc_status: Option<u32>,
    metrics: TapMetrics,
}

impl Tapped {
    /// Sends `event(sink)` to every sink; a sink whose queue is full loses the event (counted),
    /// and with `keep_only_delivered` is left out of the request's later events.
    fn send(&mut self, keep_only_delivered: bool, event: impl Fn(&Sink) -> Event) {
        let (base, metrics) = (&self.base, &self.metrics);
        self.sinks.retain(|sink| match sink.tx.try_send(events::http_event(base, event(sink))) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                metrics.events_dropped.inc();
                !keep_only_delivered
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
    }

    fn request_init<B>(&mut self, req: &http::Request<B>, authority: &str) {
        let pseudo = |sink: &Sink| {
            (sink.headers).then(|| {
                let path = req.uri().path_and_query().map_or("", |p| p.as_str());
                let pseudo = [
                    (":method", req.method().as_str().as_bytes()),
                    (":scheme", req.uri().scheme_str().unwrap_or("").as_bytes()),
                    (":authority", authority.as_bytes()),
                    (":path", path.as_bytes()),
                ];
                let h2 = req.version() == http::Version::HTTP_2;
                events::headers(pseudo.into_iter().filter(|_| h2), req.headers())
            })
        };
        // A session that missed the start of a request gets none of it.
        self.send(true, |sink| {
            Event::RequestInit(RequestInit {
                id: Some(sink.id),
                method: Some(HttpMethod::from(req.method().clone())),
                scheme: req.uri().scheme().map(Into::into),
                authority: authority.to_string(),
                path: req.uri().path().to_string(),
                headers: pseudo(sink),
            })
        });
    }

    /// The response's head arrived: `ResponseInit`.
    pub fn response<B>(&mut self, rsp: &http::Response<B>) {
        let at = Instant::now();
        let since = events::duration(at.saturating_duration_since(self.started));
        let headers = |sink: &Sink| {
            sink.headers.then(|| {
                let h2 = rsp.version() == http::Version::HTTP_2;
                let code = rsp.status();
                let status = [(":status", code.as_str().as_bytes())];
                events::headers(status.into_iter().filter(|_| h2), rsp.headers())
            })
        };
        self.send(false, |sink| {
            Event::ResponseInit(ResponseInit {
                id: Some(sink.id),
                since_request_init: since,
                http_status: rsp.status().as_u16().into(),
                headers: headers(sink),
            })
        });
        self.response_init = Some(at);
        self.grpc_status = grpc_status(rsp.headers());
    }

    pub fn add_bytes(&mut self, n: usize) {
        self.response_bytes += n as u64;
    }

    /// No response came (the upstream failed): a `ResponseEnd` without a `ResponseInit`.
    pub fn failed(mut self) {
        self.end(None, None);
    }

    /// The response ended: cleanly (with its trailers, if any) or reset with `reset`. Only the
    /// first end counts.
    pub fn end(&mut self, trailers: Option<&http::HeaderMap>, reset: Option<u32>) {
        if self.sinks.is_empty() {
            return;
        }
        let now = Instant::now();
        let end = match (reset, trailers.and_then(grpc_status).or(self.grpc_status)) {
            (Some(code), _) => Some(eos::End::ResetErrorCode(code)),
            (None, Some(status)) => Some(eos::End::GrpcStatusCode(status)),
            (None, None) => None,
        };
        let since_request = events::duration(now.saturating_duration_since(self.started));
        let since_response = self.response_init.and_then(|at| events::duration(now.saturating_duration_since(at)));
        let bytes = self.response_bytes;
        self.send(false, |sink| {
            Event::ResponseEnd(ResponseEnd {
                id: Some(sink.id),
                since_request_init: since_request,
                since_response_init: since_response,
                response_bytes: bytes,
                eos: Some(Eos { end }),
                trailers: trailers.filter(|_| sink.headers).map(|t| events::headers([], t)),
            })
        });
        self.sinks.clear();
    }
}

impl Drop for Tapped {
    fn drop(&mut self) {
        self.end(None, Some(RESET_CANCEL));
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<u32> {
    headers.get(&crate::http::headers::GRPC_STATUS)?.to_str().ok()?.parse().ok()
}

/// HTTP/2 reset codes an ended response reports when it did not end cleanly.
pub const RESET_INTERNAL_ERROR: u32 = 0x2;
pub const RESET_CANCEL: u32 = 0x8;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::metrics::TlsLabel;
    use linkerd2_proxy_api::tap::observe_request::r#match as pb;
    use linkerd2_proxy_api::tap::tap_event;

    fn everything() -> Match {
        let all = pb::Match::All(pb::Seq::default());
        Match::new(Some(linkerd2_proxy_api::tap::observe_request::Match { r#match: Some(all) })).unwrap()
    }

    fn meta() -> Meta {
        let (src, dst) = ("10.0.0.5:40000".parse().unwrap(), "10.0.0.7:8080".parse().unwrap());
        Meta::outbound(src, dst, &TlsLabel::plaintext(), None, None)
    }

    fn event(rx: &mut mpsc::Receiver<TapEvent>) -> Event {
        match rx.try_recv().unwrap().event {
            Some(tap_event::Event::Http(h)) => h.event.unwrap(),
            None => panic!("not HTTP"),
        }
    }

    #[test]
    fn sessions_take_requests_up_to_their_limit_and_a_dropped_request_ends_as_cancelled() {
        let taps = Arc::new(Taps::new(crate::serve::metrics::Metrics::default().tap()));
        assert!(!taps.active());
        let (session, mut rx) = taps.open(1, everything(), false);
        assert!(taps.active());
        let req = http::Request::get("/a").body(()).unwrap();
        let mut tapped = taps.request(&req, "web", meta(), Instant::now()).expect("matched");
        assert!(taps.request(&req, "web", meta(), Instant::now()).is_none(), "over the limit");
        tapped.response(&http::Response::builder().header("grpc-status", "0").body(()).unwrap());
        drop(tapped);
        assert!(matches!(event(&mut rx), Event::RequestInit(i) if i.path == "/a" && i.headers.is_none()));
        assert!(matches!(event(&mut rx), Event::ResponseInit(r) if r.http_status == 200));
        let Event::ResponseEnd(end) = event(&mut rx) else { panic!("an end") };
        assert_eq!(end.eos.unwrap().end, Some(eos::End::ResetErrorCode(RESET_CANCEL)));
        assert!(!session.under_limit());
        drop(session);
        assert!(!taps.active(), "no session left: back to one load per request");
        assert!(rx.try_recv().is_err());
    }
}
