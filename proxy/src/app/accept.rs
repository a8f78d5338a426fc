//! Accepting captured connections: each gets its original destination and goes to the inbound
//! or outbound side, counted for graceful draining. [`connection`] takes any IO with its
//! addresses, so everything after the socket is exercised in-process by tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use crate::app::admission::Permit;
use crate::app::config::Config;
use crate::app::dispatch::{self, Connection, Known};
use crate::app::metrics::{AcceptError, DecidedBy, Direction};
use crate::app::shared::Shared;
use crate::client::targets::Target;
use crate::transport::Io;
use crate::transport::conn_error::ConnError;
use crate::transport::detect::Protocol;
use crate::transport::orig_dst::original_dst;
use cnimesh_common::log_limit::LogLimit;

/// At most one log line per this period about shed connections or failing accepts, per listener.
const LOG_PERIOD: Duration = Duration::from_secs(10);
/// After accept() failed for want of descriptors or memory: wait this long before the next try
/// rather than spin on a listener whose backlog keeps it readable.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accepts until draining starts. Connections beyond a limit ([`crate::app::admission`]) are reset
/// at once: the client learns at once, and a slot is not held by a connection that will not be
/// served. A failing accept() never ends the loop.
pub async fn accept_loop(listener: TcpListener, direction: Direction, shared: Arc<Shared>) {
    let stop = shared.drain.signalled();
    tokio::pin!(stop);
    let (shed_log, error_log) = (LogLimit::new(LOG_PERIOD), LogLimit::new(LOG_PERIOD));
    loop {
        tokio::select! {
            () = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match shared.admission.admit(direction, peer.ip()) {
                    Ok(permit) if shared.gateway.is_some() => {
                        let shared = shared.clone();
                        tokio::spawn(async move { gateway_socket(stream, peer, shared, permit).await });
                    }
                    Ok(permit) => {
                        let shared = shared.clone();
                        tokio::spawn(async move { accepted_socket(stream, peer, direction, shared, permit).await });
                    }
                    Err(why) => {
                        shared.metrics.accept_error(direction, why);
                        // A reset rather than a FIN: nothing lingers on our side.
                        let _ = stream.set_zero_linger();
                        drop(stream);
                        if let Some(left_out) = shed_log.allow() {
                            let limits = shared.admission.limits;
                            tracing::warn!(?direction, %peer, reason = ?why, ?limits, shed_since_last_line = left_out, "shedding connections over the limit");
                        }
                    }
                },
                Err(e) => {
                    shared.metrics.accept_error(direction, AcceptError::accept);
                    if let Some(left_out) = error_log.allow() {
                        tracing::warn!(error = %e, ?direction, failed_since_last_line = left_out, "accept failed");
                    }
                    if is_resource_exhaustion(&e) {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                }
            },
        }
    }
}

/// accept() failures that persist until something is freed; others (a connection aborted
/// before it was accepted) concern one connection only.
fn is_resource_exhaustion(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

async fn accepted_socket(
    stream: TcpStream,
    peer: SocketAddr,
    direction: Direction,
    shared: Arc<Shared>,
    // Held until the connection ends.
    _permit: Permit,
) {
    let Some(addr) = original_dst(&stream) else {
        // A connection straight to the proxy port: forwarding it would loop back to us.
        let local = stream.local_addr().ok();
        tracing::warn!(?direction, %peer, local = ?local, "connection was not redirected by capture; closing it");
        return;
    };
    let _ = stream.set_nodelay(true);
    connection(stream, peer, addr, direction, shared).await;
}

/// A multicluster gateway's connection: not captured (it came to the gateway's own
/// address), admitted by [`crate::gateway`] and served as outbound traffic to its target.
async fn gateway_socket(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>, _permit: Permit) {
    let _ = stream.set_nodelay(true);
    let Ok(local) = stream.local_addr() else { return };
    let _guard = shared.drain.guard();
    let _ = gateway(stream, peer, local, &shared).await;
}

/// Serves one gateway connection from `peer` that arrived on `local` (in-process tests call it
/// with any IO); an error is counted and logged here, and returned.
pub async fn gateway<I: Io>(io: I, peer: SocketAddr, local: SocketAddr, shared: &Arc<Shared>) -> Result<(), ConnError> {
    let served = serve_gateway(io, peer, local, shared).await;
    if let Err(e) = &served {
        ended(Direction::outbound, peer, local, e, shared);
    }
    served
}

async fn serve_gateway<I: Io>(
    io: I,
    peer: SocketAddr,
    local: SocketAddr,
    shared: &Arc<Shared>,
) -> Result<(), ConnError> {
    let Some(gateway) = &shared.gateway else {
        return Err(ConnError::GatewayRefused("this proxy is not a gateway".into()));
    };
    let admitted = crate::gateway::connection(io, peer, gateway, &shared.outbound)
        .await
        .map_err(|refused| ConnError::GatewayRefused(refused.into()))?;
    let protocol = match admitted.protocol {
        Some(crate::transport::header::SessionProtocol::Http1) => Protocol::Http1,
        Some(crate::transport::header::SessionProtocol::Http2) => Protocol::Http2,
        None => Protocol::Opaque,
    };
    let known = Some(Known { protocol, by: DecidedBy::transport_header });
    let tls = admitted.target.tls.clone();
    let conn = Connection {
        direction: Direction::outbound,
        peer,
        addr: local,
        tls,
        target: admitted.target,
        known,
        policy: None,
        egress: None,
        gateway_client: Some(admitted.client),
    };
    dispatch::serve(admitted.io, bytes::Bytes::new(), conn, shared).await
}

/// Serves one captured connection from `peer` whose original destination was `addr`.
pub async fn connection<I: Io>(io: I, peer: SocketAddr, addr: SocketAddr, direction: Direction, shared: Arc<Shared>) {
    let _guard = shared.drain.guard();
    let served = match direction {
        Direction::inbound => inbound(io, peer, addr, &shared).await,
        Direction::outbound => outbound(io, peer, addr, &shared).await,
    };
    if let Err(e) = &served {
        ended(direction, peer, addr, e, &shared);
    }
}

/// A connection that ended in `error`: counted once, here, by its reason.
fn ended(direction: Direction, peer: SocketAddr, addr: SocketAddr, error: &ConnError, shared: &Shared) {
    shared.metrics.conn.conn_error(direction, error);
    tracing::debug!(?direction, %peer, %addr, reason = ?error.reason(), error = %error, "connection ended with an error");
}

async fn inbound<I: Io>(io: I, peer: SocketAddr, addr: SocketAddr, shared: &Arc<Shared>) -> Result<(), ConnError> {
    let accepted = crate::inbound::connection::connection(io, peer, addr, &shared.inbound).await?;
    let crate::inbound::connection::Accepted { io, prefix, tls, target, known, policy } = accepted;
    let conn = Connection {
        direction: Direction::inbound,
        peer,
        addr,
        tls,
        target,
        known,
        policy,
        egress: None,
        gateway_client: None,
    };
    dispatch::serve(io, prefix, conn, shared).await
}

async fn outbound<I: Io>(mut io: I, peer: SocketAddr, addr: SocketAddr, shared: &Arc<Shared>) -> Result<(), ConnError> {
    let target = crate::outbound::resolve(addr, &shared.outbound).await?;
    let known = known_protocol(addr, &target, &shared.config);
    let tls = target.tls.clone();
    // An EgressNetwork's destination is seen by its SNI, and may be refused here.
    let policy = crate::outbound::policy_of(&target).and_then(|p| p.current());
    let (prefix, egress) = crate::outbound::egress::admit(
        &mut io,
        addr,
        policy,
        (&shared.outbound.egress, &shared.outbound.egress_names),
        shared.config.detect_timeout,
    )
    .await
    .map_err(|denied| ConnError::EgressDenied(denied.into()))?;
    let conn = Connection {
        direction: Direction::outbound,
        peer,
        addr,
        tls,
        target,
        known,
        policy: None,
        egress,
        gateway_client: None,
    };
    dispatch::serve(io, prefix, conn, shared).await
}

/// An outbound connection's protocol without detection: a port configured opaque stays opaque
/// (the operator's list guards server-speaks-first protocols the control plane may not know
/// of), else what the target's outbound policy declares; `None` detects.
fn known_protocol(addr: SocketAddr, target: &Target, config: &Config) -> Option<Known> {
    if config.opaque_ports.contains(&addr.port()) {
        return Some(Known { protocol: Protocol::Opaque, by: DecidedBy::configuration });
    }
    let protocol = crate::outbound::policy_of(target)?.current()?.protocol.known()?;
    Some(Known { protocol, by: DecidedBy::policy })
}
