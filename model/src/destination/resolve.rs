//! Turning index snapshots into linkerd2-proxy-api messages for one requested port.
//!
//! Layer: model/index (pure): builds linkerd2-proxy-api messages as plain data (prost structs), no
//! tonic; `cnimesh_control::grpc::destination` streams them.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use cnimesh_common::names::TARGET_CLUSTER_METRIC_LABEL;
use linkerd2_proxy_api::destination::{
    AuthorityOverride, DestinationProfile, ProtocolHint, TlsIdentity, WeightedAddr, protocol_hint, tls_identity,
};

use super::Config;
use super::app_protocol::AppProtocol;
use super::index::{Endpoint, IpView, ServiceSnapshot};
use super::model::{PodRecord, ServicePort, ServiceRecord, SliceMirror, TargetPort};
use super::updates::{Endpoints, PortEndpoints};
use crate::meta::NsName;

/// The weight linkerd's own destination controller gives every endpoint; proxies only compare
/// weights, so any constant works, and this one matches what a stock proxy has seen elsewhere.
const WEIGHT: u32 = 10_000;

/// `name.ns.svc.<cluster domain>`, the name proxies pass back to `Get`.
pub fn fqdn(key: &NsName, config: &Config) -> String {
    format!("{}.{}.svc.{}", key.name, key.namespace, config.cluster_domain)
}

/// The ready endpoints of `port` on a service, keyed by address so streams can diff them.
pub fn service_endpoints(snapshot: &ServiceSnapshot, port: u16, config: &Arc<Config>) -> Endpoints {
    port_endpoints(snapshot, port, config).endpoints.clone()
}

/// [`service_endpoints`] with the updates into them: worked out once per snapshot and port, and
/// shared by every stream of that port.
pub fn port_endpoints(snapshot: &ServiceSnapshot, port: u16, config: &Arc<Config>) -> Arc<PortEndpoints> {
    let mut resolved = snapshot.resolved.lock();
    if let Some((_, _, endpoints)) = resolved.iter().find(|(p, c, _)| *p == port && c == config) {
        return endpoints.clone();
    }
    let endpoints = Arc::new(PortEndpoints::new(resolve_endpoints(snapshot, port, config)));
    resolved.push((port, config.clone(), endpoints.clone()));
    endpoints
}

/// Endpoints whose target port cannot be resolved are left out (they could not be dialled).
fn resolve_endpoints(snapshot: &ServiceSnapshot, port: u16, config: &Config) -> BTreeMap<SocketAddr, WeightedAddr> {
    let Some(service_port) = snapshot.service.ports.iter().find(|p| p.port == port) else {
        return BTreeMap::new();
    };
    snapshot
        .endpoints
        .iter()
        .filter_map(|ep| {
            let addr = SocketAddr::new(ep.addr, target_port(service_port, ep)?);
            if *ep.mirror != SliceMirror::Local {
                return Some((addr, mirror_addr(addr, &snapshot.service, service_port, &ep.mirror)?));
            }
            let pod = ep.pod.as_ref().map(|(name, pod)| (name.as_str(), &**pod));
            Some((addr, weighted_addr(addr, &snapshot.key.namespace, pod, config)))
        })
        .collect()
}

/// EndpointSlice ports are already resolved by the endpoints controller and carry the Service
/// port's name, so they come first. Slices written by hand may lack them: then a numeric
/// targetPort is used as is, and a named one is looked up among the pod's container ports (or a
/// slice port named after the targetPort).
fn target_port(service_port: &ServicePort, ep: &Endpoint) -> Option<u16> {
    if let Some(port) = ep.ports.get(&service_port.name) {
        return Some(*port);
    }
    match &service_port.target {
        TargetPort::Number(n) => Some(*n),
        TargetPort::Name(name) => {
            ep.pod.as_ref().and_then(|(_, pod)| pod.named_ports.get(name)).or_else(|| ep.ports.get(name)).copied()
        }
    }
}

/// An endpoint address. Meshed pods get their identity, so the client proxy originates mTLS and
/// checks the server's name, and a protocol hint: H2, so HTTP/1 can be upgraded between proxies;
/// on an opaque port, the Opaque hint instead, so the client forwards bytes without detection.
/// `opaque_transport` stays unset here: only a gateway endpoint of a mirror has it ([`mirror_addr`]).
pub fn weighted_addr(
    addr: SocketAddr,
    namespace: &str,
    pod: Option<(&str, &PodRecord)>,
    config: &Config,
) -> WeightedAddr {
    let mut metric_labels = HashMap::new();
    let (mut tls_identity, mut protocol_hint) = (None, None);
    if let Some((name, pod)) = pod {
        // Linkerd's label for an ExternalWorkload endpoint, so metrics never call it a pod.
        let kind = if pod.is_external() { "external_workload" } else { "pod" };
        metric_labels.insert(kind.to_string(), name.to_string());
        metric_labels.insert("serviceaccount".to_string(), pod.service_account.clone());
        if pod.meshed {
            match cnimesh_identity::Name::for_service_account(&pod.service_account, namespace, &config.trust_domain) {
                Ok(identity) => {
                    let dns = tls_identity::DnsLikeIdentity { name: identity.to_string() };
                    tls_identity = Some(TlsIdentity {
                        strategy: Some(tls_identity::Strategy::DnsLikeIdentity(dns.clone())),
                        server_name: Some(dns),
                    });
                    let protocol = if pod.opaque_ports.contains(addr.port()) {
                        protocol_hint::Protocol::Opaque(protocol_hint::Opaque {})
                    } else {
                        protocol_hint::Protocol::H2(protocol_hint::H2 {})
                    };
                    protocol_hint = Some(ProtocolHint { protocol: Some(protocol), opaque_transport: None });
                }
                // Without a valid name there is nothing to verify the peer against: the endpoint
                // is served as unmeshed rather than with an identity no certificate can carry.
                Err(error) => tracing::warn!(pod = name, namespace, %error, "meshed pod has no valid identity"),
            }
        }
    }
    WeightedAddr {
        addr: Some(addr.into()),
        weight: WEIGHT,
        metric_labels,
        tls_identity,
        protocol_hint,
        ..Default::default()
    }
}

fn dns_identity(name: &str) -> TlsIdentity {
    let dns = tls_identity::DnsLikeIdentity { name: name.to_string() };
    TlsIdentity { strategy: Some(tls_identity::Strategy::DnsLikeIdentity(dns.clone())), server_name: Some(dns) }
}

fn hint(opaque: bool, opaque_transport: Option<u16>) -> ProtocolHint {
    let protocol = if opaque {
        protocol_hint::Protocol::Opaque(protocol_hint::Opaque {})
    } else {
        protocol_hint::Protocol::H2(protocol_hint::H2 {})
    };
    ProtocolHint {
        protocol: Some(protocol),
        opaque_transport: opaque_transport.map(|port| protocol_hint::OpaqueTransport { inbound_port: u32::from(port) }),
    }
}

/// An endpoint of a mirror slice, as the multicluster contract serves it.
/// - Through a gateway: the gateway's address and identity, the remote Service's
///   `<fq name>:<port>` as authority override, and opaque transport to the gateway port (the
///   client proxy writes the transport header naming that authority). Opaque when the Service
///   port says so (appProtocol or the opaque-ports annotation), else H2.
/// - A remote pod (flat network): its address and the slice's identity (none: plaintext), the
///   hint per the slice's remote opaque ports; no override.
///
/// Every one is labelled with the target cluster (the slice's, else the Service's).
fn mirror_addr(
    addr: SocketAddr,
    service: &ServiceRecord,
    port: &ServicePort,
    mirror: &SliceMirror,
) -> Option<WeightedAddr> {
    let service_mirror = service.mirror.as_ref();
    let cluster = mirror.cluster().or_else(|| service_mirror.and_then(|m| m.cluster.as_deref()));
    let metric_labels =
        cluster.map(|c| HashMap::from([(TARGET_CLUSTER_METRIC_LABEL.to_string(), c.to_string())])).unwrap_or_default();
    let (mut tls_identity, mut protocol_hint, mut authority_override) = (None, None, None);
    match mirror {
        SliceMirror::Local => {}
        SliceMirror::Gateway { identity, .. } => {
            let Some(remote) = service_mirror.and_then(|m| m.remote_fq_name.as_deref()) else {
                // Without the remote name the gateway cannot be told where to go: the endpoint
                // would only ever be refused there, so it is served as no endpoint at all.
                tracing::warn!(gateway = %addr, "mirror Service without its remote name; gateway endpoint left out");
                return None;
            };
            let opaque = port.app_protocol == Some(AppProtocol::Opaque) || service.opaque_ports.contains(port.port);
            tls_identity = Some(dns_identity(identity));
            protocol_hint = Some(hint(opaque, Some(addr.port())));
            authority_override = Some(AuthorityOverride { authority_override: format!("{remote}:{}", port.port) });
        }
        SliceMirror::Remote { identity: Some(identity), opaque_ports, .. } => {
            tls_identity = Some(dns_identity(identity));
            protocol_hint = Some(hint(opaque_ports.contains(addr.port()), None));
        }
        SliceMirror::Remote { identity: None, .. } => {}
    }
    Some(WeightedAddr {
        addr: Some(addr.into()),
        weight: WEIGHT,
        metric_labels,
        tls_identity,
        protocol_hint,
        authority_override,
        ..Default::default()
    })
}

/// A profile for a service name: its FQDN when it exists, empty (passthrough) otherwise.
pub fn service_profile(view: Option<&Arc<ServiceSnapshot>>, port: u16, config: &Config) -> DestinationProfile {
    match view {
        Some(snapshot) => named_profile(&snapshot.key, &snapshot.service, port, config),
        None => DestinationProfile::default(),
    }
}

/// Opaqueness of a service port comes from the Service's own annotation: the client decides before
/// it knows which endpoint it will reach.
fn named_profile(key: &NsName, service: &ServiceRecord, port: u16, config: &Config) -> DestinationProfile {
    DestinationProfile {
        fully_qualified_name: fqdn(key, config),
        opaque_protocol: service.opaque_ports.contains(port)
            || service.app_protocol(port) == Some(super::app_protocol::AppProtocol::Opaque),
        ..Default::default()
    }
}

/// A profile for an address: a ClusterIP names its service (the proxy then calls `Get`), a pod IP
/// is that one endpoint, anything else passes through.
pub fn ip_profile(view: &IpView, ip: IpAddr, port: u16, config: &Config) -> DestinationProfile {
    match view {
        IpView::Service(key, service) => named_profile(key, service, port, config),
        IpView::Pod(key, pod) => DestinationProfile {
            opaque_protocol: pod.opaque_ports.contains(port),
            endpoint: Some(weighted_addr(SocketAddr::new(ip, port), &key.namespace, Some((&key.name, pod)), config)),
            ..Default::default()
        },
        IpView::Unknown => DestinationProfile::default(),
    }
}
