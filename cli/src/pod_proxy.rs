//! Reading a pod's HTTP endpoint through the API server's pod proxy subresource
//! (`/api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH`): how `cnimesh check` reads the node
//! agents' `/status` and `cnimesh stat`/`edges` the proxies' `/metrics`, with nothing but the
//! kubeconfig (no port-forward, no port open to the operator).
//!
//! Layer: runtime (operator CLI).

use std::time::Duration;

/// Requests through the pod proxy in flight at once: enough for big clusters, gentle on the API
/// server.
pub const CONCURRENCY: usize = 8;
/// A pod that does not answer through the API server's proxy must not hang the whole command.
pub const POD_PROXY_TIMEOUT: Duration = Duration::from_secs(10);

use crate::query_error::QueryError;
pub use crate::query_error::kube_error;

/// GET `path` of `pod`'s `port` through the API server's pod proxy subresource; the error in one
/// line ([`QueryError::detail`]).
pub async fn pod_proxy_get(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    port: u16,
    path: &str,
) -> Result<String, String> {
    pod_proxy_read(client, namespace, pod, port, path).await.map_err(|e| e.detail().to_string())
}

/// [`pod_proxy_get`] with its error typed (a refusal, no answer, …), for callers that decide on it.
pub async fn pod_proxy_read(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    port: u16,
    path: &str,
) -> Result<String, QueryError> {
    let uri = format!("/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/{path}");
    let what = format!("GET {uri}");
    let request =
        http::Request::get(&uri).body(Vec::new()).map_err(|e| QueryError::BadQuery(format!("building {uri}: {e}")))?;
    match tokio::time::timeout(POD_PROXY_TIMEOUT, client.request_text(request)).await {
        Err(_) => Err(QueryError::timeout(what, POD_PROXY_TIMEOUT)),
        Ok(Err(e)) => Err(QueryError::from_kube(what, &e)),
        Ok(Ok(text)) => Ok(text),
    }
}
