//! The one in-memory view of inbound policy: which clients may reach a pod's port, and how that
//! port's traffic is proxied ([`InboundServer`]).
//!
//! Sources push [`Change`]s in; streams subscribe to a (pod, port) and get a
//! `tokio::sync::watch` receiver: updates are pushed, never polled, and an answer that comes out
//! equal to the last one wakes nobody. A pod change recomputes that pod's channels; a change to a
//! Namespace or a policy resource recomputes every watched channel (policies reach across
//! namespaces through their references, and a recompute is a few map lookups per channel).
//!
//! Answers follow Linkerd's semantics:
//! - the Server (same namespace, selector matching the pod's labels, port equal to the port or
//!   naming a container port that is it) decides protocol and authorizations; when several match,
//!   the first by name wins, so the answer is stable;
//! - its authorizations are the AuthorizationPolicies targeting it or its namespace whose every
//!   required authentication exists (a reference to a missing one disables that policy, never
//!   widens it): no MeshTLSAuthentication/ServiceAccount means any client, no
//!   NetworkAuthentication means any network;
//! - a port no Server names gets the default policy: the pod's
//!   `config.cnimesh.io/default-inbound-policy`, else its namespace's, else the control plane's
//!   flag;
//! - the protocol (as Linkerd 2.18): a Server's explicit `proxyProtocol`, else
//!   opaque when the pod's opaque-ports annotation lists the port, else what the `appProtocol` of
//!   the Services selecting the pod declares for it ([`crate::destination::declared_for_pod_port`];
//!   two that disagree: detect, logged once naming both), else detect;
//! - kubelet probe paths of the port stay reachable under any policy ([`InboundServer::probe_paths`]).
//!
//! ExternalWorkloads are workloads like pods here: kept beside them under
//! [`crate::external::policy_key`], selected by Servers through their labels, watched by the
//! proxy running as one under that key.
//!
//! It holds no routes: the Gateway API routes attached to Services (and to EgressNetworks) are
//! the outbound index's.
//!
//! A resource that does not validate is logged with its kind, name and reason and its last good
//! version stays in force.
//!
//! Layer: model/index (pure): no kube client, no tonic.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use tokio::sync::watch;

use super::crd;
use super::model::{
    AuthzPolicyRecord, DefaultPolicy, Identities, IdentityRef, NamespaceRecord, Network, PodRecord, Protocol,
    RateLimitRecord, ServerRecord, Target, networks_from_crd,
};
use crate::destination::{Conflict, Declaration, declared_for_pod_port};
use crate::external::{self, ExternalRecord};
use crate::meta::{Invalid, NsName, key_of};

/// What the answers depend on besides cluster state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The policy of ports no Server names, where neither pod nor namespace say otherwise.
    pub default_policy: DefaultPolicy,
    /// `cluster-authenticated` clients come from these.
    pub cluster_networks: Vec<IpNet>,
    /// The trust domain identities are issued in: ServiceAccount references become names in it.
    pub trust_domain: String,
}

/// Linkerd's default cluster networks: the private and carrier-grade NAT ranges.
pub const DEFAULT_CLUSTER_NETWORKS: &str = "10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8";

impl Default for Config {
    fn default() -> Self {
        Self {
            default_policy: DefaultPolicy::default(),
            cluster_networks: DEFAULT_CLUSTER_NETWORKS.split(',').map(|n| n.parse().expect("valid")).collect(),
            trust_domain: cnimesh_identity::DEFAULT_TRUST_DOMAIN.to_string(),
        }
    }
}

/// One of the kinds policy reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Pod,
    Namespace,
    Server,
    AuthorizationPolicy,
    MeshTlsAuthentication,
    NetworkAuthentication,
    // Rate limiting
    HttpLocalRateLimitPolicy,
    // Declared protocols (the Services' appProtocol, for the pods they select)
    Service,
    /// Optional (readiness does not wait for it): kept beside the pods under
    /// [`crate::external::policy_key`].
    ExternalWorkload,
}

pub const KINDS: [Kind; 8] = [
    Kind::Pod,
    Kind::Namespace,
    Kind::Server,
    Kind::AuthorizationPolicy,
    Kind::MeshTlsAuthentication,
    Kind::NetworkAuthentication,
    Kind::HttpLocalRateLimitPolicy,
    Kind::Service,
];

/// An object as a source delivers it.
#[derive(Debug, Clone)]
pub enum Object {
    Pod(Box<Pod>),
    /// A Pod already reduced to its record: the Kubernetes source projects each Pod as it reads
    /// it (one read for both indexes), so a list of every Pod is never held as full objects.
    PodRecord(NsName, Arc<PodRecord>),
    Namespace(Box<Namespace>),
    Server(Box<crd::Server>),
    AuthorizationPolicy(Box<crd::AuthorizationPolicy>),
    MeshTlsAuthentication(Box<crd::MeshTlsAuthentication>),
    NetworkAuthentication(Box<crd::NetworkAuthentication>),
    HttpLocalRateLimitPolicy(Box<crd::HttpLocalRateLimitPolicy>),
    Service(Box<Service>),
    /// An ExternalWorkload by its own key; `None`: refused where it was read, the version known
    /// before stays.
    External(NsName, Option<Arc<ExternalRecord>>),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Pod(_) | Object::PodRecord(..) => Kind::Pod,
            Object::Namespace(_) => Kind::Namespace,
            Object::Server(_) => Kind::Server,
            Object::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
            Object::MeshTlsAuthentication(_) => Kind::MeshTlsAuthentication,
            Object::NetworkAuthentication(_) => Kind::NetworkAuthentication,
            Object::HttpLocalRateLimitPolicy(_) => Kind::HttpLocalRateLimitPolicy,
            Object::Service(_) => Kind::Service,
            Object::External(..) => Kind::ExternalWorkload,
        }
    }

    /// Namespaces are cluster-scoped: their key has an empty namespace.
    pub fn key(&self) -> NsName {
        match self {
            Object::Pod(o) => key_of(&o.metadata),
            Object::PodRecord(key, _) => key.clone(),
            Object::Namespace(o) => NsName::new("", o.metadata.name.as_deref().unwrap_or_default()),
            Object::Server(o) => key_of(&o.metadata),
            Object::AuthorizationPolicy(o) => key_of(&o.metadata),
            Object::MeshTlsAuthentication(o) => key_of(&o.metadata),
            Object::NetworkAuthentication(o) => key_of(&o.metadata),
            Object::HttpLocalRateLimitPolicy(o) => key_of(&o.metadata),
            Object::Service(o) => key_of(&o.metadata),
            Object::External(key, _) => key.clone(),
        }
    }
}

crate::meta::boxed_from!(Object: Pod => Pod, Namespace => Namespace, crd::Server => Server,
    crd::AuthorizationPolicy => AuthorizationPolicy, crd::MeshTlsAuthentication => MeshTlsAuthentication,
    crd::NetworkAuthentication => NetworkAuthentication,
    crd::HttpLocalRateLimitPolicy => HttpLocalRateLimitPolicy, Service => Service);

/// One update from a source, in the Destination index's shape; a batch is applied as one step.
pub type Change = crate::destination::Change<Kind, Object>;

/// The inbound policy of one pod port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundServer {
    pub meta: ServerMeta,
    pub protocol: Protocol,
    pub authorizations: Vec<Authorization>,
    /// HTTP paths kubelet probes on this port: authorized for anyone, whatever the policy.
    pub probe_paths: BTreeSet<String>,
    /// The Server's HTTPLocalRateLimitPolicy, if one targets it.
    pub rate_limit: Option<RateLimit>,
}

/// The rate limit in force on a Server: its policy's name (in the Server's namespace) and rates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    pub name: String,
    pub total: Option<u32>,
    pub identity: Option<u32>,
    pub overrides: Vec<(u32, BTreeSet<String>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerMeta {
    /// No Server names the port.
    Default(DefaultPolicy),
    /// The Server's name (in the pod's namespace).
    Server(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization {
    pub meta: AuthzMeta,
    /// Never empty: an authorization for every network says so with `0.0.0.0/0` and `::/0`.
    pub networks: Vec<Network>,
    pub authentication: Authentication,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthzMeta {
    Default(DefaultPolicy),
    Policy(NsName),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authentication {
    /// Any client, mesh TLS or not.
    Unauthenticated,
    /// Mesh TLS clients with one of these identities.
    MeshTls(Identities),
}

/// `None` while the pod is unknown.
pub type InboundView = Option<Arc<InboundServer>>;

/// Cheap to clone; every clone is the same index.
#[derive(Clone)]
pub struct Index {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    state: Mutex<State>,
    ready: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    pods: HashMap<NsName, Arc<PodRecord>>,
    namespaces: HashMap<String, NamespaceRecord>,
    servers: BTreeMap<NsName, ServerRecord>,
    policies: BTreeMap<NsName, AuthzPolicyRecord>,
    mesh_tls: HashMap<NsName, Identities>,
    networks: HashMap<NsName, Vec<Network>>,
    rate_limits: BTreeMap<NsName, RateLimitRecord>,
    /// Services that select pods and declare some port's protocol (the rest are not kept).
    services: BTreeMap<NsName, Declaration>,
    /// Pairs of Services whose conflicting declarations were logged, so each is said once.
    conflicts_logged: Mutex<HashSet<(NsName, NsName)>>,
    channels: HashMap<(NsName, u16), watch::Sender<InboundView>>,
    sweep_at: usize,
    dirty_pods: HashSet<NsName>,
    dirty_all: bool,
    listed: BTreeSet<Kind>,
}

impl Index {
    pub fn new(config: Config) -> Self {
        let state = State { sweep_at: 64, ..State::default() };
        Self { inner: Arc::new(Inner { config, state: Mutex::new(state), ready: watch::channel(false).0 }) }
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Applies changes as one step and wakes the streams whose answer changed.
    pub fn apply(&self, changes: impl IntoIterator<Item = Change>) {
        let mut state = self.lock();
        let config = &self.inner.config;
        for change in changes {
            match change {
                Change::Upsert(object) => state.upsert(object, config),
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
                    objects.into_iter().for_each(|o| state.upsert(o, config));
                }
            }
        }
        state.publish(config);
        if KINDS.iter().all(|kind| state.listed.contains(kind)) {
            self.inner.ready.send_if_modified(|ready| !std::mem::replace(ready, true));
        }
    }

    /// Whether every kind has been loaded in full.
    pub fn is_ready(&self) -> bool {
        *self.inner.ready.borrow()
    }

    /// Waits until [`Index::is_ready`]: answering earlier could apply the default policy to a
    /// port whose Server has not been listed yet.
    pub async fn ready(&self) {
        let _ = self.inner.ready.subscribe().wait_for(|ready| *ready).await;
    }

    /// The live answer for a pod's port.
    pub fn watch_inbound(&self, pod: &NsName, port: u16) -> watch::Receiver<InboundView> {
        let mut state = self.lock();
        let view = state.inbound(pod, port, &self.inner.config);
        let key = (pod.clone(), port);
        if let Some(tx) = state.channels.get(&key) {
            tx.send_replace(view); // Not kept current while nobody watched.
            return tx.subscribe();
        }
        if state.channels.len() >= state.sweep_at {
            state.channels.retain(|_, tx| tx.receiver_count() > 0);
            state.sweep_at = (state.channels.len() * 2).max(64);
        }
        let (tx, rx) = watch::channel(view);
        state.channels.insert(key, tx);
        rx
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.inner.state.lock()
    }
}

fn replace_if_changed<T: PartialEq>(current: &mut T, next: T) -> bool {
    let changed = *current != next;
    if changed {
        *current = next;
    }
    changed
}

/// Logs a resource the model refused; the caller keeps its last good version.
fn refused(kind: Kind, key: &NsName, error: &Invalid) {
    tracing::error!(?kind, object = %key, reason = %error, "invalid policy resource ignored; its last good version stays");
}

impl State {
    fn keys(&self, kind: Kind) -> Vec<NsName> {
        match kind {
            Kind::Pod => self.pods.keys().filter(|k| external::of_policy_key(k).is_none()).cloned().collect(),
            Kind::ExternalWorkload => self.pods.keys().filter_map(external::of_policy_key).collect(),
            Kind::Namespace => self.namespaces.keys().map(|n| NsName::new("", n)).collect(),
            Kind::Server => self.servers.keys().cloned().collect(),
            Kind::AuthorizationPolicy => self.policies.keys().cloned().collect(),
            Kind::MeshTlsAuthentication => self.mesh_tls.keys().cloned().collect(),
            Kind::NetworkAuthentication => self.networks.keys().cloned().collect(),
            Kind::HttpLocalRateLimitPolicy => self.rate_limits.keys().cloned().collect(),
            Kind::Service => self.services.keys().cloned().collect(),
        }
    }

    fn upsert(&mut self, object: Object, config: &Config) {
        let (kind, key) = (object.kind(), object.key());
        let result = match object {
            Object::Pod(pod) => {
                return self.upsert(Object::PodRecord(key, Arc::new(PodRecord::from_k8s(&pod))), config);
            }
            Object::PodRecord(_, record) => {
                self.pods.insert(key.clone(), record);
                self.dirty_pods.insert(key);
                return;
            }
            Object::External(_, None) => return,
            Object::External(_, Some(record)) => {
                let key = external::policy_key(&key.namespace, &key.name);
                self.pods.insert(key.clone(), Arc::new(PodRecord::of_external(&key, &record)));
                self.dirty_pods.insert(key);
                return;
            }
            Object::Namespace(ns) => {
                self.namespaces.insert(key.name.clone(), NamespaceRecord::from_k8s(&ns));
                Ok(())
            }
            Object::Server(o) => ServerRecord::from_crd(&o).map(|r| drop(self.servers.insert(key.clone(), r))),
            Object::AuthorizationPolicy(o) => {
                AuthzPolicyRecord::from_crd(&o).map(|r| drop(self.policies.insert(key.clone(), r)))
            }
            Object::MeshTlsAuthentication(o) => {
                Identities::from_crd(&o, &config.trust_domain).map(|r| drop(self.mesh_tls.insert(key.clone(), r)))
            }
            Object::NetworkAuthentication(o) => {
                networks_from_crd(&o).map(|r| drop(self.networks.insert(key.clone(), r)))
            }
            Object::Service(svc) => {
                // Only a change in what it declares touches the answers: most Services declare
                // nothing and cost no recompute.
                let changed = match Declaration::from_k8s(&svc) {
                    Some(declared) => self.services.insert(key.clone(), declared.clone()) != Some(declared),
                    None => self.services.remove(&key).is_some(),
                };
                if changed {
                    self.service_changed(&key);
                }
                return;
            }
            Object::HttpLocalRateLimitPolicy(o) => RateLimitRecord::from_crd(&o, &config.trust_domain).map(|r| {
                self.rate_limits.insert(key.clone(), r);
                self.report_rate_limit_conflicts(&key);
            }),
        };
        match result {
            Ok(()) => self.dirty_all = true,
            Err(error) => refused(kind, &key, &error),
        }
    }

    fn delete(&mut self, kind: Kind, key: &NsName) {
        let existed = match kind {
            Kind::Pod => {
                self.dirty_pods.insert(key.clone());
                return drop(self.pods.remove(key));
            }
            Kind::ExternalWorkload => {
                let key = external::policy_key(&key.namespace, &key.name);
                self.pods.remove(&key);
                self.dirty_pods.insert(key);
                return;
            }
            Kind::Namespace => self.namespaces.remove(&key.name).is_some(),
            Kind::Server => self.servers.remove(key).is_some(),
            Kind::AuthorizationPolicy => self.policies.remove(key).is_some(),
            Kind::MeshTlsAuthentication => self.mesh_tls.remove(key).is_some(),
            Kind::NetworkAuthentication => self.networks.remove(key).is_some(),
            Kind::HttpLocalRateLimitPolicy => self.rate_limits.remove(key).is_some(),
            Kind::Service => {
                if self.services.remove(key).is_some() {
                    self.service_changed(key);
                }
                return;
            }
        };
        self.dirty_all |= existed;
    }

    /// The policy in force for a Server: of those targeting it, the oldest (then the first by
    /// name, so the answer is stable), as Linkerd lets one policy limit a Server.
    fn rate_limit_for(&self, server: &str, ns: &str) -> Option<(&NsName, &RateLimitRecord)> {
        self.rate_limits
            .range(NsName::new(ns, "")..)
            .take_while(|(k, _)| k.namespace == ns)
            .filter(|(_, r)| r.server == server)
            .min_by(|(ka, a), (kb, b)| a.created.cmp(&b.created).then_with(|| ka.cmp(kb)))
    }

    /// Logs every policy the one just stored shares its Server with and loses to: the
    /// operator learns which one is ignored and why, whichever of the two arrived last.
    fn report_rate_limit_conflicts(&self, key: &NsName) {
        let Some(server) = self.rate_limits.get(key).map(|r| r.server.clone()) else { return };
        let Some((winner, _)) = self.rate_limit_for(&server, &key.namespace) else { return };
        for (other, r) in self.rate_limits.range(NsName::new(&key.namespace, "")..) {
            if other.namespace != key.namespace {
                break;
            }
            if r.server == server && other != winner {
                let error = Invalid(format!(
                    "Server {server:?} is already limited by HTTPLocalRateLimitPolicy {:?} (older); one policy per Server",
                    winner.name
                ));
                refused(Kind::HttpLocalRateLimitPolicy, other, &error);
            }
        }
    }

    fn publish(&mut self, config: &Config) {
        let (all, pods) = (std::mem::take(&mut self.dirty_all), std::mem::take(&mut self.dirty_pods));
        if !all && pods.is_empty() {
            return;
        }
        for ((pod, port), tx) in &self.channels {
            if tx.receiver_count() == 0 || !(all || pods.contains(pod)) {
                continue;
            }
            let view = self.inbound(pod, *port, config);
            tx.send_if_modified(|current| replace_if_changed(current, view));
        }
    }

    fn inbound(&self, pod_key: &NsName, port: u16, config: &Config) -> InboundView {
        let pod = self.pods.get(pod_key)?;
        let ns = &pod_key.namespace;
        let server = self
            .servers
            .range(NsName::new(ns, "")..)
            .take_while(|(k, _)| k.namespace == *ns)
            .find(|(_, s)| s.selector.matches(&pod.labels) && pod.resolve(&s.port) == Some(port));
        let probe_paths = pod.probes.get(&port).cloned().unwrap_or_default();
        let answer = match server {
            Some((key, server)) => {
                let mut authorizations = self.authorizations_for(&key.name, ns, config);
                // After the policies': a client they admit is counted as theirs, and only what
                // none admits falls to the access policy (audit counts it as a would-be denial).
                authorizations.extend(default_authorizations(server.access_policy, config));
                InboundServer {
                    meta: ServerMeta::Server(key.name.clone()),
                    protocol: match server.protocol {
                        Protocol::Detect => self.undeclared_protocol(ns, pod, port),
                        explicit => explicit,
                    },
                    authorizations,
                    probe_paths,
                    rate_limit: self.rate_limit_for(&key.name, ns).map(|(k, r)| RateLimit {
                        name: k.name.clone(),
                        total: r.total,
                        identity: r.identity,
                        overrides: r.overrides.clone(),
                    }),
                }
            }
            None => {
                let default = pod
                    .default_policy
                    .or_else(|| self.namespaces.get(ns).and_then(|n| n.default_policy))
                    .unwrap_or(config.default_policy);
                InboundServer {
                    meta: ServerMeta::Default(default),
                    protocol: self.undeclared_protocol(ns, pod, port),
                    authorizations: default_authorizations(default, config),
                    probe_paths,
                    rate_limit: None,
                }
            }
        };
        Some(Arc::new(answer))
    }

    /// The protocol of a pod port no Server declares one for: opaque when the pod's opaque-ports
    /// annotation lists it, else what the Services selecting the pod declare, else detect.
    fn undeclared_protocol(&self, ns: &str, pod: &PodRecord, port: u16) -> Protocol {
        if pod.opaque_ports.contains(port) {
            return Protocol::Opaque;
        }
        let services = self.services.range(NsName::new(ns, "")..).take_while(|(k, _)| k.namespace == ns);
        match declared_for_pod_port(services, &pod.labels, &pod.named_ports, port) {
            Ok(declared) => declared.map_or(Protocol::Detect, Protocol::from),
            Err(conflict) => {
                self.log_conflict(&conflict);
                Protocol::Detect
            }
        }
    }

    /// Says a conflict once per pair of Services (until one of them changes): the answer is
    /// recomputed for every pod and port they cover, and the log must not repeat with it.
    fn log_conflict(&self, conflict: &Conflict) {
        let pair = (conflict.first.0.clone(), conflict.second.0.clone());
        let mut logged = self.conflicts_logged.lock();
        // Bounded: past this many, a cluster has bigger problems than a quiet log.
        if logged.len() < 1024 && logged.insert(pair) {
            tracing::warn!(%conflict, "conflicting appProtocol declarations; the port is detected");
        }
    }

    /// A Service's declaration came, changed or went: only pods of its namespace can be
    /// affected, and a conflict it was part of may be said again if it returns.
    fn service_changed(&mut self, service: &NsName) {
        self.conflicts_logged.get_mut().retain(|(a, b)| a != service && b != service);
        let pods = self.channels.keys().filter(|(pod, _)| pod.namespace == service.namespace);
        self.dirty_pods.extend(pods.map(|(pod, _)| pod.clone()));
    }

    /// The policies targeting the Server or its namespace whose every reference resolves.
    fn authorizations_for(&self, server: &str, ns: &str, config: &Config) -> Vec<Authorization> {
        self.policies
            .range(NsName::new(ns, "")..)
            .take_while(|(k, _)| k.namespace == ns)
            .filter(|(_, p)| match &p.target {
                Target::Server(name) => name == server,
                Target::Namespace => true,
                Target::HttpRoute(_) => false,
            })
            .filter_map(|(key, policy)| {
                let authentication = match &policy.identity {
                    None => Authentication::Unauthenticated,
                    Some(IdentityRef::MeshTls(r)) => Authentication::MeshTls(self.mesh_tls.get(r)?.clone()),
                    Some(IdentityRef::ServiceAccount(r)) => {
                        Authentication::MeshTls(Identities::service_account(r, &config.trust_domain).ok()?)
                    }
                };
                let networks = match &policy.network {
                    None => Network::all(),
                    Some(r) => self.networks.get(r)?.clone(),
                };
                Some(Authorization { meta: AuthzMeta::Policy(key.clone()), networks, authentication })
            })
            .collect()
    }
}

fn default_authorizations(default: DefaultPolicy, config: &Config) -> Vec<Authorization> {
    let cluster = || config.cluster_networks.iter().map(|&net| Network { net, except: Vec::new() }).collect();
    let (networks, authentication) = match default {
        // Audit admits everyone under its own name: the proxy counts and logs what it admits
        // as would-be denials.
        DefaultPolicy::AllUnauthenticated | DefaultPolicy::Audit => (Network::all(), Authentication::Unauthenticated),
        DefaultPolicy::AllAuthenticated => (Network::all(), Authentication::MeshTls(Identities::any())),
        DefaultPolicy::ClusterAuthenticated => (cluster(), Authentication::MeshTls(Identities::any())),
        DefaultPolicy::Deny => return Vec::new(),
    };
    vec![Authorization { meta: AuthzMeta::Default(default), networks, authentication }]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(text: &str) -> Object {
        let value: serde_json::Value = serde_saphyr::from_str(text).unwrap();
        let kind = value["kind"].as_str().unwrap().to_string();
        match kind.as_str() {
            "Pod" => Object::from(serde_json::from_value::<Pod>(value).unwrap()),
            "Namespace" => Object::from(serde_json::from_value::<Namespace>(value).unwrap()),
            "Server" => Object::from(serde_json::from_value::<crd::Server>(value).unwrap()),
            "AuthorizationPolicy" => Object::from(serde_json::from_value::<crd::AuthorizationPolicy>(value).unwrap()),
            "MeshTLSAuthentication" => {
                Object::from(serde_json::from_value::<crd::MeshTlsAuthentication>(value).unwrap())
            }
            "HTTPLocalRateLimitPolicy" => {
                Object::from(serde_json::from_value::<crd::HttpLocalRateLimitPolicy>(value).unwrap())
            }
            "Service" => Object::from(serde_json::from_value::<Service>(value).unwrap()),
            _ => Object::from(serde_json::from_value::<crd::NetworkAuthentication>(value).unwrap()),
        }
    }

    fn pod() -> Object {
        object(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: api-0, namespace: shop, labels: {app: api}, annotations: {config.cnimesh.io/opaque-ports: '5432'}}\nspec:\n  containers:\n  - name: app\n    ports: [{name: http, containerPort: 8080}]\n    readinessProbe: {httpGet: {port: 8080, path: /ready}}\n",
        )
    }

    fn server(port: &str) -> Object {
        object(&format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {{name: api-http, namespace: shop}}\nspec: {{podSelector: {{matchLabels: {{app: api}}}}, port: {port}, proxyProtocol: HTTP/1}}\n"
        ))
    }

    fn policy() -> Object {
        object(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {name: web-to-api, namespace: shop}\nspec:\n  targetRef: {group: policy.cnimesh.io, kind: Server, name: api-http}\n  requiredAuthenticationRefs:\n  - {group: policy.cnimesh.io, kind: MeshTLSAuthentication, name: web}\n  - {group: policy.cnimesh.io, kind: NetworkAuthentication, name: pods}\n",
        )
    }

    fn mesh_tls() -> Object {
        object(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {name: web, namespace: shop}\nspec: {identityRefs: [{kind: ServiceAccount, name: web}]}\n",
        )
    }

    fn networks(cidr: &str) -> Object {
        object(&format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: NetworkAuthentication\nmetadata: {{name: pods, namespace: shop}}\nspec: {{networks: [{{cidr: '{cidr}', except: [10.0.0.1]}}]}}\n"
        ))
    }

    fn ready_index(config: Config) -> Index {
        let index = Index::new(config);
        index.apply(KINDS.map(|k| Change::Reset(k, Vec::new())));
        index
    }

    fn key() -> NsName {
        NsName::new("shop", "api-0")
    }

    fn answer(rx: &mut watch::Receiver<InboundView>) -> InboundServer {
        (**rx.borrow_and_update().as_ref().expect("pod known")).clone()
    }

    #[test]
    fn ports_no_server_names_get_the_default_and_probes_stay_open() {
        let index = ready_index(Config { default_policy: DefaultPolicy::Deny, ..Config::default() });
        assert!(index.is_ready());
        assert!(index.watch_inbound(&key(), 8080).borrow().is_none(), "unknown pod");
        index.apply([Change::Upsert(pod())]);
        let a = answer(&mut index.watch_inbound(&key(), 8080));
        assert_eq!(a.meta, ServerMeta::Default(DefaultPolicy::Deny));
        assert!(a.authorizations.is_empty());
        assert_eq!(a.protocol, Protocol::Detect);
        assert_eq!(a.probe_paths, BTreeSet::from(["/ready".to_string()]));
        let opaque = answer(&mut index.watch_inbound(&key(), 5432));
        assert_eq!(opaque.protocol, Protocol::Opaque);

        // The namespace's annotation overrides the flag; the pod's would override both.
        let mut rx = index.watch_inbound(&key(), 8080);
        rx.borrow_and_update();
        index.apply([Change::Upsert(object(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, annotations: {config.cnimesh.io/default-inbound-policy: cluster-authenticated}}\n",
        ))]);
        let a = answer(&mut rx);
        assert_eq!(a.meta, ServerMeta::Default(DefaultPolicy::ClusterAuthenticated));
        assert_eq!(a.authorizations[0].authentication, Authentication::MeshTls(Identities::any()));
        assert_eq!(a.authorizations[0].networks.len(), 5);
    }

    fn external_workload(labels: &str, ips: &str) -> Object {
        let workload: crate::external::ExternalWorkload = serde_saphyr::from_str(&format!(
            "apiVersion: workload.cnimesh.io/v1alpha1\nkind: ExternalWorkload\nmetadata: {{name: db-vm, namespace: shop, labels: {labels}}}\nspec: {{workloadIPs: {ips}, ports: [{{name: http, port: 8080}}], serviceAccountName: db}}\n"
        ))
        .unwrap();
        let record = ExternalRecord::from_crd(&workload).ok().map(Arc::new);
        Object::External(NsName::new("shop", "db-vm"), record)
    }

    #[test]
    fn a_server_selecting_an_external_workloads_labels_applies_to_its_proxy() {
        let index = ready_index(Config::default());
        let ew = external::policy_key("shop", "db-vm");
        assert!(index.watch_inbound(&ew, 8080).borrow().is_none(), "unknown until it exists");
        index.apply([
            Change::Upsert(external_workload("{app: api}", "[192.0.2.10]")),
            Change::Upsert(server("http")),
            Change::Upsert(policy()),
            Change::Upsert(mesh_tls()),
            Change::Upsert(networks("0.0.0.0/0")),
        ]);
        let mut rx = index.watch_inbound(&ew, 8080);
        let a = answer(&mut rx);
        assert_eq!(a.meta, ServerMeta::Server("api-http".into()), "the Server's named port resolves on it");
        let names = match &a.authorizations[0].authentication {
            Authentication::MeshTls(ids) => ids.names.clone(),
            other => panic!("{other:?}"),
        };
        let want = BTreeSet::from(["web.shop.serviceaccount.identity.cnimesh.cluster.local".to_string()]);
        assert_eq!(names, want, "only web may call it");

        // A pod re-list leaves it alone; an invalid version keeps the last good one; a delete ends it.
        index.apply([Change::Reset(Kind::Pod, Vec::new())]);
        assert!(!rx.has_changed().unwrap() || rx.borrow_and_update().is_some());
        index.apply([Change::Reset(Kind::ExternalWorkload, vec![external_workload("{app: api}", "[nope]")])]);
        assert!(index.watch_inbound(&ew, 8080).borrow().is_some(), "the last good version stays");
        index.apply([Change::Delete(Kind::ExternalWorkload, NsName::new("shop", "db-vm"))]);
        assert!(rx.borrow_and_update().is_none(), "gone with the ExternalWorkload");
    }

    #[test]
    fn a_server_takes_only_what_policies_allow_and_updates_are_pushed() {
        let index = ready_index(Config::default());
        index.apply([Change::Upsert(pod()), Change::Upsert(server("http"))]);
        let mut rx = index.watch_inbound(&key(), 8080);
        let a = answer(&mut rx);
        assert_eq!(a.meta, ServerMeta::Server("api-http".into()));
        assert_eq!(a.protocol, Protocol::Http1);
        assert!(a.authorizations.is_empty(), "a Server with no policy denies");

        // A policy whose references are missing stays out; once they exist, it counts.
        index.apply([Change::Upsert(policy())]);
        assert!(!rx.has_changed().unwrap());
        index.apply([Change::Upsert(mesh_tls()), Change::Upsert(networks("10.0.0.0/8"))]);
        let a = answer(&mut rx);
        assert_eq!(a.authorizations.len(), 1);
        let authz = &a.authorizations[0];
        assert_eq!(authz.meta, AuthzMeta::Policy(NsName::new("shop", "web-to-api")));
        assert_eq!(authz.networks[0].except, vec!["10.0.0.1/32".parse::<IpNet>().unwrap()]);
        let Authentication::MeshTls(ids) = &authz.authentication else { panic!("{authz:?}") };
        assert!(ids.names.contains("web.shop.serviceaccount.identity.cnimesh.cluster.local"));

        // A bad edit is refused and the last good version stays; an unrelated port is unaffected.
        index.apply([Change::Upsert(networks("10.0.0.0/99"))]);
        assert!(!rx.has_changed().unwrap());
        assert_eq!(
            answer(&mut index.watch_inbound(&key(), 9090)).meta,
            ServerMeta::Default(DefaultPolicy::AllUnauthenticated)
        );

        // A port name no container declares selects nothing: the default applies.
        index.apply([Change::Upsert(server("grpc"))]);
        assert_eq!(answer(&mut rx).meta, ServerMeta::Default(DefaultPolicy::AllUnauthenticated));
        index.apply([Change::Delete(Kind::Pod, key())]);
        assert!(rx.borrow_and_update().is_none());
    }

    #[test]
    fn a_namespace_target_covers_every_server_and_service_accounts_are_identities() {
        let index = ready_index(Config::default());
        let ns_policy = object(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {name: ns-wide, namespace: shop}\nspec:\n  targetRef: {kind: Namespace, name: shop}\n  requiredAuthenticationRefs: [{kind: ServiceAccount, name: ops, namespace: tools}]\n",
        );
        index.apply([Change::Upsert(pod()), Change::Upsert(server("8080")), Change::Upsert(ns_policy)]);
        let a = answer(&mut index.watch_inbound(&key(), 8080));
        assert_eq!(a.authorizations.len(), 1);
        assert_eq!(a.authorizations[0].networks, Network::all());
        let Authentication::MeshTls(ids) = &a.authorizations[0].authentication else { panic!() };
        assert!(ids.names.contains("ops.tools.serviceaccount.identity.cnimesh.cluster.local"));
    }

    fn rate_limit(name: &str, created: &str, spec: &str) -> Object {
        object(&format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: HTTPLocalRateLimitPolicy\nmetadata: {{name: {name}, namespace: shop, creationTimestamp: '{created}'}}\nspec:\n  targetRef: {{group: policy.cnimesh.io, kind: Server, name: api-http}}\n{spec}"
        ))
    }

    #[test]
    fn a_rate_limit_is_served_on_its_server_and_the_oldest_of_two_wins() {
        let index = ready_index(Config::default());
        index.apply([Change::Upsert(pod()), Change::Upsert(server("8080"))]);
        let mut rx = index.watch_inbound(&key(), 8080);
        assert_eq!(answer(&mut rx).rate_limit, None);

        let newer = rate_limit("newer", "2026-01-02T00:00:00Z", "  total: {requestsPerSecond: 5}\n");
        let older = rate_limit(
            "older",
            "2026-01-01T00:00:00Z",
            "  total: {requestsPerSecond: 100}\n  identity: {requestsPerSecond: 10}\n  overrides:\n  - requestsPerSecond: 50\n    clientRefs: [{kind: ServiceAccount, name: web}]\n",
        );
        index.apply([Change::Upsert(newer.clone())]);
        assert_eq!(answer(&mut rx).rate_limit.unwrap().name, "newer");
        index.apply([Change::Upsert(older)]);
        let limit = answer(&mut rx).rate_limit.unwrap();
        assert_eq!((limit.name.as_str(), limit.total, limit.identity), ("older", Some(100), Some(10)));
        let web = "web.shop.serviceaccount.identity.cnimesh.cluster.local".to_string();
        assert_eq!(limit.overrides, vec![(50, BTreeSet::from([web]))]);

        // A bad edit of the one in force is refused; its last good version stays.
        index.apply([Change::Upsert(rate_limit("older", "2026-01-01T00:00:00Z", "  total: {requestsPerSecond: 0}\n"))]);
        assert!(!rx.has_changed().unwrap());
        // Removed: the other takes over; both removed: no limit.
        index.apply([Change::Delete(Kind::HttpLocalRateLimitPolicy, NsName::new("shop", "older"))]);
        assert_eq!(answer(&mut rx).rate_limit.unwrap().total, Some(5));
        index.apply([Change::Reset(Kind::HttpLocalRateLimitPolicy, Vec::new())]);
        assert_eq!(answer(&mut rx).rate_limit, None);
    }

    #[test]
    fn an_audit_server_admits_after_its_policies_and_a_bad_access_policy_keeps_the_old_mode() {
        let index = ready_index(Config::default());
        let audit_server = |mode: &str| {
            object(&format!(
                "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {{name: api-http, namespace: shop}}\nspec: {{podSelector: {{}}, port: 8080, accessPolicy: {mode}}}\n"
            ))
        };
        index.apply([
            Change::Upsert(pod()),
            Change::Upsert(audit_server("audit")),
            Change::Upsert(policy()),
            Change::Upsert(mesh_tls()),
            Change::Upsert(networks("10.0.0.0/8")),
        ]);
        let mut rx = index.watch_inbound(&key(), 8080);
        let metas: Vec<AuthzMeta> = answer(&mut rx).authorizations.into_iter().map(|a| a.meta).collect();
        assert_eq!(
            metas,
            [AuthzMeta::Policy(NsName::new("shop", "web-to-api")), AuthzMeta::Default(DefaultPolicy::Audit)]
        );
        index.apply([Change::Upsert(audit_server("audti"))]);
        assert!(!rx.has_changed().unwrap(), "refused: the audit mode stays, nothing widened or narrowed");
        index.apply([Change::Upsert(audit_server("deny"))]);
        assert_eq!(answer(&mut rx).authorizations.len(), 1, "deny: only the policy");

        // The namespace default `audit` on a port no Server names.
        index.apply([Change::Upsert(object(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, annotations: {config.cnimesh.io/default-inbound-policy: audit}}\n",
        ))]);
        let a = answer(&mut index.watch_inbound(&key(), 9090));
        assert_eq!(a.meta, ServerMeta::Default(DefaultPolicy::Audit));
        assert_eq!(a.authorizations[0].authentication, Authentication::Unauthenticated);
    }

    /// A Service `name` selecting api's pod, port 80 to `target` (a number or a container port
    /// name) with `app_protocol`.
    fn service(name: &str, target: &str, app_protocol: &str) -> Object {
        object(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  selector: {{app: api}}\n  ports: [{{port: 80, targetPort: {target}, appProtocol: {app_protocol}}}]\n"
        ))
    }

    #[test]
    fn a_services_app_protocol_declares_the_protocol_of_the_pod_ports_it_targets() {
        let index = ready_index(Config::default());
        index.apply([Change::Upsert(pod())]);
        let mut rx = index.watch_inbound(&key(), 8080);
        assert_eq!(answer(&mut rx).protocol, Protocol::Detect, "nothing declared");

        for (app_protocol, served) in [
            ("http", Protocol::Http1),
            ("kubernetes.io/ws", Protocol::Http1),
            ("kubernetes.io/h2c", Protocol::Http2),
            ("cnimesh.io/opaque", Protocol::Opaque),
            ("linkerd.io/opaque", Protocol::Opaque),
            ("https", Protocol::Detect),
        ] {
            index.apply([Change::Upsert(service("api", "8080", app_protocol))]);
            assert_eq!(answer(&mut rx).protocol, served, "{app_protocol}");
        }

        // A named targetPort reaches the container port of that name.
        index.apply([Change::Upsert(service("api", "http", "kubernetes.io/h2c"))]);
        assert_eq!(answer(&mut rx).protocol, Protocol::Http2, "targetPort: http is 8080");
        assert_eq!(answer(&mut index.watch_inbound(&key(), 9090)).protocol, Protocol::Detect, "another port");

        // The Service removed: detection again, pushed to the open stream.
        index.apply([Change::Delete(Kind::Service, NsName::new("shop", "api"))]);
        assert_eq!(answer(&mut rx).protocol, Protocol::Detect);
        // A Service that selects another app declares nothing for this pod.
        index.apply([Change::Upsert(object(
            "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec:\n  selector: {app: db}\n  ports: [{port: 80, targetPort: 8080, appProtocol: http}]\n",
        ))]);
        assert!(!rx.has_changed().unwrap(), "no change for api's pod");
    }

    #[test]
    fn two_services_declaring_different_protocols_for_a_port_leave_it_detected() {
        let index = ready_index(Config::default());
        index.apply([Change::Upsert(pod()), Change::Upsert(service("api", "8080", "http"))]);
        let mut rx = index.watch_inbound(&key(), 8080);
        assert_eq!(answer(&mut rx).protocol, Protocol::Http1);
        index.apply([Change::Upsert(service("api-admin", "http", "cnimesh.io/opaque"))]);
        assert_eq!(answer(&mut rx).protocol, Protocol::Detect, "never a guess between two declarations");
        index.apply([Change::Upsert(service("api-admin", "http", "http"))]);
        assert_eq!(answer(&mut rx).protocol, Protocol::Http1, "agreeing declarations stand");
    }

    #[test]
    fn a_servers_protocol_then_the_opaque_ports_annotation_win_over_app_protocol() {
        let index = ready_index(Config::default());
        let detecting_server = object(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {name: api-http, namespace: shop}\nspec: {podSelector: {matchLabels: {app: api}}, port: 8080}\n",
        );
        let db = object(
            "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec:\n  selector: {app: api}\n  ports: [{port: 5432, appProtocol: http}]\n",
        );
        index.apply([
            Change::Upsert(pod()),
            Change::Upsert(service("api", "8080", "kubernetes.io/h2c")),
            Change::Upsert(db),
        ]);
        let mut rx = index.watch_inbound(&key(), 8080);
        assert_eq!(answer(&mut rx).protocol, Protocol::Http2);

        // A Server with no proxyProtocol (unknown) leaves it to the declaration…
        index.apply([Change::Upsert(detecting_server)]);
        let a = answer(&mut rx);
        assert_eq!((a.meta, a.protocol), (ServerMeta::Server("api-http".into()), Protocol::Http2));
        // …one that says HTTP/1 decides.
        index.apply([Change::Upsert(server("8080"))]);
        assert_eq!(answer(&mut rx).protocol, Protocol::Http1);
        // The pod's opaque-ports annotation (5432) wins over the Service's `http` there.
        assert_eq!(answer(&mut index.watch_inbound(&key(), 5432)).protocol, Protocol::Opaque);
    }

    #[test]
    fn not_ready_until_every_kind_is_listed() {
        let index = Index::new(Config::default());
        index.apply(KINDS[1..].iter().map(|&k| Change::Listed(k)));
        assert!(!index.is_ready());
        index.apply([Change::Reset(Kind::Pod, vec![pod()])]);
        assert!(index.is_ready());
    }
}
