//! The `app.kubernetes.io/*` labels every rendered object carries (CRDs and Namespaces too),
//! added at render time so the files under `daemonset/` need not repeat them: they let
//! `kubectl apply --prune -l app.kubernetes.io/part-of=cnimesh` and `cnimesh prune` find what the
//! mesh owns, and `managed-by=cnimesh` sets what the CLI rendered apart from what the control
//! plane creates at run time (Leases, events).

use serde_json::{Map, Value};

use cnimesh_common::names::AGENT_NAMESPACE;

pub const PART_OF: &str = "app.kubernetes.io/part-of";
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const VERSION: &str = "app.kubernetes.io/version";
pub const COMPONENT: &str = "app.kubernetes.io/component";

/// The selector that finds what `cnimesh install` or `upgrade` rendered.
pub const SELECTOR: &str = "app.kubernetes.io/part-of=cnimesh,app.kubernetes.io/managed-by=cnimesh";

/// Adds the four labels to every document, keeping the labels it has.
pub fn apply(docs: &mut [Value]) {
    apply_as(docs, "cnimesh", component);
}

/// The four labels with another `part-of` and component rule: the add-ons (`cnimesh tracing
/// install`), which `cnimesh prune` must not take for objects of the mesh this version dropped.
pub fn apply_as(docs: &mut [Value], part_of: &str, component: impl Fn(&Value) -> &'static str) {
    for doc in docs {
        let component = component(doc);
        let Some(object) = doc.as_object_mut() else { continue };
        let metadata =
            object.entry("metadata").or_insert_with(|| Value::Object(Map::new())).as_object_mut().expect("metadata");
        let labels = metadata.entry("labels").or_insert_with(|| Value::Object(Map::new()));
        if !labels.is_object() {
            *labels = Value::Object(Map::new());
        }
        let labels = labels.as_object_mut().expect("made an object above");
        for (key, value) in
            [(PART_OF, part_of), (MANAGED_BY, "cnimesh"), (VERSION, env!("CARGO_PKG_VERSION")), (COMPONENT, component)]
        {
            labels.insert(key.into(), Value::from(value));
        }
    }
}

/// Which part of the mesh an object belongs to, from what it is and where it lives.
pub fn component(doc: &Value) -> &'static str {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let namespace = doc.pointer("/metadata/namespace").and_then(Value::as_str);
    if kind == "CustomResourceDefinition" {
        "crds"
    } else if kind == "MutatingWebhookConfiguration"
        || name == super::WEBHOOK_SECRET
        || (kind == "Service" && name.contains("webhook"))
    {
        "webhook"
    } else if name == super::ISSUER_SECRET || name == super::TRUST_ANCHORS_CONFIG_MAP {
        "identity"
    } else if namespace == Some(AGENT_NAMESPACE)
        || (kind == "Namespace" && name == AGENT_NAMESPACE)
        || name.starts_with(cnimesh_common::names::AGENT_NAME)
    {
        "node"
    } else {
        "control-plane"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_are_added_beside_the_existing_ones_and_on_objects_without_any() {
        let mut docs = vec![
            json!({"kind": "CustomResourceDefinition", "metadata": {"name": "servers.policy.cnimesh.io"}}),
            json!({"kind": "DaemonSet", "metadata": {"name": "cnimesh-node", "namespace": AGENT_NAMESPACE,
                   "labels": {"app.kubernetes.io/name": "cnimesh-node"}}}),
        ];
        apply(&mut docs);
        assert_eq!(docs[0]["metadata"]["labels"][COMPONENT], "crds");
        assert_eq!(docs[0]["metadata"]["labels"][MANAGED_BY], "cnimesh");
        assert_eq!(docs[1]["metadata"]["labels"]["app.kubernetes.io/name"], "cnimesh-node");
        assert_eq!(docs[1]["metadata"]["labels"][COMPONENT], "node");
        assert_eq!(docs[1]["metadata"]["labels"][VERSION], env!("CARGO_PKG_VERSION"));
    }
}
