//! A scripted list + watch API server for kube-rs watchers ([`ListWatchApi`]): the test plays the
//! API server's part event by event (resumes, re-lists, 410 Gone, a watch ended by its timeout),
//! which the stateful in-process API server (`cnimesh-apiserver`, `cnimesh_e2e::kube_api`) does not
//! script. Stateful tests use that one.

use std::sync::Arc;

use parking_lot::Mutex;

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};

/// One request as the mock saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub body: Value,
}

use cnimesh_apiserver::Body;
pub use cnimesh_apiserver::client_for;

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
