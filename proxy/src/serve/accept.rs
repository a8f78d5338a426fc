//! Serving an accepted connection: a captured one, with its original destination, goes to the
//! inbound or outbound side ([`connection`]), a gateway's to the gateway's admission
//! ([`gateway`]); each is counted for graceful draining, and its error counted once, here. Both
//! take any IO with its addresses, so everything after the socket ([`crate::app::listen`]) is
//! exercised in-process by tests.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::client::targets::Target;
use crate::serve::dispatch::{self, Connection, Known};
use crate::serve::metrics::{DecidedBy, Direction};
use crate::serve::shared::{ServeConfig, Shared};
use crate::transport::Io;
use crate::transport::conn_error::ConnError;
use crate::transport::detect::Protocol;

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
fn known_protocol(addr: SocketAddr, target: &Target, config: &ServeConfig) -> Option<Known> {
    if config.opaque_ports.contains(&addr.port()) {
        return Some(Known { protocol: Protocol::Opaque, by: DecidedBy::configuration });
    }
    let protocol = crate::outbound::policy_of(target)?.current()?.protocol.known()?;
    Some(Known { protocol, by: DecidedBy::policy })
}
