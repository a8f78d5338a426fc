//! Accepting TLS connections: the loop the gRPC port and the injection webhook share. Each
//! connection's handshake is bounded, it is handed on with a watcher for graceful shutdown, and
//! at shutdown the watched connections get a while to finish. It lives below both servers so
//! that the webhook does not import the gRPC module for it.
//!
//! Layer: serving (below gRPC and the webhook).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// A client that connects but never finishes its handshake must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight calls get to finish once shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts TLS connections on `listener` until `shutdown` resolves, handing each one, once its
/// handshake is done (bounded), to `serve` with a watcher for graceful shutdown; then waits for
/// the watched connections to finish (up to 10 s). `what` names the server in logs.
pub async fn accept_tls<S, Fut>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
    what: &'static str,
    serve: S,
) where
    S: Fn(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr, Watcher) -> Fut + Clone + Send + 'static,
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
    S: Fn(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr, Watcher) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
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
        let watcher = graceful.watcher();
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
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await.is_err() {
        tracing::warn!(server = what, "connections still open after the drain timeout; closing them");
    }
}
