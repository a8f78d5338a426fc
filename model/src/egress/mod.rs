//! Egress (control side): `EgressNetwork` resources and the Gateway API routes
//! (HTTPRoute, GRPCRoute, TLSRoute, TCPRoute) whose parentRef is one, served to proxies in
//! `OutboundPolicies` answers for addresses outside the cluster networks
//! (`cnimesh_control::grpc::outbound`).
//!
//! Which EgressNetwork an address belongs to, as in Linkerd 2.18: one in the client's namespace
//! or in the global egress namespace (the control plane's namespace, [`Config::global_namespace`]),
//! whose networks hold the address (none given: everything outside the cluster networks); the
//! most specific network wins (longest prefix), then the client's own namespace over the global
//! one, then the oldest, then by name. Addresses in the cluster networks are never egress, and an
//! address no EgressNetwork holds gets no policy (forwarded as before).
//!
//! Flow: the sources deliver EgressNetworks and routes ([`Change`]); the index validates each
//! ([`model`]; a refused object is logged with its kind and name and its last good version
//! stays) and publishes one [`Snapshot`] of everything on a `watch` channel. Egress objects are
//! few and change rarely, so every open stream re-reads the snapshot when it changes.
//!
//! Layer: model/index (pure): [`crd`] (the EgressNetwork type), [`model`] (validated records)
//! and the index below.

pub mod crd;
pub mod model;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::meta::{Invalid, NsName, key_of};
use crate::metrics::Metrics;
use crate::routes::Route;
use crate::routes::crd as gateway;
use model::{EgressNetwork, StreamRoute, egress_route};

/// What selection depends on besides the objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Addresses in these are never egress (the control plane's cluster networks setting).
    pub cluster_networks: Vec<IpNet>,
    /// EgressNetworks here apply to clients of every namespace (Linkerd's global egress namespace:
    /// the control plane's namespace).
    pub global_namespace: String,
}

impl Config {
    /// The global egress namespace is the control plane's (`cnimesh`).
    pub fn new(cluster_networks: Vec<IpNet>) -> Self {
        Self { cluster_networks, global_namespace: cnimesh_common::names::CONTROL_NAMESPACE.to_string() }
    }
}

/// One of the kinds egress reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    EgressNetwork,
    HttpRoute,
    GrpcRoute,
    TlsRoute,
    TcpRoute,
}

pub const KINDS: [Kind; 5] = [Kind::EgressNetwork, Kind::HttpRoute, Kind::GrpcRoute, Kind::TlsRoute, Kind::TcpRoute];

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::EgressNetwork => "EgressNetwork",
            Kind::HttpRoute => "HTTPRoute",
            Kind::GrpcRoute => "GRPCRoute",
            Kind::TlsRoute => "TLSRoute",
            Kind::TcpRoute => "TCPRoute",
        }
    }
}

/// An object as a source delivers it.
#[derive(Debug, Clone)]
pub enum Object {
    EgressNetwork(Box<crd::EgressNetwork>),
    HttpRoute(Box<gateway::HttpRoute>),
    GrpcRoute(Box<gateway::GrpcRoute>),
    TlsRoute(Box<gateway::TlsRoute>),
    TcpRoute(Box<gateway::TcpRoute>),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::EgressNetwork(_) => Kind::EgressNetwork,
            Object::HttpRoute(_) => Kind::HttpRoute,
            Object::GrpcRoute(_) => Kind::GrpcRoute,
            Object::TlsRoute(_) => Kind::TlsRoute,
            Object::TcpRoute(_) => Kind::TcpRoute,
        }
    }

    pub fn key(&self) -> NsName {
        match self {
            Object::EgressNetwork(o) => key_of(&o.metadata),
            Object::HttpRoute(o) => key_of(&o.metadata),
            Object::GrpcRoute(o) => key_of(&o.metadata),
            Object::TlsRoute(o) => key_of(&o.metadata),
            Object::TcpRoute(o) => key_of(&o.metadata),
        }
    }
}

crate::meta::boxed_from!(Object: crd::EgressNetwork => EgressNetwork, gateway::HttpRoute => HttpRoute, gateway::GrpcRoute => GrpcRoute,
    gateway::TlsRoute => TlsRoute, gateway::TcpRoute => TcpRoute);

/// One update from a source; a batch is applied as one step.
#[derive(Debug, Clone)]
pub enum Change {
    /// Everything of a kind, as listed (a watch's list, a re-list, a directory's first read).
    Reset(Kind, Vec<Object>),
    Upsert(Object),
    Delete(Kind, NsName),
    /// The kind is loaded (files: after the first read) with nothing more to say.
    Listed(Kind),
}

/// Everything egress answers from, as of one moment.
#[derive(Debug, Default, PartialEq)]
pub struct Snapshot {
    /// By namespace and name.
    pub networks: Vec<Arc<EgressNetwork>>,
    /// HTTPRoutes and GRPCRoutes with EgressNetwork parents, oldest first then by key.
    pub routes: Vec<Arc<Route>>,
    /// TLSRoutes and TCPRoutes, the same order.
    pub streams: Vec<Arc<StreamRoute>>,
}

impl Snapshot {
    /// The EgressNetwork `ip` belongs to for a client of `client_namespace` (see the module docs).
    pub fn select(&self, ip: IpAddr, client_namespace: Option<&str>, config: &Config) -> Option<&Arc<EgressNetwork>> {
        self.networks
            .iter()
            .filter(|n| n.key.namespace == config.global_namespace || Some(&*n.key.namespace) == client_namespace)
            .filter_map(|n| Some((n.covers(ip, &config.cluster_networks)?, n)))
            .max_by(|(a, x), (b, y)| {
                let own = |n: &EgressNetwork| Some(&*n.key.namespace) == client_namespace;
                a.cmp(b)
                    .then_with(|| own(x).cmp(&own(y)))
                    // Older wins: the reverse of creation order, then of the key.
                    .then_with(|| y.created.cmp(&x.created))
                    .then_with(|| y.key.cmp(&x.key))
            })
            .map(|(_, n)| n)
    }

    /// The HTTP/gRPC routes attached to `network` on `port`, in precedence order.
    pub fn routes_of(&self, network: &NsName, port: u16) -> Vec<Arc<Route>> {
        self.routes.iter().filter(|r| model::attaches(&r.egress_parents, network, port)).cloned().collect()
    }

    /// The TLS/TCP routes attached to `network` on `port`, in precedence order.
    pub fn streams_of(&self, network: &NsName, port: u16) -> Vec<Arc<StreamRoute>> {
        self.streams.iter().filter(|r| r.attaches_to(network, port)).cloned().collect()
    }
}

/// The egress index: validated objects and the channel their snapshot is published on. Cheap
/// to clone.
#[derive(Clone)]
pub struct Index {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    /// Where refused objects are counted, when the control plane serves metrics.
    metrics: Option<Arc<Metrics>>,
    state: Mutex<State>,
    snapshot: watch::Sender<Arc<Snapshot>>,
    ready: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    networks: BTreeMap<NsName, Arc<EgressNetwork>>,
    routes: BTreeMap<(Kind, NsName), Arc<Route>>,
    streams: BTreeMap<(Kind, NsName), Arc<StreamRoute>>,
    listed: BTreeSet<Kind>,
}

impl Index {
    pub fn new(config: Config) -> Self {
        Self::build(config, None)
    }

    /// An index that counts each object it refuses (`cluster_objects_rejected_total{kind}`).
    pub fn counting_refusals(config: Config, metrics: Arc<Metrics>) -> Self {
        Self::build(config, Some(metrics))
    }

    fn build(config: Config, metrics: Option<Arc<Metrics>>) -> Self {
        let inner = Inner {
            config,
            metrics,
            state: Mutex::default(),
            snapshot: watch::channel(Arc::default()).0,
            ready: watch::channel(false).0,
        };
        Self { inner: Arc::new(inner) }
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Applies a batch of changes and publishes the result once.
    pub fn apply(&self, changes: impl IntoIterator<Item = Change>) {
        let mut state = self.inner.state.lock();
        for change in changes {
            match change {
                Change::Reset(kind, objects) => {
                    let listed: HashSet<NsName> = objects.iter().map(Object::key).collect();
                    state.retain_listed(kind, &listed);
                    objects.into_iter().for_each(|o| self.refused(state.upsert(o)));
                    state.listed.insert(kind);
                }
                Change::Upsert(object) => self.refused(state.upsert(object)),
                Change::Delete(kind, key) => state.delete(kind, &key),
                Change::Listed(kind) => drop(state.listed.insert(kind)),
            }
        }
        let next = Arc::new(state.snapshot());
        if state.listed.len() == KINDS.len() {
            self.inner.ready.send_if_modified(|ready| !std::mem::replace(ready, true));
        }
        drop(state);
        self.inner.snapshot.send_if_modified(|current| {
            let changed = **current != *next;
            if changed {
                *current = next;
            }
            changed
        });
    }

    /// Counts an object [`State::upsert`] refused.
    fn refused(&self, refused: Option<Kind>) {
        if let (Some(kind), Some(metrics)) = (refused, &self.inner.metrics) {
            metrics.object_rejected(kind.as_str());
        }
    }

    /// Waits until every kind has been listed once.
    pub async fn ready(&self) {
        let _ = self.inner.ready.subscribe().wait_for(|ready| *ready).await;
    }

    /// The live snapshot.
    pub fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.inner.snapshot.subscribe()
    }
}

/// Logs an object the model refused; its last good version stays.
fn refused(kind: Kind, key: &NsName, error: &Invalid) {
    tracing::error!(kind = kind.as_str(), object = %key, reason = %error, "invalid egress resource ignored; its last good version stays");
}

impl State {
    /// Before a list of `kind` is applied: drops what the list no longer names, and only that,
    /// so an object the model refuses keeps its last good version across a re-list as it does
    /// across an update.
    fn retain_listed(&mut self, kind: Kind, listed: &HashSet<NsName>) {
        match kind {
            Kind::EgressNetwork => self.networks.retain(|key, _| listed.contains(key)),
            Kind::HttpRoute | Kind::GrpcRoute => self.routes.retain(|(k, key), _| *k != kind || listed.contains(key)),
            Kind::TlsRoute | Kind::TcpRoute => self.streams.retain(|(k, key), _| *k != kind || listed.contains(key)),
        }
    }

    /// Applies `object`; `Some(its kind)` when it was refused (logged here, its last good
    /// version stays).
    fn upsert(&mut self, object: Object) -> Option<Kind> {
        let (kind, key) = (object.kind(), object.key());
        let result = match object {
            Object::EgressNetwork(o) => {
                EgressNetwork::from_crd(&o).map(|n| drop(self.networks.insert(key.clone(), Arc::new(n))))
            }
            Object::HttpRoute(o) => self.upsert_route(kind, &key, egress_route(Route::from_http(&o))),
            Object::GrpcRoute(o) => self.upsert_route(kind, &key, egress_route(Route::from_grpc(&o))),
            Object::TlsRoute(o) => self.upsert_stream(kind, &key, StreamRoute::from_tls(&o)),
            Object::TcpRoute(o) => self.upsert_stream(kind, &key, StreamRoute::from_tcp(&o)),
        };
        let error = result.err()?;
        refused(kind, &key, &error);
        Some(kind)
    }

    /// A route that is (no longer) attached to an EgressNetwork is none of egress's business.
    fn upsert_route(
        &mut self,
        kind: Kind,
        key: &NsName,
        route: Result<Option<Arc<Route>>, Invalid>,
    ) -> Result<(), Invalid> {
        match route? {
            Some(route) => drop(self.routes.insert((kind, key.clone()), route)),
            None => drop(self.routes.remove(&(kind, key.clone()))),
        }
        Ok(())
    }

    fn upsert_stream(&mut self, kind: Kind, key: &NsName, route: Result<StreamRoute, Invalid>) -> Result<(), Invalid> {
        let route = route?;
        if route.parents.is_empty() {
            if !self.streams.contains_key(&(kind, key.clone())) {
                tracing::debug!(kind = kind.as_str(), route = %key, "not attached to an EgressNetwork: not served");
            }
            self.streams.remove(&(kind, key.clone()));
        } else {
            self.streams.insert((kind, key.clone()), Arc::new(route));
        }
        Ok(())
    }

    fn delete(&mut self, kind: Kind, key: &NsName) {
        match kind {
            Kind::EgressNetwork => drop(self.networks.remove(key)),
            Kind::HttpRoute | Kind::GrpcRoute => drop(self.routes.remove(&(kind, key.clone()))),
            Kind::TlsRoute | Kind::TcpRoute => drop(self.streams.remove(&(kind, key.clone()))),
        }
    }

    fn snapshot(&self) -> Snapshot {
        let mut routes: Vec<Arc<Route>> = self.routes.values().cloned().collect();
        routes.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.key.cmp(&b.key)));
        let mut streams: Vec<Arc<StreamRoute>> = self.streams.values().cloned().collect();
        streams.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.key.cmp(&b.key)));
        Snapshot { networks: self.networks.values().cloned().collect(), routes, streams }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network(ns: &str, name: &str, spec: &str) -> Object {
        let text = format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: EgressNetwork\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n"
        );
        Object::from(serde_saphyr::from_str::<crd::EgressNetwork>(&text).unwrap())
    }

    #[test]
    fn the_most_specific_network_of_the_clients_namespace_or_the_global_one_is_selected() {
        let index = Index::new(Config::new(vec!["10.0.0.0/8".parse().unwrap()]));
        index.apply([Change::Reset(
            Kind::EgressNetwork,
            vec![
                network("cnimesh", "global", "{trafficPolicy: Allow}"),
                network("shop", "all", "{trafficPolicy: Deny}"),
                network("shop", "api", "{trafficPolicy: Allow, networks: [{cidr: 203.0.113.0/24}]}"),
                network("other", "x", "{trafficPolicy: Deny, networks: [{cidr: 203.0.113.7/32}]}"),
            ],
        )]);
        let rx = index.watch();
        let snap = rx.borrow().clone();
        let config = index.config();
        let pick = |ip: &str, ns: Option<&str>| snap.select(ip.parse().unwrap(), ns, config).map(|n| n.name());
        assert_eq!(pick("203.0.113.7", Some("shop")).as_deref(), Some("shop/api"));
        assert_eq!(pick("198.51.100.1", Some("shop")).as_deref(), Some("shop/all"), "own namespace over global");
        assert_eq!(pick("198.51.100.1", Some("web")).as_deref(), Some("cnimesh/global"));
        assert_eq!(pick("198.51.100.1", None).as_deref(), Some("cnimesh/global"));
        assert_eq!(pick("10.1.1.1", Some("shop")), None, "cluster addresses are not egress");
    }

    #[test]
    fn a_bad_egress_network_is_refused_counted_and_its_last_good_version_stays() {
        let metrics = Arc::new(Metrics::default());
        let index = Index::counting_refusals(Config::new(Vec::new()), metrics.clone());
        index.apply([Change::Upsert(network("shop", "n", "{trafficPolicy: Deny}"))]);
        index.apply([Change::Upsert(network("shop", "n", "{trafficPolicy: Allow, networks: [{cidr: nope}]}"))]);
        let snap = index.watch().borrow().clone();
        assert_eq!(snap.networks.len(), 1);
        assert_eq!(snap.networks[0].traffic_policy, crd::TrafficPolicy::Deny);
        let text = metrics.encode();
        assert!(text.contains("cluster_objects_rejected_total{kind=\"EgressNetwork\"} 1"), "{text}");
        // A re-list (the watch's resourceVersion expired) that holds the refused edit keeps it
        // too; one that no longer names the network removes it.
        let bad = network("shop", "n", "{trafficPolicy: Allow, networks: [{cidr: nope}]}");
        index.apply([Change::Reset(Kind::EgressNetwork, vec![bad])]);
        let snap = index.watch().borrow().clone();
        assert_eq!(snap.networks.len(), 1, "the last good version stays through a re-list");
        assert_eq!(snap.networks[0].traffic_policy, crd::TrafficPolicy::Deny);
        index.apply([Change::Reset(Kind::EgressNetwork, Vec::new())]);
        assert!(index.watch().borrow().networks.is_empty());
    }
}
