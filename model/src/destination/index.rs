//! The one in-memory view of the cluster that every stream reads from.
//!
//! Sources push [`Change`]s in; streams subscribe to a service or an IP and get a
//! `tokio::sync::watch` receiver holding a shared snapshot. Channels exist only for keys someone
//! watches, a change recomputes only the snapshots it touched, and a snapshot that comes out equal
//! to the last one wakes nobody. So an idle stream costs a receiver and its last-sent set, and the
//! work per change is proportional to the services it touches, not to the number of streams.
//!
//! Layer: model/index (pure): no kube client, no tonic; sources write it, gRPC reads it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

use tokio::sync::watch;

use super::Config;
use super::updates::PortEndpoints;

use super::model::{KINDS, Kind, Object, PodRecord, ServiceRecord, SliceMirror, SliceRecord};
use crate::external::ExternalRecord;
use crate::meta::NsName;

/// One update from a source. Sources batch them so that readers never see half of a change (a
/// re-list, or a file holding a Service and its EndpointSlice). Generic over the kinds and
/// objects so the policy index takes its updates in the same shape (`crate::policy::index::Change`).
#[derive(Debug, Clone)]
pub enum Change<K = Kind, O = Object> {
    /// Create or replace an object.
    Upsert(O),
    /// Remove an object; unknown objects are ignored.
    Delete(K, NsName),
    /// The complete set of objects of a kind, as after a (re-)list: anything not in it goes.
    /// Implies `Listed`.
    Reset(K, Vec<O>),
    /// Every object of the kind has been delivered (the end of an initial load). The index is
    /// ready once each kind has been listed.
    Listed(K),
}

/// A ready endpoint of a service, with what the resolver needs to turn it into an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: IpAddr,
    /// The slice's ports (name → number), shared by all endpoints of the slice.
    pub ports: Arc<BTreeMap<String, u16>>,
    pub pod: Option<(String, Arc<PodRecord>)>,
    /// The slice's mirror annotations (`Local` for this cluster's pods).
    pub mirror: Arc<SliceMirror>,
}

pub struct ServiceSnapshot {
    pub key: NsName,
    pub service: Arc<ServiceRecord>,
    pub endpoints: Vec<Endpoint>,
    /// Answers already worked out from this snapshot, for the resolver: all streams of a service
    /// port share one (the endpoints and the encoded updates into them), so a change costs one
    /// resolution and one encoding however many streams follow it.
    pub resolved: Mutex<Vec<Resolved>>,
}

/// The endpoints of one port under one configuration.
pub type Resolved = (u16, Arc<Config>, Arc<PortEndpoints>);

/// Snapshots are compared to decide whether anyone needs waking; the cache is not state.
impl PartialEq for ServiceSnapshot {
    fn eq(&self, other: &Self) -> bool {
        (&self.key, &self.service, &self.endpoints) == (&other.key, &other.service, &other.endpoints)
    }
}

impl Eq for ServiceSnapshot {}

impl std::fmt::Debug for ServiceSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceSnapshot")
            .field("key", &self.key)
            .field("service", &self.service)
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

/// `None` while the service does not exist.
pub type ServiceView = Option<Arc<ServiceSnapshot>>;

/// What an IP address is, for GetProfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpView {
    Unknown,
    Service(NsName, Arc<ServiceRecord>),
    Pod(NsName, Arc<PodRecord>),
}

/// Object counts, for logs and the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexStats {
    pub services: usize,
    pub endpoint_slices: usize,
    pub pods: usize,
    /// Keys (services and IPs) that currently have a channel.
    pub watched: usize,
}

/// The cluster state shared by the sources (writers) and the Destination service (readers).
/// Cloning is cheap: all clones are the same index.
#[derive(Clone)]
pub struct Index {
    state: Arc<Mutex<State>>,
    /// Whether every kind has been loaded in full. Until then an answer could claim that a service
    /// does not exist when it merely has not been listed yet, so the service waits for this.
    ready: Arc<watch::Sender<bool>>,
}

impl Default for Index {
    fn default() -> Self {
        Self { state: Arc::default(), ready: Arc::new(watch::channel(false).0) }
    }
}

/// Watch channels for keys that someone subscribed to. Dropped streams leave senders without
/// receivers behind; they are swept when the map has doubled since the last sweep, so a stream of
/// one-off lookups (GetProfile for every external IP) cannot grow it without bound.
struct Channels<K, V> {
    map: HashMap<K, watch::Sender<V>>,
    sweep_at: usize,
}

impl<K: Eq + Hash + Clone, V: PartialEq> Channels<K, V> {
    fn subscribe(&mut self, key: &K, init: impl FnOnce() -> V) -> watch::Receiver<V> {
        if let Some(tx) = self.map.get(key) {
            if tx.receiver_count() == 0 {
                tx.send_replace(init()); // Not kept current while nobody watched; see publish.
            }
            return tx.subscribe();
        }
        if self.map.len() >= self.sweep_at {
            self.map.retain(|_, tx| tx.receiver_count() > 0);
            self.sweep_at = (self.map.len() * 2).max(64);
        }
        let (tx, rx) = watch::channel(init());
        self.map.insert(key.clone(), tx);
        rx
    }

    /// Channels whose streams have all gone are left stale until the sweep or a new subscriber.
    fn publish(&self, key: &K, compute: impl FnOnce() -> V) {
        if let Some(tx) = self.map.get(key).filter(|tx| tx.receiver_count() > 0) {
            let view = compute();
            tx.send_if_modified(|current| {
                let changed = *current != view;
                if changed {
                    *current = view;
                }
                changed
            });
        }
    }
}

impl<K, V> Default for Channels<K, V> {
    fn default() -> Self {
        Self { map: HashMap::new(), sweep_at: 64 }
    }
}

#[derive(Default)]
struct State {
    services: HashMap<NsName, Arc<ServiceRecord>>,
    slices: HashMap<NsName, Arc<SliceRecord>>,
    pods: HashMap<NsName, Arc<PodRecord>>,
    /// Service → names of its slices (same namespace), sorted so snapshots are stable.
    slices_of: HashMap<NsName, BTreeSet<String>>,
    cluster_ips: HashMap<IpAddr, NsName>,
    pod_ips: HashMap<IpAddr, NsName>,
    /// ExternalWorkloads (as endpoint records) and their addresses; the Services of their
    /// namespace whose selector picks them list them as endpoints.
    externals: HashMap<NsName, (Arc<ExternalRecord>, Arc<PodRecord>)>,
    external_ips: HashMap<IpAddr, NsName>,
    /// Endpoint address → slices listing it: which services a pod change touches. Nearly every
    /// address is in one slice, so a list without duplicates, sized for one, rather than a set
    /// (whose smallest table holds four keys: about 170 bytes more per endpoint).
    slice_ips: HashMap<IpAddr, Vec<NsName>>,
    service_channels: Channels<NsName, ServiceView>,
    ip_channels: Channels<IpAddr, IpView>,
    dirty_services: HashSet<NsName>,
    dirty_ips: HashSet<IpAddr>,
    listed: BTreeSet<Kind>,
}

impl Index {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies changes as one step and wakes the streams whose answer changed.
    pub fn apply(&self, changes: impl IntoIterator<Item = Change>) {
        let mut state = self.lock();
        for change in changes {
            match change {
                Change::Upsert(object) => state.upsert(object),
                Change::Delete(kind, key) => state.delete(kind, &key),
                Change::Listed(kind) => {
                    state.listed.insert(kind);
                }
                Change::Reset(kind, objects) => {
                    state.listed.insert(kind);
                    let keep: HashSet<NsName> = objects.iter().map(Object::key).collect();
                    for key in state.keys(kind).into_iter().filter(|k| !keep.contains(k)) {
                        state.delete(kind, &key);
                    }
                    objects.into_iter().for_each(|o| state.upsert(o));
                }
            }
        }
        state.publish();
        if KINDS.iter().all(|kind| state.listed.contains(kind)) {
            self.ready.send_if_modified(|ready| !std::mem::replace(ready, true));
        }
    }

    /// Whether every kind has been loaded in full (for readiness probes).
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until [`Index::is_ready`].
    pub async fn ready(&self) {
        // The sender lives as long as `self`, so waiting cannot fail.
        let _ = self.ready.subscribe().wait_for(|ready| *ready).await;
    }

    pub fn stats(&self) -> IndexStats {
        let state = self.lock();
        IndexStats {
            services: state.services.len(),
            endpoint_slices: state.slices.len(),
            pods: state.pods.len(),
            watched: state.service_channels.map.len() + state.ip_channels.map.len(),
        }
    }

    /// The pods of `namespace` (every namespace with `None`) that `keep` accepts, sorted by
    /// namespace and name: how tap finds a resource's proxies without a second pod watch.
    pub fn pods(
        &self,
        namespace: Option<&str>,
        keep: impl Fn(&NsName, &PodRecord) -> bool,
    ) -> Vec<(NsName, Arc<PodRecord>)> {
        let state = self.lock();
        let mut pods: Vec<(NsName, Arc<PodRecord>)> = state
            .pods
            .iter()
            .filter(|(key, pod)| namespace.is_none_or(|ns| key.namespace == ns) && keep(key, pod))
            .map(|(key, pod)| (key.clone(), pod.clone()))
            .collect();
        pods.sort_by(|a, b| a.0.cmp(&b.0));
        pods
    }

    /// The ClusterIPs of the Services whose EndpointSlices list any of `ips`: where a client
    /// sends traffic meant for those pods (tap's `to`; proxies see the ClusterIP as the
    /// destination of outbound requests).
    pub fn cluster_ips_serving(&self, ips: &[IpAddr]) -> Vec<IpAddr> {
        let state = self.lock();
        let mut found: Vec<IpAddr> = ips
            .iter()
            .flat_map(|ip| state.slice_ips.get(ip).into_iter().flatten())
            .filter_map(|slice| {
                let service = state.slices.get(slice)?.service.as_ref()?;
                state.services.get(&NsName::new(&slice.namespace, service))
            })
            .flat_map(|service| service.cluster_ips.iter().copied())
            .collect();
        found.sort();
        found.dedup();
        found
    }

    pub fn watch_service(&self, key: &NsName) -> watch::Receiver<ServiceView> {
        let mut state = self.lock();
        let state = &mut *state;
        let (view, channels) = (state.service_view(key), &mut state.service_channels);
        channels.subscribe(key, || view)
    }

    pub fn watch_ip(&self, ip: IpAddr) -> watch::Receiver<IpView> {
        let mut state = self.lock();
        let state = &mut *state;
        let (view, channels) = (state.ip_view(ip), &mut state.ip_channels);
        channels.subscribe(&ip, || view)
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }
}

impl State {
    fn keys(&self, kind: Kind) -> Vec<NsName> {
        match kind {
            Kind::Service => self.services.keys().cloned().collect(),
            Kind::EndpointSlice => self.slices.keys().cloned().collect(),
            Kind::Pod => self.pods.keys().cloned().collect(),
            Kind::ExternalWorkload => self.externals.keys().cloned().collect(),
        }
    }

    fn upsert(&mut self, object: Object) {
        let key = object.key();
        match object {
            Object::Service(svc) => {
                let record = ServiceRecord::from_k8s(&svc);
                if self.services.get(&key).is_some_and(|old| **old == record) {
                    return;
                }
                self.delete(Kind::Service, &key);
                for ip in &record.cluster_ips {
                    self.cluster_ips.insert(*ip, key.clone());
                    self.dirty_ips.insert(*ip);
                }
                self.services.insert(key.clone(), Arc::new(record));
                self.dirty_services.insert(key);
            }
            Object::EndpointSlice(slice) => {
                self.upsert(Object::SliceRecord(key, Arc::new(SliceRecord::from_k8s(&slice))))
            }
            Object::SliceRecord(_, record) => {
                if self.slices.get(&key).is_some_and(|old| *old == record) {
                    return;
                }
                self.delete(Kind::EndpointSlice, &key);
                for ep in &record.endpoints {
                    // Room for one: a first push would make room for four.
                    let slices = self.slice_ips.entry(ep.addr).or_insert_with(|| Vec::with_capacity(1));
                    if !slices.contains(&key) {
                        slices.push(key.clone());
                    }
                }
                if let Some(service) = &record.service {
                    let svc = NsName::new(&key.namespace, service);
                    self.slices_of.entry(svc.clone()).or_default().insert(key.name.clone());
                    self.dirty_services.insert(svc);
                }
                self.slices.insert(key, record);
            }
            Object::Pod(pod) => self.upsert(Object::PodRecord(key, Arc::new(PodRecord::from_k8s(&pod)))),
            Object::PodRecord(_, record) => {
                if self.pods.get(&key).is_some_and(|old| *old == record) {
                    return;
                }
                self.delete(Kind::Pod, &key);
                for ip in &record.ips {
                    self.pod_ips.insert(*ip, key.clone());
                }
                self.touch_pod(&record);
                self.pods.insert(key, record);
            }
            Object::External(_, None) => {}
            Object::External(_, Some(record)) => {
                if self.externals.get(&key).is_some_and(|(old, _)| *old == record) {
                    return;
                }
                self.delete(Kind::ExternalWorkload, &key);
                let endpoint = Arc::new(PodRecord::of_external(&key, &record));
                for ip in &record.ips {
                    self.external_ips.insert(*ip, key.clone());
                }
                self.touch_external(&key, &record);
                self.externals.insert(key, (record, endpoint));
            }
        }
    }

    /// Marks what an ExternalWorkload feeds: profiles of its addresses and every Service of its
    /// namespace (any may select it, before or after the change).
    fn touch_external(&mut self, key: &NsName, record: &ExternalRecord) {
        self.dirty_ips.extend(record.ips.iter().copied());
        let services = self.services.keys().filter(|s| s.namespace == key.namespace).cloned();
        self.dirty_services.extend(services.collect::<Vec<_>>());
    }

    fn delete(&mut self, kind: Kind, key: &NsName) {
        match kind {
            Kind::Service => {
                let Some(old) = self.services.remove(key) else { return };
                for ip in &old.cluster_ips {
                    if self.cluster_ips.get(ip) == Some(key) {
                        self.cluster_ips.remove(ip);
                    }
                    self.dirty_ips.insert(*ip);
                }
                self.dirty_services.insert(key.clone());
            }
            Kind::EndpointSlice => {
                let Some(old) = self.slices.remove(key) else { return };
                for ep in &old.endpoints {
                    if let Some(slices) = self.slice_ips.get_mut(&ep.addr) {
                        slices.retain(|slice| slice != key);
                        if slices.is_empty() {
                            self.slice_ips.remove(&ep.addr);
                        }
                    }
                }
                if let Some(service) = &old.service {
                    let svc = NsName::new(&key.namespace, service);
                    if let Some(names) = self.slices_of.get_mut(&svc) {
                        names.remove(&key.name);
                        if names.is_empty() {
                            self.slices_of.remove(&svc);
                        }
                    }
                    self.dirty_services.insert(svc);
                }
            }
            Kind::Pod => {
                let Some(old) = self.pods.remove(key) else { return };
                for ip in &old.ips {
                    if self.pod_ips.get(ip) == Some(key) {
                        self.pod_ips.remove(ip);
                    }
                }
                self.touch_pod(&old);
            }
            Kind::ExternalWorkload => {
                let Some((old, _)) = self.externals.remove(key) else { return };
                for ip in &old.ips {
                    if self.external_ips.get(ip) == Some(key) {
                        self.external_ips.remove(ip);
                    }
                }
                self.touch_external(key, &old);
            }
        }
    }

    /// Marks what a pod's IPs feed: profiles of those IPs and services listing them.
    fn touch_pod(&mut self, pod: &PodRecord) {
        for ip in &pod.ips {
            self.dirty_ips.insert(*ip);
            for slice_key in self.slice_ips.get(ip).into_iter().flatten() {
                if let Some(service) = self.slices.get(slice_key).and_then(|s| s.service.as_ref()) {
                    self.dirty_services.insert(NsName::new(&slice_key.namespace, service));
                }
            }
        }
    }

    fn publish(&mut self) {
        for key in std::mem::take(&mut self.dirty_services) {
            self.service_channels.publish(&key, || self.service_view(&key));
        }
        for ip in std::mem::take(&mut self.dirty_ips) {
            self.ip_channels.publish(&ip, || self.ip_view(ip));
        }
    }

    fn service_view(&self, key: &NsName) -> ServiceView {
        let service = self.services.get(key)?.clone();
        let mut seen = HashSet::new();
        let mut endpoints = Vec::new();
        for slice_name in self.slices_of.get(key).into_iter().flatten() {
            let Some(slice) = self.slices.get(&NsName::new(&key.namespace, slice_name)) else { continue };
            // An address listed by two slices (as during a slice split) is one endpoint.
            for ep in slice.endpoints.iter().filter(|ep| ep.ready && seen.insert(ep.addr)) {
                // A mirror slice's addresses are in another cluster: never one of our pods.
                let local = *slice.mirror == SliceMirror::Local;
                let pod = ep
                    .pod
                    .as_ref()
                    .filter(|_| local)
                    .map(|name| NsName::new(&key.namespace, name))
                    .or_else(|| self.pod_ips.get(&ep.addr).filter(|p| local && p.namespace == key.namespace).cloned())
                    .and_then(|k| Some((k.name.clone(), self.pods.get(&k)?.clone())));
                endpoints.push(Endpoint {
                    addr: ep.addr,
                    ports: slice.ports.clone(),
                    pod,
                    mirror: slice.mirror.clone(),
                });
            }
        }
        self.external_endpoints(key, &service, &mut seen, &mut endpoints);
        Some(Arc::new(ServiceSnapshot { key: key.clone(), service, endpoints, resolved: Mutex::default() }))
    }

    /// The addresses of the ExternalWorkloads of the Service's namespace that its selector picks
    /// (not revoked ones: their certificates are on their way out), sorted by name so snapshots
    /// are stable. No slice lists them: the port is the Service's target, by number or by the
    /// workload's port name.
    fn external_endpoints(
        &self,
        key: &NsName,
        service: &ServiceRecord,
        seen: &mut HashSet<IpAddr>,
        endpoints: &mut Vec<Endpoint>,
    ) {
        if service.selector.is_empty() || service.mirror.is_some() {
            return;
        }
        let mut picked: Vec<(&NsName, &Arc<PodRecord>)> = self
            .externals
            .iter()
            .filter(|(k, (record, _))| {
                k.namespace == key.namespace && !record.revoked && record.selected_by(&service.selector)
            })
            .map(|(k, (_, endpoint))| (k, endpoint))
            .collect();
        picked.sort_by(|a, b| a.0.cmp(b.0));
        let (ports, mirror) = (Arc::new(BTreeMap::new()), Arc::new(SliceMirror::Local));
        for (workload, endpoint) in picked {
            for ip in endpoint.ips.iter().filter(|ip| seen.insert(**ip)) {
                endpoints.push(Endpoint {
                    addr: *ip,
                    ports: ports.clone(),
                    pod: Some((workload.name.clone(), endpoint.clone())),
                    mirror: mirror.clone(),
                });
            }
        }
    }

    /// A ClusterIP wins over a pod IP: the two ranges never overlap in a sane cluster, and a
    /// service address must keep load balancing.
    fn ip_view(&self, ip: IpAddr) -> IpView {
        if let Some((key, svc)) = self.cluster_ips.get(&ip).and_then(|k| Some((k, self.services.get(k)?))) {
            return IpView::Service(key.clone(), svc.clone());
        }
        if let Some((key, pod)) = self.pod_ips.get(&ip).and_then(|k| Some((k, self.pods.get(k)?))) {
            return IpView::Pod(key.clone(), pod.clone());
        }
        // An ExternalWorkload's address is answered as its one endpoint, with its identity.
        match self.external_ips.get(&ip).and_then(|k| Some((k, self.externals.get(k)?))) {
            Some((key, (record, endpoint))) if !record.revoked => IpView::Pod(key.clone(), endpoint.clone()),
            _ => IpView::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(yaml: &str) -> Object {
        let value: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        match value["kind"].as_str() {
            Some("Service") => {
                Object::from(serde_json::from_value::<k8s_openapi::api::core::v1::Service>(value).unwrap())
            }
            Some("Pod") => Object::from(serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(value).unwrap()),
            _ => Object::from(serde_json::from_value::<k8s_openapi::api::discovery::v1::EndpointSlice>(value).unwrap()),
        }
    }

    fn web() -> Object {
        object(
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n",
        )
    }

    fn slice() -> Object {
        object(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-a, namespace: ns, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: [10.0.0.1]}]\n",
        )
    }

    fn pod(meshed: bool) -> Object {
        let proxy = if meshed { ", {name: cnimesh-proxy}" } else { "" };
        object(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: ns}}\nspec: {{containers: [{{name: app}}{proxy}]}}\nstatus: {{podIP: 10.0.0.1}}\n"
        ))
    }

    fn key() -> NsName {
        NsName::new("ns", "web")
    }

    #[test]
    fn unchanged_objects_wake_nobody() {
        let index = Index::new();
        index.apply([Change::Upsert(web()), Change::Upsert(slice())]);
        let mut rx = index.watch_service(&key());
        rx.borrow_and_update();
        index.apply([Change::Upsert(web()), Change::Reset(Kind::EndpointSlice, vec![slice()])]);
        assert!(!rx.has_changed().unwrap());
        index.apply([Change::Delete(Kind::EndpointSlice, NsName::new("ns", "web-a"))]);
        assert!(rx.has_changed().unwrap());
        assert!(rx.borrow_and_update().as_ref().unwrap().endpoints.is_empty());
    }

    #[test]
    fn pod_changes_reach_the_services_listing_it_and_its_ip() {
        let index = Index::new();
        index.apply([Change::Upsert(web()), Change::Upsert(slice()), Change::Upsert(pod(false))]);
        let mut svc = index.watch_service(&key());
        let mut ip = index.watch_ip("10.0.0.1".parse().unwrap());
        assert!(!svc.borrow_and_update().as_ref().unwrap().endpoints[0].pod.as_ref().unwrap().1.meshed);
        ip.borrow_and_update();
        index.apply([Change::Upsert(pod(true))]);
        assert!(svc.borrow_and_update().as_ref().unwrap().endpoints[0].pod.as_ref().unwrap().1.meshed);
        assert!(matches!(&*ip.borrow_and_update(), IpView::Pod(_, p) if p.meshed));
        // The ClusterIP names the service.
        assert!(
            matches!(&*index.watch_ip("10.96.0.1".parse().unwrap()).borrow(), IpView::Service(k, _) if *k == key())
        );
    }

    #[test]
    fn a_channel_left_by_all_streams_is_current_again_for_the_next() {
        let index = Index::new();
        index.apply([Change::Upsert(web())]);
        drop(index.watch_service(&key()));
        index.apply([Change::Upsert(slice())]);
        assert_eq!(index.watch_service(&key()).borrow().as_ref().unwrap().endpoints.len(), 1);
    }

    fn db_service() -> Object {
        object(
            "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: ns}\nspec: {clusterIP: 10.96.0.9, selector: {app: db}, ports: [{name: pg, port: 5432, targetPort: pg}, {name: admin, port: 80, targetPort: 9000}]}\n",
        )
    }

    fn external(name: &str, labels: &str, ips: &str, revoked: bool) -> Object {
        let workload: crate::external::ExternalWorkload = serde_saphyr::from_str(&format!(
            "apiVersion: workload.cnimesh.io/v1alpha1\nkind: ExternalWorkload\nmetadata: {{name: {name}, namespace: ns, labels: {labels}}}\nspec: {{workloadIPs: {ips}, ports: [{{name: pg, port: 15432}}], serviceAccountName: db, revoked: {revoked}}}\n"
        ))
        .unwrap();
        let record = crate::external::ExternalRecord::from_crd(&workload).ok().map(Arc::new);
        Object::External(NsName::new("ns", name), record)
    }

    fn resolved(index: &Index, port: u16) -> Vec<(String, Option<String>)> {
        let rx = index.watch_service(&NsName::new("ns", "db"));
        let snapshot = rx.borrow().clone().expect("the service exists");
        let config = Arc::new(Config::default());
        super::super::resolve::service_endpoints(&snapshot, port, &config)
            .iter()
            .map(|(addr, weighted)| {
                let identity = weighted.tls_identity.as_ref().and_then(|t| match &t.strategy {
                    Some(linkerd2_proxy_api::destination::tls_identity::Strategy::DnsLikeIdentity(d)) => {
                        Some(d.name.clone())
                    }
                    _ => None,
                });
                (addr.to_string(), identity)
            })
            .collect()
    }

    #[test]
    fn a_service_selecting_an_external_workload_serves_its_addresses_with_its_identity() {
        let index = Index::new();
        index.apply([
            Change::Upsert(db_service()),
            Change::Upsert(external("db-vm", "{app: db}", "[192.0.2.10]", false)),
        ]);
        let identity = Some("db.ns.serviceaccount.identity.cnimesh.cluster.local".to_string());
        assert_eq!(resolved(&index, 5432), [("192.0.2.10:15432".to_string(), identity.clone())], "named target port");
        assert_eq!(resolved(&index, 80), [("192.0.2.10:9000".to_string(), identity.clone())], "numbered target port");
        // Its address is answered as that one endpoint, with its identity.
        assert!(
            matches!(&*index.watch_ip("192.0.2.10".parse().unwrap()).borrow(), IpView::Pod(k, p) if k.name == "db-vm" && p.meshed)
        );

        // Labels that no longer match, and the workload going away, take it out.
        let mut rx = index.watch_service(&NsName::new("ns", "db"));
        rx.borrow_and_update();
        index.apply([Change::Upsert(external("db-vm", "{app: other}", "[192.0.2.10]", false))]);
        assert!(rx.has_changed().unwrap(), "the selecting Service is told");
        assert!(resolved(&index, 5432).is_empty());
        index.apply([Change::Upsert(external("db-vm", "{app: db}", "[192.0.2.10]", false))]);
        assert_eq!(resolved(&index, 5432).len(), 1);
        index.apply([Change::Delete(Kind::ExternalWorkload, NsName::new("ns", "db-vm"))]);
        assert!(resolved(&index, 5432).is_empty());
        assert_eq!(*index.watch_ip("192.0.2.10".parse().unwrap()).borrow(), IpView::Unknown);
    }

    #[test]
    fn an_invalid_or_revoked_external_workload_is_no_endpoint_and_the_last_good_version_stays() {
        let index = Index::new();
        index.apply([
            Change::Upsert(db_service()),
            Change::Upsert(external("db-vm", "{app: db}", "[192.0.2.10]", false)),
        ]);
        let bad = external("db-vm", "{app: db}", "['not-an-ip']", false);
        assert!(matches!(&bad, Object::External(_, None)), "refused");
        index.apply([Change::Reset(Kind::ExternalWorkload, vec![bad])]);
        assert_eq!(resolved(&index, 5432).len(), 1, "the last good version stays through a re-list");
        index.apply([Change::Upsert(external("db-vm", "{app: db}", "[192.0.2.10]", true))]);
        assert!(resolved(&index, 5432).is_empty(), "a revoked workload gets no traffic");
        assert_eq!(*index.watch_ip("192.0.2.10".parse().unwrap()).borrow(), IpView::Unknown);
    }

    #[test]
    fn readiness_does_not_wait_for_external_workloads() {
        let index = Index::new();
        index.apply(KINDS.map(|k| Change::Reset(k, vec![])));
        assert!(index.is_ready());
    }

    #[test]
    fn ready_after_one_reset_of_each_kind() {
        let index = Index::new();
        index.apply([Change::Reset(Kind::Service, vec![]), Change::Reset(Kind::Pod, vec![])]);
        assert!(!index.is_ready());
        index.apply([Change::Reset(Kind::EndpointSlice, vec![])]);
        assert!(index.is_ready());
    }
}
