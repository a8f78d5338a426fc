//! The objects, one resourceVersion counter for all of them, the history a resumed watch is
//! replayed from, and the open watches each change is sent to. Also what a real API server adds
//! to or checks of a written object.

use std::collections::BTreeMap;

use base64::Engine;
use hyper::body::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::kinds::{self, Kind, Resource};
use crate::selector::Selector;

/// `namespace` (empty: cluster-scoped), `name`.
pub(crate) type Key = (String, String);

pub(crate) struct WatchSink {
    pub(crate) resource: Resource,
    pub(crate) namespace: Option<String>,
    pub(crate) selector: Selector,
    pub(crate) tx: mpsc::UnboundedSender<Bytes>,
}

/// One change, for replaying to watches that resume from an older version.
pub(crate) struct Change {
    pub(crate) version: u64,
    pub(crate) resource: Resource,
    pub(crate) kind: &'static str,
    pub(crate) object: Value,
}

#[derive(Default)]
pub(crate) struct Store {
    pub(crate) objects: BTreeMap<Resource, BTreeMap<Key, Value>>,
    pub(crate) history: Vec<Change>,
    pub(crate) watches: Vec<WatchSink>,
    pub(crate) version: u64,
    /// History up to this version is gone: a watch resumed from before it is told 410 Gone.
    pub(crate) compacted: u64,
    uids: u64,
    cluster_ips: u32,
}

/// One watch event line.
pub(crate) fn event_line(kind: &str, object: &Value) -> Bytes {
    Bytes::from(format!("{}\n", json!({"type": kind, "object": object})))
}

impl Store {
    /// Stores `object` (stamped with a new resourceVersion) and tells the watches.
    pub(crate) fn commit(&mut self, resource: &Resource, key: Key, mut object: Value, kind: &'static str) -> Value {
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        // The path says the namespace; the object says it too, as a real server's objects do.
        if !key.0.is_empty() {
            object["metadata"]["namespace"] = json!(key.0);
        }
        if kind == "DELETED" {
            self.objects.entry(resource.clone()).or_default().remove(&key);
        } else {
            self.objects.entry(resource.clone()).or_default().insert(key.clone(), object.clone());
        }
        let line = event_line(kind, &object);
        self.watches.retain(|w| {
            if w.resource != *resource || w.namespace.as_ref().is_some_and(|ns| *ns != key.0) {
                return !w.tx.is_closed();
            }
            !w.selector.matches(&object) || w.tx.send(line.clone()).is_ok()
        });
        self.history.push(Change { version: self.version, resource: resource.clone(), kind, object: object.clone() });
        object
    }

    /// Commits `object` unless it changes nothing (no new version, no event: as a real server).
    pub(crate) fn write(&mut self, resource: &Resource, key: Key, old: &Value, object: Value) -> Value {
        if content(&object) == content(old) {
            return old.clone();
        }
        self.commit(resource, key, object, "MODIFIED")
    }

    pub(crate) fn get(&self, resource: &Resource, key: &Key) -> Option<&Value> {
        self.objects.get(resource)?.get(key)
    }

    /// The built-in kinds and those of every stored CustomResourceDefinition.
    pub(crate) fn kinds(&self) -> Vec<Kind> {
        let crds =
            Resource { api_version: "apiextensions.k8s.io/v1".into(), plural: "customresourcedefinitions".into() };
        let mut kinds = kinds::built_in();
        for crd in self.objects.get(&crds).into_iter().flat_map(|o| o.values()) {
            for kind in kinds::from_crd(crd) {
                kinds.retain(|k| !(k.plural == kind.plural && k.api_version() == kind.api_version()));
                kinds.push(kind);
            }
        }
        kinds
    }

    /// The fields a real API server keeps or adds on a write: uid, creationTimestamp, a
    /// Service's ClusterIP, a Secret's `data` from `stringData`.
    pub(crate) fn server_fields(&mut self, resource: &Resource, old: Option<&Value>, mut object: Value) -> Value {
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
                self.uids += 1;
                object["metadata"]["uid"] = json!(format!("00000000-0000-0000-0000-{:012}", self.uids));
                // Now, unless a test says when (objects made at different times).
                if !object["metadata"]["creationTimestamp"].is_string() {
                    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
                    object["metadata"]["creationTimestamp"] = json!(now.to_string());
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
                    self.cluster_ips += 1;
                    format!("10.96.{}.{}", self.cluster_ips / 250, self.cluster_ips % 250 + 1)
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

    /// What a real API server checks of a written object: its `apiVersion` and `kind` are this
    /// resource's, and its name and namespace are those of the path. The error: why not (a 400).
    pub(crate) fn check_body(&self, body: &Value, resource: &Resource, key: &Key) -> Result<(), String> {
        let bad = Err;
        let Some(api_version) = body["apiVersion"].as_str() else {
            return bad("apiVersion must be set".to_string());
        };
        let Some(kind) = body["kind"].as_str() else { return bad("kind must be set".to_string()) };
        if api_version != resource.api_version || kinds::plural_of(&self.kinds(), api_version, kind) != resource.plural
        {
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
}

/// `body` carries a resourceVersion (a compare-and-swap) that is not `current`'s: a 409.
pub(crate) fn is_stale(body: &Value, current: Option<&Value>) -> bool {
    let sent = body["metadata"]["resourceVersion"].as_str();
    sent.is_some_and(|v| Some(v) != current.and_then(|o| o["metadata"]["resourceVersion"].as_str()))
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
