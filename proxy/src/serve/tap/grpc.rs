//! `io.linkerd.proxy.tap.Tap/Observe`: who may call it, what a valid request is (as
//! linkerd2-proxy: a positive limit and a well-formed match), and the stream of its events.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use cnimesh_identity::Name;
use linkerd2_proxy_api::tap::observe_request::extract;
use linkerd2_proxy_api::tap::{ObserveRequest, TapEvent, tap_server};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use crate::http::tap::matcher::Match;
use crate::http::tap::registry::{Session, Taps};
use crate::serve::metrics::Metrics;

/// Who is calling, from the connection's TLS: set by the tap listener on every request.
#[derive(Debug, Clone)]
pub struct TapPeer {
    pub addr: std::net::SocketAddr,
    /// The identity in the client's certificate (the handshake required one from our trust
    /// anchors); `None` if it names none.
    pub identity: Option<Name>,
}

pub struct TapService {
    taps: Arc<Taps>,
    allowed: Arc<[Name]>,
    metrics: Arc<Metrics>,
}

impl TapService {
    pub fn new(taps: Arc<Taps>, allowed: Vec<Name>, metrics: Arc<Metrics>) -> Self {
        Self { taps, allowed: allowed.into(), metrics }
    }

    fn authorize(&self, peer: Option<&TapPeer>) -> Result<(), Status> {
        let identity = peer.and_then(|p| p.identity.as_ref());
        if identity.is_some_and(|id| self.allowed.contains(id)) {
            return Ok(());
        }
        self.metrics.tap_denied_total.inc();
        let who = identity.map_or_else(|| "a client without a mesh identity".to_string(), |id| id.to_string());
        tracing::info!(peer = ?peer.map(|p| p.addr), client = %who, "tap refused");
        Err(Status::permission_denied(format!("{who} may not tap this proxy")))
    }
}

#[tonic::async_trait]
impl tap_server::Tap for TapService {
    type ObserveStream = Events;

    async fn observe(&self, req: Request<ObserveRequest>) -> Result<Response<Events>, Status> {
        self.authorize(req.extensions().get::<TapPeer>())?;
        let req = req.into_inner();
        if req.limit == 0 {
            return Err(Status::invalid_argument("limit must be positive"));
        }
        let matcher = Match::new(req.r#match).map_err(|e| Status::invalid_argument(format!("invalid match: {e}")))?;
        // No extract field: HTTP without headers, as linkerd2-proxy does for older callers.
        let headers = matches!(
            req.extract.and_then(|e| e.extract),
            Some(extract::Extract::Http(extract::Http { extract: Some(extract::http::Extract::Headers(_)) }))
        );
        let (session, rx) = self.taps.open(req.limit as usize, matcher, headers);
        tracing::debug!(limit = req.limit, headers, "tap opened");
        Ok(Response::new(Events { session: Some(session), rx, sent: self.metrics.tap_events_sent_total.clone() }))
    }
}

/// A session's events for its client. Holding the session keeps it open; at its limit the
/// session is let go so that the stream ends when the requests it took have ended.
pub struct Events {
    session: Option<Arc<Session>>,
    rx: mpsc::Receiver<TapEvent>,
    sent: Counter,
}

impl tokio_stream::Stream for Events {
    type Item = Result<TapEvent, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.session.as_ref().is_some_and(|s| !s.under_limit()) {
            self.session = None;
        }
        let polled = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(_)) = &polled {
            self.sent.inc();
        }
        polled.map(|event| event.map(Ok))
    }
}
