//! The fan-out from cluster state to the indexes, as Linkerd's `IndexList`: each index declares
//! the kinds it consumes ([`Consumer::kinds`]) and takes changes of those ([`Consumer::apply`]);
//! a source watches each kind of the union once ([`IndexList::kinds`]) and hands every change to
//! [`IndexList::apply`], which gives it to each index that declared its kind and to no other.
//!
//! So one watch feeds several indexes (Pods and Services: Destination and inbound policy),
//! a kind no index consumes is not
//! watched at all, and a new index is one more [`Consumer`] handed to the source, with no edit
//! to its watches.
//!
//! An object is read once and shared ([`Object`] holds it behind an `Arc`); each index makes its
//! own records of it. Pods and EndpointSlices are projected as they are read ([`PodProjection`],
//! the slice's record): a list of every Pod in the cluster is held as records, never as Pods.
//!
//! Layer: model/index (pure): above the indexes it feeds.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};

use crate::destination::{self, SliceRecord};
use crate::egress;
use crate::external::{ExternalRecord, ExternalWorkload};
use crate::meta::NsName;
use crate::policy::{self, crd};
use crate::routes::crd as routes;

/// A kind of object a source can watch for the indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Pod,
    Service,
    EndpointSlice,
    Namespace,
    Server,
    AuthorizationPolicy,
    MeshTlsAuthentication,
    NetworkAuthentication,
    HttpLocalRateLimitPolicy,
    HttpRoute,
    GrpcRoute,
    TlsRoute,
    TcpRoute,
    ReferenceGrant,
    EgressNetwork,
    ExternalWorkload,
}

impl Kind {
    /// The Kubernetes kind, as logs and `cluster_objects_rejected_total{kind}` name it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Namespace => "Namespace",
            Kind::Server => "Server",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::MeshTlsAuthentication => "MeshTLSAuthentication",
            Kind::NetworkAuthentication => "NetworkAuthentication",
            Kind::HttpLocalRateLimitPolicy => "HTTPLocalRateLimitPolicy",
            Kind::HttpRoute => "HTTPRoute",
            Kind::GrpcRoute => "GRPCRoute",
            Kind::TlsRoute => "TLSRoute",
            Kind::TcpRoute => "TCPRoute",
            Kind::ReferenceGrant => "ReferenceGrant",
            Kind::EgressNetwork => "EgressNetwork",
            Kind::ExternalWorkload => "ExternalWorkload",
        }
    }

    /// Whether a cluster may lack the kind's CRD: the Gateway API's kinds, the rate limit policy
    /// and EgressNetworks. A source counts such a kind as listed with no objects while it is not
    /// served, so answers that wait for every kind (outbound policy) do not wait for it; the
    /// others keep their index not ready until they are listed (inbound policy waits rather than
    /// guess).
    pub fn optional(self) -> bool {
        matches!(
            self,
            Kind::HttpLocalRateLimitPolicy
                | Kind::HttpRoute
                | Kind::GrpcRoute
                | Kind::TlsRoute
                | Kind::TcpRoute
                | Kind::ReferenceGrant
                | Kind::EgressNetwork
                | Kind::ExternalWorkload
        )
    }
}

/// A Pod as the indexes keep it, projected as it is read: the typed Pod (over 2 KiB even when
/// empty, far more with its containers) is dropped before the next one is read.
#[derive(Debug)]
pub struct PodProjection {
    pub key: NsName,
    pub destination: Arc<destination::PodRecord>,
    pub policy: Arc<policy::PodRecord>,
}

impl PodProjection {
    pub fn of(pod: &Pod) -> Self {
        Self {
            key: crate::meta::key_of(&pod.metadata),
            destination: Arc::new(destination::PodRecord::from_k8s(pod)),
            policy: Arc::new(policy::PodRecord::from_k8s(pod)),
        }
    }
}

/// An ExternalWorkload as the indexes keep it: checked once as it is read, and refused (logged
/// with its name and why) when it does not check, in which case each index keeps the version it
/// knew before.
#[derive(Debug)]
pub struct ExternalProjection {
    pub key: NsName,
    pub record: Option<Arc<ExternalRecord>>,
}

impl ExternalProjection {
    pub fn of(workload: &ExternalWorkload) -> Self {
        let key = NsName::of(&workload.metadata);
        let record = match ExternalRecord::from_crd(workload) {
            Ok(record) => Some(Arc::new(record)),
            Err(error) => {
                tracing::error!(kind = "ExternalWorkload", object = %key, reason = %error,
                    "invalid ExternalWorkload ignored; its last good version stays");
                None
            }
        };
        Self { key, record }
    }
}

/// An object as a source read it, shared by every index that consumes its kind.
#[derive(Debug, Clone)]
pub enum Object {
    Pod(Arc<PodProjection>),
    Service(Arc<Service>),
    EndpointSlice(NsName, Arc<SliceRecord>),
    Namespace(Arc<Namespace>),
    Server(Arc<crd::Server>),
    AuthorizationPolicy(Arc<crd::AuthorizationPolicy>),
    MeshTlsAuthentication(Arc<crd::MeshTlsAuthentication>),
    NetworkAuthentication(Arc<crd::NetworkAuthentication>),
    HttpLocalRateLimitPolicy(Arc<crd::HttpLocalRateLimitPolicy>),
    HttpRoute(Arc<routes::HttpRoute>),
    GrpcRoute(Arc<routes::GrpcRoute>),
    TlsRoute(Arc<routes::TlsRoute>),
    TcpRoute(Arc<routes::TcpRoute>),
    ReferenceGrant(Arc<routes::ReferenceGrant>),
    EgressNetwork(Arc<egress::crd::EgressNetwork>),
    ExternalWorkload(Arc<ExternalProjection>),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Pod(_) => Kind::Pod,
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(..) => Kind::EndpointSlice,
            Object::Namespace(_) => Kind::Namespace,
            Object::Server(_) => Kind::Server,
            Object::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
            Object::MeshTlsAuthentication(_) => Kind::MeshTlsAuthentication,
            Object::NetworkAuthentication(_) => Kind::NetworkAuthentication,
            Object::HttpLocalRateLimitPolicy(_) => Kind::HttpLocalRateLimitPolicy,
            Object::HttpRoute(_) => Kind::HttpRoute,
            Object::GrpcRoute(_) => Kind::GrpcRoute,
            Object::TlsRoute(_) => Kind::TlsRoute,
            Object::TcpRoute(_) => Kind::TcpRoute,
            Object::ReferenceGrant(_) => Kind::ReferenceGrant,
            Object::EgressNetwork(_) => Kind::EgressNetwork,
            Object::ExternalWorkload(_) => Kind::ExternalWorkload,
        }
    }
}

/// One change of one kind, as a watch reports it: in the indexes' shape.
pub type Change = destination::Change<Kind, Object>;

/// The kind a change is about.
pub fn kind_of(change: &Change) -> Kind {
    match change {
        Change::Upsert(object) => object.kind(),
        Change::Delete(kind, _) | Change::Reset(kind, _) | Change::Listed(kind) => *kind,
    }
}

/// An index fed by the fan-out: the kinds it consumes, and how it takes a change of one of them.
pub trait Consumer: Send + Sync {
    /// The kinds this index consumes; [`Consumer::apply`] gets changes of these only.
    fn kinds(&self) -> &'static [Kind];
    /// One change of a kind from [`Consumer::kinds`].
    fn apply(&self, change: &Change);
}

/// The indexes a source feeds. Cheap to clone.
#[derive(Clone, Default)]
pub struct IndexList {
    indexes: Vec<Arc<dyn Consumer>>,
}

impl IndexList {
    /// Adds an index: it gets the changes of its kinds after the indexes added before it.
    pub fn push(&mut self, index: impl Consumer + 'static) {
        self.indexes.push(Arc::new(index));
    }

    /// The union of the kinds the indexes consume: what a source watches.
    pub fn kinds(&self) -> BTreeSet<Kind> {
        self.indexes.iter().flat_map(|index| index.kinds().iter().copied()).collect()
    }

    /// Gives the change to each index that consumes its kind, in the order they were added.
    pub fn apply(&self, change: Change) {
        let kind = kind_of(&change);
        for index in self.indexes.iter().filter(|index| index.kinds().contains(&kind)) {
            index.apply(&change);
        }
    }
}

/// `change` in an index's own shape: its kind as `kind`, each object through `object` (`None`:
/// not one for this index, which only a change of another kind holds).
fn convert<K: Copy, O>(
    change: &Change,
    kind: K,
    object: impl Fn(&Object) -> Option<O>,
) -> Option<destination::Change<K, O>> {
    Some(match change {
        Change::Upsert(o) => destination::Change::Upsert(object(o)?),
        Change::Delete(_, key) => destination::Change::Delete(kind, key.clone()),
        Change::Reset(_, objects) => destination::Change::Reset(kind, objects.iter().filter_map(object).collect()),
        Change::Listed(_) => destination::Change::Listed(kind),
    })
}

/// Destination: Services, EndpointSlices, Pods and ExternalWorkloads.
impl Consumer for destination::Index {
    fn kinds(&self) -> &'static [Kind] {
        &[Kind::Pod, Kind::Service, Kind::EndpointSlice, Kind::ExternalWorkload]
    }

    fn apply(&self, change: &Change) {
        let kind = match kind_of(change) {
            Kind::Pod => destination::Kind::Pod,
            Kind::Service => destination::Kind::Service,
            Kind::EndpointSlice => destination::Kind::EndpointSlice,
            Kind::ExternalWorkload => destination::Kind::ExternalWorkload,
            _ => return,
        };
        destination::Index::apply(
            self,
            convert(change, kind, |o| match o {
                Object::Pod(p) => Some(destination::Object::PodRecord(p.key.clone(), p.destination.clone())),
                Object::Service(s) => Some(destination::Object::from(Service::clone(s))),
                Object::EndpointSlice(key, slice) => Some(destination::Object::SliceRecord(key.clone(), slice.clone())),
                Object::ExternalWorkload(e) => Some(destination::Object::External(e.key.clone(), e.record.clone())),
                _ => None,
            }),
        );
    }
}

/// Inbound policy: Pods, Namespaces, the policy resources and the Services' declared protocols.
impl Consumer for policy::Index {
    fn kinds(&self) -> &'static [Kind] {
        &[
            Kind::Pod,
            Kind::Service,
            Kind::Namespace,
            Kind::Server,
            Kind::AuthorizationPolicy,
            Kind::MeshTlsAuthentication,
            Kind::NetworkAuthentication,
            Kind::HttpLocalRateLimitPolicy,
            Kind::ExternalWorkload,
        ]
    }

    fn apply(&self, change: &Change) {
        use policy::Kind as P;
        let kind = match kind_of(change) {
            Kind::Pod => P::Pod,
            Kind::Service => P::Service,
            Kind::Namespace => P::Namespace,
            Kind::Server => P::Server,
            Kind::AuthorizationPolicy => P::AuthorizationPolicy,
            Kind::MeshTlsAuthentication => P::MeshTlsAuthentication,
            Kind::NetworkAuthentication => P::NetworkAuthentication,
            Kind::HttpLocalRateLimitPolicy => P::HttpLocalRateLimitPolicy,
            Kind::ExternalWorkload => P::ExternalWorkload,
            _ => return,
        };
        policy::Index::apply(
            self,
            convert(change, kind, |o| {
                Some(match o {
                    Object::Pod(p) => policy::Object::PodRecord(p.key.clone(), p.policy.clone()),
                    Object::Service(s) => policy::Object::from(Service::clone(s)),
                    Object::Namespace(n) => policy::Object::from(Namespace::clone(n)),
                    Object::Server(s) => policy::Object::from(crd::Server::clone(s)),
                    Object::AuthorizationPolicy(p) => policy::Object::from(crd::AuthorizationPolicy::clone(p)),
                    Object::MeshTlsAuthentication(m) => policy::Object::from(crd::MeshTlsAuthentication::clone(m)),
                    Object::NetworkAuthentication(n) => policy::Object::from(crd::NetworkAuthentication::clone(n)),
                    Object::HttpLocalRateLimitPolicy(r) => {
                        policy::Object::from(crd::HttpLocalRateLimitPolicy::clone(r))
                    }
                    Object::ExternalWorkload(e) => policy::Object::External(e.key.clone(), e.record.clone()),
                    _ => return None,
                })
            }),
        );
    }
}

/// Egress: EgressNetworks and the routes whose parent may be one.
impl Consumer for egress::Index {
    fn kinds(&self) -> &'static [Kind] {
        &[Kind::EgressNetwork, Kind::HttpRoute, Kind::GrpcRoute, Kind::TlsRoute, Kind::TcpRoute]
    }

    fn apply(&self, change: &Change) {
        let kind = match kind_of(change) {
            Kind::EgressNetwork => egress::Kind::EgressNetwork,
            Kind::HttpRoute => egress::Kind::HttpRoute,
            Kind::GrpcRoute => egress::Kind::GrpcRoute,
            Kind::TlsRoute => egress::Kind::TlsRoute,
            Kind::TcpRoute => egress::Kind::TcpRoute,
            _ => return,
        };
        let change = convert(change, kind, |o| {
            Some(match o {
                Object::EgressNetwork(n) => egress::Object::from(egress::crd::EgressNetwork::clone(n)),
                Object::HttpRoute(r) => egress::Object::from(routes::HttpRoute::clone(r)),
                Object::GrpcRoute(r) => egress::Object::from(routes::GrpcRoute::clone(r)),
                Object::TlsRoute(r) => egress::Object::from(routes::TlsRoute::clone(r)),
                Object::TcpRoute(r) => egress::Object::from(routes::TcpRoute::clone(r)),
                _ => return None,
            })
        });
        egress::Index::apply(self, change.map(egress_shape));
    }
}

/// Egress keeps a change type of its own, of the same shape.
fn egress_shape(change: destination::Change<egress::Kind, egress::Object>) -> egress::Change {
    match change {
        destination::Change::Upsert(o) => egress::Change::Upsert(o),
        destination::Change::Delete(kind, key) => egress::Change::Delete(kind, key),
        destination::Change::Reset(kind, objects) => egress::Change::Reset(kind, objects),
        destination::Change::Listed(kind) => egress::Change::Listed(kind),
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use super::*;

    /// An index that records the kinds of the changes it is given.
    struct Recorder {
        kinds: &'static [Kind],
        seen: Arc<Mutex<Vec<Kind>>>,
    }

    impl Consumer for Recorder {
        fn kinds(&self) -> &'static [Kind] {
            self.kinds
        }

        fn apply(&self, change: &Change) {
            self.seen.lock().push(kind_of(change));
        }
    }

    fn recorder(kinds: &'static [Kind]) -> (Recorder, Arc<Mutex<Vec<Kind>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        (Recorder { kinds, seen: seen.clone() }, seen)
    }

    #[test]
    fn an_index_gets_the_changes_of_exactly_the_kinds_it_declared() {
        let (routes, routes_seen) = recorder(&[Kind::HttpRoute, Kind::ReferenceGrant]);
        let (services, services_seen) = recorder(&[Kind::Service, Kind::HttpRoute]);
        let mut list = IndexList::default();
        list.push(routes);
        list.push(services);
        for kind in [Kind::HttpRoute, Kind::Pod, Kind::Service, Kind::ReferenceGrant, Kind::TcpRoute] {
            list.apply(Change::Reset(kind, Vec::new()));
        }
        list.apply(Change::Delete(Kind::HttpRoute, NsName::new("shop", "api")));
        assert_eq!(*routes_seen.lock(), [Kind::HttpRoute, Kind::ReferenceGrant, Kind::HttpRoute]);
        assert_eq!(*services_seen.lock(), [Kind::HttpRoute, Kind::Service, Kind::HttpRoute]);
    }

    #[test]
    fn the_kinds_to_watch_are_the_union_of_what_the_indexes_declare_and_no_other() {
        let mut list = IndexList::default();
        assert!(list.kinds().is_empty(), "no index, nothing to watch");
        list.push(destination::Index::new());
        assert_eq!(
            list.kinds(),
            BTreeSet::from([Kind::Pod, Kind::Service, Kind::EndpointSlice, Kind::ExternalWorkload])
        );
        list.push(egress::Index::new(egress::Config::new(Vec::new())));
        let kinds = list.kinds();
        assert!(kinds.contains(&Kind::EgressNetwork) && kinds.contains(&Kind::TcpRoute));
        assert!(!kinds.contains(&Kind::Server) && !kinds.contains(&Kind::Namespace), "no policy index: {kinds:?}");
    }

    #[test]
    fn one_listed_pod_reaches_destination_and_policy_as_the_records_projected_once() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "shop", "name": "api-0", "labels": {"app": "api"}},
            "spec": {"containers": [{"name": "app", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"podIP": "10.0.0.7"}
        }))
        .unwrap();
        let projected = Arc::new(PodProjection::of(&pod));
        let (destination_index, policy_index) = (destination::Index::new(), policy::Index::new(Default::default()));
        let mut list = IndexList::default();
        list.push(policy_index.clone());
        list.push(destination_index.clone());
        list.apply(Change::Reset(Kind::Pod, vec![Object::Pod(projected.clone())]));
        let pods = destination_index.pods(None, |_, _| true);
        assert_eq!(pods.len(), 1);
        assert!(Arc::ptr_eq(&pods[0].1, &projected.destination), "Destination keeps the projected record");
        let mut rx = policy_index.watch_inbound(&NsName::new("shop", "api-0"), 8080);
        assert!(rx.borrow_and_update().is_some(), "policy knows the pod from the same list");
    }
}
