//! A small Kubernetes API server, in-process: it holds objects of any kind and answers the verbs
//! controllers and `kubectl` use on them, so one can stand in for a whole cluster, for tests and
//! for local mode (two of them for two clusters). It keeps state, so what a client writes is what
//! later lists and watches see:
//!
//! - list and watch of any resource, all namespaces or one, with label and field selectors; a
//!   watch resumed from a resourceVersion is replayed what changed since (`watch`);
//! - create (POST), get, replace (PUT, 409 on a stale resourceVersion), delete; for tests, a
//!   YAML manifest applied by name as `kubectl apply -f` would ([`ClusterApi::apply_yaml`]);
//! - server-side apply with field managers (`apply`); JSON merge patch and an approximation of
//!   strategic merge patch (`patch`), of the object or of its `status` subresource;
//! - what a real API server adds: resourceVersions, uids, a Service's ClusterIP, a Secret's
//!   `stringData` turned into base64 `data`, no event for a write that changes nothing (`store`);
//! - discovery for kubectl (`discovery`) over a table of the kinds the mesh uses, plus the kinds
//!   of every CustomResourceDefinition written to it (`kinds`);
//! - service account tokens and TokenReview (`tokens`), the pod and service proxy subresources
//!   (`pod_proxy`);
//! - an optional bearer token (401 for any other), and fault injection (`faults`): refusing,
//!   delays, conflicts, failures;
//! - opt-in RBAC (`rbac`): a service account's token is allowed only what its Roles and
//!   ClusterRoles grant (403 otherwise), and SelfSubjectAccessReview answers by them.
//!
//! It is reached in-process ([`ClusterApi::client`]) or over HTTPS on 127.0.0.1
//! ([`ClusterApi::serve`], a certificate from a CA of its own that [`Served::kubeconfig`] carries
//! inline), which is how kube-rs clients with a kubeconfig and `kubectl` reach it. Every request
//! is recorded ([`Call`]) so a test can assert what was asked, with which credentials, and in
//! which order.
//!
//! Layers: call | response | selector | patch | kinds | faults → pod_proxy | store → rbac → tokens | discovery | client → watch | apply | list → routing → tls

mod apply;
mod call;
mod client;
mod discovery;
mod faults;
mod kinds;
mod list;
mod patch;
mod pod_proxy;
mod rbac;
mod response;
mod routing;
mod selector;
mod store;
mod tls;
mod tokens;
mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::Notify;

pub use call::Call;
pub use client::client_for;
pub use discovery::MINOR_VERSION;
pub use faults::Faults;
pub use patch::merge;
pub use response::Body;
pub use tls::{ServeError, Served};
pub use tokens::NoRandomness;

use kinds::Resource;
use store::Store;

/// Only guards against a hung test in [`ClusterApi::until`]; nothing measures time.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A whole cluster's API server, in memory.
#[derive(Default)]
pub struct ClusterApi {
    store: Mutex<Store>,
    calls: Mutex<Vec<Call>>,
    /// Woken on every request and every change, for [`ClusterApi::until`].
    changed: Notify,
    token: Mutex<Option<String>>,
    tokens: Mutex<tokens::Tokens>,
    faults: Mutex<Faults>,
    /// The minor version `/version` answers (1.x); unset: [`MINOR_VERSION`].
    minor_version: Mutex<Option<u32>>,
    /// Plain-text answers to GETs of fixed paths (a pod proxy's `/metrics`, for pods that are
    /// not running), by path: [`ClusterApi::set_text`].
    texts: Mutex<BTreeMap<String, String>>,
    /// Whether service accounts' tokens are held to their roles ([`ClusterApi::enforce_rbac`]).
    rbac: std::sync::atomic::AtomicBool,
    /// The objects each manifest put by [`ClusterApi::apply_yaml`] holds, by the manifest's name.
    applied: Mutex<BTreeMap<String, Vec<ObjectKey>>>,
}

/// apiVersion, kind, namespace (empty: cluster-scoped) and name.
type ObjectKey = (String, String, String, String);

/// Why [`ClusterApi::apply_yaml`] refused a manifest; nothing of it was applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("parsing {name}: {source}")]
    Parse { name: String, source: Box<serde_saphyr::Error> },
    #[error("an object of {name} without apiVersion, kind or metadata.name")]
    Unnamed { name: String },
}

impl ClusterApi {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A kube client whose every request this server answers, in-process.
    pub fn client(self: &Arc<Self>) -> kube::Client {
        client_for(self.clone(), |api, req: Request<kube::client::Body>| async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            api.handle(parts.method, &parts.uri, &parts.headers, bytes).await
        })
    }

    /// Serves this server over HTTP/1.1 in TLS on an ephemeral port of 127.0.0.1.
    pub async fn try_serve(self: &Arc<Self>) -> Result<Served, ServeError> {
        tls::serve(self.clone(), std::net::SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Serves this server on `addr` (a pod's address, local mode's bridge), in the network
    /// namespace of the calling thread. Refused unless `addr` is loopback or a token is required
    /// ([`ClusterApi::require_token`]): beyond its token, the server authorizes nothing unless
    /// RBAC is enforced ([`ClusterApi::enforce_rbac`]).
    pub async fn try_serve_at(self: &Arc<Self>, addr: std::net::SocketAddr) -> Result<Served, ServeError> {
        tls::serve(self.clone(), addr).await
    }

    /// Serves this server on a socket bound by the caller (in a pod's network namespace, by a
    /// thread that entered it), under the rule of [`ClusterApi::try_serve_at`].
    pub async fn try_serve_listener(self: &Arc<Self>, listener: std::net::TcpListener) -> Result<Served, ServeError> {
        tls::serve_listener(self.clone(), listener).await
    }

    /// Whether requests must bear a token ([`ClusterApi::require_token`]).
    pub fn requires_token(&self) -> bool {
        self.token.lock().is_some()
    }

    /// [`ClusterApi::try_serve`], for tests: panics when it cannot serve.
    pub async fn serve(self: &Arc<Self>) -> Served {
        self.try_serve().await.expect("serving the API server on 127.0.0.1")
    }

    /// From now on, only requests bearing `token` (or a token this server issued for the API)
    /// are answered (others: 401).
    pub fn require_token(&self, token: &str) {
        *self.token.lock() = Some(token.to_string());
    }

    /// From now on (`true`), a request bearing a token this server issued for a service account
    /// is allowed only what the Roles and ClusterRoles bound to that account grant (403
    /// Forbidden otherwise), and a SelfSubjectAccessReview answers by them. The required token
    /// ([`ClusterApi::require_token`]), and any request when none is required, may still do
    /// everything: they stand for the cluster's administrator.
    pub fn enforce_rbac(&self, enforce: bool) {
        self.rbac.store(enforce, std::sync::atomic::Ordering::SeqCst);
    }

    /// A token for service account `namespace/name`, for `audiences` (none: the API's own, which
    /// also authenticates requests to this server), as its token request subresource issues one.
    pub fn issue_token(&self, namespace: &str, name: &str, audiences: &[&str]) -> Result<String, NoRandomness> {
        let uid = self
            .get("v1", "ServiceAccount", namespace, name)
            .and_then(|a| a["metadata"]["uid"].as_str().map(String::from));
        let audiences = audiences.iter().map(|a| a.to_string()).collect();
        self.tokens.lock().issue(namespace, name, &uid.unwrap_or_default(), audiences)
    }

    /// Answers GETs of `path` with `text` from now on, without asking a pod (a pod proxy's
    /// `/metrics` of a workload that is only data): replaced by the next call for the same path.
    pub fn set_text(&self, path: &str, text: String) {
        self.texts.lock().insert(path.to_string(), text);
    }

    /// `/version` answers Kubernetes 1.`minor` from now on, as after the cluster's own upgrade.
    pub fn set_minor_version(&self, minor: u32) {
        *self.minor_version.lock() = Some(minor);
    }

    /// Refusing: every open watch ends and every request is answered 503, until called with
    /// `false`.
    pub fn refuse(&self, refusing: bool) {
        self.faults.lock().refusing = refusing;
        if refusing {
            self.store.lock().watches.clear();
        }
        self.changed.notify_waiters();
    }

    /// Ends every open watch of resources whose plural contains `plural` (empty: all), as a
    /// real server does when a watch's timeout expires; clients resume from their last version.
    pub fn end_watches(&self, plural: &str) {
        self.store.lock().watches.retain(|w| !w.resource.plural.contains(plural));
        self.changed.notify_waiters();
    }

    /// Forgets the history of changes, as a real server's compaction does: a watch resumed from
    /// a version before now is told 410 Gone, and its client must list again.
    pub fn compact(&self) {
        let mut store = self.store.lock();
        store.compacted = store.version;
        store.history.clear();
    }

    /// An API server restart that lost its watch cache, for the resources whose plural contains
    /// `plural`: their watches end, `change` is made while they cannot be opened again (500), and
    /// the history is compacted, so the clients' resumes are told 410 Gone and they list again,
    /// finding what `change` did only in that list.
    pub fn restart_losing_history(&self, plural: &str, change: impl FnOnce(&Self)) {
        let before = self.faults.lock().clone();
        self.set_faults(|f| {
            f.failing_requests = usize::MAX;
            f.only_paths_containing = format!("/{plural}");
        });
        self.end_watches(plural);
        change(self);
        self.compact();
        self.set_faults(|f| *f = before);
    }

    /// The current resourceVersion (of the last change), as a list answers it.
    pub fn resource_version(&self) -> String {
        self.store.lock().version.to_string()
    }

    /// Changes the faults in force (delays, conflicts, failures; see [`Faults`]).
    pub fn set_faults(&self, change: impl FnOnce(&mut Faults)) {
        let refusing = {
            let mut faults = self.faults.lock();
            change(&mut faults);
            faults.refusing
        };
        self.refuse(refusing);
    }

    /// Creates or replaces `object` (its `apiVersion`, `kind`, namespace and name say where), as
    /// `kubectl apply` would: watches see ADDED or MODIFIED. A `metadata.uid` it carries is kept.
    pub fn put(&self, object: Value) -> Value {
        let api_version = object["apiVersion"].as_str().expect("an apiVersion").to_string();
        let kind = object["kind"].as_str().expect("a kind").to_string();
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        let name = object["metadata"]["name"].as_str().expect("a name").to_string();
        let written = {
            let mut store = self.store.lock();
            let resource = self.resource(&store, &api_version, &kind);
            let old = store.get(&resource, &(namespace.clone(), name.clone())).cloned();
            // A test may say an object's uid (a pod's, which the runtime also knows), where a
            // client's create cannot.
            let uid = object["metadata"]["uid"].clone();
            let mut object = store.server_fields(&resource, old.as_ref(), object);
            if uid.is_string() {
                object["metadata"]["uid"] = uid;
            }
            let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
            store.commit(&resource, (namespace, name), object, kind)
        };
        self.changed.notify_waiters();
        written
    }

    /// Every object of the YAML (or JSON) stream `yaml`, put as `kubectl apply -f <name>` would:
    /// objects the manifest `name` held before and no longer does are deleted.
    pub fn apply_yaml(&self, name: &str, yaml: &str) -> Result<(), ApplyError> {
        let docs: Vec<Value> = serde_saphyr::from_str_multiple(yaml)
            .map_err(|source| ApplyError::Parse { name: name.to_string(), source: Box::new(source) })?;
        let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
        let keys = docs.iter().map(key_of).collect::<Option<Vec<_>>>();
        let keys = keys.ok_or_else(|| ApplyError::Unnamed { name: name.to_string() })?;
        docs.into_iter().for_each(|doc| drop(self.put(doc)));
        let before = self.applied.lock().insert(name.to_string(), keys.clone()).unwrap_or_default();
        for gone in before.into_iter().filter(|k| !keys.contains(k)) {
            self.remove_if_present(&gone);
        }
        Ok(())
    }

    /// Deletes every object applied as `name` (`kubectl delete -f <name>`).
    pub fn delete_applied(&self, name: &str) {
        let applied = self.applied.lock().remove(name).unwrap_or_default();
        applied.iter().for_each(|key| self.remove_if_present(key));
    }

    /// Deletes the object unless something else did already.
    fn remove_if_present(&self, (api_version, kind, namespace, name): &ObjectKey) {
        if self.get(api_version, kind, namespace, name).is_some() {
            self.remove(api_version, kind, namespace, name);
        }
    }

    /// Deletes an object, as `kubectl delete` would: watches see DELETED.
    pub fn remove(&self, api_version: &str, kind: &str, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        {
            let mut store = self.store.lock();
            let resource = self.resource(&store, api_version, kind);
            let object = store.get(&resource, &key).cloned().expect("the object to remove exists");
            store.commit(&resource, key, object, "DELETED");
        }
        self.changed.notify_waiters();
    }

    /// The object as stored now.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let store = self.store.lock();
        let resource = self.resource(&store, api_version, kind);
        store.get(&resource, &(namespace.to_string(), name.to_string())).cloned()
    }

    /// Every object of `kind` stored now.
    pub fn list(&self, api_version: &str, kind: &str) -> Vec<Value> {
        let store = self.store.lock();
        let resource = self.resource(&store, api_version, kind);
        store.objects.get(&resource).map(|o| o.values().cloned().collect()).unwrap_or_default()
    }

    fn resource(&self, store: &Store, api_version: &str, kind: &str) -> Resource {
        Resource { api_version: api_version.to_string(), plural: kinds::plural_of(&store.kinds(), api_version, kind) }
    }

    /// Every request so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }

    /// Waits until `check` finds what it looks for in this server (its calls, its objects),
    /// which it is given again after every request and change; panics naming `what` after
    /// [`PATIENCE`].
    pub async fn until<T>(&self, what: &str, mut check: impl FnMut(&Self) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let changed = self.changed.notified();
            if let Some(found) = check(self) {
                return found;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("waited {PATIENCE:?} for {what}; the calls were:\n{}", self.describe_calls());
            }
        }
    }

    /// Waits for the `n`th watch (from 1) of `path` to be open; its request.
    pub async fn nth_watch(&self, path: &str, n: usize) -> Call {
        let what = format!("watch {n} of {path}");
        self.until(&what, |a| a.calls.lock().iter().filter(|c| c.path == path && c.is_watch()).nth(n - 1).cloned())
            .await
    }

    /// Waits for a watch of `path` from resourceVersion `version` to be open; its request.
    pub async fn watch_from(&self, path: &str, version: &str) -> Call {
        let what = format!("a watch of {path} from {version}");
        self.until(&what, |a| {
            a.calls
                .lock()
                .iter()
                .rev()
                .find(|c| c.path == path && c.is_watch() && c.param("resourceVersion") == Some(version))
                .cloned()
        })
        .await
    }

    /// How many lists (GETs that are not watches) of `path` were asked for.
    pub fn lists_of(&self, path: &str) -> usize {
        self.calls.lock().iter().filter(|c| c.path == path && c.method == http::Method::GET && !c.is_watch()).count()
    }

    /// One line per call, for failure messages.
    pub fn describe_calls(&self) -> String {
        self.calls
            .lock()
            .iter()
            .map(|c| {
                let query: Vec<String> = c.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("{} {}?{}", c.method, c.path, query.join("&"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn key_of(doc: &Value) -> Option<ObjectKey> {
    let s = |p: &str| doc.pointer(p).and_then(Value::as_str).map(String::from);
    Some((s("/apiVersion")?, s("/kind")?, s("/metadata/namespace").unwrap_or_default(), s("/metadata/name")?))
}
