//! A mocked Kubernetes API server for kube-rs clients: the one part of the system that cannot run
//! here. It answers the requests the node agent makes (pod list/watch/get/delete/patch, events,
//! node get/patch) from in-memory objects, and records every request for assertions.

use std::sync::Arc;

use parking_lot::Mutex;

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

/// One request as the mock saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub body: Value,
}

#[derive(Default)]
pub struct MockApi {
    pub pods: Mutex<Vec<Pod>>,
    pub node: Mutex<Option<Node>>,
    pub seen: Mutex<Vec<Seen>>,
}

pub use cnimesh_apiserver::client_for;
use cnimesh_apiserver::{Body, merge};

fn full(status: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("valid response")
}

fn not_found(what: &str) -> Response<Body> {
    full(
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": format!("{what} not found")}),
    )
}

fn key(pod: &Pod) -> (String, String) {
    (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default())
}

impl MockApi {
    pub fn new(pods: Vec<Pod>, node: Option<Node>) -> Arc<Self> {
        Arc::new(Self { pods: Mutex::new(pods), node: Mutex::new(node), seen: Mutex::default() })
    }

    /// A kube client whose every request this mock answers.
    pub fn client(self: &Arc<Self>) -> kube::Client {
        client_for(self.clone(), |mock, req| async move { mock.handle(req).await })
    }

    pub fn requests(&self, method: Method, path_prefix: &str) -> Vec<Seen> {
        self.seen.lock().iter().filter(|s| s.method == method && s.path.starts_with(path_prefix)).cloned().collect()
    }

    async fn handle(&self, req: Request<kube::client::Body>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let seen = Seen {
            method: parts.method.clone(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        };
        self.seen.lock().push(seen.clone());
        let segments: Vec<&str> = seen.path.trim_matches('/').split('/').collect();
        match (&seen.method, segments.as_slice()) {
            (&Method::GET, ["api", "v1", "pods"]) if seen.query.contains("watch=true") => {
                // A watch that stays open and quiet.
                let stream = futures::stream::pending::<Result<Frame<Bytes>, std::convert::Infallible>>();
                Response::builder().status(200).body(StreamBody::new(stream).boxed()).expect("valid response")
            }
            (&Method::GET, ["api", "v1", "pods"]) => {
                let node = seen.query.split('&').find_map(|kv| kv.strip_prefix("fieldSelector=spec.nodeName%3D"));
                let items: Vec<&Pod> = Vec::new();
                let pods = self.pods.lock();
                let items: Vec<&Pod> = pods
                    .iter()
                    .filter(|p| node.is_none_or(|n| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n)))
                    .chain(items)
                    .collect();
                full(
                    StatusCode::OK,
                    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}),
                )
            }
            (method, ["api", "v1", "namespaces", ns, "pods", name]) => {
                let mut pods = self.pods.lock();
                let Some(index) = pods.iter().position(|p| key(p) == (ns.to_string(), name.to_string())) else {
                    return not_found(&format!("pods \"{name}\""));
                };
                match *method {
                    Method::DELETE => full(StatusCode::OK, json!(pods.remove(index))),
                    Method::PATCH => {
                        let mut v = serde_json::to_value(&pods[index]).unwrap();
                        merge(&mut v, &seen.body);
                        pods[index] = serde_json::from_value(v.clone()).unwrap();
                        full(StatusCode::OK, v)
                    }
                    _ => full(StatusCode::OK, json!(pods[index])),
                }
            }
            (&Method::POST, ["api", "v1", "namespaces", _, "events"]) => full(StatusCode::CREATED, seen.body.clone()),
            (method, ["api", "v1", "nodes", name]) => {
                let mut node = self.node.lock();
                let Some(n) = node.as_mut().filter(|n| n.metadata.name.as_deref() == Some(*name)) else {
                    return not_found(&format!("nodes \"{name}\""));
                };
                if *method == Method::PATCH {
                    let mut v = serde_json::to_value(&*n).unwrap();
                    merge(&mut v, &seen.body);
                    *n = serde_json::from_value(v).unwrap();
                }
                full(StatusCode::OK, json!(n))
            }
            _ => not_found(&seen.path),
        }
    }
}

/// A scripted list + watch API server for controllers built on kube-rs watchers. Each resource
/// collection (`/api/v1/services`, `/apis/discovery.k8s.io/v1/endpointslices`, …) answers lists
/// from items the test sets and watches from events the test sends, so a test can play the API
/// server's part in resumes, re-lists and 410 Gone.
#[derive(Default)]
pub struct ListWatchApi {
    collections: Mutex<std::collections::HashMap<String, Collection>>,
    pub seen: Mutex<Vec<Seen>>,
    watch_opened: tokio::sync::Notify,
}

#[derive(Default)]
struct Collection {
    items: Vec<Value>,
    resource_version: String,
    /// The open watch, if any: events sent here become lines of its response body.
    watch: Option<tokio::sync::mpsc::UnboundedSender<Bytes>>,
}

impl ListWatchApi {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A kube client whose every request this mock answers.
    pub fn client(self: &Arc<Self>) -> kube::Client {
        client_for(self.clone(), |mock, req| async move { mock.handle(req).await })
    }

    /// What the next list of `path` returns.
    pub fn set_list(&self, path: &str, items: Vec<Value>, resource_version: &str) {
        let mut collections = self.collections.lock();
        let collection = collections.entry(path.to_string()).or_default();
        collection.items = items;
        collection.resource_version = resource_version.to_string();
    }

    /// Requests to `path` that were lists (`watch == false`) or watches (`watch == true`).
    pub fn requests(&self, path: &str, watch: bool) -> Vec<Seen> {
        self.seen.lock().iter().filter(|s| s.path == path && s.query.contains("watch=true") == watch).cloned().collect()
    }

    /// Waits until `count` watches of `path` have been opened; returns the last one's request.
    pub async fn wait_watches(&self, path: &str, count: usize) -> Seen {
        loop {
            let opened = self.watch_opened.notified();
            let watches = self.requests(path, true);
            if watches.len() >= count {
                return watches[count - 1].clone();
            }
            opened.await;
        }
    }

    /// Sends a watch event (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`) on the open watch.
    pub fn send(&self, path: &str, kind: &str, object: Value) {
        let line = format!("{}\n", json!({"type": kind, "object": object}));
        let collections = self.collections.lock();
        let watch = collections.get(path).and_then(|c| c.watch.as_ref()).expect("a watch is open");
        watch.send(Bytes::from(line)).expect("the watcher reads its watch");
    }

    /// Tells the watcher its resourceVersion is too old, as an API server does after compaction.
    pub fn gone(&self, path: &str) {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410, "message": "too old resource version"});
        self.send(path, "ERROR", status);
    }

    /// Ends the open watch cleanly, as an API server does when its timeout expires.
    pub fn end_watch(&self, path: &str) {
        self.collections.lock().get_mut(path).and_then(|c| c.watch.take());
    }

    async fn handle(&self, req: Request<kube::client::Body>) -> Response<Body> {
        let seen = Seen {
            method: req.method().clone(),
            path: req.uri().path().to_string(),
            query: req.uri().query().unwrap_or_default().to_string(),
            body: Value::Null,
        };
        let is_watch = seen.query.contains("watch=true");
        if !is_watch {
            self.seen.lock().push(seen.clone());
        }
        let mut collections = self.collections.lock();
        let Some(collection) = collections.get_mut(&seen.path).filter(|_| seen.method == Method::GET) else {
            if is_watch {
                self.seen.lock().push(seen.clone());
            }
            return not_found(&seen.path);
        };
        if !is_watch {
            let list = json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": collection.resource_version}, "items": collection.items});
            return full(StatusCode::OK, list);
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        collection.watch = Some(tx);
        drop(collections);
        // Seen only once it can be sent to: `wait_watches` then `send` must not race.
        self.seen.lock().push(seen);
        self.watch_opened.notify_waiters();
        let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))));
        Response::builder().status(200).body(StreamBody::new(stream).boxed()).expect("valid response")
    }
}
