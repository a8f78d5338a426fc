//! The multicluster gateway (`CNIMESH_PROXY_MODE=gateway`): a cnimesh proxy that
//! admits connections from other clusters' proxies to this cluster's Services.
//!
//! The contract (docs/tasks/multicluster.md, "The gateway"): the gateway listens on the inbound
//! port and accepts **only** mesh mTLS addressed to its own identity, with a client certificate
//! chained to the trust anchors (a plaintext client, a TLS client without a certificate or with
//! one from another anchor is refused at the handshake). The connection must then start with
//! the transport header ([`crate::transport::header`]); its `name` must be a Service name of the
//! gateway's own cluster domain (`<svc>.<ns>.svc.<domain>`), never an address and never another
//! domain, and a Service its Destination serves it: the gateway is not an open proxy. Its
//! discovery marks every request as the gateway's
//! ([`crate::client::discovery::Discovery::for_gateway`]), and Destination then answers as if
//! only the Services exported through it (`mirror.cnimesh.io/exported=true`) existed, so any
//! other Service of the cluster is refused like an unknown name (`unknown_service`); the check
//! is made for every connection, so an unexported Service is refused from the moment its
//! Destination stream says so, even while its target is cached. Admitted
//! connections go through the outbound stack ([`crate::outbound::service`]): mTLS to the
//! Service's pods with the gateway's identity, HTTP balanced per request, opaque bytes as they
//! are. Every refusal is counted by reason (`gateway_refused_total{reason}`) and logged
//! (rate-limited); admitted connections are counted with their client and target
//! (`gateway_connections_total{client_id,target,session}`).
//!
//! Who may use the gateway: a mesh identity of **another** trust domain, chained to the anchors
//! (all linked clusters share one) by an issuer of its own trust domain; a workload of the
//! gateway's own cluster is refused (`own_trust_domain`): it goes to its Services directly, where
//! their policy sees it as itself. What it may reach: the exported Services only, and of those
//! what the target workloads' own inbound policy allows the *calling* workload: every HTTP
//! request the gateway forwards carries the client's verified identity in
//! [`crate::http::headers::GATEWAY_CLIENT_ID`] (set here, replacing whatever the client sent),
//! which the target's inbound believes from this cluster's gateway alone, and requires on every
//! HTTP request from it. Opaque sessions carry no header, so the gateway admits them only to a
//! port Destination says every endpoint takes as opaque (the pod's opaque-ports annotation,
//! which its proxy reads no HTTP on; `opaque_to_non_opaque_port` otherwise): HTTP bytes in an
//! opaque session must never reach a proxy that would parse them and believe their headers.
//! Their target sees the gateway's identity.

pub mod metrics;
pub mod name;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cnimesh_common::log_limit::LogLimit;
use cnimesh_identity::Name;

use crate::client::targets::Target;
use crate::outbound::Outbound;
use crate::transport::Io;
use crate::transport::header::{HeaderError, SessionProtocol, TransportHeader};
use crate::transport::identity::Identity;
use crate::transport::labels::TlsLabel;
use crate::transport::tls;
pub use metrics::{GatewayMetrics, Refusal};

/// What the gateway needs besides the outbound side.
pub struct Gateway {
    pub identity: Arc<Identity>,
    /// This cluster's domain: the only one whose Service names the gateway forwards to.
    pub cluster_domain: String,
    /// How long a client has for its ClientHello, then for its transport header.
    pub wait: Duration,
    pub metrics: Arc<GatewayMetrics>,
}

/// An admitted connection: mTLS terminated, its header read and its target resolved.
pub struct Admitted<I> {
    pub io: tls::ClientIo<I>,
    /// The client's TLS (`client_id`: the calling proxy's identity).
    pub tls: TlsLabel,
    /// The calling proxy's verified identity (of another trust domain than the gateway's).
    pub client: Name,
    /// `name:port` from the header.
    pub authority: String,
    pub target: Arc<Target>,
    /// How the bytes are spoken (`None`: opaque).
    pub protocol: Option<SessionProtocol>,
}

/// Why a connection was not admitted; its reason is the metric label.
#[derive(Debug, thiserror::Error)]
#[error("gateway refused {peer}: {why}")]
pub struct Refused {
    pub peer: SocketAddr,
    pub reason: Refusal,
    pub why: String,
}

static REFUSED_LOG: LogLimit = LogLimit::new(Duration::from_secs(10));

/// Admits one connection from `peer`, or refuses it (counted and logged).
pub async fn connection<I: Io>(
    io: I,
    peer: SocketAddr,
    gateway: &Gateway,
    outbound: &Outbound,
) -> Result<Admitted<I>, Refused> {
    let admitted = admit(io, peer, gateway, outbound).await;
    match &admitted {
        Ok(a) => gateway.metrics.admitted(&a.tls, &a.authority, a.protocol),
        Err(refused) => {
            gateway.metrics.refused(refused.reason);
            if let Some(left_out) = REFUSED_LOG.allow() {
                tracing::warn!(%peer, reason = ?refused.reason, left_out, "{refused}");
            }
        }
    }
    admitted
}

async fn admit<I: Io>(io: I, peer: SocketAddr, gateway: &Gateway, outbound: &Outbound) -> Result<Admitted<I>, Refused> {
    let refused = |reason, why: String| Refused { peer, reason, why };
    let accepted = tls::inbound(io, &gateway.identity, gateway.wait, true)
        .await
        .map_err(|e| refused(Refusal::tls_handshake, format!("TLS handshake failed: {e}")))?;
    let (mut io, prefix, tls) = match accepted {
        tls::Inbound::Accepted { io, prefix, tls } => (io, prefix, tls),
        tls::Inbound::Refused(why) => return Err(refused(Refusal::not_mtls, why.to_string())),
        tls::Inbound::Undecided { .. } => {
            return Err(refused(Refusal::not_mtls, "no ClientHello within the wait".into()));
        }
    };
    // The verifier requires a certificate chained to the anchors; a missing identity here
    // would be a configuration error of ours, and still never gets through.
    let client = tls.client_id.as_deref().and_then(|id| Name::parse(id).ok());
    let Some(client) = client.filter(|_| tls.tls && prefix.is_empty()) else {
        return Err(refused(Refusal::not_mtls, "no client identity".into()));
    };
    if !from_another_trust_domain(&client, &gateway.identity.name) {
        return Err(refused(
            Refusal::own_trust_domain,
            format!(
                "{client} is of this cluster's trust domain: it must call the Service directly, not through the gateway"
            ),
        ));
    }
    let header = TransportHeader::read(&mut io, gateway.wait).await.map_err(|e| match e {
        HeaderError::NoPreamble | HeaderError::TimedOut(_) | HeaderError::Io(_) => {
            refused(Refusal::no_transport_header, e.to_string())
        }
        _ => refused(Refusal::bad_transport_header, e.to_string()),
    })?;
    name::check(&header.name, &gateway.cluster_domain).map_err(|e| refused(e.refusal(), e.to_string()))?;
    let authority = format!("{}:{}", header.name, header.port);
    // Its Destination answers the gateway as if only exported Services existed, and says so
    // on the open stream when a Service is unexported: a target cached before is checked again.
    let target = crate::outbound::service(&authority, outbound).await.filter(|t| t.route.routable());
    let Some(target) = target else {
        return Err(refused(
            Refusal::unknown_service,
            format!("remote service not found or not exported: {authority}"),
        ));
    };
    if header.protocol.is_none() && !target.route.declared_opaque() {
        return Err(refused(
            Refusal::opaque_to_non_opaque_port,
            format!("an opaque session to {authority}, whose endpoints are not declared opaque: only HTTP goes there"),
        ));
    }
    Ok(Admitted { io, tls, client, authority, target, protocol: header.protocol })
}

/// Whether `client` is a workload of another trust domain than the `gateway`'s own.
fn from_another_trust_domain(client: &Name, gateway: &Name) -> bool {
    matches!((client.trust_domain(), gateway.trust_domain()), (Some(c), Some(g)) if c != g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_workloads_of_other_trust_domains_may_use_the_gateway() {
        let name = |sa: &str, td: &str| Name::for_service_account(sa, "shop", td).unwrap();
        let gateway = Name::for_service_account("cnimesh-gateway", "cnimesh-multicluster", "west.local").unwrap();
        assert!(from_another_trust_domain(&name("client", "cluster.local"), &gateway));
        assert!(!from_another_trust_domain(&name("intruder", "west.local"), &gateway));
        assert!(!from_another_trust_domain(&Name::parse("web.example.com").unwrap(), &gateway));
    }
}
