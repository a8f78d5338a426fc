//! The inbound side: connections addressed to this pod. [`connection`] admits them (only this
//! pod's own, non-loopback addresses), terminates mTLS and finds each port's target and
//! policy; [`policy`] is the inbound authorization policy those ports are served under, and
//! [`http`] decides each HTTP request under it.

pub mod connection;
pub mod http;
pub mod policy;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::client::targets::Targets;
use crate::transport::identity::Identity;
use crate::transport::labels::ConnMetrics;
use policy::discover::Policies;
use policy::metrics::AuthzMetrics;

/// What the inbound side keeps for every connection.
pub struct Inbound {
    pub config: InboundConfig,
    /// Present when the proxy has an identity (and so does mTLS).
    pub identity: Option<Arc<Identity>>,
    /// Present when inbound policy discovery is configured; without it every client is
    /// allowed, as before policies existed.
    pub policies: Option<Arc<Policies>>,
    pub local_ips: LocalIps,
    /// This pod's ports, each with its client to the app.
    pub targets: Targets<SocketAddr>,
    pub metrics: ConnMetrics,
    pub authz: Arc<AuthzMetrics>,
}

/// The configuration the inbound side reads (the app's `Config` has the same fields).
#[derive(Debug, Clone)]
pub struct InboundConfig {
    pub detect_timeout: Duration,
    /// Ports whose traffic is forwarded as opaque TCP without detection (server-speaks-first).
    pub opaque_ports: Vec<u16>,
    pub opaque_tls_wait: Duration,
    pub inbound_require_tls: bool,
    pub connect_timeout: Duration,
}

/// This pod's own addresses, learnt on first use: an address is local when a socket can bind to
/// it (the kernel's own answer, covering every interface and family).
#[derive(Debug, Default)]
pub struct LocalIps(parking_lot::Mutex<std::collections::HashSet<std::net::IpAddr>>);

impl LocalIps {
    /// Records `ip` as this pod's without asking the kernel: for in-process tests, whose "pod"
    /// address routes to an app on loopback (loopback itself is never an inbound destination).
    pub fn declare(&self, ip: std::net::IpAddr) {
        self.0.lock().insert(ip);
    }

    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        if self.0.lock().contains(&ip) {
            return true;
        }
        let local = std::net::UdpSocket::bind((ip, 0)).is_ok();
        let mut known = self.0.lock();
        // A pod has a handful of addresses; the bound keeps a confused caller from growing it.
        if local && known.len() < 64 {
            known.insert(ip);
        }
        local
    }
}
