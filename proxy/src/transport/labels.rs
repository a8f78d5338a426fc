//! Metric labels of connections, as Linkerd names them: direction, TLS and peer identity,
//! target address, why a connection was not served, and what decided its protocol. The families
//! that use them are registered by the serving layer ([`crate::serve::metrics`]); the labels live here, with
//! the connections they describe, so every layer above can label what it counts.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::conn_error::{ConnError, Reason};
pub use super::detect::DecidedBy;
use super::detect::DetectError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
pub enum Direction {
    #[allow(non_camel_case_types)]
    inbound,
    #[allow(non_camel_case_types)]
    outbound,
}

/// How a connection was secured: `tls="true"` with `client_id` (inbound) or `server_id`
/// (outbound) when the peer's identity is known, as Linkerd labels them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct TlsLabel {
    pub tls: bool,
    pub client_id: Option<String>,
    pub server_id: Option<String>,
}

impl TlsLabel {
    pub fn plaintext() -> Self {
        Self::default()
    }
}

impl EncodeLabelSet for TlsLabel {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut labels = vec![("tls", if self.tls { "true" } else { "false" })];
        if let Some(id) = &self.client_id {
            labels.push(("client_id", id));
        }
        if let Some(id) = &self.server_id {
            labels.push(("server_id", id));
        }
        labels.encode(encoder)
    }
}

/// `dst_kind`, what an outbound destination is. Only egress (an EgressNetwork's
/// destination, seen by hostname in `outbound_egress_*`) is labelled, `dst_kind="egress"`; the
/// mesh's own traffic keeps its label set, so existing queries and dashboards are unchanged.
/// `cnimesh edges` uses it to leave out the plain IP row of traffic it shows by hostname.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DstKind {
    #[default]
    Mesh,
    Egress,
}

impl DstKind {
    pub fn egress(egress: bool) -> Self {
        if egress { Self::Egress } else { Self::Mesh }
    }
}

impl EncodeLabelSet for DstKind {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        match self {
            DstKind::Mesh => Ok(()),
            DstKind::Egress => [("dst_kind", "egress")].encode(encoder),
        }
    }
}

/// `target_cluster_name`, the linked cluster an outbound destination is in (a mirror
/// Service's endpoints, as Destination labels them). Like `dst_kind`, only that traffic carries
/// it: the cluster's own series keep their label set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct TargetCluster(pub Option<std::sync::Arc<str>>);

impl EncodeLabelSet for TargetCluster {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        match &self.0 {
            None => Ok(()),
            Some(cluster) => [(cnimesh_common::names::TARGET_CLUSTER_METRIC_LABEL, &**cluster)].encode(encoder),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TcpLabels {
    pub direction: Direction,
    pub target_addr: String,
    #[prometheus(flatten)]
    pub dst_kind: DstKind,
    #[prometheus(flatten)]
    pub target_cluster: TargetCluster,
    #[prometheus(flatten)]
    pub tls: TlsLabel,
}

/// Why a connection was closed before it was served, as the `error` label of
/// `{inbound,outbound}_tcp_accept_errors_total` (linkerd2-proxy's family; `tls_detect_timeout` is
/// its value too, the others are ours).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum AcceptError {
    /// Shed: the direction's connection limit was reached.
    connection_limit,
    /// Shed: the client's address already holds its per-source share.
    source_limit,
    /// No ClientHello (nor anything else) within the detect timeout.
    tls_detect_timeout,
    /// No decisive bytes (HTTP/1 request line, HTTP/2 preface, anything opaque) in time.
    detect_timeout,
    /// The listener's accept() itself failed (out of descriptors, out of memory).
    accept,
    /// Inbound to an address that leads to loopback (127.0.0.0/8, ::1, the unspecified 0.0.0.0/8
    /// and ::, their IPv4-mapped forms): a neighbour addressing a pod's loopback-only services;
    /// never served.
    loopback_destination,
    /// Inbound to a port without a policy watch while every watch is held by an open
    /// connection: refused rather than given a wider default.
    policy_watch_limit,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AcceptErrorLabels {
    pub error: AcceptError,
}

/// `tcp_connection_errors_total`: connections that ended in a [`ConnError`], by its reason.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ConnErrorLabels {
    pub direction: Direction,
    pub reason: Reason,
}

/// `connection_protocol_total`: how connections were served and why.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ProtocolLabels {
    pub direction: Direction,
    pub protocol: &'static str,
    pub decided_by: DecidedBy,
}

impl ProtocolLabels {
    pub fn new(direction: Direction, protocol: super::detect::Protocol, decided_by: DecidedBy) -> Self {
        use super::detect::Protocol;
        let protocol = match protocol {
            Protocol::Http1 => "http1",
            Protocol::Http2 => "http2",
            Protocol::Opaque => "opaque",
        };
        Self { direction, protocol, decided_by }
    }
}

/// Distinct `target_addr` values kept per direction (outbound destinations are unbounded).
const MAX_TARGETS: usize = 1024;

/// A label whose distinct values are capped; later values read `other`.
#[derive(Default)]
pub struct Bounded {
    seen: Mutex<HashSet<String>>,
}

impl Bounded {
    pub fn label(&self, value: &str, cap: usize) -> String {
        let mut seen = self.seen.lock();
        if seen.contains(value) {
            return value.to_string();
        }
        if seen.len() >= cap {
            return "other".into();
        }
        seen.insert(value.to_string());
        value.to_string()
    }
}

/// Connections the proxy did not serve, and the bounded `target_addr` label: handles into the
/// app's registry, shared by the accept loop and both sides.
#[derive(Clone)]
pub struct ConnMetrics {
    pub tcp_refused_total: Family<TcpLabels, Counter>,
    /// `inbound_tcp_accept_errors_total` and `outbound_tcp_accept_errors_total`, by direction.
    pub tcp_accept_errors_total: [Family<AcceptErrorLabels, Counter>; 2],
    pub tcp_connection_errors_total: Family<ConnErrorLabels, Counter>,
    targets: Arc<[Bounded; 2]>,
}

impl ConnMetrics {
    pub fn new(
        tcp_refused_total: Family<TcpLabels, Counter>,
        tcp_accept_errors_total: [Family<AcceptErrorLabels, Counter>; 2],
    ) -> Self {
        Self {
            tcp_refused_total,
            tcp_accept_errors_total,
            tcp_connection_errors_total: Family::default(),
            targets: Arc::default(),
        }
    }

    /// The label value for a target address, bounded in number of distinct values.
    pub fn target_label(&self, direction: Direction, target: std::net::SocketAddr) -> String {
        self.targets[direction as usize].label(&target.to_string(), MAX_TARGETS)
    }

    /// A connection that ended in `error`: counted by its reason, and in the family that has
    /// long named it (`tcp_refused_total` for a refusal of the destination or its TLS,
    /// `*_tcp_accept_errors_total` for one closed before it was served).
    pub fn conn_error(&self, direction: Direction, error: &ConnError) {
        let labels = ConnErrorLabels { direction, reason: error.reason() };
        self.tcp_connection_errors_total.get_or_create(&labels).inc();
        match error {
            ConnError::LoopbackDestination { .. } => self.accept_error(direction, AcceptError::loopback_destination),
            ConnError::PolicyWatchLimit(_) => self.accept_error(direction, AcceptError::policy_watch_limit),
            ConnError::TlsUndecided { .. } => self.accept_error(direction, AcceptError::tls_detect_timeout),
            ConnError::Detect(DetectError::TimedOut { .. }) => {
                self.accept_error(direction, AcceptError::detect_timeout)
            }
            ConnError::NotOurAddress { addr }
            | ConnError::TlsRefused { addr, .. }
            | ConnError::NoTarget { addr, .. } => self.tcp_refused(direction, *addr),
            _ => {}
        }
    }

    /// A connection refused by policy (inbound plaintext where mTLS is required, outbound to a
    /// meshed endpoint before we hold a certificate).
    pub fn tcp_refused(&self, direction: Direction, target: std::net::SocketAddr) {
        let labels = TcpLabels {
            direction,
            target_addr: self.target_label(direction, target),
            dst_kind: DstKind::Mesh,
            target_cluster: TargetCluster::default(),
            tls: TlsLabel::plaintext(),
        };
        self.tcp_refused_total.get_or_create(&labels).inc();
    }

    /// A connection closed before it was served.
    pub fn accept_error(&self, direction: Direction, error: AcceptError) {
        self.tcp_accept_errors_total[direction as usize].get_or_create(&AcceptErrorLabels { error }).inc();
    }
}
