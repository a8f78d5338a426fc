//! The cluster as `stat` and `edges` see it: pods (their workloads, IP, service account, proxy)
//! and Services (a ClusterIP stands for the pods it selects), so that a metric's `target_addr`
//! can be traced back to the workload behind it.
//!
//! Layer: model (pure).

use std::collections::BTreeMap;
use std::net::IpAddr;

use cnimesh_common::names::{OWNER_LABEL_PREFIX, PROXY_CONTAINER};
use k8s_openapi::api::core::v1::{Pod, Service};

pub use cnimesh_model::resource::{Kind, Resource};
use cnimesh_model::workload::Workload;

/// One pod, reduced to what the metrics are attributed by.
#[derive(Debug, Clone)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub ip: Option<IpAddr>,
    /// It runs `cnimesh-proxy` (and so has a `/metrics` to read).
    pub meshed: bool,
    pub service_account: String,
    pub labels: BTreeMap<String, String>,
    /// Its controller from the owner references (for pods injected before the owner labels).
    pub owner: Option<Workload>,
}

impl PodView {
    pub fn new(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let in_spec = |name: &str| {
            spec.is_some_and(|s| s.containers.iter().chain(s.init_containers.iter().flatten()).any(|c| c.name == name))
        };
        Self {
            namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
            name: meta.name.clone().unwrap_or_default(),
            ip: pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()).and_then(|ip| ip.parse().ok()),
            meshed: in_spec(PROXY_CONTAINER),
            service_account: spec.and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into()),
            labels: meta.labels.clone().unwrap_or_default(),
            owner: Workload::of_pod(meta),
        }
    }

    /// The name of the `kind` this pod belongs to: its owner label (what the injector wrote),
    /// else its controller; the namespace or the pod itself for those kinds.
    pub fn resource_name(&self, kind: Kind) -> Option<String> {
        match kind {
            Kind::Namespace => Some(self.namespace.clone()),
            Kind::Pod => Some(self.name.clone()),
            _ => self
                .labels
                .get(&format!("{OWNER_LABEL_PREFIX}{}", kind.name()))
                .cloned()
                .or_else(|| self.owner.as_ref().filter(|w| w.kind == kind.name()).map(|w| w.name.clone())),
        }
    }

    /// `sa.ns`: the identity its proxy proves, without the trust domain's suffix.
    pub fn short_identity(&self) -> String {
        format!("{}.{}", self.service_account, self.namespace)
    }
}

/// A Service's ClusterIPs and selector.
#[derive(Debug, Clone)]
pub struct ServiceView {
    pub namespace: String,
    pub name: String,
    pub cluster_ips: Vec<IpAddr>,
    pub selector: BTreeMap<String, String>,
}

impl ServiceView {
    pub fn new(service: &Service) -> Self {
        let spec = service.spec.as_ref();
        let ips = spec.and_then(|s| s.cluster_ips.clone().or_else(|| s.cluster_ip.clone().map(|ip| vec![ip])));
        Self {
            namespace: service.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            name: service.metadata.name.clone().unwrap_or_default(),
            cluster_ips: ips.into_iter().flatten().filter_map(|ip| ip.parse().ok()).collect(),
            selector: spec.and_then(|s| s.selector.clone()).unwrap_or_default(),
        }
    }

    fn selects(&self, pod: &PodView) -> bool {
        !self.selector.is_empty()
            && pod.namespace == self.namespace
            && self.selector.iter().all(|(k, v)| pod.labels.get(k) == Some(v))
    }
}

/// Pods and Services of the namespaces looked at.
#[derive(Debug, Clone, Default)]
pub struct Mesh {
    pub pods: Vec<PodView>,
    pub services: Vec<ServiceView>,
}

impl Mesh {
    pub fn new(pods: &[Pod], services: &[Service]) -> Self {
        let mut pods: Vec<PodView> = pods.iter().map(PodView::new).collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Self { pods, services: services.iter().map(ServiceView::new).collect() }
    }

    /// The pods an address reaches: the pod with that IP, or those its Service selects.
    pub fn pods_at(&self, ip: IpAddr) -> Vec<&PodView> {
        let direct: Vec<&PodView> = self.pods.iter().filter(|p| p.ip == Some(ip)).collect();
        if !direct.is_empty() {
            return direct;
        }
        self.services
            .iter()
            .filter(|s| s.cluster_ips.contains(&ip))
            .flat_map(|s| self.pods.iter().filter(move |p| s.selects(p)))
            .collect()
    }
}

/// The IP of a `target_addr` label (`10.0.0.1:80`, `[fd00::1]:80`).
pub fn target_ip(target_addr: &str) -> Option<IpAddr> {
    target_addr.parse::<std::net::SocketAddr>().map(|a| a.ip()).ok().or_else(|| target_addr.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_addresses_give_their_ip() {
        assert_eq!(target_ip("10.0.0.1:80"), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(target_ip("[fd00::1]:80"), Some("fd00::1".parse().unwrap()));
    }
}
