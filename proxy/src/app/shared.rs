//! What every connection of the proxy shares: configuration, metrics, resolved targets, identity
//! and discovery. Its own module so the accepting side ([`crate::app::accept`]) and the per-request
//! side ([`crate::app::forward`]) both use it without importing each other.

use std::sync::Arc;

use crate::app::admission::{Admission, Limits, fd_limit};
use crate::app::config::Config;
use crate::app::drain::Drain;
use crate::app::metrics::Metrics;
use crate::app::spans::Tracer;
use crate::client::discovery::Discovery;
use crate::http::tap::Taps;
use crate::inbound::{Inbound, InboundConfig};
use crate::outbound::Outbound;
use crate::outbound::static_identities::MeshedEndpoints;
use crate::transport::identity::Identity;

/// State shared by every connection of the proxy.
pub struct Shared {
    pub config: Config,
    pub metrics: Arc<Metrics>,
    pub drain: Drain,
    /// Present when the proxy has an identity (and so does mTLS).
    pub identity: Option<Arc<Identity>>,
    /// Present when a Destination service is configured.
    pub discovery: Option<Arc<Discovery>>,
    /// The inbound side's state: its policies, this pod's addresses and ports.
    pub inbound: Inbound,
    /// The outbound side's state: resolved targets, outbound policies.
    pub outbound: Outbound,
    /// Connection limits, checked at accept ([`crate::app::accept::accept_loop`]).
    pub admission: Admission,
    /// Open tap sessions, offered each HTTP request ([`crate::http::tap`]).
    pub taps: Arc<Taps>,
    /// Distributed tracing, when a collector is configured ([`crate::app::spans`]); set by
    /// [`crate::run`] once the exporter task runs. `None`: requests pay one `Option` check.
    pub tracer: Option<Arc<Tracer>>,
    /// In gateway mode, what its inbound listeners admit with ([`crate::gateway`]).
    pub gateway: Option<crate::gateway::Gateway>,
}

impl Shared {
    /// The shared state of a proxy with `config`: what [`crate::run`] serves with, and what
    /// in-process tests drive [`crate::app::accept::connection`] with. Policy discovery, when
    /// configured, is set afterwards (`inbound.policies`, `outbound.policies`).
    pub fn new(
        config: Config,
        metrics: Arc<Metrics>,
        drain: Drain,
        identity: Option<Arc<Identity>>,
        discovery: Option<Arc<Discovery>>,
    ) -> Self {
        let admission = Admission::new(Limits::resolve(&config, fd_limit()));
        let inbound = Inbound {
            config: InboundConfig {
                detect_timeout: config.detect_timeout,
                opaque_ports: config.opaque_ports.clone(),
                opaque_tls_wait: config.opaque_tls_wait,
                inbound_require_tls: config.inbound_require_tls,
                connect_timeout: config.connect_timeout,
            },
            identity: identity.clone(),
            policies: None,
            local_ips: Default::default(),
            targets: Default::default(),
            metrics: metrics.conn.clone(),
            authz: Arc::new(metrics.authz.clone()),
        };
        let outbound = Outbound {
            connect_timeout: config.connect_timeout,
            identity: identity.clone(),
            discovery: discovery.clone(),
            static_identities: MeshedEndpoints::new(config.outbound_identities.clone()),
            policies: None,
            by_addr: Default::default(),
            by_service: Default::default(),
            routes: metrics.routes.clone(),
            egress: metrics.egress.clone(),
            egress_names: Arc::default(),
        };
        let gateway = match (&config.mode, &identity) {
            (crate::app::config::Mode::Gateway { cluster_domain }, Some(identity)) => Some(crate::gateway::Gateway {
                identity: identity.clone(),
                cluster_domain: cluster_domain.clone(),
                wait: config.opaque_tls_wait.max(config.detect_timeout),
                metrics: metrics.gateway.clone(),
            }),
            _ => None,
        };
        Self {
            gateway,
            admission,
            config,
            taps: Arc::new(Taps::new(metrics.tap())),
            metrics,
            drain,
            identity,
            discovery,
            inbound,
            outbound,
            tracer: None,
        }
    }
}
