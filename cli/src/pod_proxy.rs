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

/// A kube error in one line: the API server's own message for API errors (not the debug dump
/// kube's Display adds), the cause chain otherwise.
pub fn kube_error(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({} {})", status.message, status.code, status.reason),
        other => cnimesh_common::error::with_causes(other.to_string(), other),
    }
}

/// GET `path` of `pod`'s `port` through the API server's pod proxy subresource.
pub async fn pod_proxy_get(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    port: u16,
    path: &str,
) -> Result<String, String> {
    let uri = format!("/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/{path}");
    let request = http::Request::get(&uri).body(Vec::new()).map_err(|e| format!("building {uri}: {e}"))?;
    match tokio::time::timeout(POD_PROXY_TIMEOUT, client.request_text(request)).await {
        Err(_) => Err(format!("no answer within {}s", POD_PROXY_TIMEOUT.as_secs())),
        Ok(Err(e)) => Err(kube_error(&e)),
        Ok(Ok(text)) => Ok(text),
    }
}
