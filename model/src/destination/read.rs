//! What `Get` serves for an authority right now, as one read-only answer: the control plane's
//! admin page `/destination.json` (and so `cnimesh diagnostics endpoints SERVICE`). It resolves
//! through the same index snapshot and [`super::resolve::service_endpoints`] the gRPC stream
//! sends, so what an operator reads cannot drift from what proxies are told.
//!
//! Layer: model/index (pure).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use linkerd2_proxy_api::destination::{protocol_hint, tls_identity};

use super::Config;
use super::index::Index;
use super::path::{self, Target};
use super::resolve;

/// One endpoint as `Get` sends it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServedEndpoint {
    pub addr: SocketAddr,
    pub weight: u32,
    /// The identity the client proxy will require of this endpoint (meshed pods only).
    pub identity: Option<String>,
    /// `h2` (meshed: HTTP/1 upgraded between proxies), `opaque`, or none (not meshed).
    pub protocol_hint: Option<&'static str>,
    /// `pod`, `serviceaccount`.
    pub labels: BTreeMap<String, String>,
}

/// The answer for one authority.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Served {
    /// The service's full name, as proxies pass it back to `Get`.
    pub service: String,
    pub port: u16,
    /// Whether the service exists (`no_endpoints{exists}` when it has no ready endpoint).
    pub exists: bool,
    /// Whether the index has loaded every kind once (before that, `Get` waits).
    pub ready: bool,
    pub endpoints: Vec<ServedEndpoint>,
}

/// Why an authority cannot be answered; the message names the bad value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReadError {
    /// The authority is not `<service>.<namespace>[.svc[.<domain>]]:<port>`.
    #[error("{0}")]
    Path(String),
    #[error("{0} is an address: Destination's Get resolves service names (<service>.<namespace>:<port>)")]
    Address(SocketAddr),
}

/// What `Get(authority)` serves now.
pub fn served(index: &Index, authority: &str, config: &Arc<Config>) -> Result<Served, ReadError> {
    let (key, port) =
        match path::parse(authority, &config.cluster_domain).map_err(|e| ReadError::Path(e.to_string()))? {
            Target::Service { key, port } => (key, port),
            Target::Addr(addr) => return Err(ReadError::Address(addr)),
        };
    let view = index.watch_service(&key).borrow().clone();
    let endpoints = view.as_ref().map(|s| resolve::service_endpoints(s, port, config)).unwrap_or_default();
    let endpoints = endpoints
        .iter()
        .map(|(addr, w)| ServedEndpoint {
            addr: *addr,
            weight: w.weight,
            identity: w.tls_identity.as_ref().and_then(|t| match &t.strategy {
                Some(tls_identity::Strategy::DnsLikeIdentity(d)) => Some(d.name.clone()),
                _ => None,
            }),
            protocol_hint: w.protocol_hint.as_ref().and_then(|h| match h.protocol {
                Some(protocol_hint::Protocol::H2(_)) => Some("h2"),
                Some(protocol_hint::Protocol::Opaque(_)) => Some("opaque"),
                _ => None,
            }),
            labels: w.metric_labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        })
        .collect();
    Ok(Served {
        service: resolve::fqdn(&key, config),
        port,
        exists: view.is_some(),
        ready: index.is_ready(),
        endpoints,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destination::Change;
    use crate::destination::test_objects::object;

    /// `web` in `shop`: port 80 to 8080, one meshed pod and one plain pod behind it.
    fn index() -> Index {
        let index = Index::new();
        index.apply([
            Change::Upsert(object(serde_json::json!({
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80, "targetPort": 8080}]},
            }))),
            Change::Upsert(object(serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "web-a", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": ["10.244.0.11"], "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "shop"}},
                    {"addresses": ["10.244.0.12"], "targetRef": {"kind": "Pod", "name": "web-2", "namespace": "shop"}},
                ],
            }))),
            Change::Upsert(object(serde_json::json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1", "namespace": "shop"},
                "spec": {"serviceAccountName": "web", "containers": [{"name": "app"}, {"name": "cnimesh-proxy"}]},
                "status": {"podIP": "10.244.0.11"},
            }))),
            Change::Upsert(object(serde_json::json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-2", "namespace": "shop"},
                "spec": {"serviceAccountName": "web", "containers": [{"name": "app"}]},
                "status": {"podIP": "10.244.0.12"},
            }))),
        ]);
        index
    }

    #[test]
    fn a_service_is_served_with_each_endpoints_identity_and_hint() {
        let served = served(&index(), "web.shop:80", &Arc::new(Config::default())).unwrap();
        assert_eq!(served.service, "web.shop.svc.cluster.local");
        assert!(served.exists);
        assert_eq!(served.endpoints.len(), 2, "{served:?}");
        let meshed = &served.endpoints[0];
        assert_eq!(meshed.addr, "10.244.0.11:8080".parse().unwrap());
        assert_eq!(meshed.identity.as_deref(), Some("web.shop.serviceaccount.identity.cnimesh.cluster.local"));
        assert_eq!(meshed.protocol_hint, Some("h2"));
        assert_eq!(meshed.labels["pod"], "web-1");
        let plain = &served.endpoints[1];
        assert_eq!((plain.identity.as_deref(), plain.protocol_hint), (None, None), "not meshed: plaintext");
    }

    #[test]
    fn unknown_services_other_ports_and_addresses_are_told_apart() {
        let config = Arc::new(Config::default());
        let missing = served(&index(), "api.shop.svc.cluster.local:80", &config).unwrap();
        assert!(!missing.exists && missing.endpoints.is_empty());
        let other_port = served(&index(), "web.shop:81", &config).unwrap();
        assert!(other_port.exists && other_port.endpoints.is_empty(), "no such service port: nothing to dial");
        let addr = served(&index(), "10.96.0.10:80", &config).unwrap_err();
        assert!(addr.to_string().contains("10.96.0.10:80"), "{addr}");
        let bad = served(&index(), "web.shop", &config).unwrap_err();
        assert!(bad.to_string().contains("\"web.shop\" has no port"), "{bad}");
    }
}
