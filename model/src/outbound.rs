//! The one outbound index: per parent, a Service or an EgressNetwork ([`Parent`]), the routes
//! attached to it, which the outbound policy server (`cnimesh_control::grpc::outbound`) answers
//! from, beside the EgressNetworks themselves, which an address outside the cluster networks is
//! matched against ([`Index::watch_egress`]).
//!
//! It consumes the Gateway API's HTTPRoutes, GRPCRoutes, TLSRoutes, TCPRoutes and
//! ReferenceGrants, and EgressNetworks ([`Consumer::kinds`]); inbound policy
//! ([`crate::policy`]) keeps no routes. A route attaches to the parents its parentRefs name: a
//! Service's routes are those a grant allows ([`crate::routes::routes_of`]); an EgressNetwork's
//! are validated as egress serves them ([`crate::egress`]). Streams subscribe to a parent and
//! get a `tokio::sync::watch` receiver, pushed on change only.
//!
//! Layer: model/index (pure).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::egress;
use crate::index_list::{Change, Consumer, Kind, Object, kind_of};
use crate::meta::{Invalid, NsName};
use crate::routes::{self, Grant, Route, RouteKind, ServiceRoutes};

/// What outbound policy is attached to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Parent {
    Service(NsName),
    EgressNetwork(NsName),
}

/// The HTTP and gRPC routes attached to one parent (on any port), in precedence order.
pub type Attached = ServiceRoutes;

/// The kinds a Service's routes are computed from: outbound answers for Services wait for these.
const SERVICE_ROUTE_KINDS: [Kind; 3] = [Kind::HttpRoute, Kind::GrpcRoute, Kind::ReferenceGrant];

/// Cheap to clone; every clone is the same index.
#[derive(Clone)]
pub struct Index {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    /// Routes and grants listed: what every Service answer waits for.
    ready: watch::Sender<bool>,
    /// EgressNetworks and their routes, by address.
    egress: egress::Index,
}

#[derive(Default)]
struct State {
    routes: BTreeMap<(RouteKind, NsName), Arc<Route>>,
    grants: BTreeMap<NsName, Grant>,
    channels: HashMap<Parent, watch::Sender<Attached>>,
    sweep_at: usize,
    listed: BTreeSet<Kind>,
}

impl Index {
    /// An outbound index whose EgressNetworks are kept by `egress`.
    pub fn new(egress: egress::Index) -> Self {
        let state = State { sweep_at: 64, ..State::default() };
        Self { inner: Arc::new(Inner { state: Mutex::new(state), ready: watch::channel(false).0, egress }) }
    }

    /// Waits until routes and grants are loaded: a Service's answer needs nothing else from here.
    pub async fn ready(&self) {
        let _ = self.inner.ready.subscribe().wait_for(|ready| *ready).await;
    }

    /// The live routes attached to `parent`.
    pub fn watch(&self, parent: &Parent) -> watch::Receiver<Attached> {
        let mut state = self.inner.state.lock();
        let view = state.attached(parent, &self.inner.egress);
        if let Some(tx) = state.channels.get(parent) {
            tx.send_if_modified(|current| replace_if_changed(current, view));
            return tx.subscribe();
        }
        if state.channels.len() >= state.sweep_at {
            state.channels.retain(|_, tx| tx.receiver_count() > 0);
            state.sweep_at = (state.channels.len() * 2).max(64);
        }
        let (tx, rx) = watch::channel(view);
        state.channels.insert(parent.clone(), tx);
        rx
    }

    /// The EgressNetworks (and their routes) an address outside the cluster networks is matched
    /// against: selecting one takes all of them.
    pub fn egress(&self) -> &egress::Index {
        &self.inner.egress
    }
}

impl State {
    fn attached(&self, parent: &Parent, egress: &egress::Index) -> Attached {
        Arc::new(match parent {
            Parent::Service(service) => routes::routes_of(service, &self.routes, &self.grants),
            Parent::EgressNetwork(network) => egress
                .watch()
                .borrow()
                .routes
                .iter()
                .filter(|r| r.egress_parents.iter().any(|p| p.network == *network))
                .cloned()
                .collect(),
        })
    }

    fn upsert(&mut self, object: &Object) {
        let (kind, route) = match object {
            Object::HttpRoute(o) => (Kind::HttpRoute, Route::from_http(o)),
            Object::GrpcRoute(o) => (Kind::GrpcRoute, Route::from_grpc(o)),
            Object::ReferenceGrant(o) => {
                self.grants.insert(crate::meta::key_of(&o.metadata), Grant::from_crd(o));
                return;
            }
            _ => return,
        };
        match route {
            Ok(route) => drop(self.routes.insert((route.kind, route.key.clone()), Arc::new(route))),
            Err(error) => refused(kind, object, &error),
        }
    }

    fn delete(&mut self, kind: Kind, key: &NsName) {
        match kind {
            Kind::HttpRoute => drop(self.routes.remove(&(RouteKind::Http, key.clone()))),
            Kind::GrpcRoute => drop(self.routes.remove(&(RouteKind::Grpc, key.clone()))),
            Kind::ReferenceGrant => drop(self.grants.remove(key)),
            _ => {}
        }
    }

    /// A list replaces what the kind holds, except that only what the list no longer names
    /// goes: a route the model refuses keeps its last good version across a re-list (a watch
    /// resumed after a 410, an API server restart) as it does across an update.
    fn reset(&mut self, kind: Kind, objects: &[Object]) {
        let listed: HashSet<NsName> = objects.iter().filter_map(key_of).collect();
        match kind {
            Kind::HttpRoute => self.routes.retain(|(k, key), _| *k != RouteKind::Http || listed.contains(key)),
            Kind::GrpcRoute => self.routes.retain(|(k, key), _| *k != RouteKind::Grpc || listed.contains(key)),
            Kind::ReferenceGrant => self.grants.retain(|key, _| listed.contains(key)),
            _ => {}
        }
        objects.iter().for_each(|o| self.upsert(o));
    }

    fn publish(&self, egress: &egress::Index) {
        for (parent, tx) in &self.channels {
            if tx.receiver_count() > 0 {
                let view = self.attached(parent, egress);
                tx.send_if_modified(|current| replace_if_changed(current, view));
            }
        }
    }
}

/// The key of a route or grant this index keeps.
fn key_of(object: &Object) -> Option<NsName> {
    match object {
        Object::HttpRoute(o) => Some(crate::meta::key_of(&o.metadata)),
        Object::GrpcRoute(o) => Some(crate::meta::key_of(&o.metadata)),
        Object::ReferenceGrant(o) => Some(crate::meta::key_of(&o.metadata)),
        _ => None,
    }
}

/// Logs a route the model refused; the last good version stays.
fn refused(kind: Kind, object: &Object, error: &Invalid) {
    let key = key_of(object).unwrap_or_else(|| NsName::new("", ""));
    tracing::error!(kind = kind.name(), object = %key, reason = %error, "invalid route ignored; its last good version stays");
}

fn replace_if_changed<T: PartialEq>(current: &mut T, next: T) -> bool {
    let changed = *current != next;
    if changed {
        *current = next;
    }
    changed
}

impl Consumer for Index {
    fn kinds(&self) -> &'static [Kind] {
        &[Kind::HttpRoute, Kind::GrpcRoute, Kind::TlsRoute, Kind::TcpRoute, Kind::ReferenceGrant, Kind::EgressNetwork]
    }

    fn apply(&self, change: &Change) {
        let kind = kind_of(change);
        if self.inner.egress.kinds().contains(&kind) {
            Consumer::apply(&self.inner.egress, change);
        }
        let mut state = self.inner.state.lock();
        match change {
            Change::Upsert(object) => state.upsert(object),
            Change::Delete(kind, key) => state.delete(*kind, key),
            Change::Reset(kind, objects) => state.reset(*kind, objects),
            Change::Listed(_) => {}
        }
        if matches!(change, Change::Reset(..) | Change::Listed(_)) {
            state.listed.insert(kind);
        }
        state.publish(&self.inner.egress);
        if SERVICE_ROUTE_KINDS.iter().all(|k| state.listed.contains(k)) {
            self.inner.ready.send_if_modified(|ready| !std::mem::replace(ready, true));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(text: &str) -> Object {
        let value: serde_json::Value = serde_saphyr::from_str(text).unwrap();
        match value["kind"].as_str().unwrap() {
            "HTTPRoute" => Object::HttpRoute(Arc::new(serde_json::from_value(value).unwrap())),
            "ReferenceGrant" => Object::ReferenceGrant(Arc::new(serde_json::from_value(value).unwrap())),
            "EgressNetwork" => Object::EgressNetwork(Arc::new(serde_json::from_value(value).unwrap())),
            other => panic!("{other}"),
        }
    }

    fn index() -> Index {
        Index::new(egress::Index::new(egress::Config::new(Vec::new())))
    }

    #[test]
    fn routes_are_pushed_per_service_and_grants_decide_foreign_backends() {
        let index = index();
        let api = NsName::new("shop", "api");
        let mut rx = index.watch(&Parent::Service(api));
        assert!(rx.borrow_and_update().is_empty());
        let route = |regex: &str| {
            object(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: split, namespace: shop}}\nspec:\n  parentRefs: [{{group: '', kind: Service, name: api}}]\n  rules: [{{matches: [{{path: {{type: RegularExpression, value: '{regex}'}}}}], backendRefs: [{{name: api-v2, namespace: canary, port: 80}}]}}]\n"
            ))
        };
        let grant = || {
            object(
                "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: canary}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}]\n  to: [{group: '', kind: Service, name: api-v2}]\n",
            )
        };
        let regex = |rx: &mut watch::Receiver<Attached>| {
            let routes = rx.borrow_and_update().clone();
            let crate::routes::model::Matches::Http(m) = &routes[0].rules[0].matches else { panic!() };
            m[0].path.clone()
        };
        let other = index.watch(&Parent::Service(NsName::new("shop", "db")));

        index.apply(&Change::Upsert(route("^/a")));
        assert!(!rx.has_changed().unwrap(), "a backend in canary without a grant there: not served");
        index.apply(&Change::Upsert(grant()));
        assert_eq!(regex(&mut rx), Some(crate::routes::model::PathMatch::Regex("^/a".into())));

        // A bad edit is refused; the last good version stays, as it does through a grant's
        // removal and return.
        index.apply(&Change::Upsert(route("([")));
        assert!(!rx.has_changed().unwrap());
        index.apply(&Change::Delete(Kind::ReferenceGrant, NsName::new("canary", "g")));
        assert!(rx.borrow_and_update().is_empty());
        index.apply(&Change::Upsert(grant()));
        assert_eq!(regex(&mut rx), Some(crate::routes::model::PathMatch::Regex("^/a".into())));
        index.apply(&Change::Reset(Kind::HttpRoute, Vec::new()));
        assert!(rx.borrow_and_update().is_empty());
        assert!(!other.has_changed().unwrap(), "another Service's routes never changed");
    }

    #[test]
    fn a_route_whose_edit_was_refused_keeps_its_last_good_version_through_a_re_list() {
        let index = index();
        let mut rx = index.watch(&Parent::Service(NsName::new("shop", "api")));
        let route = |path: &str| {
            object(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: split, namespace: shop}}\nspec:\n  parentRefs: [{{group: '', kind: Service, name: api}}]\n  rules: [{{matches: [{{path: {{type: RegularExpression, value: '{path}'}}}}], backendRefs: [{{name: api, port: 80}}]}}]\n"
            ))
        };
        index.apply(&Change::Reset(Kind::HttpRoute, vec![route("^/a")]));
        assert_eq!(rx.borrow_and_update().len(), 1);
        index.apply(&Change::Upsert(route("([")));
        // The watch re-lists (its resourceVersion expired): the list holds the refused edit.
        index.apply(&Change::Reset(Kind::HttpRoute, vec![route("([")]));
        let routes = rx.borrow_and_update().clone();
        assert_eq!(routes.len(), 1, "the last good version is still attached");
        let crate::routes::model::Matches::Http(m) = &routes[0].rules[0].matches else { panic!() };
        assert_eq!(m[0].path, Some(crate::routes::model::PathMatch::Regex("^/a".into())));
        // A list that no longer names it removes it.
        index.apply(&Change::Reset(Kind::HttpRoute, Vec::new()));
        assert!(rx.borrow_and_update().is_empty());
    }

    #[test]
    fn an_egress_networks_routes_are_its_own_and_no_services() {
        let index = index();
        let world = Parent::EgressNetwork(NsName::new("shop", "world"));
        let mut rx = index.watch(&world);
        index.apply(&Change::Reset(Kind::EgressNetwork, vec![object(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: EgressNetwork\nmetadata: {name: world, namespace: shop}\nspec: {trafficPolicy: Deny}\n",
        )]));
        index.apply(&Change::Reset(Kind::HttpRoute, vec![object(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: h, namespace: shop}\nspec:\n  parentRefs: [{group: policy.cnimesh.io, kind: EgressNetwork, name: world}]\n",
        )]));
        let attached = rx.borrow_and_update().clone();
        assert_eq!(attached.iter().map(|r| r.key.name.as_str()).collect::<Vec<_>>(), ["h"]);
        assert!(index.watch(&Parent::Service(NsName::new("shop", "world"))).borrow().is_empty());
    }

    #[test]
    fn service_answers_wait_for_routes_and_grants_only() {
        let index = index();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        for kind in SERVICE_ROUTE_KINDS {
            index.apply(&Change::Listed(kind));
        }
        runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(10), index.ready()).await.expect("ready");
        });
    }
}
