//! A mocked Kubernetes API server that holds objects of any kind and answers the verbs controllers
//! use on them, so one can stand in for a whole cluster (both clusters of the mirror's
//! Kubernetes path). [`crate::kube_mock`] scripts list and watch answers by hand; this one keeps
//! state instead, so what a controller writes is what later lists and watches see:
//!
//! - list and watch of any resource, all namespaces or one, with label and field selectors; a
//!   watch resumed from a resourceVersion is replayed what changed since;
//! - create (POST), get, replace (PUT, 409 on a stale resourceVersion), delete;
//! - server-side apply (`application/apply-patch+yaml`: the body must carry `apiVersion`, `kind`
//!   and the name, `fieldManager` is required, another manager's object is a 409 unless
//!   `force=true`); JSON merge patch of the object or of its `status` subresource;
//! - what a real API server adds: resourceVersions, uids, a Service's ClusterIP, a Secret's
//!   `stringData` turned into base64 `data`, no event for a write that changes nothing;
//! - an optional bearer token (401 for any other), and a refusing mode (every open watch ended,
//!   every request answered 503) for a cluster that stops answering.
//!
//! It is reached in-process ([`ClusterApi::client`]) or over HTTPS on 127.0.0.1
//! ([`ClusterApi::serve`], a certificate from a CA of its own that [`Served::kubeconfig`] carries
//! inline), which is how a Link's kubeconfig reaches it. Every request is recorded ([`Call`]) so a
//! test can assert what was asked, with which credentials, and in which order.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

/// Only guards against a hung test in [`ClusterApi::until`]; nothing measures time.
pub const PATIENCE: Duration = Duration::from_secs(60);

type Body = BoxBody<Bytes, Infallible>;

/// One request as the mock saw it.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    pub path: String,
    /// Percent-decoded `key=value` pairs of the query, in order.
    pub query: Vec<(String, String)>,
    pub content_type: String,
    pub body: Value,
    /// The `Authorization` header, as sent.
    pub authorization: Option<String>,
}

impl Call {
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn is_watch(&self) -> bool {
        self.param("watch") == Some("true")
    }

    /// A server-side apply.
    pub fn is_apply(&self) -> bool {
        self.method == Method::PATCH && self.content_type.starts_with(APPLY_PATCH)
    }
}

const APPLY_PATCH: &str = "application/apply-patch+yaml";
const MERGE_PATCH: &str = "application/merge-patch+json";
const STRATEGIC_PATCH: &str = "application/strategic-merge-patch+json";

/// Which collection a path names: `/api/v1/...` or `/apis/<group>/<version>/...`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Resource {
    /// `v1` or `<group>/<version>`: the objects' `apiVersion`.
    api_version: String,
    /// The plural, lower case (`services`).
    plural: String,
}

#[derive(Debug)]
struct Target {
    resource: Resource,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => (version.to_string(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let owned = |s: &&str| Some(s.to_string());
    let (namespace, plural, name, subresource) = match rest {
        ["namespaces", ns, plural] => (owned(ns), plural, None, None),
        ["namespaces", ns, plural, name] => (owned(ns), plural, owned(name), None),
        ["namespaces", ns, plural, name, sub] => (owned(ns), plural, owned(name), owned(sub)),
        [plural] => (None, plural, None, None),
        [plural, name] => (None, plural, owned(name), None),
        [plural, name, sub] => (None, plural, owned(name), owned(sub)),
        _ => return None,
    };
    Some(Target { resource: Resource { api_version, plural: plural.to_string() }, namespace, name, subresource })
}

/// The plural of a kind, as the API spells every kind these tests use.
fn plural_of(kind: &str) -> String {
    format!("{}s", kind.to_lowercase())
}

/// `namespace` (empty: cluster-scoped), `name`.
type Key = (String, String);

struct WatchSink {
    resource: Resource,
    namespace: Option<String>,
    selector: Selector,
    tx: mpsc::UnboundedSender<Bytes>,
}

/// One change, for replaying to watches that resume from an older version.
struct Change {
    version: u64,
    resource: Resource,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct Store {
    objects: BTreeMap<Resource, BTreeMap<Key, Value>>,
    history: Vec<Change>,
    watches: Vec<WatchSink>,
    version: u64,
    uids: u64,
    cluster_ips: u32,
}

impl Store {
    /// Stores `object` (stamped with a new resourceVersion) and tells the watches.
    fn commit(&mut self, resource: &Resource, key: Key, mut object: Value, kind: &'static str) -> Value {
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        if kind == "DELETED" {
            self.objects.entry(resource.clone()).or_default().remove(&key);
        } else {
            self.objects.entry(resource.clone()).or_default().insert(key.clone(), object.clone());
        }
        let line = Bytes::from(format!("{}\n", json!({"type": kind, "object": object})));
        self.watches.retain(|w| {
            if w.resource != *resource || w.namespace.as_ref().is_some_and(|ns| *ns != key.0) {
                return !w.tx.is_closed();
            }
            !w.selector.matches(&object) || w.tx.send(line.clone()).is_ok()
        });
        self.history.push(Change { version: self.version, resource: resource.clone(), kind, object: object.clone() });
        object
    }

    fn get(&self, resource: &Resource, key: &Key) -> Option<&Value> {
        self.objects.get(resource)?.get(key)
    }
}

/// A label selector (`a=b,c!=d,e,!f`) and a field selector (`metadata.name=x`) together.
#[derive(Debug, Clone, Default)]
struct Selector {
    labels: Vec<(String, Op)>,
    fields: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
enum Op {
    Is(String),
    IsNot(String),
    Exists,
    Absent,
}

impl Selector {
    fn parse(labels: Option<&str>, fields: Option<&str>) -> Self {
        let terms = |s: Option<&str>| -> Vec<String> {
            s.unwrap_or_default().split(',').map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect()
        };
        let labels = terms(labels)
            .into_iter()
            .map(|term| {
                if let Some((k, v)) = term.split_once("!=") {
                    (k.to_string(), Op::IsNot(v.to_string()))
                } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                    (k.to_string(), Op::Is(v.to_string()))
                } else if let Some(k) = term.strip_prefix('!') {
                    (k.to_string(), Op::Absent)
                } else {
                    (term, Op::Exists)
                }
            })
            .collect();
        let fields = terms(fields)
            .into_iter()
            .filter_map(|t| t.split_once('=').map(|(k, v)| (k.trim_end_matches('=').to_string(), v.to_string())))
            .collect();
        Self { labels, fields }
    }

    fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label_ok = self.labels.iter().all(|(key, op)| {
            let value = labels.get(key).and_then(Value::as_str);
            match op {
                Op::Is(v) => value == Some(v.as_str()),
                Op::IsNot(v) => value != Some(v.as_str()),
                Op::Exists => value.is_some(),
                Op::Absent => value.is_none(),
            }
        });
        label_ok
            && self.fields.iter().all(|(path, want)| {
                let pointer = format!("/{}", path.replace('.', "/"));
                object.pointer(&pointer).and_then(Value::as_str).unwrap_or_default() == want
            })
    }
}

/// A whole cluster's API server, in memory.
#[derive(Default)]
pub struct ClusterApi {
    store: Mutex<Store>,
    calls: Mutex<Vec<Call>>,
    /// Woken on every request and every change, for [`ClusterApi::until`].
    changed: Notify,
    token: Mutex<Option<String>>,
    refusing: AtomicBool,
}

fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response<Body> {
    let message = message.into();
    json_response(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": reason,
            "code": code.as_u16(), "message": message}),
    )
}

fn json_response(code: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("a valid response")
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(kv), String::new()),
        })
        .collect()
}

/// `object` without what the server maintains, to tell a write that changes nothing.
fn content(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    object
}

/// A server listening on 127.0.0.1 for a [`ClusterApi`], over TLS with a certificate for
/// `127.0.0.1` from a CA of its own; stops (connections too) when dropped.
pub struct Served {
    pub addr: SocketAddr,
    /// The CA its certificate chains to (PEM).
    pub ca_pem: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Served {
    /// `https://127.0.0.1:PORT`.
    pub fn server(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// A kubeconfig for this server as `cluster`, authenticating with `token`: what `cnimesh
    /// multicluster link` writes (the server, its CA inline, a token).
    pub fn kubeconfig(&self, cluster: &str, token: &str) -> String {
        self.kubeconfig_with_user(cluster, &format!("token: {token}"))
    }

    /// The same with the user's fields given as YAML (indented under `user:` by this function).
    pub fn kubeconfig_with_user(&self, cluster: &str, user: &str) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let user: String = user.lines().map(|l| format!("    {l}\n")).collect();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\ncontexts:\n- name: {cluster}\n  context:\n    cluster: {cluster}\n    user: mirror\ncurrent-context: {cluster}\nusers:\n- name: mirror\n  user:\n{user}",
            self.server()
        )
    }
}

/// A TLS acceptor for `127.0.0.1` and the CA (PEM) its certificate chains to.
fn tls_for_loopback() -> (tokio_rustls::TlsAcceptor, String) {
    use cnimesh_identity::ca;
    let lifetime = Duration::from_secs(24 * 3600);
    let authority = ca::new_private_ca("kube-api-mock", lifetime).expect("a CA");
    let leaf = ca::Signer::new(&authority)
        .and_then(|s| s.new_server_cert(&["127.0.0.1".to_string()], lifetime))
        .expect("a server certificate");
    let chain = cnimesh_identity::pem::certs(leaf.cert_pem.as_bytes(), "the mock's certificate").expect("PEM");
    let key = cnimesh_identity::pem::key(leaf.key_pem.as_bytes(), "the mock's key").expect("PEM");
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(cnimesh_identity::provider::provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("a server config");
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), authority.cert_pem)
}

impl ClusterApi {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A kube client whose every request this mock answers, in-process.
    pub fn client(self: &Arc<Self>) -> kube::Client {
        crate::kube_mock::client_for(self.clone(), |mock, req: Request<kube::client::Body>| async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            mock.handle(parts.method, &parts.uri, &parts.headers, bytes)
        })
    }

    /// Serves this mock over HTTP/1.1 in TLS on an ephemeral port of 127.0.0.1.
    pub async fn serve(self: &Arc<Self>) -> Served {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding 127.0.0.1:0");
        let addr = listener.local_addr().expect("a bound address");
        let (acceptor, ca_pem) = tls_for_loopback();
        let mock = self.clone();
        let task = tokio::spawn(async move {
            // Held here so that aborting the accept loop ends its connections too.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let mock = mock.clone();
                let acceptor = acceptor.clone();
                let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let mock = mock.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        Ok::<_, Infallible>(mock.handle(parts.method, &parts.uri, &parts.headers, bytes))
                    }
                });
                connections.spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else { return };
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Served { addr, ca_pem, task }
    }

    /// From now on, only requests bearing `token` are answered (others: 401).
    pub fn require_token(&self, token: &str) {
        *self.token.lock() = Some(token.to_string());
    }

    /// Refusing: every open watch ends and every request is answered 503, until called with
    /// `false`.
    pub fn refuse(&self, refusing: bool) {
        self.refusing.store(refusing, Ordering::SeqCst);
        if refusing {
            self.store.lock().watches.clear();
        }
        self.changed.notify_waiters();
    }

    /// Creates or replaces `object` (its `apiVersion`, `kind`, namespace and name say where), as
    /// `kubectl apply` would: watches see ADDED or MODIFIED.
    pub fn put(&self, object: Value) -> Value {
        let api_version = object["apiVersion"].as_str().expect("an apiVersion").to_string();
        let kind = object["kind"].as_str().expect("a kind").to_string();
        let resource = Resource { api_version, plural: plural_of(&kind) };
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        let name = object["metadata"]["name"].as_str().expect("a name").to_string();
        let written = {
            let mut store = self.store.lock();
            let old = store.get(&resource, &(namespace.clone(), name.clone())).cloned();
            let object = self.server_fields(&mut store, &resource, old.as_ref(), object);
            let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
            store.commit(&resource, (namespace, name), object, kind)
        };
        self.changed.notify_waiters();
        written
    }

    /// Deletes an object, as `kubectl delete` would: watches see DELETED.
    pub fn remove(&self, api_version: &str, kind: &str, namespace: &str, name: &str) {
        let resource = Resource { api_version: api_version.to_string(), plural: plural_of(kind) };
        let key = (namespace.to_string(), name.to_string());
        {
            let mut store = self.store.lock();
            let object = store.get(&resource, &key).cloned().expect("the object to remove exists");
            store.commit(&resource, key, object, "DELETED");
        }
        self.changed.notify_waiters();
    }

    /// The object as stored now.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let resource = Resource { api_version: api_version.to_string(), plural: plural_of(kind) };
        self.store.lock().get(&resource, &(namespace.to_string(), name.to_string())).cloned()
    }

    /// Every object of `kind` stored now.
    pub fn list(&self, api_version: &str, kind: &str) -> Vec<Value> {
        let resource = Resource { api_version: api_version.to_string(), plural: plural_of(kind) };
        self.store.lock().objects.get(&resource).map(|o| o.values().cloned().collect()).unwrap_or_default()
    }

    /// Every request so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }

    /// Waits until `check` finds what it looks for in this mock (its calls, its objects), which
    /// it is given again after every request and change; panics naming `what` after
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

    /// The fields a real API server keeps or adds on a write: uid, creationTimestamp, a
    /// Service's ClusterIP, a Secret's `data` from `stringData`.
    fn server_fields(&self, store: &mut Store, resource: &Resource, old: Option<&Value>, mut object: Value) -> Value {
        if !object["metadata"].is_object() {
            object["metadata"] = json!({});
        }
        match old {
            Some(old) => {
                for field in ["uid", "creationTimestamp"] {
                    object["metadata"][field] = old["metadata"][field].clone();
                }
            }
            None => {
                store.uids += 1;
                object["metadata"]["uid"] = json!(format!("00000000-0000-0000-0000-{:012}", store.uids));
                // A test may say when an object was created (objects made at different times).
                if !object["metadata"]["creationTimestamp"].is_string() {
                    object["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
                }
            }
        }
        if resource.plural == "services" && object["spec"]["type"].as_str() != Some("ExternalName") {
            if !object["spec"].is_object() {
                object["spec"] = json!({});
            }
            let kept = old.and_then(|o| o["spec"]["clusterIP"].as_str()).map(String::from);
            if object["spec"]["clusterIP"].as_str().is_none() {
                let ip = kept.unwrap_or_else(|| {
                    store.cluster_ips += 1;
                    format!("10.96.{}.{}", store.cluster_ips / 250, store.cluster_ips % 250 + 1)
                });
                object["spec"]["clusterIP"] = json!(ip);
                object["spec"]["clusterIPs"] = json!([ip]);
            }
        }
        if resource.plural == "secrets"
            && let Some(Value::Object(strings)) = object.as_object_mut().and_then(|o| o.remove("stringData"))
        {
            for (key, value) in strings {
                let encoded = base64::engine::general_purpose::STANDARD.encode(value.as_str().unwrap_or_default());
                object["data"][key] = json!(encoded);
            }
        }
        object
    }

    fn handle(&self, method: Method, uri: &http::Uri, headers: &HeaderMap, body: Bytes) -> Response<Body> {
        let content_type =
            headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let parsed_body = serde_json::from_slice(&body)
            .or_else(|_| serde_saphyr::from_str::<Value>(&String::from_utf8_lossy(&body)).map_err(|_| ()))
            .unwrap_or(Value::Null);
        let call = Call {
            method,
            path: uri.path().to_string(),
            query: parse_query(uri.query().unwrap_or_default()),
            content_type,
            body: parsed_body,
            authorization: headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(String::from),
        };
        let token = self.token.lock().clone();
        let response = if self.refusing.load(Ordering::SeqCst) {
            status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", "the API server is refusing (test)")
        } else if let Some(token) = token
            && headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok())
                != Some(&format!("Bearer {token}"))
        {
            status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
        } else {
            match parse_path(&call.path) {
                Some(target) => self.answer(&call, target),
                None => status(StatusCode::NOT_FOUND, "NotFound", format!("the server could not find {}", call.path)),
            }
        };
        // A watch is recorded once it is registered, so a test waiting for it can then write.
        self.calls.lock().push(call);
        self.changed.notify_waiters();
        response
    }

    fn answer(&self, call: &Call, target: Target) -> Response<Body> {
        let Target { resource, namespace, name, subresource } = target;
        let mut store = self.store.lock();
        let Some(name) = name else {
            return match call.method {
                Method::GET if call.is_watch() => self.open_watch(&mut store, call, resource, namespace),
                Method::GET => {
                    let selector = Selector::parse(call.param("labelSelector"), call.param("fieldSelector"));
                    let items: Vec<Value> = store
                        .objects
                        .get(&resource)
                        .into_iter()
                        .flat_map(|objects| objects.iter())
                        .filter(|((ns, _), o)| namespace.as_ref().is_none_or(|n| n == ns) && selector.matches(o))
                        .map(|(_, o)| o.clone())
                        .collect();
                    json_response(
                        StatusCode::OK,
                        json!({"apiVersion": resource.api_version, "kind": "List",
                            "metadata": {"resourceVersion": store.version.to_string()}, "items": items}),
                    )
                }
                Method::POST => {
                    let name = call.body["metadata"]["name"].as_str().unwrap_or_default().to_string();
                    let key = (namespace.clone().unwrap_or_default(), name.clone());
                    if let Err(why) = check_body(&call.body, &resource, &key) {
                        return status(StatusCode::BAD_REQUEST, "BadRequest", why);
                    }
                    if store.get(&resource, &key).is_some() {
                        return status(
                            StatusCode::CONFLICT,
                            "AlreadyExists",
                            format!("{} {name:?} already exists", resource.plural),
                        );
                    }
                    let object = self.server_fields(&mut store, &resource, None, call.body.clone());
                    json_response(StatusCode::CREATED, store.commit(&resource, key, object, "ADDED"))
                }
                _ => status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    format!("{} on a collection", call.method),
                ),
            };
        };
        let key = (namespace.unwrap_or_default(), name.clone());
        let not_found = || status(StatusCode::NOT_FOUND, "NotFound", format!("{} {name:?} not found", resource.plural));
        let existing = store.get(&resource, &key).cloned();
        match (&call.method, subresource.as_deref()) {
            (&Method::GET, None | Some("status")) => {
                existing.map_or_else(not_found, |o| json_response(StatusCode::OK, o))
            }
            (&Method::DELETE, None) => match existing {
                Some(object) => json_response(StatusCode::OK, store.commit(&resource, key, object, "DELETED")),
                None => not_found(),
            },
            (&Method::PUT, None | Some("status")) => {
                let Some(old) = existing else { return not_found() };
                if let Err(why) = check_body(&call.body, &resource, &key) {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", why);
                }
                let sent = call.body["metadata"]["resourceVersion"].as_str();
                if sent.is_some_and(|v| Some(v) != old["metadata"]["resourceVersion"].as_str()) {
                    return status(StatusCode::CONFLICT, "Conflict", format!("the object {name:?} has been modified"));
                }
                let mut object = self.server_fields(&mut store, &resource, Some(&old), call.body.clone());
                // A write of the object leaves its status alone, and the reverse.
                if subresource.is_some() {
                    let status = object["status"].take();
                    object = old.clone();
                    object["status"] = status;
                } else if !old["status"].is_null() {
                    object["status"] = old["status"].clone();
                }
                json_response(StatusCode::OK, self.write(&mut store, &resource, key, &old, object))
            }
            (&Method::PATCH, None | Some("status")) if call.content_type.starts_with(APPLY_PATCH) => {
                self.apply(&mut store, call, &resource, key, existing, subresource.is_some())
            }
            (&Method::PATCH, None | Some("status"))
                if call.content_type.starts_with(MERGE_PATCH) || call.content_type.starts_with(STRATEGIC_PATCH) =>
            {
                let Some(old) = existing else { return not_found() };
                let mut object = old.clone();
                let mut patch = call.body.clone();
                match subresource {
                    Some(_) => patch = json!({"status": patch["status"].take()}),
                    None => {
                        if let Some(p) = patch.as_object_mut() {
                            p.remove("status");
                        }
                    }
                }
                crate::kube_mock::merge(&mut object, &patch);
                json_response(StatusCode::OK, self.write(&mut store, &resource, key, &old, object))
            }
            (&Method::PATCH, _) => status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format: {}", call.content_type),
            ),
            _ => not_found(),
        }
    }

    /// Commits `object` unless it changes nothing (no new version, no event: as a real server).
    fn write(&self, store: &mut Store, resource: &Resource, key: Key, old: &Value, object: Value) -> Value {
        if content(&object) == content(old) {
            return old.clone();
        }
        store.commit(resource, key, object, "MODIFIED")
    }

    fn apply(
        &self,
        store: &mut Store,
        call: &Call,
        resource: &Resource,
        key: Key,
        existing: Option<Value>,
        status_only: bool,
    ) -> Response<Body> {
        let Some(manager) = call.param("fieldManager").filter(|m| !m.is_empty()) else {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "PATCH requests with apply content type require fieldManager",
            );
        };
        if let Err(why) = check_body(&call.body, resource, &key) {
            return status(StatusCode::BAD_REQUEST, "BadRequest", why);
        }
        // As the API server: the status subresource of an object that is not there cannot be
        // applied (a status write racing the object's deletion must not bring it back).
        if status_only && existing.is_none() {
            return status(StatusCode::NOT_FOUND, "NotFound", format!("{} {:?} not found", resource.plural, key.1));
        }
        if !call.body["metadata"]["managedFields"].is_null() {
            return status(StatusCode::BAD_REQUEST, "BadRequest", "metadata.managedFields must be nil");
        }
        let sent = call.body["metadata"]["resourceVersion"].as_str();
        let current = existing.as_ref().and_then(|o| o["metadata"]["resourceVersion"].as_str());
        if sent.is_some_and(|v| Some(v) != current) {
            return status(StatusCode::CONFLICT, "Conflict", format!("the object {:?} has been modified", key.1));
        }
        let force = call.param("force") == Some("true");
        let others: Vec<String> = existing
            .iter()
            .flat_map(|o| o["metadata"]["managedFields"].as_array().cloned().unwrap_or_default())
            .filter_map(|f| f["manager"].as_str().map(String::from))
            .filter(|m| m != manager)
            .collect();
        if !others.is_empty() && !force {
            return status(
                StatusCode::CONFLICT,
                "Conflict",
                format!("Apply failed with conflicts: fields managed by {}", others.join(", ")),
            );
        }
        let mut object = self.server_fields(store, resource, existing.as_ref(), call.body.clone());
        if let Some(old) = &existing {
            if status_only {
                let status = object["status"].take();
                object = old.clone();
                object["status"] = status;
            } else if !old["status"].is_null() {
                object["status"] = old["status"].clone();
            }
        }
        object["metadata"]["managedFields"] =
            json!([{"manager": manager, "operation": "Apply", "apiVersion": resource.api_version}]);
        let written = match &existing {
            Some(old) => self.write(store, resource, key, old, object),
            None => store.commit(resource, key, object, "ADDED"),
        };
        json_response(StatusCode::OK, written)
    }

    fn open_watch(
        &self,
        store: &mut Store,
        call: &Call,
        resource: Resource,
        namespace: Option<String>,
    ) -> Response<Body> {
        let selector = Selector::parse(call.param("labelSelector"), call.param("fieldSelector"));
        let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
        let in_scope = |ns: &str, o: &Value| namespace.as_deref().is_none_or(|n| n == ns) && selector.matches(o);
        let since = call.param("resourceVersion").and_then(|v| v.parse::<u64>().ok()).filter(|v| *v > 0);
        let replay: Vec<(&str, &Value)> = match since {
            Some(since) => store
                .history
                .iter()
                .filter(|c| c.version > since && c.resource == resource)
                .filter(|c| in_scope(c.object["metadata"]["namespace"].as_str().unwrap_or_default(), &c.object))
                .map(|c| (c.kind, &c.object))
                .collect(),
            // No version: every object there is, as ADDED.
            None => store
                .objects
                .get(&resource)
                .into_iter()
                .flat_map(|o| o.iter())
                .filter(|((ns, _), o)| in_scope(ns, o))
                .map(|(_, o)| ("ADDED", o))
                .collect(),
        };
        for (kind, object) in replay {
            let _ = tx.send(Bytes::from(format!("{}\n", json!({"type": kind, "object": object}))));
        }
        store.watches.push(WatchSink { resource, namespace, selector, tx });
        let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))));
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(StreamBody::new(stream).boxed())
            .expect("a valid response")
    }
}

/// What a real API server checks of a written object: its `apiVersion` and `kind` are this
/// resource's, and its name and namespace are those of the path. The error: why not (a 400).
fn check_body(body: &Value, resource: &Resource, key: &Key) -> Result<(), String> {
    let bad = Err;
    let Some(api_version) = body["apiVersion"].as_str() else {
        return bad("apiVersion must be set".to_string());
    };
    let Some(kind) = body["kind"].as_str() else { return bad("kind must be set".to_string()) };
    if api_version != resource.api_version || plural_of(kind) != resource.plural {
        return bad(format!("{api_version} {kind} is not {} {}", resource.api_version, resource.plural));
    }
    if body["metadata"]["name"].as_str() != Some(key.1.as_str()) {
        return bad(format!(
            "the name of the object ({}) does not match the path ({})",
            body["metadata"]["name"], key.1
        ));
    }
    if let Some(ns) = body["metadata"]["namespace"].as_str()
        && ns != key.0
    {
        return bad(format!("the namespace of the object ({ns}) does not match the path ({})", key.0));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_and_queries_read_as_the_api_server_reads_them() {
        let query = parse_query("labelSelector=a%2Fb%3Dtrue%2Cc%21%3Dx%2Cd&watch=true");
        assert_eq!(query[0], ("labelSelector".to_string(), "a/b=true,c!=x,d".to_string()));
        let selector = Selector::parse(Some(&query[0].1), Some("metadata.name=web"));
        let object = json!({"metadata": {"name": "web", "labels": {"a/b": "true", "d": ""}}});
        assert!(selector.matches(&object));
        let other = json!({"metadata": {"name": "web", "labels": {"a/b": "true", "c": "x", "d": ""}}});
        assert!(!selector.matches(&other));
        assert_eq!(percent_decode("100%"), "100%");
    }
}
