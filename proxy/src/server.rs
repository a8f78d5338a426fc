//! Accepting captured connections: original destination, the mTLS decision, protocol detection,
//! then HTTP or opaque forwarding, with TCP metrics and graceful draining.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use crate::counting::CountingIo;
use crate::detect::{self, PrefixedIo, Protocol};
use crate::http::HttpProxy;
use crate::io::MaybeTls;
use crate::metrics::{Direction, OpenConnection, TcpLabels, TlsLabel};
use crate::orig_dst::original_dst;
use crate::route::{Route, Target};
use crate::shared::Shared;
use crate::tcp;
use crate::tls::{self, ClientIo};

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
    if let Err(e) = secure(stream, direction, target, &shared).await {
        tracing::debug!(?direction, %peer, %target, error = %e, "connection ended with an error");
    }
}

/// The TLS decision for a connection (terminate inbound mTLS; originate outbound mTLS to a
/// meshed endpoint), then the connection is served with its metrics labelled accordingly.
async fn secure(
    stream: TcpStream,
    direction: Direction,
    target: SocketAddr,
    shared: &Arc<Shared>,
) -> anyhow::Result<()> {
    let config = &shared.config;
    let opaque_port = config.opaque_ports.contains(&target.port());
    // Inbound capture redirects whatever arrives at the pod: a neighbour on the same L2 segment
    // could address a packet to any IP and have us relay it from this pod's address. Only this
    // pod's own addresses are destinations of inbound traffic.
    if direction == Direction::inbound && !shared.local_ips.contains(target.ip()) {
        shared.metrics.tcp_refused(direction, target);
        anyhow::bail!("refused: inbound connection to {target}, which is not an address of this pod");
    }
    let (io, prefix, route) = match (direction, shared.identity.as_deref()) {
        (Direction::inbound, Some(identity)) => {
            let wait = if opaque_port { config.opaque_tls_wait } else { config.detect_timeout };
            match tls::inbound(stream, identity, wait, config.inbound_require_tls).await? {
                tls::Inbound::Accepted { io, prefix, tls } => (io, prefix, Ok(tls)),
                tls::Inbound::Refused(why) => {
                    shared.metrics.tcp_refused(direction, target);
                    anyhow::bail!("refused: {why}");
                }
            }
        }
        (Direction::inbound, None) => (MaybeTls::Plain(stream), Bytes::new(), Ok(TlsLabel::plaintext())),
        (Direction::outbound, _) => {
            let route =
                outbound_route(target, shared).await.inspect_err(|_| shared.metrics.tcp_refused(direction, target))?;
            (MaybeTls::Plain(stream), Bytes::new(), Err(route))
        }
    };
    // Inbound goes to the original destination; outbound where its route says.
    let (tls, route) = match route {
        Ok(tls) => (tls, Route::Fixed(Target { addr: target, tls: None })),
        Err(route) => (route.tls_label(), route),
    };
    let m = &shared.metrics;
    let labels = TcpLabels { direction, target_addr: m.target_label(direction, target), tls: tls.clone() };
    let counters = tcp::Counters {
        read: m.tcp_read_bytes_total.get_or_create(&labels).clone(),
        write: m.tcp_write_bytes_total.get_or_create(&labels).clone(),
    };
    let open = OpenConnection::open(m.clone(), labels);
    let conn = Connection { direction, target, tls, route, open, counters };
    serve(io, prefix, opaque_port, conn, shared).await
}

/// An outbound connection's route: a discovered service's endpoints, or its original
/// destination with the identity it is known to have (from discovery or configuration).
async fn outbound_route(target: SocketAddr, shared: &Shared) -> anyhow::Result<Route> {
    let mut expected = shared.static_identities.identity(target);
    if let Some(discovery) = &shared.discovery
        && let Some(profile) = discovery.profile(target).await
    {
        if let Some(service) = profile.service {
            let authority = format!("{service}:{}", target.port());
            let endpoints = discovery.endpoints(&authority).await;
            // Never heard back about the service: let the original destination handle it.
            if endpoints.borrow().routable() {
                return Ok(Route::Balanced { service: authority, endpoints, identity: shared.identity.clone() });
            }
            tracing::warn!(%target, %authority, "no answer about the service yet; forwarding to the original destination");
        }
        if let Some(identity) = profile.endpoint.and_then(|e| e.identity.clone()) {
            expected = Some(identity);
        }
    }
    let tls = tls::outbound(shared.identity.as_deref(), expected).map_err(|why| anyhow::anyhow!(why))?;
    Ok(Route::Fixed(Target { addr: target, tls }))
}

/// What is known of a connection once its TLS is settled.
struct Connection {
    direction: Direction,
    target: SocketAddr,
    tls: TlsLabel,
    route: Route,
    open: Arc<OpenConnection>,
    counters: tcp::Counters,
}

async fn serve(
    mut io: ClientIo,
    read: Bytes,
    opaque_port: bool,
    conn: Connection,
    shared: &Arc<Shared>,
) -> anyhow::Result<()> {
    let config = &shared.config;
    let (protocol, prefix) = if opaque_port {
        (Protocol::Opaque, read)
    } else if read.is_empty()
        && matches!(io, MaybeTls::Plain(_))
        && conn.direction == Direction::inbound
        && shared.identity.is_some()
    {
        // The TLS check already waited and saw nothing: a server-speaks-first client.
        (Protocol::Opaque, read)
    } else {
        detect::detect(&mut io, read, config.detect_timeout).await?
    };
    if protocol == Protocol::Opaque {
        let picked = conn.route.pick()?;
        let connected = tls::connect(picked.target.addr, config.connect_timeout, picked.target.tls.as_ref()).await;
        if let (Err(_), Some(load)) = (&connected, &picked.load) {
            load.fail();
        }
        let upstream = connected?;
        // `picked` holds the connection as load on its endpoint until it ends.
        let forwarded = tcp::forward(io, prefix, upstream, config.idle_timeout, conn.counters).await;
        drop(picked);
        return Ok(forwarded?);
    }
    let io = TokioIo::new(CountingIo::new(PrefixedIo::new(prefix, io), conn.counters.read, conn.counters.write));
    let proxy = Arc::new(HttpProxy::new(
        conn.direction,
        conn.target,
        protocol == Protocol::Http2,
        conn.route,
        conn.tls,
        conn.open,
        shared,
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
            // A client that half-closes after its request (`nc`, HTTP/1.0 tools, health checkers)
            // still waits for the response: its FIN is not a cancellation. hyper's default would
            // drop the in-flight request and close without a reply.
            .half_close(true)
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
