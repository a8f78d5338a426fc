//! The inbound side: connections addressed to this pod. Only the pod's own addresses are
//! served; mTLS to our identity is terminated (or required); the target is the original
//! destination, whose client to the app is cached per port. With policy discovery configured,
//! each port's policy ([`crate::inbound::policy`]) decides the protocol and who may connect.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::Inbound;
use crate::client::target::Route;
use crate::client::targets::Target;
use crate::inbound::policy::enforce::ConnPolicy;
use crate::inbound::policy::model::PortProtocol;
use crate::transport::Io;
use crate::transport::conn_error::ConnError;
use crate::transport::detect::{Known, Protocol};
use crate::transport::labels::{DecidedBy, Direction, TlsLabel};
use crate::transport::maybe_tls::MaybeTls;
use crate::transport::tls;
use cnimesh_common::log_limit::LogLimit;

/// An inbound connection ready to be served: TLS settled, its target, protocol (when known
/// without detection) and policy found.
pub struct Accepted<I> {
    pub io: tls::ClientIo<I>,
    /// Bytes already read from the client.
    pub prefix: Bytes,
    pub tls: TlsLabel,
    pub target: Arc<Target>,
    pub known: Option<Known>,
    pub policy: Option<Arc<ConnPolicy>>,
}

/// Admits one inbound connection from `peer` to `addr`, its original destination; the app
/// serves what it returns, and counts a refusal where it accepted the connection.
pub async fn connection<I: Io>(
    io: I,
    peer: SocketAddr,
    addr: SocketAddr,
    inbound: &Inbound,
) -> Result<Accepted<I>, ConnError> {
    let config = &inbound.config;
    // Checked before anything else: a neighbour that addresses its packets to 127.0.0.1 (its own
    // route via this pod, or a raw frame to our MAC) would otherwise reach the app's
    // loopback-only listeners, which trust that only this pod can connect. So would 0.0.0.0 or
    // `::`, which the app's client below would dial as loopback, and which "an address of this
    // pod" (one a socket can bind) lets through.
    if reaches_loopback(addr.ip()) {
        if let Some(left_out) = LOOPBACK_LOG.allow() {
            tracing::warn!(%peer, %addr, left_out, "refused: inbound connection to a loopback address");
        }
        return Err(ConnError::LoopbackDestination { peer, addr });
    }
    // Inbound capture redirects whatever arrives at the pod: a neighbour on the same L2 segment
    // could address a packet to any IP and have us relay it from this pod's address. Only this
    // pod's own addresses are destinations of inbound traffic.
    if !inbound.local_ips.contains(addr.ip()) {
        return Err(ConnError::NotOurAddress { addr });
    }
    let target = port_target(addr, inbound);
    let port = match &inbound.policies {
        Some(p) => match p.port(addr.port()).await {
            Ok(watch) => Some(watch),
            Err(full) => {
                if let Some(left_out) = WATCH_LIMIT_LOG.allow() {
                    tracing::warn!(%peer, %addr, left_out, "{full}");
                }
                return Err(ConnError::PolicyWatchLimit(full.into()));
            }
        },
        None => None,
    };
    let policy_protocol = port.as_ref().map(|p| p.current().protocol);
    let policy_opaque = policy_protocol == Some(PortProtocol::Opaque);
    // Declared HTTP (a Server's proxyProtocol, a Service's appProtocol): a client
    // silent through the TLS wait is plaintext HTTP, served as such, not cut off by detection.
    let declared_http = matches!(policy_protocol, Some(PortProtocol::Http1 | PortProtocol::Http2));
    let opaque = |by| Some(Known { protocol: Protocol::Opaque, by });
    let known = if config.opaque_ports.contains(&addr.port()) {
        opaque(DecidedBy::configuration)
    } else if policy_opaque {
        opaque(DecidedBy::policy)
    } else {
        None
    };
    let enforce = |tls: &TlsLabel| {
        port.map(|p| {
            let target_addr = inbound.metrics.target_label(Direction::inbound, addr);
            Arc::new(ConnPolicy::new(p, peer.ip(), tls.clone(), target_addr, inbound.authz.clone()))
        })
    };
    match inbound.identity.as_deref() {
        Some(identity) => {
            let declared = known.is_some() || declared_http;
            let wait = if declared { config.opaque_tls_wait } else { config.detect_timeout };
            match tls::inbound(io, identity, wait, config.inbound_require_tls).await? {
                tls::Inbound::Accepted { io, prefix, tls } => {
                    let policy = enforce(&tls);
                    Ok(Accepted { io, prefix, tls, target, known, policy })
                }
                // Silent (or dribbling) for the whole wait: on an opaque port, a server-speaks-first
                // client waiting for its greeting; on a declared HTTP port, a late HTTP client;
                // elsewhere a client that never says anything meaningful, closed rather than
                // handed to the app.
                tls::Inbound::Undecided { io, prefix } if declared => {
                    let tls = TlsLabel::plaintext();
                    let policy = enforce(&tls);
                    let io: tls::ClientIo<I> = MaybeTls::Plain(io);
                    Ok(Accepted { io, prefix, tls, target, known, policy })
                }
                tls::Inbound::Undecided { prefix, .. } => Err(ConnError::TlsUndecided { wait, read: prefix.len() }),
                tls::Inbound::Refused(why) => Err(ConnError::TlsRefused { addr, why }),
            }
        }
        None => {
            let tls = TlsLabel::plaintext();
            let policy = enforce(&tls);
            Ok(Accepted { io: MaybeTls::Plain(io), prefix: Bytes::new(), tls, target, known, policy })
        }
    }
}

static LOOPBACK_LOG: LogLimit = LogLimit::new(Duration::from_secs(10));
static WATCH_LIMIT_LOG: LogLimit = LogLimit::new(Duration::from_secs(10));

/// Whether dialling `ip` reaches this pod's loopback: 127.0.0.0/8 and ::1; the unspecified
/// 0.0.0.0/8 and `::` (Linux connects a socket aimed at 0.0.0.0 or `::` to loopback, and no
/// other address of 0.0.0.0/8 is ever a pod's); and the IPv4-mapped forms of both IPv4 ranges
/// (`::ffff:127.0.0.0/104`, `::ffff:0.0.0.0/104`, what an IPv4 client looks like through an
/// IPv6 socket).
pub fn reaches_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.octets()[0] == 0,
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.is_unspecified() || v6.to_ipv4_mapped().is_some_and(|v4| reaches_loopback(v4.into()))
        }
    }
}

/// The target of one of our ports: the app, in plaintext on the pod's own address.
fn port_target(addr: SocketAddr, inbound: &Inbound) -> Arc<Target> {
    if let Some(target) = inbound.targets.get(&addr) {
        return target;
    }
    let target = Target::new(Route::fixed(addr, None, inbound.config.connect_timeout));
    inbound.targets.insert(addr, target.clone(), None);
    target
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_unspecified_in_every_spelling_reach_loopback() {
        for ip in [
            "127.0.0.1",
            "127.255.0.9",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:127.1.2.3",
            "0.0.0.0",
            "0.1.2.3",
            "::",
            "::ffff:0.0.0.0",
        ] {
            assert!(reaches_loopback(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["10.0.0.1", "::ffff:10.0.0.1", "fe80::1", "::2", "128.0.0.1", "1.0.0.0"] {
            assert!(!reaches_loopback(ip.parse().unwrap()), "{ip}");
        }
    }
}
