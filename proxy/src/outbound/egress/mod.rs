//! Egress (proxy side): connections to an address the control plane answered with an
//! EgressNetwork's policy (the policy's parent is `kind: EgressNetwork`), seen by hostname and
//! allowed or refused as its routes say.
//!
//! - The hostname: for the application's own TLS, the SNI of its ClientHello, peeked without
//!   consuming it (the proxy never terminates that TLS; the same bytes go upstream); for HTTP,
//!   each request's Host/authority ([`crate::outbound::http::routed`]); for anything else, the
//!   IP address.
//! - Refusals: a TLS connection whose SNI the policy's TLS routes refuse (the `Forbidden` filter
//!   of the fallback route under `trafficPolicy: Deny`), or any non-HTTP connection when the
//!   opaque route is forbidden, is closed once its ClientHello (or its first bytes) is read; an
//!   HTTP request is answered 403 with `cnimesh-proxy-error: egress denied by EgressNetwork
//!   <ns>/<name>` ([`crate::http::error::ProxyError::EgressDenied`]).
//! - Names bound to addresses ([`names`]): a hostname is believed only when the connection's
//!   original destination is among the addresses the proxy resolved for it through the pod's
//!   resolver; otherwise the connection (or request) is the IP's, which the policy decides on
//!   and the metrics and tap count, never the name. A request whose authority and Host header
//!   name different hosts is refused. (The proxy never terminates the application's TLS, so a
//!   connection shows either an SNI or HTTP Hosts, never both.)
//! - Metrics ([`EgressMetrics`]): `outbound_egress_connections_total`,
//!   `outbound_egress_requests_total` and `outbound_egress_denied_total`, labelled
//!   `dst_kind="egress"`, `egress_network="<ns>/<name>"`, `dst_hostname` and (connections,
//!   refusals) `protocol`. Hostnames are chosen by applications and the outside world, not by the
//!   mesh: the distinct values per proxy are capped ([`MAX_HOSTNAMES`]) and later ones read
//!   `other`, so a client that walks many names cannot grow the proxy's memory or its scrape.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::outbound::policy::model::OutboundPolicy;
use crate::outbound::routes::model::ResourceRef;
use crate::transport::Io;
use crate::transport::labels::Bounded;
use crate::transport::tls::client_hello::{self, Peek};

pub mod dns;
pub mod names;

pub use crate::outbound::policy::streams::StreamRules;

/// Distinct `dst_hostname` values per proxy; the rest read `other`.
pub const MAX_HOSTNAMES: usize = 1000;

/// The kind of a policy parent that marks egress.
pub const EGRESS_NETWORK_KIND: &str = "EgressNetwork";

/// Whether a policy is an EgressNetwork's.
pub fn is_egress(parent: &ResourceRef) -> bool {
    &*parent.kind == EGRESS_NETWORK_KIND
}

/// `<ns>/<name>` of the EgressNetwork.
pub fn network_name(parent: &ResourceRef) -> String {
    format!("{}/{}", parent.namespace, parent.name)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum EgressProtocol {
    tls,
    http,
    opaque,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct EgressLabels {
    pub dst_kind: &'static str,
    pub egress_network: String,
    pub dst_hostname: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct EgressConnLabels {
    #[prometheus(flatten)]
    pub egress: EgressLabels,
    pub protocol: EgressProtocol,
}

/// The egress families (handles into the app's registry) and the hostname bound.
#[derive(Default)]
pub struct EgressMetrics {
    pub outbound_egress_connections_total: Family<EgressConnLabels, Counter>,
    pub outbound_egress_requests_total: Family<EgressLabels, Counter>,
    pub outbound_egress_denied_total: Family<EgressConnLabels, Counter>,
    hostnames: Bounded,
}

impl EgressMetrics {
    /// The labels of egress traffic to `hostname` under the EgressNetwork `parent`.
    pub fn labels(&self, parent: &ResourceRef, hostname: &str) -> EgressLabels {
        EgressLabels {
            dst_kind: "egress",
            egress_network: network_name(parent),
            dst_hostname: self.hostnames.label(&hostname.to_ascii_lowercase(), MAX_HOSTNAMES),
        }
    }
}

/// The hostname an HTTP request names: its authority's host, else its Host header's; lower
/// case. `None` when it names none.
pub fn request_hostname<B>(req: &http::Request<B>) -> Option<String> {
    let host = req.uri().host().map(str::to_string).or_else(|| header_host(req))?;
    Some(host.to_ascii_lowercase())
}

fn header_host<B>(req: &http::Request<B>) -> Option<String> {
    let value = req.headers().get(http::header::HOST)?.to_str().ok()?;
    Some(value.parse::<http::uri::Authority>().ok()?.host().to_string())
}

/// Whether the request's authority and its Host header name different hosts (an upstream may
/// read either).
pub fn hosts_disagree<B>(req: &http::Request<B>) -> bool {
    match (req.uri().host(), req.headers().get(http::header::HOST)) {
        (Some(authority), Some(_)) => !header_host(req).is_some_and(|h| h.eq_ignore_ascii_case(authority)),
        _ => false,
    }
}

/// The hostname an egress request was seen as (its Host when bound to the connection's
/// destination, else the destination's IP), kept in the request's extensions for tap and the
/// request metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenAs {
    pub hostname: String,
    /// Not the request's own Host: its authority label reads the destination instead.
    pub unbound: bool,
}

/// An egress connection as it was admitted.
#[derive(Debug, Clone)]
pub struct Admitted {
    pub labels: EgressLabels,
    /// The policy refuses opaque (non-HTTP) traffic: refuse it if detection finds it opaque.
    pub opaque_forbidden: bool,
    /// Already decided and counted when admitted (TLS).
    pub decided: bool,
}

/// Why an egress connection was closed.
#[derive(Debug, thiserror::Error)]
#[error("egress to {hostname} ({addr}) denied by EgressNetwork {network}")]
pub struct Denied {
    pub network: String,
    pub hostname: String,
    pub addr: SocketAddr,
}

/// Looks at an outbound connection to an egress address before it is served: peeks its
/// ClientHello (within `timeout`) for the SNI, counts it, and refuses it when the policy says
/// so. Returns the bytes read (to be replayed) and what the connection's later steps need;
/// `None` for a connection whose policy is not an EgressNetwork's (nothing read).
pub async fn admit<I: Io>(
    io: &mut I,
    addr: SocketAddr,
    policy: Option<Arc<OutboundPolicy>>,
    (metrics, names): (&EgressMetrics, &names::Names),
    timeout: Duration,
) -> Result<(Bytes, Option<Admitted>), Denied> {
    let Some(policy) = policy.filter(|p| is_egress(&p.parent)) else { return Ok((Bytes::new(), None)) };
    let rules = &policy.streams;
    let declared_opaque =
        rules.tls.is_none() && matches!(policy.protocol, crate::outbound::policy::model::Protocol::Opaque);
    // An opaque port may serve a server-speaks-first protocol: nothing to wait for there.
    let (peek, read) = if declared_opaque {
        (Peek::NotTls, Bytes::new())
    } else {
        client_hello::read(io, timeout).await.unwrap_or((Peek::NotTls, Bytes::new()))
    };
    let sni = match &peek {
        Peek::ClientHello(sni) => sni.clone(),
        _ => None,
    };
    let tls = matches!(peek, Peek::ClientHello(_));
    let refused_as =
        |sni: Option<&str>| if rules.tls.is_some() { rules.tls_refused(sni) } else { tls && rules.opaque_forbidden };
    let mut hostname = sni.clone().unwrap_or_else(|| addr.ip().to_string());
    let mut refused = refused_as(sni.as_deref());
    // An SNI the policy admits is believed only for the addresses it resolves to; otherwise the
    // connection is decided on, and counted, as one to the bare IP address.
    if !refused
        && let Some(name) = &sni
        && !names.bound(name, addr.ip()).await
    {
        hostname = addr.ip().to_string();
        refused = refused_as(Some(&hostname));
    }
    let labels = metrics.labels(&policy.parent, &hostname);
    let protocol = if tls { EgressProtocol::tls } else { EgressProtocol::opaque };
    let conn_labels = EgressConnLabels { egress: labels.clone(), protocol };
    if refused {
        metrics.outbound_egress_denied_total.get_or_create(&conn_labels).inc();
        return Err(Denied { network: labels.egress_network, hostname: labels.dst_hostname, addr });
    }
    let decided = tls || rules.tls.is_some();
    if decided {
        metrics.outbound_egress_connections_total.get_or_create(&conn_labels).inc();
    }
    Ok((read, Some(Admitted { labels, opaque_forbidden: rules.opaque_forbidden, decided })))
}

impl Admitted {
    /// Counts a connection served as HTTP or opaque once detection decided (TLS ones were
    /// counted when admitted); `Err` when opaque traffic is refused.
    pub fn served(&self, metrics: &EgressMetrics, http: bool, addr: SocketAddr) -> Result<(), Denied> {
        if self.decided {
            return Ok(());
        }
        let protocol = if http { EgressProtocol::http } else { EgressProtocol::opaque };
        let labels = EgressConnLabels { egress: self.labels.clone(), protocol };
        if !http && self.opaque_forbidden {
            metrics.outbound_egress_denied_total.get_or_create(&labels).inc();
            return Err(Denied {
                network: self.labels.egress_network.clone(),
                hostname: self.labels.dst_hostname.clone(),
                addr,
            });
        }
        metrics.outbound_egress_connections_total.get_or_create(&labels).inc();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_beyond_the_cap_read_other() {
        let m = EgressMetrics::default();
        let parent = ResourceRef {
            group: "policy.cnimesh.io".into(),
            kind: "EgressNetwork".into(),
            namespace: "shop".into(),
            name: "world".into(),
            port: 443,
            section: "".into(),
        };
        for i in 0..MAX_HOSTNAMES {
            assert_eq!(m.labels(&parent, &format!("h{i}.test")).dst_hostname, format!("h{i}.test"));
        }
        let over = m.labels(&parent, "one-too-many.test");
        assert_eq!((over.dst_hostname.as_str(), over.egress_network.as_str()), ("other", "shop/world"));
        assert_eq!(m.labels(&parent, "H0.test").dst_hostname, "h0.test", "seen names keep their series");
    }
}
