//! One upstream endpoint's connections: the proxy's only pool layer. HTTP/2 multiplexes every
//! request on one connection; HTTP/1 keeps a few idle connections to reuse. Built once per
//! endpoint of a cached target (see [`crate::client::targets`]) and shared by every client
//! connection and request to it, so a request finds its connection without a global lock.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response, Version};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;

use crate::client::discovery::GatewayTarget;
use crate::http::serve_conn::{H1_MAX_BUF, H2_CONN_WINDOW, H2_MAX_SEND_BUF, H2_STREAM_WINDOW};
use crate::transport::header::{SessionProtocol, TransportHeader};
use crate::transport::tls::{self, UpstreamIo, UpstreamTls};

/// What goes upstream: a client's body streamed through, or one buffered so that the request
/// can be sent again (a retry).
pub type RequestBody = http_body_util::Either<Incoming, http_body_util::Full<bytes::Bytes>>;

/// Idle HTTP/1 connections kept per endpoint; more concurrent requests open more connections,
/// which close after their request once the pool is full.
const MAX_IDLE_H1: usize = 64;
/// An idle HTTP/1 connection older than this is closed rather than reused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("connecting: {0}")]
    Connect(#[source] io::Error),
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

/// Why [`Upstream::try_send`] has no response: the request never reached a connection to the
/// endpoint (so it comes back as it was, and may go elsewhere), or it did.
pub enum Unsent {
    /// No connection could be made: not a byte of the request was written.
    NotConnected(io::Error, Box<Request<RequestBody>>),
    Failed(SendError),
}

impl Unsent {
    pub fn into_error(self) -> SendError {
        match self {
            Unsent::NotConnected(error, _) => SendError::Connect(error),
            Unsent::Failed(error) => error,
        }
    }
}

impl From<hyper::Error> for Unsent {
    fn from(e: hyper::Error) -> Self {
        Unsent::Failed(e.into())
    }
}

/// Whether a connect that failed with `error` failed at establishing the connection (refused,
/// unreachable, timed out, reset before the handshake was over), so that another endpoint
/// may be tried. A failure of TLS verification is not one: it is a fact about the peer.
pub fn establishment_failed(error: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionRefused | TimedOut | HostUnreachable | NetworkUnreachable | ConnectionReset | ConnectionAborted
    )
}

struct Idle {
    sender: http1::SendRequest<RequestBody>,
    since: Instant,
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub tls: Option<UpstreamTls>,
    /// A multicluster gateway: every connection starts with the transport header
    /// naming this target, and HTTP requests carry its authority.
    pub gateway: Option<Arc<GatewayTarget>>,
    connect_timeout: Duration,
    h1: Mutex<Vec<Idle>>,
    h2: Mutex<Option<http2::SendRequest<RequestBody>>>,
    /// Held while the HTTP/2 connection is made, so concurrent first requests share it.
    h2_connecting: tokio::sync::Mutex<()>,
}

impl Upstream {
    pub fn new(addr: SocketAddr, tls: Option<UpstreamTls>, connect_timeout: Duration) -> Self {
        Self {
            addr,
            tls,
            gateway: None,
            connect_timeout,
            h1: Mutex::default(),
            h2: Mutex::default(),
            h2_connecting: Default::default(),
        }
    }

    /// This upstream is a multicluster gateway forwarding to `gateway`.
    pub fn with_gateway(self, gateway: Option<Arc<GatewayTarget>>) -> Self {
        Self { gateway, ..self }
    }

    /// A new connection (TCP, and mTLS to a meshed endpoint) for opaque bytes.
    pub async fn connect(&self) -> io::Result<UpstreamIo> {
        self.connect_for(None).await
    }

    /// A new connection for a session of `protocol` (`None`: opaque); to a gateway, it starts
    /// with the transport header saying so.
    pub async fn connect_for(&self, protocol: Option<SessionProtocol>) -> io::Result<UpstreamIo> {
        let mut io = tls::connect(self.addr, self.connect_timeout, self.tls.as_ref()).await?;
        if let Some(gateway) = &self.gateway {
            use tokio::io::AsyncWriteExt;
            let header = TransportHeader { port: gateway.port, name: gateway.name.clone(), protocol };
            io.write_all(&header.encode()).await?;
        }
        Ok(io)
    }

    /// Sends `req` in its own version: HTTP/2 on the shared connection, HTTP/1 on an idle
    /// connection or a new one. A request an idle connection could not take (closed meanwhile)
    /// is sent again on a new connection: it never left.
    pub async fn send(self: &Arc<Self>, req: Request<RequestBody>) -> Result<Response<Incoming>, SendError> {
        self.try_send(req).await.map_err(Unsent::into_error)
    }

    /// Like [`Upstream::send`], giving the request back when no connection could be made for
    /// it ([`Unsent::NotConnected`]).
    pub async fn try_send(self: &Arc<Self>, req: Request<RequestBody>) -> Result<Response<Incoming>, Unsent> {
        if req.version() == Version::HTTP_2 {
            return self.send_h2(req).await;
        }
        let req = match self.take_h1() {
            Some(mut sender) => match sender.try_send_request(req).await {
                Ok(response) => {
                    self.clone().reuse_when_ready(sender);
                    return Ok(response);
                }
                Err(mut e) => match e.take_message() {
                    Some(req) => req,
                    None => return Err(Unsent::Failed(e.into_error().into())),
                },
            },
            None => req,
        };
        // A new connection (TCP, TLS, the transport header, hyper's handshake): its futures are
        // boxed where they are awaited, so that the rare connect does not size every request's
        // future. Each request's future is moved several times (into hyper's HTTP/2 stream, into
        // the spawned task), and a kilobyte more in it is copied at each move.
        let io = match Box::pin(self.connect_for(Some(SessionProtocol::Http1))).await {
            Ok(io) => io,
            Err(error) => return Err(Unsent::NotConnected(error, Box::new(req))),
        };
        let mut sender = Box::pin(self.handshake_h1(io)).await?;
        let response = sender.send_request(req).await?;
        self.clone().reuse_when_ready(sender);
        Ok(response)
    }

    fn take_h1(&self) -> Option<http1::SendRequest<RequestBody>> {
        let mut idle = self.h1.lock();
        while let Some(i) = idle.pop() {
            // The most recent first (warm); a closed or stale one is dropped.
            if i.sender.is_ready() && i.since.elapsed() < IDLE_TIMEOUT {
                return Some(i.sender);
            }
        }
        None
    }

    /// Keeps `sender` for reuse once its response is over (hyper says when: `ready`), so the
    /// pool only ever holds connections that can take a request at once.
    fn reuse_when_ready(self: Arc<Self>, mut sender: http1::SendRequest<RequestBody>) {
        tokio::spawn(async move {
            if sender.ready().await.is_ok() {
                let mut idle = self.h1.lock();
                if idle.len() < MAX_IDLE_H1 {
                    idle.push(Idle { sender, since: Instant::now() });
                }
            }
        });
    }

    async fn handshake_h1(&self, io: UpstreamIo) -> Result<http1::SendRequest<RequestBody>, hyper::Error> {
        let (sender, conn) = http1::Builder::new().max_buf_size(H1_MAX_BUF).handshake(TokioIo::new(io)).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream HTTP/1 connection ended");
            }
        });
        Ok(sender)
    }

    async fn send_h2(&self, req: Request<RequestBody>) -> Result<Response<Incoming>, Unsent> {
        let mut sender = match self.shared_h2() {
            Some(sender) => sender,
            None => {
                let _connecting = self.h2_connecting.lock().await;
                match self.shared_h2() {
                    Some(sender) => sender,
                    None => {
                        // Boxed, as for HTTP/1 (see `try_send`).
                        let io = match Box::pin(self.connect_for(Some(SessionProtocol::Http2))).await {
                            Ok(io) => io,
                            Err(error) => return Err(Unsent::NotConnected(error, Box::new(req))),
                        };
                        let sender = Box::pin(self.handshake_h2(io)).await?;
                        *self.h2.lock() = Some(sender.clone());
                        sender
                    }
                }
            }
        };
        Ok(sender.send_request(req).await?)
    }

    fn shared_h2(&self) -> Option<http2::SendRequest<RequestBody>> {
        self.h2.lock().as_ref().filter(|s| !s.is_closed()).cloned()
    }

    async fn handshake_h2(&self, io: UpstreamIo) -> Result<http2::SendRequest<RequestBody>, hyper::Error> {
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONN_WINDOW)
            .max_send_buf_size(H2_MAX_SEND_BUF)
            .handshake(TokioIo::new(io))
            .await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
            }
        });
        Ok(sender)
    }
}
