//! `cnimesh authz --local DIR`: local mode's cluster directory (`DIR/cluster`, the manifests
//! `cnimesh-local up --dir DIR` writes and its control plane reads) answered as an API server
//! answers the command's reads, so that the evaluation is the same code on the same objects: a
//! kube client whose GETs are served from the manifests (a named object, or a namespace's
//! objects of a kind, whatever the API version asked), and whose pod-proxy reads of a proxy's
//! admin port go to the pod's address (audit mode's would-be denials). Nothing is written.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use serde_json::{Value, json};

use crate::pod_proxy::POD_PROXY_TIMEOUT;
use crate::query_error::QueryError;

/// A client answering from the manifests under `dir/cluster`, read now.
pub fn client(dir: &Path) -> Result<kube::Client, QueryError> {
    let objects = Arc::new(read(&dir.join("cluster"))?);
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let objects = objects.clone();
        async move {
            let (code, text, content_type) = answer(&objects, req.method(), req.uri().path()).await;
            let response = http::Response::builder()
                .status(code)
                .header("content-type", content_type)
                .body(Full::new(Bytes::from(text)))
                .expect("a response");
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    Ok(kube::Client::new(service, "default"))
}

/// The objects by their unversioned path (`/api/namespaces/shop/pods/web-1`,
/// `/apis/policy.cnimesh.io/namespaces/shop/servers/web-http`).
type Objects = BTreeMap<String, Value>;

/// Every object of the manifests under `cluster` (hidden directories, such as the control
/// plane's `.status/`, left out); an error when there are none or one cannot be read.
fn read(cluster: &Path) -> Result<Objects, QueryError> {
    let mut files = Vec::new();
    manifests(cluster, &mut files).map_err(|e| {
        QueryError::unreachable(
            format!("reading {}", cluster.display()),
            format_args!("{e}: is local mode up there (`cnimesh-local up`)?"),
        )
    })?;
    files.sort();
    let mut objects = Objects::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| QueryError::unreachable(format!("reading {}", file.display()), e))?;
        let docs = crate::yaml::documents(&text, &file.display().to_string())
            .map_err(|e| QueryError::invalid(file.display().to_string(), e.source))?;
        objects.extend(docs.into_iter().filter_map(|doc| Some((path_of(&doc)?, doc))));
    }
    if objects.is_empty() {
        return Err(QueryError::unreachable(
            format!("no objects under {}", cluster.display()),
            "is local mode up there (`cnimesh-local up`)?",
        ));
    }
    Ok(objects)
}

fn manifests(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        if path.is_dir() {
            if !name.starts_with('.') {
                manifests(&path, files)?;
            }
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            files.push(path);
        }
    }
    Ok(())
}

/// Where an API server serves `doc`, without the version.
fn path_of(doc: &Value) -> Option<String> {
    let api_version = doc["apiVersion"].as_str()?;
    let kind = doc["kind"].as_str()?;
    let name = doc["metadata"]["name"].as_str()?;
    let base = match api_version.rsplit_once('/') {
        Some((group, _)) => format!("/apis/{group}"),
        None => "/api".to_string(),
    };
    Some(match (kind, doc["metadata"]["namespace"].as_str()) {
        ("Namespace", _) => format!("{base}/namespaces/{name}"),
        (_, namespace) => format!("{base}/namespaces/{}/{}/{name}", namespace.unwrap_or("default"), plural(kind)),
    })
}

/// A kind's resource name: `Pod` → `pods`, `AuthorizationPolicy` → `authorizationpolicies`.
fn plural(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    match lower.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{lower}s"),
    }
}

/// `path` without its API version (`/api/v1/…` → `/api/…`, `/apis/GROUP/VERSION/…` →
/// `/apis/GROUP/…`), as a list of segments.
fn unversioned(path: &str) -> Vec<&str> {
    let mut segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.first() {
        Some(&"api") if segments.len() > 1 => {
            segments.remove(1);
        }
        Some(&"apis") if segments.len() > 2 => {
            segments.remove(2);
        }
        _ => {}
    }
    segments
}

/// The API server's answer to a GET of `path`: (status, body, content type).
async fn answer(objects: &Objects, method: &http::Method, path: &str) -> (u16, String, &'static str) {
    if method != http::Method::GET {
        return status(405, &format!("{method} {path}: local mode is read only here"));
    }
    let segments = unversioned(path);
    let key = format!("/{}", segments.join("/"));
    // `/api/namespaces/NS/pods/NAME:PORT/proxy/PATH`: the pod's admin port, at its address.
    if let ["api", "namespaces", namespace, "pods", target, "proxy", rest @ ..] = segments.as_slice() {
        return pod_proxy(objects, namespace, target, &rest.join("/")).await;
    }
    if let Some(object) = objects.get(&key) {
        return (200, object.to_string(), "application/json");
    }
    // An odd number of segments after the group is a collection (`namespaces`,
    // `namespaces/NS/KIND`), an even one an object that is not there.
    let after_group = if segments.first() == Some(&"apis") { segments.len() - 2 } else { segments.len() - 1 };
    if after_group % 2 == 0 {
        return status(404, &format!("{path} not found"));
    }
    let prefix = format!("{key}/");
    let items: Vec<&Value> = objects
        .iter()
        .filter(|(p, _)| p.strip_prefix(&prefix).is_some_and(|name| !name.contains('/')))
        .map(|(_, v)| v)
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items});
    (200, list.to_string(), "application/json")
}

async fn pod_proxy(objects: &Objects, namespace: &str, target: &str, path: &str) -> (u16, String, &'static str) {
    let Some((name, port)) = target.rsplit_once(':').and_then(|(n, p)| Some((n, p.parse::<u16>().ok()?))) else {
        return status(400, &format!("{target}: expected NAME:PORT"));
    };
    let pod = objects.get(&format!("/api/namespaces/{namespace}/pods/{name}"));
    let Some(ip) = pod.and_then(|p| p["status"]["podIP"].as_str()).and_then(|ip| ip.parse::<IpAddr>().ok()) else {
        return status(404, &format!("pod {namespace}/{name} has no address in local mode's manifests"));
    };
    match crate::stat::fetch::http_get(SocketAddr::new(ip, port), &format!("/{path}"), POD_PROXY_TIMEOUT).await {
        Ok(text) => (200, text, "text/plain"),
        Err(e) => status(503, &format!("error trying to reach pod {namespace}/{name}: {e}")),
    }
}

fn status(code: u16, message: &str) -> (u16, String, &'static str) {
    let reason = match code {
        400 => "BadRequest",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        _ => "ServiceUnavailable",
    };
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": message, "reason": reason, "code": code});
    (code, body.to_string(), "application/json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_versions_map_to_the_paths_an_api_server_serves() {
        let server = json!({"apiVersion": "policy.cnimesh.io/v1alpha1", "kind": "Server",
                            "metadata": {"name": "web-http", "namespace": "shop"}});
        assert_eq!(path_of(&server).unwrap(), "/apis/policy.cnimesh.io/namespaces/shop/servers/web-http");
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}});
        assert_eq!(path_of(&ns).unwrap(), "/api/namespaces/shop");
        assert_eq!(plural("AuthorizationPolicy"), "authorizationpolicies");
        assert_eq!(plural("HTTPRoute"), "httproutes");
        assert_eq!(
            unversioned("/apis/gateway.networking.k8s.io/v1/namespaces/shop/httproutes").join("/"),
            "apis/gateway.networking.k8s.io/namespaces/shop/httproutes"
        );
        assert_eq!(unversioned("/api/v1/namespaces/shop").join("/"), "api/namespaces/shop");
    }
}
