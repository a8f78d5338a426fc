//! gRPC over TLS without tonic's own TLS: tonic's server takes its certificate once, at build
//! time, while ours changes whenever the issuer is reloaded. So tonic provides the routing
//! (`Routes`) and we provide the listener: tokio-rustls with a config whose certificate resolver
//! is swappable, and hyper's HTTP/2 server.
//!
//! To serve another service, add it to the `Routes` before calling [`serve_tls`]
//! (`routes.add_service(FooServer::new(foo))`): everything on the listener shares the one
//! certificate and connection handling, and with it the port's defences:
//! - a client certificate is asked for and verified against the mesh's trust anchors
//!   ([`peer`]); every call but Identity's Certify without one is answered `UNAUTHENTICATED`,
//!   and its connection is then ended gracefully (GOAWAY after the answer): a client that
//!   certified on it reconnects with its new certificate instead of being refused forever;
//! - connections per peer, streams per peer, per identity and in all are bounded ([`limits`]),
//!   over a bound `RESOURCE_EXHAUSTED` (or the connection is closed at accept);
//! - HTTP/2 windows and send buffers are small, so a stream that is not read costs little;
//! - the frames many streams send for one change leave in one write ([`batched_writes`]).
//!
//! With `serve --trace-collector`, every call also gets a SERVER span ([`spans`]).
//!
//! Layer: gRPC: serving and connecting over TLS; the services themselves are [`destination`],
//! [`identity`], and policy's [`inbound`] and [`outbound`].

pub mod batched_writes;
pub mod destination;
pub mod identity;
pub mod inbound;
pub mod limits;
pub mod outbound;
pub mod peer;
pub mod preencoded;
pub mod spans;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tonic::service::Routes;
use tower::ServiceExt;

use cnimesh_common::log_limit::LogLimit;

use crate::tls_accept::accept_tls_with;
use batched_writes::BatchedWrites;
use cnimesh_model::metrics::Metrics;
use limits::{Admission, Refusal};

/// Pings on idle connections find proxies that vanished without a FIN (node died, conntrack
/// dropped): their long-lived streams would otherwise be held open forever.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Flow-control windows: what a client may send before we read it. gRPC requests to the
/// control plane are a few hundred bytes; hyper's defaults (1 MiB per stream) would let one
/// stream park a megabyte on us.
const STREAM_WINDOW: u32 = 64 * 1024;
const CONNECTION_WINDOW: u32 = 1024 * 1024;
/// What a stream's answers may queue towards a client that does not read (hyper's default is
/// ~400 KiB per stream). The services coalesce updates (each stream follows the latest state
/// of a watch), so a slow reader gets fewer, newer updates, never an unbounded backlog.
const SEND_BUFFER: usize = 64 * 1024;
/// Header blocks: a gRPC call's are well under 1 KiB.
const MAX_HEADER_LIST: u32 = 16 * 1024;
/// Refusals are logged at most this often per reason (each is counted in metrics regardless).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Serves `routes` over TLS (HTTP/2 only, as gRPC is) on `listener` until `shutdown` resolves,
/// then lets in-flight calls finish (up to 10 s). `tls` should ask for client certificates
/// ([`peer::server_config`]): calls other than Certify need one. `admission` bounds what each
/// client may hold; refusals are counted in `metrics`.
pub async fn serve_tls(
    listener: TcpListener,
    routes: Routes,
    tls: Arc<rustls::ServerConfig>,
    admission: Arc<Admission>,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    serve_tls_traced(listener, routes, tls, admission, metrics, None, shutdown).await
}

/// [`serve_tls`], with a SERVER span per call when `tracer` is given ([`spans`]).
pub async fn serve_tls_traced(
    listener: TcpListener,
    routes: Routes,
    tls: Arc<rustls::ServerConfig>,
    admission: Arc<Admission>,
    metrics: Arc<Metrics>,
    tracer: Option<spans::GrpcTracing>,
    shutdown: impl Future<Output = ()>,
) {
    let routes = routes.prepare();
    let refusals = Arc::new(RefusalLog::new(metrics));
    let streams_per_connection = admission.limits().streams_per_connection;
    let accept = {
        let (admission, refusals) = (admission.clone(), refusals.clone());
        move |peer: SocketAddr| match admission.connection(peer.ip()) {
            Ok(permit) => Some(permit),
            Err(refusal) => {
                refusals.refused(&refusal);
                None
            }
        }
    };
    accept_tls_with(listener, tls, shutdown, "gRPC", accept, move |tls, peer, watcher| {
        let (routes, admission, refusals, tracer) =
            (routes.clone(), admission.clone(), refusals.clone(), tracer.clone());
        let caller = peer::identity_of(tls.get_ref().1);
        let identity = caller.as_ref().map(|c| c.name.clone());
        // Set when a call is refused for want of a client certificate: the connection is then
        // ended gracefully, so that a client which has certified since (a proxy's first
        // connection is made before it holds a certificate, and kept) reconnects with it.
        let refused_anonymous = Arc::new(tokio::sync::Notify::new());
        let close = refused_anonymous.clone();
        async move {
            let service = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                // Services may read who is calling (tonic keeps the extensions in its `Request`).
                if let Some(caller) = &caller {
                    req.extensions_mut().insert(caller.clone());
                }
                let mut span = tracer.as_ref().and_then(|t| t.start(&req, peer, identity.as_ref()));
                let path = req.uri().path();
                if identity.is_none() && peer::requires_identity(path) {
                    refusals.unauthenticated(peer, path);
                    refused_anonymous.notify_one();
                    let status = tonic::Status::unauthenticated(format!(
                        "{path} needs a mesh client certificate (only Identity's Certify is served without one)"
                    ));
                    if let Some(span) = span {
                        span.refused(&status);
                    }
                    return futures::future::ready(Ok(status.into_http())).left_future();
                }
                let permit = match admission.stream(peer.ip(), identity.as_ref()) {
                    Ok(permit) => permit,
                    Err(refusal) => {
                        refusals.refused(&refusal);
                        let status = tonic::Status::resource_exhausted(refusal.to_string());
                        if let Some(span) = span {
                            span.refused(&status);
                        }
                        return futures::future::ready(Ok(status.into_http())).left_future();
                    }
                };
                // The permit (and the span) live as long as the response body: a stream holds
                // them until it ends.
                routes
                    .clone()
                    .oneshot(req)
                    .map(move |response| {
                        response.map(|response| {
                            if let Some(span) = &mut span {
                                span.observe(response.headers());
                            }
                            response.map(|body| {
                                tonic::body::Body::new(body.map_frame(move |frame| {
                                    let _held = &permit;
                                    if let (Some(span), Some(trailers)) = (&mut span, frame.trailers_ref()) {
                                        span.observe(trailers);
                                    }
                                    frame
                                }))
                            })
                        })
                    })
                    .right_future()
            });
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .keep_alive_interval(KEEPALIVE_INTERVAL)
                .max_concurrent_streams(streams_per_connection)
                .initial_stream_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .max_send_buf_size(SEND_BUFFER)
                .max_header_list_size(MAX_HEADER_LIST)
                .serve_connection(TokioIo::new(BatchedWrites::new(tls)), service);
            if let Err(error) = watcher.watch_or_close(conn, close.notified()).await {
                tracing::debug!(%peer, %error, "gRPC connection ended with an error");
            }
        }
    })
    .await
}

/// Counts every refusal and logs them rate-limited: a flood must not turn into a log flood.
struct RefusalLog {
    metrics: Arc<Metrics>,
    /// One limit per reason: the four [`Refusal`]s, then calls without a certificate.
    logs: [LogLimit; 5],
}

impl RefusalLog {
    fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics, logs: std::array::from_fn(|_| LogLimit::new(REFUSAL_LOG_INTERVAL)) }
    }

    fn unauthenticated(&self, peer: SocketAddr, path: &str) {
        self.metrics.grpc_refused("unauthenticated");
        if let Some(left_out) = self.logs[4].allow() {
            tracing::warn!(%peer, path, left_out, "refused a call without a mesh client certificate (logged at most every 10 s)");
        }
    }

    fn refused(&self, refusal: &Refusal) {
        self.metrics.grpc_refused(refusal.reason());
        let i = match refusal {
            Refusal::ConnectionsPerPeer { .. } => 0,
            Refusal::StreamsPerPeer { .. } => 1,
            Refusal::StreamsPerIdentity { .. } => 2,
            Refusal::Streams { .. } => 3,
        };
        if let Some(left_out) = self.logs[i].allow() {
            tracing::warn!(
                reason = refusal.reason(),
                left_out,
                "{refusal} (refusals logged at most every 10 s per reason)"
            );
        }
    }
}
