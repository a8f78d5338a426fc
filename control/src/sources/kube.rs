//! Cluster state from the Kubernetes API: one kube-rs watcher per kind, all namespaces; with a
//! policy index ([`KubeSource::with_policy`]) the same Pod and Service watches feed it too, and
//! it gets Namespaces, the policy resources and the
//! Gateway API's HTTPRoutes, GRPCRoutes and ReferenceGrants (optional: a cluster without their
//! CRDs has none of them); with an egress index ([`KubeSource::with_egress`]) also
//! EgressNetworks, TLSRoutes and TCPRoutes, and the same HTTPRoute and GRPCRoute watches feed it.
//!
//! A watcher lists, then watches from the list's resourceVersion, resumes from the last version it
//! saw when a watch ends, and re-lists when the server says that version is gone (410). Each list
//! becomes one [`Change::Reset`], so objects deleted while the watch was down disappear too. The
//! index is the store: no reflector cache of full objects is kept beside it.
//!
//! Objects are watched untyped and read one by one, so that one that does not read as its kind
//! (a field of the wrong type, a required one missing: what a CRD's schema would refuse, were it
//! installed without one) is refused alone, logged with its kind, namespace and name and counted
//! (`cluster_objects_rejected_total{kind}`): the version the index holds stays, and the rest of
//! its kind still lists and updates.
//!
//! Layer: sources (kube).

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use super::{Source, SourceError};
use cnimesh_model::destination::{self, Change, Index, Kind, Object, SliceRecord};
use cnimesh_model::egress;
use cnimesh_model::meta::NsName;
use cnimesh_model::metrics::Metrics;
use cnimesh_model::policy::{self, crd};
use cnimesh_model::routes::crd as routes;

pub struct KubeSource {
    client: kube::Client,
    policy: Option<policy::Index>,
    egress: Option<egress::Index>,
    metrics: Option<Arc<Metrics>>,
}

impl KubeSource {
    pub fn new(client: kube::Client) -> Self {
        Self { client, policy: None, egress: None, metrics: None }
    }

    /// Counts each object refused as unreadable (`cluster_objects_rejected_total{kind}`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Also keeps an egress index in step: EgressNetworks, TLSRoutes and TCPRoutes,
    /// and the HTTPRoutes and GRPCRoutes policy watches anyway.
    pub fn with_egress(mut self, egress: egress::Index) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Also keeps a policy index in step: Namespaces and the policy resources, and the same Pod
    /// watch Destination uses (one watch, two indexes).
    pub fn with_policy(mut self, policy: policy::Index) -> Self {
        self.policy = Some(policy);
        self
    }
}

impl Source for KubeSource {
    /// Watch errors are logged and retried with kube-rs' default backoff, so this does not return
    /// while the process is healthy. Until the policy CRDs are installed their watches fail (and
    /// say so) and the policy index stays not ready: inbound policy waits rather than guess.
    async fn run(self, index: Index) -> Result<(), SourceError> {
        let watches = Watches { client: self.client, metrics: self.metrics };
        let policy = self.policy;
        let egress = self.egress;
        let with_policy = policy.is_some();
        let pods = follow_as(
            watches.of::<Pod>(),
            "Pod",
            Absent::Retry,
            |pod: Pod| PodProjection::of(&pod, with_policy),
            |update: Update<PodProjection>| {
                if let Some(policy) = &policy {
                    policy.apply(update.policy_change());
                }
                index.apply([update.destination_change()]);
            },
        );
        let destination = async {
            futures::join!(
                follow(watches.of::<Service>(), "Service", Absent::Retry, |u: Update<Service>| {
                    // Declared protocols. One watch, two indexes, as for Pods.
                    if let Some(policy) = &policy {
                        policy.apply([policy_change(policy::Kind::Service, u.clone())]);
                    }
                    index.apply([destination_change(Kind::Service, u)])
                }),
                follow_as(
                    watches.of::<EndpointSlice>(),
                    "EndpointSlice",
                    Absent::Retry,
                    |slice: EndpointSlice| (NsName::of(&slice.metadata), Arc::new(SliceRecord::from_k8s(&slice))),
                    |u| index.apply([slice_change(u)])
                ),
                pods,
            )
        };
        match &policy {
            None => drop(destination.await),
            Some(policy) => {
                futures::join!(
                    destination,
                    follow_policy(watches.of::<Namespace>(), policy::Kind::Namespace, policy),
                    follow_policy(watches.of::<crd::Server>(), policy::Kind::Server, policy),
                    follow_policy(watches.of::<crd::AuthorizationPolicy>(), policy::Kind::AuthorizationPolicy, policy),
                    follow_policy(
                        watches.of::<crd::MeshTlsAuthentication>(),
                        policy::Kind::MeshTlsAuthentication,
                        policy
                    ),
                    follow_policy(
                        watches.of::<crd::NetworkAuthentication>(),
                        policy::Kind::NetworkAuthentication,
                        policy
                    ),
                    follow_shared_routes(
                        watches.of::<routes::HttpRoute>(),
                        policy::Kind::HttpRoute,
                        policy,
                        egress.as_ref().map(|e| (e, egress::Kind::HttpRoute))
                    ),
                    follow_shared_routes(
                        watches.of::<routes::GrpcRoute>(),
                        policy::Kind::GrpcRoute,
                        policy,
                        egress.as_ref().map(|e| (e, egress::Kind::GrpcRoute))
                    ),
                    follow_routes(watches.of::<routes::ReferenceGrant>(), policy::Kind::ReferenceGrant, policy),
                    follow_egress(&watches, egress.as_ref()),
                    // Rate limiting. Optional like the routes: a cluster whose CRDs
                    // predate it has no limits, and policy must not wait for the kind.
                    follow_routes(
                        watches.of::<crd::HttpLocalRateLimitPolicy>(),
                        policy::Kind::HttpLocalRateLimitPolicy,
                        policy
                    ),
                );
            }
        }
        Ok(())
    }
}

/// What a watcher reports, with the initial list (or a re-list) gathered into one step.
#[derive(Clone)]
enum Update<K> {
    Reset(Vec<K>),
    Apply(K),
    /// Only the key: a deleted object's last version need not read as its kind.
    Delete(NsName),
}

/// A Pod as both indexes keep it, projected as it is read: the typed Pod (over 2 KiB even when
/// empty, far more with its containers) is dropped before the next one is read, so a list of
/// every Pod in the cluster is held as records of a few hundred bytes, and never twice.
struct PodProjection {
    key: NsName,
    destination: Arc<destination::PodRecord>,
    /// Only with a policy index.
    policy: Option<Arc<policy::PodRecord>>,
}

impl PodProjection {
    fn of(pod: &Pod, with_policy: bool) -> Self {
        Self {
            key: NsName::of(&pod.metadata),
            destination: Arc::new(destination::PodRecord::from_k8s(pod)),
            policy: with_policy.then(|| Arc::new(policy::PodRecord::from_k8s(pod))),
        }
    }
}

impl Update<PodProjection> {
    /// The policy index's share: the same records' other half (`None` for a pod projected
    /// without one, which only happens when there is no policy index).
    fn policy_change(&self) -> Option<policy::Change> {
        let object = |p: &PodProjection| Some(policy::Object::PodRecord(p.key.clone(), p.policy.clone()?));
        Some(match self {
            Update::Reset(pods) => policy::Change::Reset(policy::Kind::Pod, pods.iter().filter_map(object).collect()),
            Update::Apply(pod) => policy::Change::Upsert(object(pod)?),
            Update::Delete(key) => policy::Change::Delete(policy::Kind::Pod, key.clone()),
        })
    }

    fn destination_change(self) -> Change {
        let object = |p: PodProjection| Object::PodRecord(p.key, p.destination);
        match self {
            Update::Reset(pods) => Change::Reset(Kind::Pod, pods.into_iter().map(object).collect()),
            Update::Apply(pod) => Change::Upsert(object(pod)),
            Update::Delete(key) => Change::Delete(Kind::Pod, key),
        }
    }
}

fn slice_change(update: Update<(NsName, Arc<SliceRecord>)>) -> Change {
    let object = |(key, record)| Object::SliceRecord(key, record);
    match update {
        Update::Reset(slices) => Change::Reset(Kind::EndpointSlice, slices.into_iter().map(object).collect()),
        Update::Apply(slice) => Change::Upsert(object(slice)),
        Update::Delete(key) => Change::Delete(Kind::EndpointSlice, key),
    }
}

fn destination_change<K>(kind: Kind, update: Update<K>) -> Change
where
    Object: From<K>,
{
    match update {
        Update::Reset(objects) => Change::Reset(kind, objects.into_iter().map(Object::from).collect()),
        Update::Apply(object) => Change::Upsert(Object::from(object)),
        Update::Delete(key) => Change::Delete(kind, key),
    }
}

fn policy_change<K>(kind: policy::Kind, update: Update<K>) -> policy::Change
where
    policy::Object: From<K>,
{
    match update {
        Update::Reset(objects) => policy::Change::Reset(kind, objects.into_iter().map(policy::Object::from).collect()),
        Update::Apply(object) => policy::Change::Upsert(policy::Object::from(object)),
        Update::Delete(key) => policy::Change::Delete(kind, key),
    }
}

async fn follow_policy<K>(api: Typed<K>, kind: policy::Kind, policy: &policy::Index)
where
    policy::Object: From<K>,
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    follow(api, kind_name(kind), Absent::Retry, |u| policy.apply([policy_change(kind, u)])).await
}

/// The Gateway API's kinds (and the rate limit policy) are optional: a cluster without its CRDs has no routes, and outbound
/// policy (which waits for every kind to be listed) must not wait for them.
async fn follow_routes<K>(api: Typed<K>, kind: policy::Kind, policy: &policy::Index)
where
    policy::Object: From<K>,
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    follow(api, kind_name(kind), Absent::Empty, |u| policy.apply([policy_change(kind, u)])).await
}

/// [`follow_routes`] for HTTPRoutes and GRPCRoutes, which also go to the egress index when there
/// is one.
async fn follow_shared_routes<K>(
    api: Typed<K>,
    kind: policy::Kind,
    policy: &policy::Index,
    egress: Option<(&egress::Index, egress::Kind)>,
) where
    policy::Object: From<K>,
    egress::Object: From<K>,
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    follow(api, kind_name(kind), Absent::Empty, |u: Update<K>| {
        if let Some((egress, kind)) = egress {
            egress.apply([egress_change(kind, u.clone())]);
        }
        policy.apply([policy_change(kind, u)])
    })
    .await
}

/// EgressNetworks, TLSRoutes and TCPRoutes. All optional (a cluster without the CRDs
/// has none), so outbound answers never wait for them.
async fn follow_egress(watches: &Watches, egress: Option<&egress::Index>) {
    let Some(egress) = egress else { return };
    futures::join!(
        follow(watches.of::<egress::crd::EgressNetwork>(), "EgressNetwork", Absent::Empty, |u| egress
            .apply([egress_change(egress::Kind::EgressNetwork, u)])),
        follow(watches.of::<routes::TlsRoute>(), "TLSRoute", Absent::Empty, |u| egress
            .apply([egress_change(egress::Kind::TlsRoute, u)])),
        follow(watches.of::<routes::TcpRoute>(), "TCPRoute", Absent::Empty, |u| egress
            .apply([egress_change(egress::Kind::TcpRoute, u)])),
    );
}

fn egress_change<K>(kind: egress::Kind, update: Update<K>) -> egress::Change
where
    egress::Object: From<K>,
{
    match update {
        Update::Reset(objects) => egress::Change::Reset(kind, objects.into_iter().map(egress::Object::from).collect()),
        Update::Apply(object) => egress::Change::Upsert(egress::Object::from(object)),
        Update::Delete(key) => egress::Change::Delete(kind, key),
    }
}

/// What a watch does while the API server does not serve its kind (404: CRD not installed).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Absent {
    /// Keep retrying; the index stays not ready.
    Retry,
    /// Count it as listed with no objects (once, until it is served), and keep retrying.
    Empty,
}

fn kind_name(kind: policy::Kind) -> &'static str {
    match kind {
        policy::Kind::Pod => "Pod",
        policy::Kind::Namespace => "Namespace",
        policy::Kind::Server => "Server",
        policy::Kind::AuthorizationPolicy => "AuthorizationPolicy",
        policy::Kind::MeshTlsAuthentication => "MeshTLSAuthentication",
        policy::Kind::NetworkAuthentication => "NetworkAuthentication",
        policy::Kind::HttpRoute => "HTTPRoute",
        policy::Kind::GrpcRoute => "GRPCRoute",
        policy::Kind::ReferenceGrant => "ReferenceGrant",
        policy::Kind::HttpLocalRateLimitPolicy => "HTTPLocalRateLimitPolicy",
        policy::Kind::Service => "Service",
    }
}

/// Where the watches go, and what counts the objects they refuse.
struct Watches {
    client: kube::Client,
    metrics: Option<Arc<Metrics>>,
}

impl Watches {
    /// Every object of kind `K`, all namespaces, watched untyped and read one by one.
    fn of<K: kube::Resource<DynamicType = ()>>(&self) -> Typed<K> {
        let resource = ApiResource::erase::<K>(&());
        Typed {
            api: Api::all_with(self.client.clone(), &resource),
            metrics: self.metrics.clone(),
            kind: std::marker::PhantomData,
        }
    }
}

/// A watch of kind `K`'s objects as they come (untyped), for [`follow`] to read as `K`.
struct Typed<K> {
    api: Api<DynamicObject>,
    metrics: Option<Arc<Metrics>>,
    kind: std::marker::PhantomData<K>,
}

impl<K: DeserializeOwned> Typed<K> {
    /// The object as `K`; refused (logged, counted) when it does not read as one.
    fn read(&self, kind: &'static str, object: DynamicObject) -> Option<K> {
        let key = key_of(&object);
        match serde_json::to_value(object).and_then(serde_json::from_value) {
            Ok(typed) => Some(typed),
            Err(error) => {
                tracing::warn!(kind, namespace = %key.namespace, name = %key.name, %error,
                    "object refused: it does not read as its kind; the version known before stays");
                if let Some(metrics) = &self.metrics {
                    metrics.object_rejected(kind);
                }
                None
            }
        }
    }
}

async fn follow<K>(api: Typed<K>, kind: &'static str, absent: Absent, deliver: impl FnMut(Update<K>))
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    follow_as(api, kind, absent, |object| object, deliver).await
}

/// [`follow`], with each object projected (`project`) as soon as it is read: what a list
/// gathers until it is complete is the projections, not the objects.
async fn follow_as<K, P>(
    api: Typed<K>,
    kind: &'static str,
    absent: Absent,
    project: impl Fn(K) -> P,
    mut deliver: impl FnMut(Update<P>),
) where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let events = watcher::watcher(api.api.clone(), watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut listed = Vec::new();
    let mut absent_reported = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(object)) => listed.extend(api.read(kind, object).map(&project)),
            Ok(Event::InitDone) => {
                tracing::debug!(kind, objects = listed.len(), "listed");
                absent_reported = false;
                deliver(Update::Reset(std::mem::take(&mut listed)));
            }
            Ok(Event::Apply(object)) => {
                if let Some(object) = api.read(kind, object) {
                    deliver(Update::Apply(project(object)))
                }
            }
            Ok(Event::Delete(object)) => deliver(Update::Delete(key_of(&object))),
            Err(error) if absent == Absent::Empty && not_served(&error) => {
                if !std::mem::replace(&mut absent_reported, true) {
                    tracing::warn!(kind, %error, "kind not served (CRD not installed?): none of it, watching for it");
                    deliver(Update::Reset(Vec::new()));
                }
            }
            Err(error) => tracing::warn!(kind, %error, "watch failed; retrying"),
        }
    }
}

/// The object's key as the indexes keep it: a cluster-scoped object (a Namespace) has an empty
/// namespace.
fn key_of(object: &DynamicObject) -> NsName {
    let name = object.metadata.name.as_deref().unwrap_or_default();
    NsName::new(object.metadata.namespace.as_deref().unwrap_or_default(), name)
}

fn not_served(error: &watcher::Error) -> bool {
    let api = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status,
        _ => return false,
    };
    api.code == 404
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A pod with much that neither index reads (an image, env, volumes, conditions) beside
    /// what they do (labels, the proxy container, named ports, a probe, annotations, its IP).
    fn pod() -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "shop", "name": "api-0", "labels": {"app": "api"},
                "annotations": {"config.cnimesh.io/opaque-ports": "5432", "kubectl.kubernetes.io/last-applied-configuration": "{\"huge\": true}"}},
            "spec": {"serviceAccountName": "api", "volumes": [{"name": "data", "emptyDir": {}}], "containers": [
                {"name": "app", "image": "registry.example/api:1", "env": [{"name": "SECRET_PATH", "value": "/etc/api"}],
                 "ports": [{"name": "http", "containerPort": 8080}],
                 "readinessProbe": {"httpGet": {"port": "http", "path": "/ready"}}},
                {"name": "cnimesh-proxy", "image": "registry.example/proxy:1"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}],
                "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_is_read_once_into_what_both_indexes_keep_and_nothing_else() {
        let pod = pod();
        let projected = PodProjection::of(&pod, true);
        assert_eq!(projected.key, NsName::new("shop", "api-0"));
        assert_eq!(*projected.destination, destination::PodRecord::from_k8s(&pod));
        let policy = projected.policy.clone().expect("a policy record when there is a policy index");
        assert_eq!(*policy, policy::PodRecord::from_k8s(&pod));
        assert_eq!(policy.labels.get("app").map(String::as_str), Some("api"), "labels stay: policy selects on them");
        assert_eq!(policy.probes.get(&8080).map(|p| p.len()), Some(1), "the probe's port and path stay");
        assert!(projected.destination.meshed && projected.destination.opaque_ports.contains(5432));
        let kept = format!("{:?} {:?}", projected.destination, policy);
        for gone in ["registry.example", "SECRET_PATH", "emptyDir", "last-applied", "Ready"] {
            assert!(!kept.contains(gone), "{gone} is not kept: {kept}");
        }
        assert!(PodProjection::of(&pod, false).policy.is_none(), "no policy index, no policy record");
    }

    #[test]
    fn a_listed_pod_reaches_both_indexes_as_the_records_projected_once() {
        let projected = PodProjection::of(&pod(), true);
        let (destination_record, policy_record) = (projected.destination.clone(), projected.policy.clone().unwrap());
        let listed = Update::Reset(vec![projected]);
        match listed.policy_change() {
            Some(policy::Change::Reset(policy::Kind::Pod, objects)) => match objects.as_slice() {
                [policy::Object::PodRecord(key, record)] => {
                    assert_eq!(key, &NsName::new("shop", "api-0"));
                    assert!(Arc::ptr_eq(record, &policy_record), "the record projected on reading, not a copy");
                }
                other => panic!("one pod record, got {other:?}"),
            },
            _ => panic!("a reset of the pods"),
        }
        let index = Index::new();
        index.apply([listed.destination_change()]);
        let pods = index.pods(None, |_, _| true);
        assert_eq!(pods.len(), 1);
        assert!(Arc::ptr_eq(&pods[0].1, &destination_record), "the index keeps the projected record");

        // The same as the index makes of the full Pod itself.
        let from_pod = Index::new();
        from_pod.apply([Change::Reset(Kind::Pod, vec![Object::from(pod())])]);
        assert_eq!(from_pod.pods(None, |_, _| true), pods);
    }

    #[test]
    fn without_a_policy_index_a_pod_change_is_for_destination_alone() {
        let update = Update::Apply(PodProjection::of(&pod(), false));
        assert!(update.policy_change().is_none());
        assert!(matches!(update.destination_change(), Change::Upsert(Object::PodRecord(..))));
    }
}
