//! The gateway's own families: refusals by reason, admitted connections by client and
//! target. Registered by the app with the others.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::transport::header::SessionProtocol;
use crate::transport::labels::TlsLabel;

/// Why the gateway refused a connection (`gateway_refused_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Refusal {
    /// Not mTLS to the gateway's identity (plaintext, another SNI, nothing in time).
    not_mtls,
    /// The TLS handshake failed: no client certificate, one from another anchor or from an
    /// issuer that may not issue its trust domain, bad TLS.
    tls_handshake,
    /// The client is a workload of the gateway's own trust domain: it reaches its own cluster's
    /// Services directly, under their policy, never through the gateway (whose hop would hide
    /// who it is).
    own_trust_domain,
    /// The connection did not start with a transport header.
    no_transport_header,
    /// A transport header that does not decode (too long, not the message, no port or name).
    bad_transport_header,
    /// The header names an address, not a Service.
    address_target,
    /// The header names something other than a Service of this cluster's domain.
    foreign_name,
    /// A Service name this cluster's Destination does not know, or a Service not exported
    /// through the gateway (not labelled `mirror.cnimesh.io/exported=true`): Destination
    /// answers the gateway alike for both ([`crate::client::discovery::Discovery::for_gateway`]).
    unknown_service,
    /// An opaque session (its client did not speak HTTP) to a Service port whose endpoints are
    /// not declared opaque: their proxies may read the bytes as HTTP, with headers (such as the
    /// forwarded client identity) the gateway never checked or set.
    opaque_to_non_opaque_port,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefusedLabels {
    pub reason: Refusal,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ConnectionLabels {
    /// The calling proxy's identity.
    pub client_id: String,
    /// `name:port` the header named.
    pub target: String,
    /// `http1`, `http2` or `opaque`.
    pub session: &'static str,
}

/// Distinct (client, target) series kept; beyond, one `other` series (a client cannot grow the
/// registry without bound by naming many Services: unknown ones are refused before this).
const MAX_SERIES: usize = 1024;

#[derive(Debug, Default)]
pub struct GatewayMetrics {
    pub refused_total: Family<RefusedLabels, Counter>,
    pub connections_total: Family<ConnectionLabels, Counter>,
    series: parking_lot::Mutex<usize>,
}

impl GatewayMetrics {
    pub fn refused(&self, reason: Refusal) {
        self.refused_total.get_or_create(&RefusedLabels { reason }).inc();
    }

    pub fn admitted(&self, tls: &TlsLabel, authority: &str, protocol: Option<SessionProtocol>) {
        let session = match protocol {
            Some(SessionProtocol::Http1) => "http1",
            Some(SessionProtocol::Http2) => "http2",
            None => "opaque",
        };
        let mut labels = ConnectionLabels {
            client_id: tls.client_id.clone().unwrap_or_default(),
            target: authority.to_string(),
            session,
        };
        let mut series = self.series.lock();
        if *series >= MAX_SERIES && self.connections_total.get(&labels).is_none() {
            labels = ConnectionLabels { client_id: "other".into(), target: "other".into(), session };
        } else if self.connections_total.get(&labels).is_none() {
            *series += 1;
        }
        drop(series);
        self.connections_total.get_or_create(&labels).inc();
    }
}
