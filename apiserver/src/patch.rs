//! Patches: JSON merge patch (RFC 7386), JSON patch (RFC 6902, all or nothing), and an
//! approximation of strategic merge patch for `kubectl apply`'s updates.
//!
//! A real API server merges a strategic patch by each field's schema (`patchMergeKey`,
//! `patchStrategy`). This server has no schemas, so it merges lists of objects that all carry a
//! `name` by that name (containers, ports, volumes, env: the lists kubectl's patches touch in
//! practice), honours `$patch: delete` and `$patch: replace`, drops the other `$` directives
//! (`$setElementOrder/…`, `$retainKeys`, `$deleteFromPrimitiveList/…`), and replaces every other
//! list, as merge patch does.

use serde_json::Value;

/// JSON merge patch (RFC 7386).
pub fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// JSON patch (RFC 6902): every operation applies, or none does. The error: why not.
pub(crate) fn json_patch(target: &mut Value, operations: &Value) -> Result<(), String> {
    let operations: json_patch::Patch =
        serde_json::from_value(operations.clone()).map_err(|e| format!("not a JSON patch: {e}"))?;
    json_patch::patch(target, &operations).map_err(|e| e.to_string())
}

/// Strategic merge patch, approximated as the module says.
pub(crate) fn strategic_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (t, Value::Object(p)) if p.get("$patch").and_then(Value::as_str) == Some("replace") => {
            let mut replacement = Value::Object(p.clone());
            strip_directives(&mut replacement);
            *t = replacement;
        }
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if k.starts_with('$') {
                    continue;
                }
                if v.is_null() {
                    t.remove(k);
                } else {
                    strategic_merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (Value::Array(t), Value::Array(p)) if by_name(p) && by_name(t) => {
            for item in p {
                let name = &item["name"];
                let at = t.iter().position(|e| e["name"] == *name);
                match (at, item.get("$patch").and_then(Value::as_str)) {
                    (Some(i), Some("delete")) => {
                        t.remove(i);
                    }
                    (None, Some("delete")) => {}
                    (Some(i), _) => strategic_merge(&mut t[i], item),
                    (None, _) => {
                        let mut item = item.clone();
                        strip_directives(&mut item);
                        t.push(item);
                    }
                }
            }
        }
        (t, p) => {
            let mut p = p.clone();
            strip_directives(&mut p);
            *t = p;
        }
    }
}

/// Every element is an object with a `name`: a list merged by name.
fn by_name(list: &[Value]) -> bool {
    list.iter().all(|e| e.get("name").is_some())
}

fn strip_directives(value: &mut Value) {
    match value {
        Value::Object(o) => {
            o.retain(|k, _| !k.starts_with('$'));
            o.values_mut().for_each(strip_directives);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_strategic_patch_merges_containers_by_name_and_drops_its_directives() {
        let mut deployment = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "web", "image": "nginx:1", "ports": [{"containerPort": 80}]},
            {"name": "side", "image": "busybox"}]}}}});
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "web"}, {"name": "side"}],
            "containers": [{"name": "web", "image": "nginx:2"}, {"name": "side", "$patch": "delete"}]}}}});
        strategic_merge(&mut deployment, &patch);
        assert_eq!(
            deployment,
            json!({"spec": {"template": {"spec": {"containers": [
                {"name": "web", "image": "nginx:2", "ports": [{"containerPort": 80}]}]}}}})
        );
    }

    #[test]
    fn a_json_patch_applies_all_its_operations_or_none() {
        let mut object = json!({"spec": {"replicas": 1, "ports": [80]}});
        json_patch(
            &mut object,
            &json!([{"op": "replace", "path": "/spec/replicas", "value": 2},
            {"op": "add", "path": "/spec/ports/-", "value": 81}]),
        )
        .unwrap();
        assert_eq!(object, json!({"spec": {"replicas": 2, "ports": [80, 81]}}));
        let failing = json!([{"op": "replace", "path": "/spec/replicas", "value": 3},
            {"op": "test", "path": "/spec/replicas", "value": 9}]);
        assert!(json_patch(&mut object, &failing).is_err());
        assert_eq!(object["spec"]["replicas"], 2, "nothing of a failed patch applies");
    }

    #[test]
    fn lists_without_names_are_replaced_as_merge_patch_replaces_them() {
        let mut object = json!({"spec": {"ports": [{"port": 80}, {"port": 81}], "keep": 1}});
        strategic_merge(&mut object, &json!({"spec": {"ports": [{"port": 82}]}}));
        assert_eq!(object, json!({"spec": {"ports": [{"port": 82}], "keep": 1}}));
    }
}
