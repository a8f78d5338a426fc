//! Accepting TLS connections: the loop the gRPC port and the injection webhook share. Each
//! connection's handshake is bounded, it is handed on with a [`Drain`] for graceful shutdown, and
//! at shutdown the watched connections get a while to finish. A server may also end one
//! connection gracefully on its own (the gRPC port does, after refusing a call for want of a
//! client certificate). It lives below both servers so that the webhook does not import the gRPC
//! module for it.
//!
//! Layer: serving (below gRPC and the webhook).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// A client that connects but never finishes its handshake must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight calls get to finish once shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// One connection's side of the server's graceful shutdown: [`Drain::watch`] serves the
/// connection and asks it to finish (HTTP/2: GOAWAY, calls in flight still answered) once the
/// server shuts down.
#[derive(Debug)]
pub struct Drain(watch::Receiver<()>);

impl Drain {
    /// Serves `conn` to its end, asking it to finish gracefully when the server shuts down.
    pub async fn watch<C: GracefulConnection>(self, conn: C) -> C::Output {
        self.watch_or_close(conn, std::future::pending()).await
    }

    /// [`Self::watch`], also asking `conn` to finish gracefully as soon as `close` resolves: the
    /// client then opens a new connection for its next calls.
    pub async fn watch_or_close<C: GracefulConnection>(
        mut self,
        conn: C,
        close: impl Future<Output = ()>,
    ) -> C::Output {
        tokio::pin!(conn, close);
        tokio::select! {
            ended = conn.as_mut() => return ended,
            // A closed sender is a server that is gone: finish as well.
            _ = self.0.changed() => {}
            () = &mut close => {}
        }
        conn.as_mut().graceful_shutdown();
        // The receiver is held until the connection is done: the server's drain waits for it.
        conn.await
    }
}

/// Accepts TLS connections on `listener` until `shutdown` resolves, handing each one, once its
/// handshake is done (bounded), to `serve` with a [`Drain`] for graceful shutdown; then waits
/// for the watched connections to finish (up to 10 s). `what` names the server in logs.
pub async fn accept_tls<S, Fut>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
    what: &'static str,
    serve: S,
) where
    S: Fn(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr, Drain) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    accept_tls_with(listener, tls, shutdown, what, |_| Some(()), serve).await
}

/// [`accept_tls`], where `admit` decides on each accepted connection before its handshake: a
/// `None` closes it at once; the permit it returns is held until the connection ends.
pub async fn accept_tls_with<A, P, S, Fut>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
    what: &'static str,
    admit: A,
    serve: S,
) where
    A: Fn(SocketAddr) -> Option<P>,
    P: Send + 'static,
    S: Fn(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr, Drain) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let acceptor = TlsAcceptor::from(tls);
    // Every connection holds a receiver until it ends; the drain below waits for all of them.
    let (drain, _) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // e.g. EMFILE: back off instead of spinning.
                    tracing::warn!(%error, server = what, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(permit) = admit(peer) else {
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let watcher = Drain(drain.subscribe());
        let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, async move { acceptor.accept(tcp).await });
        let serve = serve.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match handshake.await {
                Ok(Ok(tls)) => serve(tls, peer, watcher).await,
                Ok(Err(error)) => tracing::debug!(%peer, %error, server = what, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, server = what, "TLS handshake timed out"),
            }
        });
    }
    drop(listener);
    let _ = drain.send(());
    if tokio::time::timeout(DRAIN_TIMEOUT, drain.closed()).await.is_err() {
        tracing::warn!(server = what, "connections still open after the drain timeout; closing them");
    }
}
