//! Server-side apply (`application/apply-patch+yaml`): the body must carry `apiVersion`, `kind`
//! and the name, `fieldManager` is required, and an object another manager applied is a 409
//! unless `force=true`. Ownership is per object, not per field: the applied body replaces the
//! object (its status kept), where a real server would merge fields other managers own.

use http::{Response, StatusCode};
use serde_json::{Value, json};

use crate::call::Call;
use crate::kinds::Resource;
use crate::response::{Body, json_response, status};
use crate::store::{self, Key, Store};

pub(crate) fn apply(
    store: &mut Store,
    call: &Call,
    resource: &Resource,
    key: Key,
    existing: Option<Value>,
    status_only: bool,
) -> Response<Body> {
    let Some(manager) = call.param("fieldManager").filter(|m| !m.is_empty()) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "PATCH requests with apply content type require fieldManager",
        );
    };
    if let Err(why) = store.check_body(&call.body, resource, &key) {
        return status(StatusCode::BAD_REQUEST, "BadRequest", why);
    }
    // As the API server: the status subresource of an object that is not there cannot be
    // applied (a status write racing the object's deletion must not bring it back).
    if status_only && existing.is_none() {
        return status(StatusCode::NOT_FOUND, "NotFound", format!("{} {:?} not found", resource.plural, key.1));
    }
    if !call.body["metadata"]["managedFields"].is_null() {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "metadata.managedFields must be nil");
    }
    if store::is_stale(&call.body, existing.as_ref()) {
        return status(StatusCode::CONFLICT, "Conflict", format!("the object {:?} has been modified", key.1));
    }
    let force = call.param("force") == Some("true");
    let others: Vec<String> = existing
        .iter()
        .flat_map(|o| o["metadata"]["managedFields"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f["manager"].as_str().map(String::from))
        .filter(|m| m != manager)
        .collect();
    if !others.is_empty() && !force {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Apply failed with conflicts: fields managed by {}", others.join(", ")),
        );
    }
    let mut object = store.server_fields(resource, existing.as_ref(), call.body.clone());
    if let Some(old) = &existing {
        if status_only {
            let status = object["status"].take();
            object = old.clone();
            object["status"] = status;
        } else if !old["status"].is_null() {
            object["status"] = old["status"].clone();
        }
    }
    object["metadata"]["managedFields"] =
        json!([{"manager": manager, "operation": "Apply", "apiVersion": resource.api_version}]);
    let written = match &existing {
        Some(old) => store.write(resource, key, old, object),
        None => store.commit(resource, key, object, "ADDED"),
    };
    json_response(StatusCode::OK, written)
}
