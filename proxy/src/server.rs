//! Accepting captured connections: each gets its original destination and goes to the inbound
//! or outbound side, counted for graceful draining. [`connection`] takes any IO with its
//! addresses, so everything after the socket is exercised in-process by tests.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};

use crate::config::Config;
use crate::metrics::{DecidedBy, Direction};
use crate::outbound::targets::Target;
use crate::serve::{self, Connection, Known};
use crate::shared::Shared;
use crate::transport::Io;
use crate::transport::detect::Protocol;
use crate::transport::orig_dst::original_dst;

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
                    tokio::spawn(async move { accepted_socket(stream, peer, direction, shared).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, ?direction, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}

async fn accepted_socket(stream: TcpStream, peer: SocketAddr, direction: Direction, shared: Arc<Shared>) {
    let Some(addr) = original_dst(&stream) else {
        // A connection straight to the proxy port: forwarding it would loop back to us.
        let local = stream.local_addr().ok();
        tracing::warn!(?direction, %peer, local = ?local, "connection was not redirected by capture; closing it");
        return;
    };
    let _ = stream.set_nodelay(true);
    connection(stream, peer, addr, direction, shared).await;
}

/// Serves one captured connection from `peer` whose original destination was `addr`.
pub async fn connection<I: Io>(io: I, peer: SocketAddr, addr: SocketAddr, direction: Direction, shared: Arc<Shared>) {
    let _guard = shared.drain.guard();
    let served = match direction {
        Direction::inbound => crate::inbound::connection(io, peer, addr, &shared).await,
        Direction::outbound => outbound(io, addr, &shared).await,
    };
    if let Err(e) = served {
        tracing::debug!(?direction, %peer, %addr, error = %e, "connection ended with an error");
    }
}

async fn outbound<I: Io>(io: I, addr: SocketAddr, shared: &Arc<Shared>) -> anyhow::Result<()> {
    let target = crate::outbound::resolve(addr, shared)
        .await
        .inspect_err(|_| shared.metrics.tcp_refused(Direction::outbound, addr))?;
    let known = known_protocol(addr, &target, &shared.config);
    let conn =
        Connection { direction: Direction::outbound, addr, tls: target.tls.clone(), target, known, policy: None };
    serve::serve(io, Bytes::new(), conn, shared).await
}

/// An outbound connection's protocol without detection: a port configured opaque stays opaque
/// (the operator's list guards server-speaks-first protocols the control plane may not know
/// of), else what the target's outbound policy declares; `None` detects.
fn known_protocol(addr: SocketAddr, target: &Target, config: &Config) -> Option<Known> {
    if config.opaque_ports.contains(&addr.port()) {
        return Some(Known { protocol: Protocol::Opaque, by: DecidedBy::configuration });
    }
    let protocol = target.policy.as_ref()?.current()?.protocol.known()?;
    Some(Known { protocol, by: DecidedBy::policy })
}
