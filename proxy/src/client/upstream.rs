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

/// HTTP/1 connections kept per endpoint (idle, or finishing a response); more concurrent
/// requests open more connections, which close after their request once the pool is full.
const MAX_IDLE_H1: usize = 64;
/// The hard bound on kept HTTP/1 connections per endpoint, idle ones and those still carrying a
/// response together.
const MAX_KEPT_H1: usize = 2 * MAX_IDLE_H1;
/// A kept HTTP/1 connection whose last response began longer ago than this is closed rather
/// than reused.
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

/// A kept HTTP/1 connection and when it was kept.
struct Kept {
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
    h1: Mutex<Vec<Kept>>,
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
                    self.keep(sender);
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
        self.keep(sender);
        Ok(response)
    }

    /// An HTTP/1 connection that can take a request now. The most recent first (warm); one
    /// still carrying its last response's body stays for later; a closed or stale one is dropped.
    fn take_h1(&self) -> Option<http1::SendRequest<RequestBody>> {
        let mut pool = self.h1.lock();
        let mut i = pool.len();
        while i > 0 {
            i -= 1;
            let conn = &pool[i];
            if conn.sender.is_ready() {
                let conn = pool.remove(i);
                if conn.since.elapsed() < IDLE_TIMEOUT {
                    return Some(conn.sender);
                }
            } else if conn.sender.is_closed() {
                pool.remove(i);
            }
        }
        None
    }

    /// Keeps `sender` for the next request once its response head is in: it is taken again
    /// once hyper says it is ready (its response over). Kept at once rather than by a task
    /// waiting for it to be ready: a task spawned, polled and freed per request costs more
    /// than the check [`Upstream::take_h1`] makes.
    ///
    /// A full pool makes room: closed connections go, then the oldest idle one (dropping an idle
    /// sender closes its connection cleanly). Connections still carrying a response are never
    /// let go, so long responses (streams, downloads) cannot crowd reuse out: they may take the
    /// pool past [`MAX_IDLE_H1`], up to [`MAX_KEPT_H1`].
    fn keep(&self, sender: http1::SendRequest<RequestBody>) {
        let mut pool = self.h1.lock();
        if pool.len() >= MAX_IDLE_H1 {
            pool.retain(|c| !c.sender.is_closed());
        }
        if pool.len() >= MAX_IDLE_H1
            && let Some(oldest_idle) = pool.iter().position(|c| c.sender.is_ready())
        {
            pool.remove(oldest_idle);
        }
        if pool.len() < MAX_KEPT_H1 {
            pool.push(Kept { sender, since: Instant::now() });
        }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use http::header::HOST;
    use http_body_util::{BodyExt, Either, Full};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::Notify;

    use super::*;

    /// An HTTP/1 server counting its connections: `/hold` gets its head and a first chunk at
    /// once and the end of its body only once `release` is notified; anything else is answered
    /// whole at once.
    async fn server(release: Arc<Notify>) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let release = release.clone();
                tokio::spawn(async move {
                    let (mut buf, mut pending) = (vec![0u8; 4096], Vec::new());
                    loop {
                        let n = match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        pending.extend_from_slice(&buf[..n]);
                        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head: Vec<u8> = pending.drain(..end + 4).collect();
                            let answered = if head.starts_with(b"GET /hold ") {
                                let first = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n";
                                stream.write_all(first).await.is_ok() && {
                                    release.notified().await;
                                    stream.write_all(b"0\r\n\r\n").await.is_ok()
                                }
                            } else {
                                stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_ok()
                            };
                            if !answered {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, connections)
    }

    fn get(path: &str) -> Request<RequestBody> {
        Request::get(path).header(HOST, "app").body(Either::Right(Full::new(Bytes::new()))).unwrap()
    }

    #[tokio::test]
    async fn a_connection_still_carrying_a_response_body_is_not_given_another_request() {
        let release = Arc::new(Notify::new());
        let (addr, connections) = server(release.clone()).await;
        let upstream = Arc::new(Upstream::new(addr, None, Duration::from_secs(5)));
        let held = upstream.send(get("/hold")).await.unwrap();
        // The first connection is kept, but its response's body is not over: the next request
        // gets a connection of its own rather than waiting behind it.
        let next = upstream.send(get("/next")).await.unwrap();
        assert_eq!(next.into_body().collect().await.unwrap().to_bytes(), "ok");
        assert_eq!(connections.load(Ordering::SeqCst), 2);
        release.notify_one();
        assert_eq!(held.into_body().collect().await.unwrap().to_bytes(), "ok");
        let again = upstream.send(get("/again")).await.unwrap();
        assert_eq!(again.into_body().collect().await.unwrap().to_bytes(), "ok");
    }
}
