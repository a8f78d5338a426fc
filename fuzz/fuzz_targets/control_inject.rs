//! The injection webhook: an AdmissionReview body (from the API server, but its pod comes from
//! whoever may create pods) in, a review with a JSON patch out. The patch must apply to the pod
//! with json-patch, a valid Pod must stay a valid Pod, and a second pass must change nothing.
//! Input: a flags byte (path, sidecar mode), then a review, or just a pod to wrap in one.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use cnimesh_model::inject::{InjectConfig};

use cnimesh_control::inject::{INJECT_PATH, OPT_IN_PATH, Webhook};
use http::StatusCode;
use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fn webhooks() -> &'static [Webhook; 2] {
    static HOOKS: OnceLock<[Webhook; 2]> = OnceLock::new();
    HOOKS.get_or_init(|| {
        let anchors = cnimesh_identity::ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap();
        let config = |native_sidecars| InjectConfig {
            trust_anchors_pem: anchors.cert_pem.clone(),
            native_sidecars,
            ..Default::default()
        };
        [Webhook::new(config(false)).unwrap(), Webhook::new(config(true)).unwrap()]
    })
}

fn review_of(pod: Value) -> Value {
    let namespace = pod.pointer("/metadata/namespace").cloned().unwrap_or(json!("default"));
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
        }
    })
}

/// Runs one review; returns the patched object if the webhook answered with a patch.
fn review(hook: &Webhook, path: &str, body: &[u8]) -> Option<Option<Value>> {
    let out = match hook.review(path, body) {
        Ok(out) => out,
        Err((status, message)) => {
            assert!(matches!(status, StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND), "{status}: {message}");
            assert!(!message.is_empty());
            return None;
        }
    };
    let out: Value = serde_json::from_slice(&out).expect("the answer is JSON");
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    // serde skips ignored fields without checking their UTF-8, so a review the webhook reads
    // may still not be a JSON value; the API server never sends one.
    let Ok(request) = serde_json::from_slice::<Value>(body) else { return None };
    let response = &out["response"];
    assert_eq!(response["uid"], request["request"]["uid"], "{out}");
    assert_eq!(response["allowed"], true, "the webhook never denies: {out}");
    let Some(patch) = response.get("patch") else { return Some(None) };
    assert_eq!(response["patchType"], "JSONPatch", "{out}");
    let bytes: k8s_openapi::ByteString = serde_json::from_value(patch.clone()).expect("the patch is base64");
    let patch: json_patch::Patch = serde_json::from_slice(&bytes.0).expect("a JSON patch");
    let original = request["request"]["object"].clone();
    let mut patched = original.clone();
    json_patch::patch(&mut patched, &patch).unwrap_or_else(|e| panic!("the patch does not apply: {e}\n{patch:?}"));
    if serde_json::from_value::<Pod>(original).is_ok() {
        serde_json::from_value::<Pod>(patched.clone()).unwrap_or_else(|e| panic!("patched pod is not a Pod: {e}"));
    }
    Some(Some(patched))
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else { return };
    let path = if flags & 1 == 0 { INJECT_PATH } else { OPT_IN_PATH };
    let hook = &webhooks()[usize::from(flags & 2 != 0)];
    let wrapped;
    let body = match serde_json::from_slice::<Value>(body) {
        Ok(v) if v.is_object() => {
            let mut review = if v.get("request").is_none() { review_of(v) } else { v };
            // The API server's object always has `metadata` (Go serialises the zero ObjectMeta
            // as `{}`), and the webhook reads it as one: the patch is applied to that object.
            if let Some(Value::Object(object)) = review.pointer_mut("/request/object")
                && object.get("metadata").is_none_or(Value::is_null)
            {
                object.insert("metadata".into(), json!({}));
            }
            wrapped = serde_json::to_vec(&review).unwrap();
            &wrapped[..]
        }
        _ => body,
    };
    let Some(Some(patched)) = review(hook, path, body) else { return };
    // Idempotent: the injected pod, reviewed again, needs no further change.
    let mut again: Value = serde_json::from_slice(body).unwrap();
    again["request"]["object"] = patched.clone();
    if let Some(Some(twice)) = review(hook, path, &serde_json::to_vec(&again).unwrap()) {
        assert_eq!(twice, patched, "a second pass changed the injected pod");
    }
});
