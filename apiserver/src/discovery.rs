//! Discovery, as kubectl reads it before any request: `/version`, `/api`, `/api/v1`, `/apis`
//! and `/apis/<group>/<version>`, listing the served kinds with their verbs, scope, kind and
//! short names. Aggregated discovery is not spoken: the plain JSON answer tells kubectl to read
//! the legacy documents. OpenAPI (`/openapi/v2`, `/openapi/v3`) is a 404, which kubectl takes
//! as "no schemas": it then validates nothing client-side and merges its apply patches by the
//! types it was built with.

use http::{Response, StatusCode};
use serde_json::{Value, json};

use crate::kinds::Kind;
use crate::response::{Body, json_response};

/// The Kubernetes version this server claims unless told another.
pub const MINOR_VERSION: u32 = 33;

const ALL_VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

/// The answer to a discovery path, or `None` when `path` is not one.
pub(crate) fn answer(path: &str, kinds: &[Kind], minor: u32) -> Option<Response<Body>> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let body = match segments.as_slice() {
        ["version"] => json!({
            "major": "1", "minor": minor.to_string(), "gitVersion": format!("v1.{minor}.0-cnimesh"),
            "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "", "compiler": "", "platform": "linux/amd64",
        }),
        ["api"] => json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        ["apis"] => groups(kinds),
        ["openapi", "v2"] => return Some(empty_openapi_v2()),
        ["api", version] => resources(version, kinds.iter().filter(|k| k.group.is_empty() && k.version == *version)),
        ["apis", group, version] => {
            let gv = format!("{group}/{version}");
            let mut served = kinds.iter().filter(|k| k.group == *group && k.version == *version).peekable();
            served.peek()?;
            resources(&gv, served)
        }
        _ => return None,
    };
    Some(json_response(StatusCode::OK, body))
}

/// An OpenAPI v2 document with no definitions, in the protobuf kubectl asks for (field 1,
/// `swagger`, is `"2.0"`): kubectl then validates no kind client-side, rather than refusing to
/// apply without `--validate=false` for want of a document.
fn empty_openapi_v2() -> Response<Body> {
    use http_body_util::{BodyExt, Full};
    const SWAGGER_2_0: &[u8] = &[0x0a, 0x03, b'2', b'.', b'0'];
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        .body(Full::new(hyper::body::Bytes::from_static(SWAGGER_2_0)).boxed())
        .expect("a valid response")
}

fn groups(kinds: &[Kind]) -> Value {
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for kind in kinds.iter().filter(|k| !k.group.is_empty()) {
        match groups.iter_mut().find(|(g, _)| *g == kind.group) {
            Some((_, versions)) if !versions.contains(&kind.version.as_str()) => versions.push(&kind.version),
            Some(_) => {}
            None => groups.push((&kind.group, vec![&kind.version])),
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(group, versions)| {
            let versions: Vec<Value> =
                versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect();
            json!({"name": group, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resources<'a>(group_version: &str, kinds: impl Iterator<Item = &'a Kind>) -> Value {
    let mut resources = Vec::new();
    for kind in kinds {
        let verbs: &[&str] = if kind.verbs.is_empty() { ALL_VERBS } else { &kind.verbs };
        resources.push(json!({
            "name": kind.plural, "singularName": kind.kind.to_lowercase(), "namespaced": kind.namespaced,
            "kind": kind.kind, "verbs": verbs, "shortNames": kind.short_names,
        }));
        for sub in &kind.subresources {
            let verbs: &[&str] = match sub.as_str() {
                "token" => &["create"],
                "proxy" => &["get", "create", "delete", "patch", "update"],
                _ => &["get", "patch", "update"],
            };
            resources.push(json!({
                "name": format!("{}/{sub}", kind.plural), "singularName": "", "namespaced": kind.namespaced,
                "kind": kind.kind, "verbs": verbs,
            }));
        }
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body(path: &str) -> Option<Value> {
        let response = answer(path, &crate::kinds::built_in(), MINOR_VERSION)?;
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Some(serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn discovery_lists_each_group_once_and_each_kind_with_its_scope_and_short_names() {
        let groups = body("/apis").await.unwrap();
        let names: Vec<&str> =
            groups["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names, unique);
        assert!(names.contains(&"policy.cnimesh.io"));
        let gateway =
            groups["groups"].as_array().unwrap().iter().find(|g| g["name"] == "gateway.networking.k8s.io").unwrap();
        assert_eq!(gateway["preferredVersion"]["version"], "v1");
        let core = body("/api/v1").await.unwrap();
        let pods = core["resources"].as_array().unwrap().iter().find(|r| r["name"] == "pods").unwrap();
        assert_eq!((pods["namespaced"].as_bool(), pods["shortNames"][0].as_str()), (Some(true), Some("po")));
        assert!(body("/apis/nothing.example/v1").await.is_none());
    }
}
