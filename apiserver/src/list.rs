//! A collection's list, paged as a real API server pages it: at most `limit` items, then a
//! `continue` token where the next page starts. Clients page (kube-rs and client-go ask for 500
//! at a time), so a client's memory while it lists a large collection is one page's; a stand-in
//! that answered with every object at once would measure something no cluster does.
//!
//! Every page of one list carries the first page's resourceVersion, as a real server's does: the
//! watch that follows resumes from it and replays what changed while the pages were read.

use std::ops::Bound;

use http::{Response, StatusCode};
use serde_json::{Value, json};

use crate::call::Call;
use crate::kinds::Resource;
use crate::response::{Body, json_response, status};
use crate::selector::Selector;
use crate::store::{Key, Store};

/// Where a list's next page starts: the version of its first page and the last key served.
struct Continue {
    version: u64,
    after: Key,
}

impl Continue {
    /// `version/namespace/name`: names and namespaces never contain a slash.
    fn token(&self) -> String {
        format!("{}/{}/{}", self.version, self.after.0, self.after.1)
    }

    fn parse(token: &str) -> Option<Self> {
        let mut parts = token.splitn(3, '/');
        let version = parts.next()?.parse().ok()?;
        let after = (parts.next()?.to_string(), parts.next()?.to_string());
        Some(Self { version, after })
    }
}

/// The answer to a list of `resource` (in `namespace`, or all of them).
pub(crate) fn answer(
    store: &Store,
    call: &Call,
    resource: &Resource,
    namespace: Option<&str>,
    list_kind: String,
) -> Response<Body> {
    let selector = Selector::parse(call.param("labelSelector"), call.param("fieldSelector"));
    let from = match call.param("continue").filter(|t| !t.is_empty()) {
        None => None,
        Some(token) => match Continue::parse(token) {
            Some(from) if from.version >= store.compacted => Some(from),
            Some(_) => return status(StatusCode::GONE, "Expired", "the continue token's resourceVersion is too old"),
            None => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("continue token {token:?} is not one this server gave"),
                );
            }
        },
    };
    let version = from.as_ref().map_or(store.version, |f| f.version);
    let start = from.map_or(Bound::Unbounded, |f| Bound::Excluded(f.after));
    let limit = call.param("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0).unwrap_or(usize::MAX);
    let mut matching = store
        .objects
        .get(resource)
        .into_iter()
        .flat_map(|objects| objects.range((start.clone(), Bound::Unbounded)))
        .filter(|((ns, _), o)| namespace.is_none_or(|n| n == ns) && selector.matches(o));
    let items: Vec<(&Key, &Value)> = matching.by_ref().take(limit).collect();
    let mut metadata = json!({"resourceVersion": version.to_string()});
    if let (Some((last, _)), true) = (items.last(), matching.next().is_some()) {
        metadata["continue"] = json!(Continue { version, after: (*last).clone() }.token());
    }
    let items: Vec<&Value> = items.into_iter().map(|(_, o)| o).collect();
    json_response(
        StatusCode::OK,
        json!({"apiVersion": resource.api_version, "kind": list_kind, "metadata": metadata, "items": items}),
    )
}
