//! Helpers the fuzz targets share: the invariants more than one target asserts.

use cnimesh_cni::error::CniError;
use serde_json::Value;

/// A CNI error must leave the plugin as the spec's error object: JSON with `cniVersion`, the
/// numeric `code` it carries and a `msg`, whatever bytes caused it.
pub fn assert_cni_error_json(e: &CniError, cni_version: &str) {
    let json = e.to_json(cni_version);
    let v: Value = serde_json::from_str(&json).unwrap_or_else(|err| panic!("error object {json:?} is not JSON: {err}"));
    assert_eq!(v["cniVersion"], cni_version, "{json}");
    assert_eq!(v["code"].as_u64(), Some(e.code as u64), "{json}");
    assert_eq!(v["msg"].as_str(), Some(e.msg.as_str()), "{json}");
    assert_eq!(v.get("details").and_then(Value::as_str), e.details.as_deref(), "{json}");
}

/// `value` written as JSON and read back is `value` again.
pub fn assert_json_round_trip(value: &Value) {
    let text = serde_json::to_string(value).expect("a JSON value serialises");
    let back: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?} does not parse back: {e}"));
    assert_eq!(&back, value, "JSON round trip changed the value: {text}");
}
