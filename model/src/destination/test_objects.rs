//! Cluster objects from JSON, for the tests of the modules that read them.
//!
//! Layer: model/index (pure), tests only.

use super::Object;

/// A Service, Pod or (any other kind) EndpointSlice.
pub fn object(value: serde_json::Value) -> Object {
    match value["kind"].as_str() {
        Some("Service") => Object::from(serde_json::from_value::<k8s_openapi::api::core::v1::Service>(value).unwrap()),
        Some("Pod") => Object::from(serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(value).unwrap()),
        _ => Object::from(serde_json::from_value::<k8s_openapi::api::discovery::v1::EndpointSlice>(value).unwrap()),
    }
}
