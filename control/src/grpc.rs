//! gRPC over TLS without tonic's own TLS: tonic's server takes its certificate once, at build
//! time, while ours changes whenever the issuer is reloaded. So tonic provides the routing
//! (`Routes`) and we provide the listener: tokio-rustls with a config whose certificate resolver
//! is swappable, and hyper's HTTP/2 server.
//!
//! To serve another service, add it to the `Routes` before calling [`serve_tls`]
//! (`routes.add_service(FooServer::new(foo))`): everything on the listener shares the one
//! certificate and connection handling.
//!
//! Layer: gRPC: serving and connecting over TLS; the services themselves are [`destination`],
//! [`identity`], and policy's [`inbound`] and [`outbound`].

pub mod destination;
pub mod identity;
pub mod inbound;
pub mod outbound;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tonic::service::Routes;
use tower::ServiceExt;

/// A client that connects but never finishes its handshake must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pings on idle connections find proxies that vanished without a FIN (node died, conntrack
/// dropped): their long-lived streams would otherwise be held open forever.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// A proxy holds one Destination stream per destination it talks to, all on one connection:
/// hyper's default of 200 would stall a busy proxy's 201st lookup.
const MAX_STREAMS: u32 = 10_000;
/// How long in-flight calls get to finish once shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `routes` over TLS (HTTP/2 only, as gRPC is) on `listener` until `shutdown` resolves,
/// then lets in-flight calls finish (up to 10 s).
pub async fn serve_tls(
    listener: TcpListener,
    routes: Routes,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
) {
    let routes = routes.prepare();
    accept_tls(listener, tls, shutdown, "gRPC", move |tls, peer, watcher| {
        let routes = routes.clone();
        async move {
            let service = service_fn(move |req| routes.clone().oneshot(req));
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .keep_alive_interval(KEEPALIVE_INTERVAL)
                .max_concurrent_streams(MAX_STREAMS)
                .serve_connection(TokioIo::new(tls), service);
            if let Err(error) = watcher.watch(conn).await {
                tracing::debug!(%peer, %error, "gRPC connection ended with an error");
            }
        }
    })
    .await
}

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
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let watcher = graceful.watcher();
        let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, async move { acceptor.accept(tcp).await });
        let serve = serve.clone();
        tokio::spawn(async move {
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
