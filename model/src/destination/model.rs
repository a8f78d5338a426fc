//! The few facts Destination needs from Services, EndpointSlices and Pods, distilled from the
//! Kubernetes objects once when they arrive. Both sources feed the same conversions, and the index
//! keeps only these records: a full Pod object is tens of KiB, the record is a few dozen bytes.
//!
//! Layer: model/index (pure): Kubernetes object types in, plain records out; no kube client, no
//! tonic.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::accrual::FailureAccrual;
use super::app_protocol::AppProtocol;
use crate::routes::model::ServiceDefaults;

use cnimesh_common::names::{
    MIRROR_CLUSTER_NAME_LABEL, MIRROR_EXPORTED_GATEWAY, MIRROR_EXPORTED_LABEL, MIRROR_GATEWAY_IDENTITY_ANNOTATION,
    MIRROR_REMOTE_IDENTITY_ANNOTATION, MIRROR_REMOTE_OPAQUE_PORTS_ANNOTATION, MIRROR_REMOTE_SERVICE_ANNOTATION,
    MIRRORED_SERVICE_LABEL, OWNER_KINDS, OWNER_LABEL_PREFIX,
};
/// docs/architecture.md, "Names and numbers": the container whose presence marks a pod as meshed, and the annotation naming
/// ports on which traffic is not HTTP (server-speaks-first protocols and the like).
pub use cnimesh_common::names::{OPAQUE_PORTS_ANNOTATION, PROXY_CONTAINER};

use crate::external::ExternalRecord;
use crate::external::crd::RESOURCE_KIND as EXTERNAL_KIND;
use crate::meta::NsName;
use crate::workload::Workload;
/// The label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// One of the kinds Destination reads. Anything else in a source is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Service,
    EndpointSlice,
    Pod,
    /// Optional: a cluster without the CRD (and a source that reads no ExternalWorkloads) has
    /// none, so readiness does not wait for it.
    ExternalWorkload,
}

/// The kinds the index waits for before it answers ([`super::Index::is_ready`]).
pub const KINDS: [Kind; 3] = [Kind::Service, Kind::EndpointSlice, Kind::Pod];

/// A Kubernetes object as a source delivers it (boxed: a Pod is over 2 KiB even when empty).
#[derive(Debug, Clone)]
pub enum Object {
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    Pod(Box<Pod>),
    /// A Pod already reduced to its record: the Kubernetes source projects each Pod as it reads
    /// it, so a list of every Pod in the cluster is never held as full objects.
    PodRecord(NsName, Arc<PodRecord>),
    /// An EndpointSlice already reduced to its record, for the same reason.
    SliceRecord(NsName, Arc<SliceRecord>),
    /// An ExternalWorkload, checked; the Services selecting it get its addresses as endpoints.
    /// `None`: it was refused (logged where it was read); the version known before stays, also
    /// through a re-list.
    External(NsName, Option<Arc<ExternalRecord>>),
}

impl From<Service> for Object {
    fn from(o: Service) -> Self {
        Object::Service(Box::new(o))
    }
}

impl From<EndpointSlice> for Object {
    fn from(o: EndpointSlice) -> Self {
        Object::EndpointSlice(Box::new(o))
    }
}

impl From<Pod> for Object {
    fn from(o: Pod) -> Self {
        Object::Pod(Box::new(o))
    }
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::Pod(_) | Object::PodRecord(..) => Kind::Pod,
            Object::SliceRecord(..) => Kind::EndpointSlice,
            Object::External(..) => Kind::ExternalWorkload,
        }
    }

    pub fn key(&self) -> NsName {
        NsName::of(match self {
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
            Object::PodRecord(key, _) | Object::SliceRecord(key, _) | Object::External(key, _) => return key.clone(),
        })
    }
}

/// Ports listed in an opaque-ports annotation: single ports and `low-high` ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortSet(Vec<(u16, u16)>);

impl PortSet {
    /// Entries that are not ports are skipped with a warning rather than failing the object: one
    /// typo should not take a whole workload out of discovery.
    fn parse(owner: &NsName, value: &str) -> Self {
        let mut ranges = Vec::new();
        for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let range = match item.split_once('-') {
                Some((lo, hi)) => lo.trim().parse().ok().zip(hi.trim().parse().ok()),
                None => item.parse().ok().map(|p| (p, p)),
            };
            match range {
                Some((lo, hi)) if lo <= hi => ranges.push((lo, hi)),
                _ => {
                    tracing::warn!(object = %owner, annotation = OPAQUE_PORTS_ANNOTATION, item, "not a port or port range; ignored")
                }
            }
        }
        Self(ranges)
    }

    /// The opaque-ports annotation of an object (policy reads pods' too).
    pub fn of(owner: &NsName, meta: &ObjectMeta) -> Self {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(OPAQUE_PORTS_ANNOTATION))
            .map(|v| Self::parse(owner, v))
            .unwrap_or_default()
    }

    pub fn contains(&self, port: u16) -> bool {
        self.0.iter().any(|&(lo, hi)| (lo..=hi).contains(&port))
    }
}

/// Where a Service port sends traffic on its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetPort {
    Number(u16),
    /// A container port name, resolved per endpoint.
    Name(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub port: u16,
    /// Empty when unnamed (only allowed for single-port services); EndpointSlice ports carry the
    /// same name, which is how a slice port is matched to its service port.
    pub name: String,
    pub target: TargetPort,
    /// What its `appProtocol` declares ([`super::app_protocol`]); `None`: detect.
    pub app_protocol: Option<AppProtocol>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRecord {
    pub cluster_ips: Vec<IpAddr>,
    /// TCP ports only: the mesh carries nothing else.
    pub ports: Vec<ServicePort>,
    pub opaque_ports: PortSet,
    /// Its retry and timeout annotations, for its routes (outbound policy).
    pub route_defaults: ServiceDefaults,
    /// Its `balancer.cnimesh.io/failure-accrual…` annotations, for every client's balancer.
    pub failure_accrual: Option<FailureAccrual>,
    /// A mirror of a linked cluster's Service (`None` for the cluster's own).
    pub mirror: Option<ServiceMirror>,
    /// Its selector: the ExternalWorkloads it picks are endpoints beside its slices' (the
    /// endpoints controller writes no slice for them). Empty: it selects none.
    pub selector: BTreeMap<String, String>,
    /// Labelled `mirror.cnimesh.io/exported=true`: the one kind of Service this
    /// cluster's multicluster gateway forwards to ([`super::caller`]). A `remote-discovery`
    /// export is not: linked clusters reach its pods directly.
    pub gateway_exported: bool,
}

/// What a mirror Service says of the remote Service it stands for (the contract in
/// docs/tasks/multicluster.md): its name there, which a gateway endpoint's authority override
/// carries, and the cluster, which labels its traffic's metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceMirror {
    /// `name.ns.svc.<remote cluster domain>`; `None` on a federated Service (no one remote).
    pub remote_fq_name: Option<String>,
    /// `None` on a federated Service: each of its slices names its own.
    pub cluster: Option<String>,
}

impl ServiceMirror {
    fn of(meta: &ObjectMeta) -> Option<Self> {
        if !is_mirror(meta) {
            return None;
        }
        let annotation = |name: &str| meta.annotations.as_ref().and_then(|a| a.get(name)).cloned();
        let cluster = meta.labels.as_ref().and_then(|l| l.get(MIRROR_CLUSTER_NAME_LABEL)).cloned();
        Some(Self { remote_fq_name: annotation(MIRROR_REMOTE_SERVICE_ANNOTATION), cluster })
    }
}

/// Whether an object was written by the mirror controller (`mirror.cnimesh.io/mirrored-service`).
fn is_mirror(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().and_then(|l| l.get(MIRRORED_SERVICE_LABEL)).is_some_and(|v| v == "true")
}

impl ServiceRecord {
    /// What port `port` declares with its `appProtocol`.
    pub fn app_protocol(&self, port: u16) -> Option<AppProtocol> {
        self.ports.iter().find(|p| p.port == port).and_then(|p| p.app_protocol)
    }
}

impl ServiceRecord {
    pub fn from_k8s(svc: &Service) -> Self {
        let key = NsName::of(&svc.metadata);
        let spec = svc.spec.as_ref();
        let mut cluster_ips: Vec<IpAddr> = spec
            .and_then(|s| s.cluster_ips.clone())
            .unwrap_or_default()
            .into_iter()
            .chain(spec.and_then(|s| s.cluster_ip.clone()))
            .filter_map(|ip| ip.parse().ok()) // "None" for headless services.
            .collect();
        cluster_ips.sort();
        cluster_ips.dedup();
        let ports = service_ports(svc);
        let route_defaults = ServiceDefaults::from_annotations(&svc.metadata).unwrap_or_else(|e| {
            // As for opaque ports: one typo should not take the Service out of discovery.
            tracing::warn!(service = %key, reason = %e.0, "retry/timeout annotations ignored");
            ServiceDefaults::default()
        });
        let failure_accrual = FailureAccrual::from_annotations(&svc.metadata).unwrap_or_else(|e| {
            // As for the retry annotations: served without accrual, and said loudly.
            tracing::error!(service = %key, annotation = e.annotation, reason = %e.why, "failure accrual annotations rejected; the Service is served without failure accrual");
            None
        });
        let mirror = ServiceMirror::of(&svc.metadata);
        let gateway_exported = svc
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(MIRROR_EXPORTED_LABEL))
            .is_some_and(|v| v == MIRROR_EXPORTED_GATEWAY);
        Self {
            cluster_ips,
            ports,
            opaque_ports: PortSet::of(&key, &svc.metadata),
            route_defaults,
            failure_accrual,
            mirror,
            selector: spec.and_then(|s| s.selector.clone()).unwrap_or_default(),
            gateway_exported,
        }
    }
}

/// A Service's TCP ports: where each sends traffic on its endpoints and what it declares.
fn service_ports(svc: &Service) -> Vec<ServicePort> {
    svc.spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .filter(|p| is_tcp(p.protocol.as_deref()))
        .filter_map(|p| {
            let port = u16::try_from(p.port).ok()?;
            let target = match &p.target_port {
                None => TargetPort::Number(port),
                Some(IntOrString::Int(n)) => TargetPort::Number(u16::try_from(*n).ok()?),
                Some(IntOrString::String(s)) => match s.parse() {
                    Ok(n) => TargetPort::Number(n),
                    Err(_) => TargetPort::Name(s.clone()),
                },
            };
            let app_protocol = p.app_protocol.as_deref().and_then(AppProtocol::parse);
            Some(ServicePort { port, name: p.name.clone().unwrap_or_default(), target, app_protocol })
        })
        .collect()
}

/// What a Service declares about the pods it selects: its selector and the ports whose
/// `appProtocol` the mesh reads, with their targets. The inbound policy of those pods serves it
/// ([`crate::policy`]); the ports are read by the same code as [`ServiceRecord`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    /// Never empty: a Service without a selector selects no pod.
    pub selector: BTreeMap<String, String>,
    /// Only ports with a declared protocol; never empty.
    pub ports: Vec<ServicePort>,
}

impl Declaration {
    /// `None` for a Service that selects no pods or declares no port's protocol (most of them):
    /// nothing for inbound policy to keep.
    pub fn from_k8s(svc: &Service) -> Option<Self> {
        let selector = svc.spec.as_ref()?.selector.clone().filter(|s| !s.is_empty())?;
        let ports: Vec<ServicePort> = service_ports(svc).into_iter().filter(|p| p.app_protocol.is_some()).collect();
        (!ports.is_empty()).then_some(Self { selector, ports })
    }

    /// Whether it selects a pod with `labels` (equality on every selector label, as Kubernetes).
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// Two Services (or two ports of one) declare different protocols for the same pod port: the
/// owner's contradiction, which the mesh does not resolve by guessing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Services {} ({:?}) and {} ({:?}) declare different protocols for pod port {port}; it is detected",
    first.0, first.1, second.0, second.1
)]
pub struct Conflict {
    pub port: u16,
    pub first: (NsName, AppProtocol),
    pub second: (NsName, AppProtocol),
}

/// The protocol Services declare for `port` of a pod with `labels` and container ports
/// `named_ports`: what the inbound proxy of that pod may serve without detection. `services`
/// are the pod's namespace's Services that declare something. `Ok(None)`: none declares the
/// port; [`Conflict`]: two disagree, and the caller detects.
pub fn declared_for_pod_port<'a>(
    services: impl IntoIterator<Item = (&'a NsName, &'a Declaration)>,
    labels: &BTreeMap<String, String>,
    named_ports: &BTreeMap<String, u16>,
    port: u16,
) -> Result<Option<AppProtocol>, Conflict> {
    let mut declared: Option<(&NsName, AppProtocol)> = None;
    let targeting = services
        .into_iter()
        .filter(|(_, d)| d.selects(labels))
        .flat_map(|(key, d)| d.ports.iter().map(move |p| (key, p)))
        .filter(|(_, p)| match &p.target {
            TargetPort::Number(n) => *n == port,
            TargetPort::Name(name) => named_ports.get(name) == Some(&port),
        });
    for (key, protocol) in targeting.filter_map(|(key, p)| Some((key, p.app_protocol?))) {
        match declared {
            None => declared = Some((key, protocol)),
            Some((_, first)) if first == protocol => {}
            Some((first_key, first)) => {
                return Err(Conflict { port, first: (first_key.clone(), first), second: (key.clone(), protocol) });
            }
        }
    }
    Ok(declared.map(|(_, protocol)| protocol))
}

fn is_tcp(protocol: Option<&str>) -> bool {
    protocol.is_none_or(|p| p == "TCP")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceEndpoint {
    pub addr: IpAddr,
    pub ready: bool,
    /// The pod behind this address (`targetRef` of kind Pod), in the slice's namespace.
    pub pod: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceRecord {
    /// From the `kubernetes.io/service-name` label; a slice without it serves no service.
    pub service: Option<String>,
    /// Port name → number, TCP only; shared with every endpoint the index derives from the slice.
    pub ports: Arc<BTreeMap<String, u16>>,
    pub endpoints: Vec<SliceEndpoint>,
    /// Where a mirror slice's endpoints are (shared with every endpoint of the slice).
    pub mirror: Arc<SliceMirror>,
}

/// What a slice's annotations say about its endpoints, as the mirror controller wrote
/// them. Only these few strings are kept, never the slice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SliceMirror {
    /// Not a mirror slice: endpoints are this cluster's pods (identity from the pod).
    #[default]
    Local,
    /// A gateway export: the one endpoint is the remote cluster's gateway, proving `identity`;
    /// traffic goes to it with the transport header naming the remote Service.
    Gateway { identity: String, cluster: Option<String> },
    /// Remote discovery (flat network) or a federated member: endpoints are remote pods, all
    /// proving `identity` (`None`: unmeshed pods, plaintext), opaque on `opaque_ports`.
    Remote { identity: Option<String>, opaque_ports: PortSet, cluster: Option<String> },
}

impl SliceMirror {
    fn of(key: &NsName, meta: &ObjectMeta) -> Self {
        if !is_mirror(meta) {
            return Self::Local;
        }
        let annotations = meta.annotations.as_ref();
        let annotation = |name: &str| annotations.and_then(|a| a.get(name)).cloned();
        let cluster = meta.labels.as_ref().and_then(|l| l.get(MIRROR_CLUSTER_NAME_LABEL)).cloned();
        match annotation(MIRROR_GATEWAY_IDENTITY_ANNOTATION) {
            Some(identity) => Self::Gateway { identity, cluster },
            None => Self::Remote {
                identity: annotation(MIRROR_REMOTE_IDENTITY_ANNOTATION),
                opaque_ports: annotation(MIRROR_REMOTE_OPAQUE_PORTS_ANNOTATION)
                    .map(|v| PortSet::parse(key, &v))
                    .unwrap_or_default(),
                cluster,
            },
        }
    }

    /// The cluster its endpoints are in, when a mirror slice names it.
    pub fn cluster(&self) -> Option<&str> {
        match self {
            Self::Local => None,
            Self::Gateway { cluster, .. } | Self::Remote { cluster, .. } => cluster.as_deref(),
        }
    }
}

impl SliceRecord {
    pub fn from_k8s(slice: &EndpointSlice) -> Self {
        let service = slice.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)).cloned();
        let ports = slice
            .ports
            .iter()
            .flatten()
            .filter(|p| is_tcp(p.protocol.as_deref()))
            .filter_map(|p| Some((p.name.clone().unwrap_or_default(), u16::try_from(p.port?).ok()?)))
            .collect::<BTreeMap<_, _>>()
            .into();
        // FQDN slices carry names, not addresses; the mesh resolves IPs only.
        let family_ok = matches!(slice.address_type.as_str(), "IPv4" | "IPv6");
        let endpoints = slice
            .endpoints
            .iter()
            .filter(|_| family_ok)
            .flat_map(|ep| {
                // The API documents a missing `ready` as "unknown, treat as ready".
                let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                let pod =
                    ep.target_ref.as_ref().filter(|r| r.kind.as_deref() == Some("Pod")).and_then(|r| r.name.clone());
                ep.addresses
                    .iter()
                    .filter_map(move |a| Some(SliceEndpoint { addr: a.parse().ok()?, ready, pod: pod.clone() }))
            })
            .collect();
        let mirror = Arc::new(SliceMirror::of(&NsName::of(&slice.metadata), &slice.metadata));
        Self { service, ports, endpoints, mirror }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRecord {
    /// Empty for pods whose IP says nothing about them: host-network pods share the node's, and
    /// finished pods have given theirs back.
    pub ips: Vec<IpAddr>,
    pub meshed: bool,
    pub service_account: String,
    pub opaque_ports: PortSet,
    /// Container port name → number, for Services whose targetPort is a name.
    pub named_ports: BTreeMap<String, u16>,
    /// The workloads it belongs to, kind (lower case) → name, for tap to find a resource's pods:
    /// its controller from the owner references (a Deployment's ReplicaSet as both), overridden
    /// by the owner labels the injector wrote (`cnimesh.io/proxy-<kind>`).
    pub workloads: BTreeMap<String, String>,
}

impl PodRecord {
    pub fn from_k8s(pod: &Pod) -> Self {
        let key = NsName::of(&pod.metadata);
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let finished = matches!(status.and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        let mut ips: Vec<IpAddr> = if host_network || finished {
            Vec::new()
        } else {
            status
                .and_then(|s| s.pod_ips.as_ref())
                .into_iter()
                .flatten()
                .map(|p| p.ip.as_str())
                .chain(status.and_then(|s| s.pod_ip.as_deref()))
                .filter_map(|ip| ip.parse().ok())
                .collect()
        };
        ips.sort();
        ips.dedup();
        let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
        let init_containers = spec.and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
        // A native sidecar is an init container that keeps running (restartPolicy Always).
        let meshed = containers.iter().any(|c| c.name == PROXY_CONTAINER)
            || init_containers
                .iter()
                .any(|c| c.name == PROXY_CONTAINER && c.restart_policy.as_deref() == Some("Always"));
        let named_ports = containers
            .iter()
            .chain(init_containers.iter().filter(|c| c.restart_policy.as_deref() == Some("Always")))
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| is_tcp(p.protocol.as_deref()))
            .filter_map(|p| Some((p.name.clone()?, u16::try_from(p.container_port).ok()?)))
            .collect();
        let service_account = spec
            .and_then(|s| s.service_account_name.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".to_string());
        Self {
            ips,
            meshed,
            service_account,
            opaque_ports: PortSet::of(&key, &pod.metadata),
            named_ports,
            workloads: workloads_of(&pod.metadata),
        }
    }
}

impl PodRecord {
    /// An ExternalWorkload as an endpoint: meshed (it runs a proxy), with its identity, its named
    /// ports and its opaque-ports annotation, and the one workload it is (`externalworkload`).
    pub fn of_external(key: &NsName, workload: &ExternalRecord) -> Self {
        let opaque_ports =
            workload.annotations.get(OPAQUE_PORTS_ANNOTATION).map(|v| PortSet::parse(key, v)).unwrap_or_default();
        Self {
            ips: workload.ips.clone(),
            meshed: true,
            service_account: workload.service_account.clone(),
            opaque_ports,
            named_ports: workload.named_ports.clone(),
            workloads: BTreeMap::from([(EXTERNAL_KIND.to_string(), key.name.clone())]),
        }
    }

    /// Whether it stands for an ExternalWorkload rather than a pod.
    pub fn is_external(&self) -> bool {
        self.workloads.contains_key(EXTERNAL_KIND)
    }
}

/// See [`PodRecord::workloads`].
fn workloads_of(meta: &ObjectMeta) -> BTreeMap<String, String> {
    let mut workloads: BTreeMap<String, String> = meta
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.controller == Some(true))
        .map(|o| (o.kind.to_lowercase(), o.name.clone()))
        .collect();
    if let Some(owner) = Workload::of_pod(meta) {
        workloads.insert(owner.kind, owner.name);
    }
    for (key, value) in meta.labels.iter().flatten() {
        if let Some(kind) = key.strip_prefix(OWNER_LABEL_PREFIX).filter(|k| OWNER_KINDS.contains(k)) {
            workloads.insert(kind.to_string(), value.clone());
        }
    }
    workloads
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_yaml<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn opaque_ports_take_lists_and_ranges_and_skip_junk() {
        let set = PortSet::parse(&NsName::new("ns", "p"), "3306, 8000-8002,nope,9-1,");
        assert!(set.contains(3306) && set.contains(8001) && !set.contains(8003) && !set.contains(9));
    }

    #[test]
    fn native_sidecar_marks_a_pod_meshed_and_sa_defaults() {
        let pod: Pod = from_yaml(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: n}\nspec:\n  initContainers:\n  - {name: cnimesh-proxy, restartPolicy: Always}\n  containers:\n  - name: app\n    ports: [{name: web, containerPort: 8080}]\nstatus: {podIP: 10.0.0.1, podIPs: [{ip: 10.0.0.1}, {ip: 'fd00::1'}]}\n",
        );
        let rec = PodRecord::from_k8s(&pod);
        assert!(rec.meshed);
        assert_eq!(rec.service_account, "default");
        assert_eq!(rec.ips.len(), 2);
        assert_eq!(rec.named_ports.get("web"), Some(&8080));
    }

    #[test]
    fn workloads_come_from_the_controller_and_the_owner_labels() {
        let pod: Pod = from_yaml(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-abc-1\n  labels: {pod-template-hash: abc, cnimesh.io/proxy-deployment: web, cnimesh.io/workload-ns: shop}\n  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-abc, uid: u, controller: true}]\nspec: {containers: [{name: app}]}\n",
        );
        let workloads = PodRecord::from_k8s(&pod).workloads;
        assert_eq!(workloads.get("replicaset").map(String::as_str), Some("web-abc"));
        assert_eq!(workloads.get("deployment").map(String::as_str), Some("web"));
        assert_eq!(workloads.len(), 2, "{workloads:?}");
    }

    #[test]
    fn plain_init_container_named_like_the_proxy_is_not_a_sidecar() {
        let pod: Pod = from_yaml(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  initContainers: [{name: cnimesh-proxy}]\n  containers: [{name: app}]\n",
        );
        assert!(!PodRecord::from_k8s(&pod).meshed);
    }

    #[test]
    fn slice_readiness_defaults_to_ready() {
        let slice: EndpointSlice = from_yaml(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}, {name: dns, port: 53, protocol: UDP}]\nendpoints:\n- addresses: [10.0.0.1]\n- addresses: [10.0.0.2]\n  conditions: {ready: false}\n",
        );
        let rec = SliceRecord::from_k8s(&slice);
        assert_eq!(rec.service.as_deref(), Some("web"));
        assert_eq!(rec.ports.len(), 1);
        assert_eq!(rec.endpoints.iter().map(|e| e.ready).collect::<Vec<_>>(), [true, false]);
    }

    #[test]
    fn a_pod_ports_declared_protocol_comes_from_the_services_that_select_it() {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "shop"},
            "spec": {
                "selector": {"app": "db"},
                "ports": [
                    {"port": 5432, "targetPort": "pg", "appProtocol": "cnimesh.io/opaque"},
                    {"port": 80, "targetPort": 8080, "appProtocol": "http"},
                    {"port": 81, "targetPort": 8081, "appProtocol": "https"},
                ],
            },
        }))
        .unwrap();
        let record = Declaration::from_k8s(&svc).expect("declares ports");
        assert_eq!(record.ports.len(), 2, "only the ports it declares: {record:?}");
        let key = NsName::new("shop", "db");
        let labels: BTreeMap<String, String> = [("app".to_string(), "db".to_string())].into();
        let named: BTreeMap<String, u16> = [("pg".to_string(), 15432)].into();
        let declared = |labels: &BTreeMap<String, String>, port| {
            declared_for_pod_port([(&key, &record)], labels, &named, port).unwrap()
        };
        assert_eq!(declared(&labels, 15432), Some(AppProtocol::Opaque), "a named targetPort");
        assert_eq!(declared(&labels, 8080), Some(AppProtocol::Http1));
        assert_eq!(declared(&labels, 8081), None, "not a value the mesh declares");
        assert_eq!(declared(&labels, 9999), None, "no Service port targets it");
        assert_eq!(declared(&BTreeMap::new(), 8080), None, "the Service does not select the pod");

        // A second Service that says otherwise for the same pod port: a conflict, never a guess;
        // one that agrees is no conflict.
        let other = |app_protocol: &str| {
            let svc: Service = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "db-admin", "namespace": "shop"},
                "spec": {"selector": {"app": "db"}, "ports": [{"port": 8080, "appProtocol": app_protocol}]},
            }))
            .unwrap();
            Declaration::from_k8s(&svc).unwrap()
        };
        let (admin_key, agrees, disagrees) =
            (NsName::new("shop", "db-admin"), other("http"), other("kubernetes.io/h2c"));
        let both = |second: &Declaration| {
            declared_for_pod_port([(&key, &record), (&admin_key, second)], &labels, &named, 8080)
        };
        assert_eq!(both(&agrees), Ok(Some(AppProtocol::Http1)));
        let conflict = both(&disagrees).unwrap_err();
        assert_eq!((conflict.first.0.name.as_str(), conflict.second.0.name.as_str()), ("db", "db-admin"));
        assert!(conflict.to_string().contains("shop/db-admin"), "{conflict}");
    }

    #[test]
    fn services_that_select_nothing_or_declare_nothing_are_not_kept() {
        let svc = |spec: serde_json::Value| {
            let svc: Service =
                serde_json::from_value(serde_json::json!({"metadata": {"name": "s"}, "spec": spec})).unwrap();
            Declaration::from_k8s(&svc)
        };
        assert_eq!(svc(serde_json::json!({"ports": [{"port": 80, "appProtocol": "http"}]})), None, "no selector");
        assert_eq!(svc(serde_json::json!({"selector": {}, "ports": [{"port": 80, "appProtocol": "http"}]})), None);
        assert_eq!(
            svc(serde_json::json!({"selector": {"app": "a"}, "ports": [{"port": 80}]})),
            None,
            "nothing declared"
        );
    }
}
