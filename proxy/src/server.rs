//! Accepting captured connections: original destination, protocol detection, then HTTP or opaque
//! forwarding, with TCP metrics and graceful draining.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use crate::config::Config;
use crate::counting::CountingIo;
use crate::detect::{self, PrefixedIo, Protocol};
use crate::drain::Drain;
use crate::http::{Clients, HttpProxy};
use crate::metrics::{Direction, Metrics, OpenConnection, TcpLabels};
use crate::orig_dst::original_dst;
use crate::tcp;

/// State shared by every connection of the proxy.
pub struct Shared {
    pub config: Config,
    pub metrics: Arc<Metrics>,
    pub clients: Arc<Clients>,
    pub drain: Drain,
}

/// Accepts until draining starts.
pub async fn accept_loop(listener: TcpListener, direction: Direction, shared: Arc<Shared>) {
    let stop = shared.drain.signalled();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let shared = shared.clone();
                    tokio::spawn(async move { connection(stream, peer, direction, shared).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, ?direction, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}

async fn connection(stream: TcpStream, peer: SocketAddr, direction: Direction, shared: Arc<Shared>) {
    let local = stream.local_addr().ok();
    let Some(target) = original_dst(&stream) else {
        // A connection straight to the proxy port: forwarding it would loop back to us.
        tracing::warn!(?direction, %peer, local = ?local, "connection was not redirected by capture; closing it");
        return;
    };
    let _guard = shared.drain.guard();
    let _ = stream.set_nodelay(true);
    let m = &shared.metrics;
    let labels = TcpLabels { direction, target_addr: m.target_label(direction, target), tls: "false".into() };
    let read = m.tcp_read_bytes_total.get_or_create(&labels).clone();
    let written = m.tcp_write_bytes_total.get_or_create(&labels).clone();
    let open = OpenConnection::open(m.clone(), labels);
    if let Err(e) = serve(stream, direction, target, read, written, open, &shared).await {
        tracing::debug!(?direction, %peer, %target, error = %e, "connection ended with an error");
    }
}

async fn serve(
    mut stream: TcpStream,
    direction: Direction,
    target: SocketAddr,
    read: prometheus_client::metrics::counter::Counter,
    written: prometheus_client::metrics::counter::Counter,
    open: Arc<OpenConnection>,
    shared: &Arc<Shared>,
) -> anyhow::Result<()> {
    let config = &shared.config;
    let (protocol, prefix) = if config.opaque_ports.contains(&target.port()) {
        (Protocol::Opaque, Bytes::new())
    } else {
        detect::detect(&mut stream, config.detect_timeout).await?
    };
    if protocol == Protocol::Opaque {
        let upstream = tcp::connect(target, config.connect_timeout).await?;
        let counters = tcp::Counters { read, write: written };
        return Ok(tcp::forward(stream, prefix, upstream, config.idle_timeout, counters).await?);
    }
    let io = TokioIo::new(CountingIo::new(PrefixedIo::new(prefix, stream), read, written));
    let proxy = Arc::new(HttpProxy::new(
        direction,
        target,
        protocol == Protocol::Http2,
        &shared.clients,
        shared.metrics.clone(),
        shared.drain.clone(),
        open,
    ));
    let service = service_fn(move |req| proxy.clone().handle(req));
    let stop = shared.drain.signalled();
    if protocol == Protocol::Http2 {
        let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .serve_connection(io, service);
        until_drained(conn, stop, |c| c.graceful_shutdown()).await?;
    } else {
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            // Slowloris: a client that does not finish its headers in time is cut off.
            .header_read_timeout(config.header_timeout)
            .serve_connection(io, service)
            .with_upgrades();
        until_drained(conn, stop, |c| c.graceful_shutdown()).await?;
    }
    Ok(())
}

/// Drives a hyper connection; once draining starts, asks it to finish gracefully (complete the
/// in-flight requests, accept no new ones) and waits for that.
async fn until_drained<C, E>(
    conn: C,
    stop: impl std::future::Future<Output = ()>,
    graceful: fn(std::pin::Pin<&mut C>),
) -> Result<(), E>
where
    C: std::future::Future<Output = Result<(), E>>,
{
    tokio::pin!(conn);
    tokio::pin!(stop);
    tokio::select! {
        r = conn.as_mut() => r,
        () = stop => {
            graceful(conn.as_mut());
            conn.await
        }
    }
}
