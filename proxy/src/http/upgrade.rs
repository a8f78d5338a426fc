//! Splicing an upgraded HTTP/1 connection (WebSocket, CONNECT) to its upstream counterpart.

use std::net::SocketAddr;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// Copy buffers of a tunnel: small, as most tunnels carry small messages.
const TUNNEL_BUF: usize = 4 * 1024;

/// Waits for both sides' upgrades, then copies both ways until both end or `revoked` resolves
/// (the client's authorization withdrawn: both sides are closed); `held` (drain guard,
/// open-connection gauge, endpoint load) lives as long as the tunnel.
pub async fn splice<H>(
    server_side: OnUpgrade,
    client_side: OnUpgrade,
    target: SocketAddr,
    held: H,
    revoked: impl std::future::Future<Output = ()>,
) {
    match tokio::try_join!(server_side, client_side) {
        Ok((a, b)) => {
            let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
            tokio::select! {
                copied = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, TUNNEL_BUF, TUNNEL_BUF) => {
                    if let Err(e) = copied {
                        tracing::debug!(%target, error = %e, "upgraded connection ended");
                    }
                }
                () = revoked => tracing::info!(%target, "tunnel closed: its authorization was revoked"),
            }
        }
        Err(e) => tracing::warn!(%target, error = %e, "upgrade failed"),
    }
    drop(held);
}
