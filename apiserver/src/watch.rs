//! Watches: opened with the objects there are (as ADDED) or, resumed from a resourceVersion, with
//! what changed since; then every change that matches, as one JSON line each. A resume from before
//! a compaction ([`crate::ClusterApi::compact`]) is one ERROR event, 410 Expired, as on a real
//! server, so clients re-list.

use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::call::Call;
use crate::kinds::Resource;
use crate::response::Body;
use crate::selector::Selector;
use crate::store::{Store, WatchSink, event_line};

pub(crate) fn open(store: &mut Store, call: &Call, resource: Resource, namespace: Option<String>) -> Response<Body> {
    let selector = Selector::parse(call.param("labelSelector"), call.param("fieldSelector"));
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    let in_scope = |ns: &str, o: &Value| namespace.as_deref().is_none_or(|n| n == ns) && selector.matches(o);
    let since = call.param("resourceVersion").and_then(|v| v.parse::<u64>().ok()).filter(|v| *v > 0);
    if let Some(since) = since.filter(|v| *v < store.compacted) {
        // As a real server after compaction: one ERROR event, then the watch ends.
        let expired = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "reason": "Expired", "code": 410,
            "message": format!("too old resource version: {since} ({})", store.compacted)});
        return Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(Full::new(event_line("ERROR", &expired)).boxed())
            .expect("a valid response");
    }
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
        let _ = tx.send(event_line(kind, object));
    }
    store.watches.push(WatchSink { resource, namespace, selector, tx });
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))));
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(StreamBody::new(stream).boxed())
        .expect("a valid response")
}
