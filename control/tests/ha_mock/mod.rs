//! An in-memory API server for the HA tests: objects by path, one resourceVersion counter, PUT
//! refused with 409 when its resourceVersion is stale, POST refused with 409 when the name is
//! taken, merge and JSON patches, list and watch (replaying from a resourceVersion). Each replica
//! gets its own client with its own faults (partition, hung Lease calls, failing or conflicting
//! Lease writes), so a test can break one replica's view of the API while the other's works.
//!
//! Every write outside the Leases is checked against the guard Lease: the writer must hold it
//! when the write arrives, or the write is recorded as a violation (two writers at once).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::time::Instant;

type Body = BoxBody<Bytes, Infallible>;

/// One write as the store saw it.
#[derive(Debug, Clone)]
pub struct Write {
    pub path: String,
    pub method: Method,
    pub by: String,
    pub at: Instant,
    pub body: Value,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    rv: u64,
    /// (collection path, resourceVersion, event type, object)
    events: Vec<(String, u64, &'static str, Value)>,
}

#[derive(Default)]
pub struct Store {
    state: Mutex<State>,
    changed: Notify,
    /// The Lease (object path) every other write must be made by the holder of.
    pub guard: Mutex<Option<String>>,
    pub writes: Mutex<Vec<Write>>,
    pub violations: Mutex<Vec<String>>,
    /// 409s answered, injected or real.
    pub conflicts: AtomicUsize,
}

/// One replica's view of the API server.
#[derive(Default)]
pub struct Faults {
    pub identity: Mutex<String>,
    /// Every call fails to connect.
    pub partitioned: AtomicBool,
    /// Calls to Leases wait until cleared.
    pub hang_leases: AtomicBool,
    /// This many Lease writes answer 500.
    pub fail_lease_writes: AtomicUsize,
    /// This many Lease writes answer 409 without applying.
    pub conflict_lease_writes: AtomicUsize,
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "reason": reason, "code": code, "message": message});
    respond(code, &body)
}

fn respond(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).expect("a status"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("a response")
}

/// `(collection, Some(name))` for an object path, `(collection, None)` for a collection.
fn split(path: &str) -> (String, Option<String>) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let collection_len = match segments.as_slice() {
        ["api", _, "namespaces", _, ..] => 5,
        ["api", ..] => 3,
        ["apis", _, _, "namespaces", _, ..] => 6,
        _ => 4,
    };
    if segments.len() > collection_len {
        (format!("/{}", segments[..collection_len].join("/")), Some(segments[collection_len].to_string()))
    } else {
        (path.to_string(), None)
    }
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query.split('&').find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

/// `fieldSelector=metadata.name%3Dfoo` → `foo`.
fn name_selector(query: &str) -> Option<String> {
    let selector = query_param(query, "fieldSelector")?;
    let decoded = selector.replace("%3D", "=").replace("%3d", "=");
    decoded.strip_prefix("metadata.name=").map(str::to_string)
}

impl Store {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A client for a replica named `identity` with its own `faults`.
    pub fn client(self: &Arc<Self>, faults: Arc<Faults>) -> kube::Client {
        let store = self.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let (store, faults) = (store.clone(), faults.clone());
            async move { store.handle(&faults, req).await }
        });
        kube::Client::new(service, "default")
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.state.lock().objects.get(path).cloned()
    }

    /// Puts an object in place as an operator's `kubectl apply` would.
    pub fn insert(&self, path: &str, mut object: Value) {
        let mut state = self.state.lock();
        state.rv += 1;
        object["metadata"]["resourceVersion"] = json!(state.rv.to_string());
        let (collection, _) = split(path);
        let rv = state.rv;
        state.events.push((collection, rv, "ADDED", object.clone()));
        state.objects.insert(path.to_string(), object);
        drop(state);
        self.changed.notify_waiters();
    }

    /// The objects `path` held, oldest first (for failure messages).
    pub fn history(&self, path: &str) -> Vec<Value> {
        let name = split(path).1;
        let collection = split(path).0;
        let state = self.state.lock();
        state
            .events
            .iter()
            .filter(|(c, _, _, o)| {
                *c == collection && o.pointer("/metadata/name").and_then(Value::as_str) == name.as_deref()
            })
            .map(|(_, _, _, o)| o.clone())
            .collect()
    }

    pub fn writes_to(&self, path: &str) -> Vec<Write> {
        self.writes.lock().iter().filter(|w| w.path == path).cloned().collect()
    }

    fn holder(&self, lease: &str) -> Option<String> {
        self.get(lease)?.pointer("/spec/holderIdentity")?.as_str().map(str::to_string)
    }

    async fn handle(
        self: &Arc<Self>,
        faults: &Faults,
        req: Request<kube::client::Body>,
    ) -> Result<Response<Body>, std::io::Error> {
        if faults.partitioned.load(Ordering::SeqCst) {
            return Err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "partitioned"));
        }
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or_default().to_string();
        let is_lease = path.contains("/leases");
        while is_lease && faults.hang_leases.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if faults.partitioned.load(Ordering::SeqCst) {
            return Err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "partitioned"));
        }
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let method = parts.method.clone();
        if is_lease && method != Method::GET {
            if take_one(&faults.fail_lease_writes) {
                return Ok(status(500, "InternalError", "injected failure"));
            }
            if take_one(&faults.conflict_lease_writes) {
                self.conflicts.fetch_add(1, Ordering::SeqCst);
                return Ok(status(409, "Conflict", "injected conflict"));
            }
        }
        let content_type =
            parts.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let (collection, name) = split(&path);
        if method != Method::GET && !is_lease {
            let by = faults.identity.lock().clone();
            let guard = self.guard.lock().clone();
            if let Some(lease) = guard
                && self.holder(&lease).as_deref() != Some(by.as_str())
            {
                let holder = self.holder(&lease);
                self.violations.lock().push(format!("{method} {path} by {by} while {holder:?} holds {lease}"));
            }
            self.writes.lock().push(Write {
                path: path.clone(),
                method: method.clone(),
                by,
                at: Instant::now(),
                body: body.clone(),
            });
        }
        Ok(match (method, name) {
            (Method::GET, Some(_)) => match self.get(&path) {
                Some(object) => respond(200, &object),
                None => status(404, "NotFound", &format!("{path} not found")),
            },
            (Method::GET, None) if query_param(&query, "watch") == Some("true") => self.watch(&collection, &query),
            (Method::GET, None) => {
                let selected = name_selector(&query);
                let state = self.state.lock();
                let items: Vec<&Value> = state
                    .objects
                    .iter()
                    .filter(|(p, _)| split(p).0 == collection)
                    .filter(|(p, _)| selected.as_ref().is_none_or(|n| split(p).1.as_ref() == Some(n)))
                    .map(|(_, v)| v)
                    .collect();
                respond(
                    200,
                    &json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": state.rv.to_string()}, "items": items}),
                )
            }
            (Method::POST, None) => {
                let name = body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
                let path = format!("{collection}/{name}");
                if self.get(&path).is_some() {
                    self.conflicts.fetch_add(1, Ordering::SeqCst);
                    return Ok(status(409, "AlreadyExists", &format!("{path} already exists")));
                }
                respond(201, &self.store(&path, body, "ADDED"))
            }
            (Method::PUT, Some(_)) => {
                let Some(current) = self.get(&path) else {
                    return Ok(status(404, "NotFound", &format!("{path} not found")));
                };
                let want = body.pointer("/metadata/resourceVersion").and_then(Value::as_str);
                if want != current.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
                    self.conflicts.fetch_add(1, Ordering::SeqCst);
                    return Ok(status(409, "Conflict", "the object has been modified"));
                }
                respond(200, &self.store(&path, body, "MODIFIED"))
            }
            (Method::PATCH, Some(_)) => {
                let Some(mut current) = self.get(&path) else {
                    return Ok(status(404, "NotFound", &format!("{path} not found")));
                };
                if content_type.starts_with("application/json-patch+json") {
                    let ops: json_patch::Patch = match serde_json::from_value(body) {
                        Ok(ops) => ops,
                        Err(e) => return Ok(status(400, "BadRequest", &e.to_string())),
                    };
                    if let Err(e) = json_patch::patch(&mut current, &ops) {
                        return Ok(status(422, "Invalid", &e.to_string()));
                    }
                } else {
                    json_patch::merge(&mut current, &body);
                }
                respond(200, &self.store(&path, current, "MODIFIED"))
            }
            (Method::DELETE, Some(_)) => {
                let removed = self.state.lock().objects.remove(&path);
                match removed {
                    Some(object) => respond(200, &object),
                    None => status(404, "NotFound", &format!("{path} not found")),
                }
            }
            _ => status(405, "MethodNotAllowed", &path),
        })
    }

    fn store(&self, path: &str, mut object: Value, kind: &'static str) -> Value {
        let mut state = self.state.lock();
        state.rv += 1;
        let (collection, name) = split(path);
        object["metadata"]["resourceVersion"] = json!(state.rv.to_string());
        object["metadata"]["name"] = json!(name);
        let rv = state.rv;
        state.events.push((collection, rv, kind, object.clone()));
        state.objects.insert(path.to_string(), object.clone());
        drop(state);
        self.changed.notify_waiters();
        object
    }

    /// Events of `collection` after the query's resourceVersion, then new ones as they come.
    fn watch(self: &Arc<Self>, collection: &str, query: &str) -> Response<Body> {
        let from: u64 = query_param(query, "resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
        let selected = name_selector(query);
        let collection = collection.to_string();
        let store = self.clone();
        let stream = futures::stream::unfold(from, move |cursor| {
            let (store, collection, selected) = (store.clone(), collection.clone(), selected.clone());
            async move {
                loop {
                    let notified = store.changed.notified();
                    let lines: Vec<(u64, String)> = {
                        let state = store.state.lock();
                        state
                            .events
                            .iter()
                            .filter(|(c, rv, _, o)| {
                                *c == collection
                                    && *rv > cursor
                                    && selected
                                        .as_ref()
                                        .is_none_or(|n| o.pointer("/metadata/name").and_then(Value::as_str) == Some(n))
                            })
                            .map(|(_, rv, kind, o)| (*rv, format!("{}\n", json!({"type": kind, "object": o}))))
                            .collect()
                    };
                    if let Some(last) = lines.last().map(|(rv, _)| *rv) {
                        let text: String = lines.into_iter().map(|(_, l)| l).collect();
                        return Some((Ok::<_, Infallible>(Frame::data(Bytes::from(text))), last));
                    }
                    notified.await;
                }
            }
        });
        Response::builder().status(200).body(StreamBody::new(stream).boxed()).expect("a response")
    }
}

fn take_one(counter: &AtomicUsize) -> bool {
    counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}
