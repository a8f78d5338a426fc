//! Reading the pages: through the API server (a pod's admin port by the pod proxy, the control
//! plane's admin port by the service proxy), or straight from an admin address. Each error names
//! the pod, service or port that was wrong.

use std::net::SocketAddr;

use cnimesh_common::names::{CONTROL_NAME, CONTROL_NAMESPACE, PROXY_ADMIN_PORT, PROXY_CONTAINER};
use k8s_openapi::api::core::v1::{Pod, Service};

use crate::pod_proxy::{POD_PROXY_TIMEOUT, pod_proxy_read};
use crate::query_error::QueryError;

/// How the admin pages are reached.
pub enum Reach {
    /// Through the API server's pod and service proxies.
    Cluster(kube::Client),
    /// An admin port read directly: a proxy's for the pod pages, the control plane's for a
    /// service's endpoints (port-forward).
    Direct(SocketAddr),
}

fn ensure_meshed(pod: &Pod, namespace: &str, name: &str) -> Result<(), QueryError> {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    if !containers.any(|c| c.name == PROXY_CONTAINER) {
        return Err(QueryError::bad_query(format!(
            "pod {namespace}/{name} has no {PROXY_CONTAINER} container: it is not meshed"
        )));
    }
    Ok(())
}

/// The ports of a Service; `wanted` if it has it, else its only one; errors list the ports.
fn pick_port(service: &Service, namespace: &str, name: &str, wanted: Option<u16>) -> Result<u16, QueryError> {
    let ports: Vec<u16> = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|p| u16::try_from(p.port).ok())
        .collect();
    let list = || ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
    match (wanted, ports.as_slice()) {
        (Some(port), _) if ports.contains(&port) => Ok(port),
        (Some(port), _) => {
            Err(QueryError::bad_query(format!("service {namespace}/{name} has no port {port} (its ports: {})", list())))
        }
        (None, [only]) => Ok(*only),
        (None, []) => Err(QueryError::bad_query(format!("service {namespace}/{name} has no ports"))),
        (None, _) => Err(QueryError::bad_query(format!(
            "service {namespace}/{name} has ports {}: say which with --port",
            list()
        ))),
    }
}

/// What a command names: a pod (`NAME`, `pod/NAME`) or a service (`svc/NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Pod(String),
    Service(String),
}

impl Target {
    pub fn parse(text: &str) -> Result<Self, QueryError> {
        let (kind, name) = text.split_once('/').unwrap_or(("pod", text));
        if name.is_empty() || name.contains('/') {
            return Err(QueryError::bad_query(format!("{text:?}: expected NAME, pod/NAME or svc/NAME")));
        }
        match kind {
            "pod" | "pods" | "po" => Ok(Self::Pod(name.to_string())),
            "svc" | "service" | "services" => Ok(Self::Service(name.to_string())),
            other => Err(QueryError::bad_query(format!("{text:?}: unknown kind {other:?} (expected pod or svc)"))),
        }
    }
}

/// A page of `pod`'s proxy admin server.
pub async fn proxy_page(reach: &Reach, namespace: &str, pod: &str, path: &str) -> Result<String, QueryError> {
    match reach {
        Reach::Direct(addr) => crate::stat::fetch::http_get(*addr, &format!("/{path}"), POD_PROXY_TIMEOUT)
            .await
            .map_err(|e| QueryError::unreachable(format!("reading /{path} from the admin port {addr}"), e)),
        Reach::Cluster(client) => {
            meshed_pod(client, namespace, pod).await?;
            pod_proxy_read(client, namespace, pod, PROXY_ADMIN_PORT, path)
                .await
                .map_err(|e| e.about(format!("reading /{path} of {namespace}/{pod}'s proxy through the API server")))
        }
    }
}

/// Checks that the pod exists and has a proxy, so the error says so rather than the pod proxy's.
async fn meshed_pod(client: &kube::Client, namespace: &str, name: &str) -> Result<(), QueryError> {
    let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), namespace);
    let pod = match tokio::time::timeout(POD_PROXY_TIMEOUT, api.get_opt(name)).await {
        Err(_) => return Err(QueryError::timeout(format!("reading pod {namespace}/{name}"), POD_PROXY_TIMEOUT)),
        Ok(Err(e)) => return Err(QueryError::from_kube(format!("reading pod {namespace}/{name}"), &e)),
        Ok(Ok(None)) => return Err(QueryError::not_found(format!("pod {namespace}/{name}"))),
        Ok(Ok(Some(pod))) => pod,
    };
    ensure_meshed(&pod, namespace, name)
}

/// What Destination serves for `service`'s `port` (the only port when `None`): the authority asked
/// and the control plane's `/destination.json` answer.
pub async fn destination(
    reach: &Reach,
    namespace: &str,
    service: &str,
    port: Option<u16>,
) -> Result<(String, String), QueryError> {
    let port = match (reach, port) {
        (Reach::Cluster(client), port) => service_port(client, namespace, service, port).await?,
        (Reach::Direct(_), Some(port)) => port,
        (Reach::Direct(addr), None) => {
            return Err(QueryError::bad_query(format!(
                "--port is needed with --admin-addr {addr}: the service's ports are not looked up"
            )));
        }
    };
    let authority = format!("{service}.{namespace}:{port}");
    let query =
        format!("authority={}", percent_encoding::utf8_percent_encode(&authority, percent_encoding::NON_ALPHANUMERIC));
    let direct = match reach {
        Reach::Direct(addr) => Some(*addr),
        Reach::Cluster(_) => None,
    };
    let text = match (reach, direct) {
        (_, Some(addr)) => {
            crate::stat::fetch::http_get(addr, &format!("/destination.json?{query}"), POD_PROXY_TIMEOUT).await.map_err(
                |e| QueryError::unreachable(format!("asking the control plane's admin port {addr} for {authority}"), e),
            )?
        }
        (Reach::Cluster(client), None) => {
            let uri = format!(
                "/api/v1/namespaces/{CONTROL_NAMESPACE}/services/{CONTROL_NAME}:admin/proxy/destination.json?{query}"
            );
            let request = http::Request::get(&uri)
                .body(Vec::new())
                .map_err(|e| QueryError::bad_query(format!("building {uri}: {e}")))?;
            match tokio::time::timeout(POD_PROXY_TIMEOUT, client.request_text(request)).await {
                Err(_) => {
                    let what = format!("asking the control plane for {authority}");
                    return Err(QueryError::timeout(what, POD_PROXY_TIMEOUT));
                }
                Ok(Err(e)) => {
                    let what = format!(
                        "asking the control plane ({CONTROL_NAMESPACE}/{CONTROL_NAME}, port admin) for {authority}"
                    );
                    return Err(QueryError::from_kube(what, &e));
                }
                Ok(Ok(text)) => text,
            }
        }
        (_, None) => return Err(QueryError::unreachable(format!("asking for {authority}"), "no control plane to ask")),
    };
    Ok((authority, text))
}

/// The service's port: `wanted` if the service has it, else its only port; errors list the ports.
async fn service_port(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    wanted: Option<u16>,
) -> Result<u16, QueryError> {
    let api: kube::Api<Service> = kube::Api::namespaced(client.clone(), namespace);
    let service = match tokio::time::timeout(POD_PROXY_TIMEOUT, api.get_opt(name)).await {
        Err(_) => {
            return Err(QueryError::timeout(format!("reading service {namespace}/{name}"), POD_PROXY_TIMEOUT));
        }
        Ok(Err(e)) => return Err(QueryError::from_kube(format!("reading service {namespace}/{name}"), &e)),
        Ok(Ok(None)) => return Err(QueryError::not_found(format!("service {namespace}/{name}"))),
        Ok(Ok(Some(service))) => service,
    };
    pick_port(&service, namespace, name, wanted)
}
