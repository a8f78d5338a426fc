//! Why a connection was closed before or while it was served: one typed error for the whole
//! connection path (accept, the inbound side's admission, the outbound side's target, protocol
//! detection, opaque forwarding, the HTTP server). Code decides on the variant, never on the
//! text; each variant has its `reason` label, and is counted once, where the connection was
//! accepted ([`ConnMetrics::conn_error`](super::labels::ConnMetrics::conn_error)).

use std::net::SocketAddr;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelValue;

use super::detect::DetectError;

/// An error of a layer above the transport's, kept for its message (the variant says what).
pub type Source = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Inbound to an address that leads to loopback: a neighbour addressing the pod's
    /// loopback-only services.
    #[error("refused: inbound connection from {peer} to the loopback address {addr}")]
    LoopbackDestination { peer: SocketAddr, addr: SocketAddr },
    /// Inbound to an address that is not this pod's: a neighbour using the pod as a relay.
    #[error("refused: inbound connection to {addr}, which is not an address of this pod")]
    NotOurAddress { addr: SocketAddr },
    /// Inbound to a port without a policy watch while every watch is in use.
    #[error("refused: {0}")]
    PolicyWatchLimit(#[source] Source),
    /// Inbound with mTLS: neither a ClientHello nor anything else decisive within the wait.
    #[error("closed: nothing decisive from the client within {wait:?} ({read} bytes)")]
    TlsUndecided { wait: Duration, read: usize },
    /// Inbound: not mTLS to this proxy's identity where it is required.
    #[error("refused: {why}")]
    TlsRefused { addr: SocketAddr, why: &'static str },
    /// Outbound: no target for the destination (a meshed endpoint before we hold a
    /// certificate).
    #[error("{why}")]
    NoTarget { addr: SocketAddr, why: &'static str },
    /// Outbound to an EgressNetwork's destination its policy refuses.
    #[error("refused: {0}")]
    EgressDenied(#[source] Source),
    /// A multicluster gateway's refusal (counted by reason in `gateway_refused_total` too).
    #[error("refused: {0}")]
    GatewayRefused(#[source] Source),
    /// No protocol: detection timed out or failed to read.
    #[error(transparent)]
    Detect(#[from] DetectError),
    /// An opaque connection the port's policy does not authorize.
    #[error("refused: connection to {addr} not authorized by policy")]
    PolicyDenied { addr: SocketAddr },
    /// An opaque connection a policy update no longer authorizes.
    #[error("closed: connection to {addr} no longer authorized by policy")]
    Revoked { addr: SocketAddr },
    /// An opaque connection's target has no endpoint to send it to.
    #[error("no endpoint: {0}")]
    NoEndpoint(#[source] Source),
    /// An opaque connection's endpoint could not be connected to.
    #[error("connecting upstream: {0}")]
    Connect(#[source] std::io::Error),
    /// Reading or writing a connection (a TLS handshake, opaque bytes).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The HTTP server ended with an error.
    #[error("HTTP: {0}")]
    Http(#[source] Source),
}

/// `reason`, the label of `tcp_connection_errors_total`: a [`ConnError`]'s variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Reason {
    loopback_destination,
    not_our_address,
    policy_watch_limit,
    tls_undecided,
    tls_refused,
    no_target,
    egress_denied,
    gateway_refused,
    detect_timeout,
    detect_io,
    policy_denied,
    revoked,
    no_endpoint,
    connect,
    io,
    http,
}

impl ConnError {
    pub fn reason(&self) -> Reason {
        match self {
            ConnError::LoopbackDestination { .. } => Reason::loopback_destination,
            ConnError::NotOurAddress { .. } => Reason::not_our_address,
            ConnError::PolicyWatchLimit(_) => Reason::policy_watch_limit,
            ConnError::TlsUndecided { .. } => Reason::tls_undecided,
            ConnError::TlsRefused { .. } => Reason::tls_refused,
            ConnError::NoTarget { .. } => Reason::no_target,
            ConnError::EgressDenied(_) => Reason::egress_denied,
            ConnError::GatewayRefused(_) => Reason::gateway_refused,
            ConnError::Detect(DetectError::TimedOut { .. }) => Reason::detect_timeout,
            ConnError::Detect(DetectError::Io(_)) => Reason::detect_io,
            ConnError::PolicyDenied { .. } => Reason::policy_denied,
            ConnError::Revoked { .. } => Reason::revoked,
            ConnError::NoEndpoint(_) => Reason::no_endpoint,
            ConnError::Connect(_) => Reason::connect,
            ConnError::Io(_) => Reason::io,
            ConnError::Http(_) => Reason::http,
        }
    }
}
