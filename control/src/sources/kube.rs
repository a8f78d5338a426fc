//! Cluster state from the Kubernetes API: one kube-rs watcher per kind, all namespaces, for the
//! union of the kinds its indexes consume ([`IndexList`]): each change goes to every index that
//! declared its kind. Destination always; with a policy index ([`KubeSource::with_policy`]) the
//! same Pod and Service watches feed it too, and it adds Namespaces and the policy resources;
//! with the outbound index ([`KubeSource::with_index`]) the Gateway API's routes and grants and
//! EgressNetworks. A kind no index consumes is not watched. The Gateway API's
//! kinds, the rate limit policy and EgressNetworks are optional ([`Kind::optional`]): a cluster
//! without their CRDs has none of them.
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

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use super::{Source, SourceError};
use cnimesh_model::destination::{self, SliceRecord};
use cnimesh_model::external::ExternalWorkload;
use cnimesh_model::index_list::{Change, Consumer, ExternalProjection, IndexList, Kind, Object, PodProjection};
use cnimesh_model::meta::NsName;
use cnimesh_model::metrics::Metrics;
use cnimesh_model::policy;

pub struct KubeSource {
    client: kube::Client,
    indexes: IndexList,
    metrics: Option<Arc<Metrics>>,
}

impl KubeSource {
    pub fn new(client: kube::Client) -> Self {
        Self { client, indexes: IndexList::default(), metrics: None }
    }

    /// Counts each object refused as unreadable (`cluster_objects_rejected_total{kind}`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Also keeps `index` in step: the kinds it declares are watched (once, whichever other
    /// index consumes them too) and their changes reach it. An index another one already feeds
    /// (the outbound index feeds its egress index) is not given again: it would take every
    /// change twice.
    pub fn with_index(mut self, index: impl Consumer + 'static) -> Self {
        self.indexes.push(index);
        self
    }

    /// Also keeps a policy index in step: Namespaces and the policy resources, and the same Pod
    /// watch Destination uses (one watch, two indexes).
    pub fn with_policy(self, policy: policy::Index) -> Self {
        self.with_index(policy)
    }

    /// The kinds [`Source::run`] watches for `indexes`: the union of what they consume.
    pub fn watched(indexes: &IndexList) -> BTreeSet<Kind> {
        indexes.kinds()
    }
}

impl Source for KubeSource {
    /// Watch errors are logged and retried with kube-rs' default backoff, so this does not return
    /// while the process is healthy. Until the policy CRDs are installed their watches fail (and
    /// say so) and the policy index stays not ready: inbound policy waits rather than guess.
    async fn run(self, index: destination::Index) -> Result<(), SourceError> {
        let watches = Watches { client: self.client, metrics: self.metrics };
        // Destination last: a Pod or Service reaches the indexes added before it first.
        let mut indexes = self.indexes;
        indexes.push(index);
        let follows = Self::watched(&indexes).into_iter().map(|kind| watches.follow(kind, &indexes));
        futures::future::join_all(follows).await;
        Ok(())
    }
}

/// What a watcher reports, with the initial list (or a re-list) gathered into one step.
enum Update {
    Reset(Vec<Object>),
    Apply(Object),
    /// Only the key: a deleted object's last version need not read as its kind.
    Delete(NsName),
}

impl Update {
    fn change(self, kind: Kind) -> Change {
        match self {
            Update::Reset(objects) => Change::Reset(kind, objects),
            Update::Apply(object) => Change::Upsert(object),
            Update::Delete(key) => Change::Delete(kind, key),
        }
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

    /// The watch of `kind`, each change handed to `indexes`. Every kind's objects are read as
    /// their type and shared; Pods and EndpointSlices are projected as they are read, so a list
    /// gathers records, not objects.
    fn follow<'a>(&'a self, kind: Kind, indexes: &'a IndexList) -> BoxFuture<'a, ()> {
        let deliver = move |update: Update| indexes.apply(update.change(kind));
        match kind {
            Kind::Pod => {
                follow_as(self.of::<Pod>(), kind, |pod| Object::Pod(Arc::new(PodProjection::of(&pod))), deliver).boxed()
            }
            Kind::Service => self.shared(kind, Object::Service, deliver),
            Kind::EndpointSlice => follow_as(
                self.of::<EndpointSlice>(),
                kind,
                |slice: EndpointSlice| {
                    Object::EndpointSlice(NsName::of(&slice.metadata), Arc::new(SliceRecord::from_k8s(&slice)))
                },
                deliver,
            )
            .boxed(),
            Kind::Namespace => self.shared(kind, Object::Namespace, deliver),
            Kind::Server => self.shared(kind, Object::Server, deliver),
            Kind::AuthorizationPolicy => self.shared(kind, Object::AuthorizationPolicy, deliver),
            Kind::MeshTlsAuthentication => self.shared(kind, Object::MeshTlsAuthentication, deliver),
            Kind::NetworkAuthentication => self.shared(kind, Object::NetworkAuthentication, deliver),
            Kind::HttpLocalRateLimitPolicy => self.shared(kind, Object::HttpLocalRateLimitPolicy, deliver),
            Kind::HttpRoute => self.shared(kind, Object::HttpRoute, deliver),
            Kind::GrpcRoute => self.shared(kind, Object::GrpcRoute, deliver),
            Kind::TlsRoute => self.shared(kind, Object::TlsRoute, deliver),
            Kind::TcpRoute => self.shared(kind, Object::TcpRoute, deliver),
            Kind::ReferenceGrant => self.shared(kind, Object::ReferenceGrant, deliver),
            Kind::EgressNetwork => self.shared(kind, Object::EgressNetwork, deliver),
            Kind::ExternalWorkload => follow_as(
                self.of::<ExternalWorkload>(),
                kind,
                |workload: ExternalWorkload| Object::ExternalWorkload(Arc::new(ExternalProjection::of(&workload))),
                deliver,
            )
            .boxed(),
        }
    }

    /// The watch of a kind whose objects every index shares as read (`wrap`: the [`Object`]
    /// variant holding it).
    fn shared<'a, K>(
        &'a self,
        kind: Kind,
        wrap: fn(Arc<K>) -> Object,
        deliver: impl FnMut(Update) + Send + 'a,
    ) -> BoxFuture<'a, ()>
    where
        K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        follow_as(self.of::<K>(), kind, move |object| wrap(Arc::new(object)), deliver).boxed()
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

/// Follows one kind, each object projected (`project`) as soon as it is read: what a list
/// gathers until it is complete is the projections, not the objects. A kind that is
/// [optional](Kind::optional) counts as listed with no objects while it is not served.
async fn follow_as<K>(api: Typed<K>, kind: Kind, project: impl Fn(K) -> Object, mut deliver: impl FnMut(Update))
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let events = watcher::watcher(api.api.clone(), watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events);
    let (absent, kind) = (if kind.optional() { Absent::Empty } else { Absent::Retry }, kind.name());
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
    use super::*;
    use cnimesh_model::egress;

    #[test]
    fn destination_alone_watches_its_four_kinds_and_nothing_else() {
        let mut indexes = IndexList::default();
        indexes.push(destination::Index::new());
        assert_eq!(
            KubeSource::watched(&indexes),
            BTreeSet::from([Kind::Pod, Kind::Service, Kind::EndpointSlice, Kind::ExternalWorkload])
        );
    }

    #[test]
    fn a_policy_index_adds_its_kinds_and_shares_the_pod_and_service_watches() {
        let mut indexes = IndexList::default();
        indexes.push(policy::Index::new(Default::default()));
        indexes.push(destination::Index::new());
        let watched = KubeSource::watched(&indexes);
        assert!(watched.contains(&Kind::Server) && watched.contains(&Kind::Namespace));
        assert_eq!(watched.iter().filter(|k| **k == Kind::Pod).count(), 1, "one Pod watch for both");
        assert!(!watched.contains(&Kind::HttpRoute) && !watched.contains(&Kind::EgressNetwork), "no outbound index");
    }

    #[test]
    fn the_outbound_index_brings_the_routes_grants_and_egress_networks_it_declares() {
        let mut indexes = IndexList::default();
        indexes.push(destination::Index::new());
        let before = KubeSource::watched(&indexes);
        indexes.push(cnimesh_model::outbound::Index::new(egress::Index::new(egress::Config::new(Vec::new()))));
        let added: Vec<Kind> = KubeSource::watched(&indexes).difference(&before).copied().collect();
        assert_eq!(
            added,
            [
                Kind::HttpRoute,
                Kind::GrpcRoute,
                Kind::TlsRoute,
                Kind::TcpRoute,
                Kind::ReferenceGrant,
                Kind::EgressNetwork
            ]
        );
    }
}
