//! The listeners: accepting sockets until draining starts, shedding connections over the limits
//! ([`crate::app::admission`]), and handing each captured one, with its original destination, to
//! the serving layer ([`crate::serve::accept`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use crate::app::admission::{Admission, Permit};
use crate::serve::accept;
use crate::serve::metrics::{AcceptError, Direction};
use crate::serve::shared::Shared;
use crate::transport::orig_dst::original_dst;
use cnimesh_common::log_limit::LogLimit;

/// Listeners bound by the process that started the proxy and handed down systemd-style
/// (`LISTEN_FDS` descriptors from fd 3, or `LISTEN_FDS_FIRST_FD`): `cnimesh-node host` holds the
/// proxy's ports for its whole life, so no local user can bind them while the proxy restarts.
/// Each must be a listening TCP socket; each is used for the configured address it is bound to.
pub struct Inherited(Vec<std::net::TcpListener>);

#[derive(Debug, thiserror::Error)]
pub enum InheritedError {
    #[error("inherited fd {index} (LISTEN_FDS): {source}")]
    Invalid { index: usize, source: std::io::Error },
    #[error("inherited fd {index} (LISTEN_FDS) is not a listening socket")]
    NotListening { index: usize },
    #[error("inherited listener {addr} is not one of the configured inbound or outbound addresses")]
    Unused { addr: String },
}

impl Inherited {
    /// Takes the inherited listeners and removes `LISTEN_*` from the environment (so no child
    /// inherits them); none when `LISTEN_FDS` is unset. Call before other threads read the
    /// environment.
    pub fn from_env() -> Result<Self, InheritedError> {
        let mut fds = listenfd::ListenFd::from_env();
        let mut listeners = Vec::new();
        for index in 0..fds.len() {
            let invalid = |source| InheritedError::Invalid { index, source };
            let listener = fds
                .take_tcp_listener(index)
                .map_err(invalid)?
                .ok_or_else(|| invalid(std::io::Error::other("already taken")))?;
            let listening = nix::sys::socket::getsockopt(&listener, nix::sys::socket::sockopt::AcceptConn)
                .map_err(|e| invalid(e.into()))?;
            if !listening {
                return Err(InheritedError::NotListening { index });
            }
            listener.set_nonblocking(true).map_err(invalid)?;
            listeners.push(listener);
        }
        Ok(Self(listeners))
    }

    /// The inherited listener bound to exactly `addr`, if there is one.
    pub fn take(&mut self, addr: SocketAddr) -> std::io::Result<Option<TcpListener>> {
        let Some(i) = self.0.iter().position(|l| l.local_addr().is_ok_and(|a| a == addr)) else { return Ok(None) };
        TcpListener::from_std(self.0.remove(i)).map(Some)
    }

    /// Refuses leftovers: a listener nobody serves would take connections and never answer.
    pub fn finish(self) -> Result<(), InheritedError> {
        match self.0.first() {
            None => Ok(()),
            Some(l) => {
                Err(InheritedError::Unused { addr: l.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string()) })
            }
        }
    }
}

/// At most one log line per this period about shed connections or failing accepts, per listener.
const LOG_PERIOD: Duration = Duration::from_secs(10);
/// After accept() failed for want of descriptors or memory: wait this long before the next try
/// rather than spin on a listener whose backlog keeps it readable.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accepts until draining starts. Connections beyond a limit ([`crate::app::admission`]) are reset
/// at once: the client learns at once, and a slot is not held by a connection that will not be
/// served. A failing accept() never ends the loop.
pub async fn accept_loop(listener: TcpListener, direction: Direction, shared: Arc<Shared>, admission: Arc<Admission>) {
    let stop = shared.drain.signalled();
    tokio::pin!(stop);
    let (shed_log, error_log) = (LogLimit::new(LOG_PERIOD), LogLimit::new(LOG_PERIOD));
    loop {
        tokio::select! {
            () = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match admission.admit(direction, peer.ip()) {
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
                            let limits = admission.limits;
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
    accept::connection(stream, peer, addr, direction, shared).await;
}

/// A multicluster gateway's connection: not captured (it came to the gateway's own
/// address), admitted by [`crate::gateway`] and served ([`accept::gateway`]) as outbound traffic to its target.
async fn gateway_socket(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>, _permit: Permit) {
    let _ = stream.set_nodelay(true);
    let Ok(local) = stream.local_addr() else { return };
    let _guard = shared.drain.guard();
    let _ = accept::gateway(stream, peer, local, &shared).await;
}
