//! What every connection of the proxy shares: the serving settings, metrics, resolved targets,
//! identity and discovery. Its own module so the accepting side ([`crate::serve::accept`]) and the
//! per-request side ([`crate::serve::forward`]) both use it without importing each other. Built
//! from the process's configuration by the program ([`crate::app::shared`]).

use std::sync::Arc;

use crate::client::discovery::Discovery;
use crate::http::tap::Taps;
use crate::inbound::Inbound;
use crate::outbound::Outbound;
use crate::serve::drain::Drain;
use crate::serve::metrics::Metrics;
use crate::serve::spans::Tracer;
use crate::transport::identity::Identity;

/// State shared by every connection of the proxy.
pub struct Shared {
    pub config: ServeConfig,
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
    /// Open tap sessions, offered each HTTP request ([`crate::http::tap`]).
    pub taps: Arc<Taps>,
    /// Distributed tracing, when a collector is configured ([`crate::serve::spans`]); set by
    /// [`crate::run`] once the exporter task runs. `None`: requests pay one `Option` check.
    pub tracer: Option<Arc<Tracer>>,
    /// In gateway mode, what its inbound listeners admit with ([`crate::gateway`]).
    pub gateway: Option<crate::gateway::Gateway>,
}

/// The settings of serving a connection, from the process's configuration
/// ([`crate::app::config::Config`] has what each means).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub detect_timeout: std::time::Duration,
    pub header_timeout: std::time::Duration,
    pub idle_timeout: std::time::Duration,
    pub connect_timeout: std::time::Duration,
    /// Outbound ports served opaque without detection.
    pub opaque_ports: Vec<u16>,
    pub outbound_h2_upgrade: bool,
}
