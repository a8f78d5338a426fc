//! One object as the API server sends it to the control plane's Kubernetes source: untyped JSON,
//! written by anyone allowed to create an object of its kind. Read as its kind, as the source
//! reads each object, it goes into the Destination, policy and outbound indexes as the source
//! puts it there, and is deleted again. Never a panic or a hang; the object read, written back as JSON,
//! reads again as the same object; once deleted, the Destination index holds nothing.
#![no_main]

use std::sync::Arc;

use cnimesh_model::index_list::{self, Consumer};
use cnimesh_model::meta::NsName;
use cnimesh_model::{destination, egress, outbound, policy};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use libfuzzer_sys::fuzz_target;
use policy::crd;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use cnimesh_model::routes::crd as routes;

/// `value` read as `K`, or `None` where the source would refuse it (logged, counted); what it
/// read written back reads as the same.
fn read<K: DeserializeOwned + Serialize>(value: Value) -> Option<K> {
    let typed: K = serde_json::from_value(value).ok()?;
    let written = serde_json::to_value(&typed).expect("a read object serialises");
    let again: K =
        serde_json::from_value(written.clone()).unwrap_or_else(|e| panic!("{written} does not read back: {e}"));
    assert_eq!(serde_json::to_value(&again).expect("serialises"), written);
    Some(typed)
}

fn to_destination(object: destination::Object) {
    let index = destination::Index::new();
    let (kind, key) = (object.kind(), object.key());
    index.apply([destination::Change::Upsert(object)]);
    index.apply([destination::Change::Delete(kind, key)]);
    let stats = index.stats();
    assert_eq!((stats.services, stats.endpoint_slices, stats.pods), (0, 0, 0), "{stats:?}");
}

fn to_policy(object: policy::Object) {
    let index = policy::Index::new(policy::Config::default());
    let (kind, key) = (object.kind(), object.key());
    index.apply([policy::Change::Upsert(object)]);
    index.apply([policy::Change::Delete(kind, key)]);
}

/// A kind only the policy index watches.
fn policy_kind<K: DeserializeOwned + Serialize>(value: Value)
where
    policy::Object: From<K>,
{
    if let Some(object) = read::<K>(value) {
        to_policy(policy::Object::from(object));
    }
}

/// Pods and Services: one watch, both indexes.
fn shared_kind<K: DeserializeOwned + Serialize + Clone>(value: Value)
where
    policy::Object: From<K>,
    destination::Object: From<K>,
{
    if let Some(object) = read::<K>(value) {
        to_policy(policy::Object::from(object.clone()));
        to_destination(destination::Object::from(object));
    }
}

/// The Gateway API's routes and grants: the outbound index's kinds.
fn outbound_kind<K: DeserializeOwned + Serialize>(value: Value, wrap: fn(Arc<K>) -> index_list::Object) {
    let meta = |field: &str| value["metadata"][field].as_str().unwrap_or_default().to_string();
    let key = NsName::new(meta("namespace"), meta("name"));
    if let Some(object) = read::<K>(value) {
        let index = outbound::Index::new(egress::Index::new(egress::Config::new(Vec::new())));
        let object = wrap(Arc::new(object));
        let kind = object.kind();
        index.apply(&index_list::Change::Upsert(object));
        index.apply(&index_list::Change::Delete(kind, key));
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else { return };
    let field = |name: &str| value.get(name).and_then(Value::as_str).unwrap_or_default().to_string();
    match (field("apiVersion").as_str(), field("kind").as_str()) {
        ("v1", "Service") => shared_kind::<Service>(value),
        ("v1", "Pod") => shared_kind::<Pod>(value),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            if let Some(slice) = read::<EndpointSlice>(value) {
                to_destination(destination::Object::from(slice));
            }
        }
        ("v1", "Namespace") => policy_kind::<Namespace>(value),
        (crd::API_VERSION, "Server") => policy_kind::<crd::Server>(value),
        (crd::API_VERSION, "AuthorizationPolicy") => policy_kind::<crd::AuthorizationPolicy>(value),
        (crd::API_VERSION, "MeshTLSAuthentication") => policy_kind::<crd::MeshTlsAuthentication>(value),
        (crd::API_VERSION, "NetworkAuthentication") => policy_kind::<crd::NetworkAuthentication>(value),
        (crd::API_VERSION, "HTTPLocalRateLimitPolicy") => policy_kind::<crd::HttpLocalRateLimitPolicy>(value),
        (routes::API_VERSION, "HTTPRoute") => outbound_kind::<routes::HttpRoute>(value, index_list::Object::HttpRoute),
        (routes::API_VERSION, "GRPCRoute") => outbound_kind::<routes::GrpcRoute>(value, index_list::Object::GrpcRoute),
        (routes::REFERENCE_GRANT_API_VERSION, "ReferenceGrant") => {
            outbound_kind::<routes::ReferenceGrant>(value, index_list::Object::ReferenceGrant)
        }
        _ => {}
    }
});
