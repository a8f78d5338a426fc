//! Wiring the state every connection shares ([`Shared`]) from the process's configuration: the
//! inbound and outbound sides' settings, the gateway's admission, the tap registry.

use std::sync::Arc;

use crate::app::config::{Config, Mode};
use crate::client::discovery::Discovery;
use crate::http::tap::Taps;
use crate::inbound::{Inbound, InboundConfig};
use crate::outbound::Outbound;
use crate::outbound::static_identities::MeshedEndpoints;
use crate::serve::drain::Drain;
use crate::serve::metrics::Metrics;
use crate::serve::shared::{ServeConfig, Shared};
use crate::transport::identity::Identity;

impl Shared {
    /// The shared state of a proxy with `config`: what [`crate::run`] serves with, and what
    /// in-process tests drive [`crate::serve::accept::connection`] with. Policy discovery, when
    /// configured, is set afterwards (`inbound.policies`, `outbound.policies`).
    pub fn new(
        config: Config,
        metrics: Arc<Metrics>,
        drain: Drain,
        identity: Option<Arc<Identity>>,
        discovery: Option<Arc<Discovery>>,
    ) -> Self {
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
            ingress: match &config.mode {
                Mode::Ingress { cluster_domain, namespaces } => Some(crate::outbound::ingress::Ingress {
                    cluster_domain: cluster_domain.clone(),
                    namespaces: namespaces.clone(),
                }),
                _ => None,
            },
        };
        let gateway = match (&config.mode, &identity) {
            (Mode::Gateway { cluster_domain }, Some(identity)) => Some(crate::gateway::Gateway {
                identity: identity.clone(),
                cluster_domain: cluster_domain.clone(),
                wait: config.opaque_tls_wait.max(config.detect_timeout),
                metrics: metrics.gateway.clone(),
            }),
            _ => None,
        };
        Self {
            gateway,
            config: ServeConfig {
                detect_timeout: config.detect_timeout,
                header_timeout: config.header_timeout,
                idle_timeout: config.idle_timeout,
                connect_timeout: config.connect_timeout,
                opaque_ports: config.opaque_ports,
                outbound_h2_upgrade: config.outbound_h2_upgrade,
            },
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
