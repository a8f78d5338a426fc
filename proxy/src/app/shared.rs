//! What every connection of the proxy shares: configuration, metrics, resolved targets, identity
//! and discovery. Its own module so the accepting side ([`crate::app::accept`]) and the per-request
//! side ([`crate::app::forward`]) both use it without importing each other.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::app::admission::{Admission, Limits, fd_limit};
use crate::app::config::Config;
use crate::app::drain::Drain;
use crate::app::metrics::Metrics;
use crate::client::discovery::Discovery;
use crate::client::targets::{Outbound, Targets};
use crate::http::tap::Taps;
use crate::inbound::policy::discover::Policies;
use crate::outbound::policy::discover::OutboundPolicies;
use crate::outbound::static_identities::MeshedEndpoints;
use crate::transport::identity::Identity;

/// State shared by every connection of the proxy.
pub struct Shared {
    pub config: Config,
    pub metrics: Arc<Metrics>,
    pub drain: Drain,
    /// Present when the proxy has an identity (and so does mTLS).
    pub identity: Option<Arc<Identity>>,
    /// Meshed endpoints fixed by configuration (`CNIMESH_PROXY_OUTBOUND_IDENTITIES`), for
    /// destinations discovery does not resolve.
    pub static_identities: Arc<MeshedEndpoints>,
    /// Present when a Destination service is configured.
    pub discovery: Option<Arc<Discovery>>,
    /// Present when inbound policy discovery is configured; without it every client is
    /// allowed, as before policies existed.
    pub policies: Option<Arc<Policies>>,
    /// Present when outbound policy discovery is configured; without it connections detect
    /// their protocol unless their port is configured opaque.
    pub outbound_policies: Option<Arc<OutboundPolicies>>,
    pub local_ips: LocalIps,
    /// Inbound targets (this pod's ports), each with its client to the app.
    pub inbound: Targets<SocketAddr>,
    pub outbound: Outbound,
    /// Connection limits, checked at accept ([`crate::app::accept::accept_loop`]).
    pub admission: Admission,
    /// Open tap sessions, offered each HTTP request ([`crate::http::tap`]).
    pub taps: Arc<Taps>,
}

impl Shared {
    /// The shared state of a proxy with `config`: what [`crate::app::run::run`] serves with, and what
    /// in-process tests drive [`crate::app::accept::connection`] with.
    pub fn new(
        config: Config,
        metrics: Arc<Metrics>,
        drain: Drain,
        identity: Option<Arc<Identity>>,
        discovery: Option<Arc<Discovery>>,
    ) -> Self {
        let admission = Admission::new(Limits::resolve(&config, fd_limit()));
        Self {
            admission,
            static_identities: Arc::new(MeshedEndpoints::new(config.outbound_identities.clone())),
            config,
            taps: Arc::new(Taps::new(metrics.tap())),
            metrics,
            drain,
            identity,
            discovery,
            policies: None,
            outbound_policies: None,
            local_ips: LocalIps::default(),
            inbound: Targets::default(),
            outbound: Outbound::default(),
        }
    }
}

/// This pod's own addresses, learnt on first use: an address is local when a socket can bind to
/// it (the kernel's own answer, covering every interface and family).
#[derive(Debug, Default)]
pub struct LocalIps(std::sync::Mutex<std::collections::HashSet<std::net::IpAddr>>);

impl LocalIps {
    /// Records `ip` as this pod's without asking the kernel: for in-process tests, whose "pod"
    /// address routes to an app on loopback (loopback itself is never an inbound destination).
    pub fn declare(&self, ip: std::net::IpAddr) {
        self.0.lock().expect("not poisoned").insert(ip);
    }

    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        if self.0.lock().expect("not poisoned").contains(&ip) {
            return true;
        }
        let local = std::net::UdpSocket::bind((ip, 0)).is_ok();
        let mut known = self.0.lock().expect("not poisoned");
        // A pod has a handful of addresses; the bound keeps a confused caller from growing it.
        if local && known.len() < 64 {
            known.insert(ip);
        }
        local
    }
}
