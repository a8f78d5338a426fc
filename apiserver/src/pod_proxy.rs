//! The proxy subresources, as the CLI reads a pod's admin endpoint through the API server: the
//! pod's (`/api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH`) goes over plain HTTP to the pod's
//! `status.podIP`; the service's (`/api/v1/namespaces/NS/services/NAME:PORT/proxy/PATH`, the port
//! by name or number) to a running pod its selector picks, at the port's target port. Pods are
//! reachable from this host in local mode, where they are network namespaces on its bridge. The
//! pod's answer is streamed back as it comes (the control plane's tap stream never ends by itself).

use std::net::IpAddr;

use futures::StreamExt;
use http::header::{AUTHORIZATION, CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, BodyStream, Full, StreamBody};
use hyper::body::Bytes;
use serde_json::Value;

use crate::response::{Body, status};

/// Which kind of object a proxy path names.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(crate) enum Via {
    Pod,
    Service,
}

/// What a proxy path names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ProxyTarget {
    pub(crate) via: Via,
    pub(crate) namespace: String,
    /// The pod's or the service's name.
    pub(crate) name: String,
    /// A pod's port number; a service's port by name or number (empty: its first port).
    pub(crate) port: String,
    /// The path on the pod, from its leading `/`.
    pub(crate) path: String,
}

pub(crate) fn parse(path: &str) -> Option<ProxyTarget> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (namespace, rest) = rest.split_once('/')?;
    let (via, rest) = match rest.split_once('/')? {
        ("pods", rest) => (Via::Pod, rest),
        ("services", rest) => (Via::Service, rest),
        _ => return None,
    };
    let (name_port, rest) = rest.split_once("/proxy")?;
    if namespace.is_empty() || name_port.contains('/') || !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    let (name, port) = match (name_port.rsplit_once(':'), via) {
        (Some((name, port)), Via::Pod) => (name, port.parse::<u16>().ok()?.to_string()),
        (Some((name, port)), Via::Service) => (name, port.to_string()),
        (None, Via::Pod) => (name_port, "80".to_string()),
        (None, Via::Service) => (name_port, String::new()),
    };
    let path = if rest.is_empty() { "/".to_string() } else { rest.to_string() };
    Some(ProxyTarget { via, namespace: namespace.to_string(), name: name.to_string(), port, path })
}

/// The address a service's proxy goes to: the first running pod (by name) of `pods` that its
/// selector picks and that has an IP, at the target port of the service port named `port`.
pub(crate) fn service_backend(service: &Value, pods: &[Value], port: &str) -> Result<(IpAddr, u16), String> {
    let ports = service["spec"]["ports"].as_array().cloned().unwrap_or_default();
    let chosen = ports
        .iter()
        .find(|p| {
            port.is_empty()
                || p["name"].as_str() == Some(port)
                || p["port"].as_u64().is_some_and(|n| n.to_string() == port)
        })
        .ok_or_else(|| format!("the service has no port {port:?}"))?;
    let selector =
        service["spec"]["selector"].as_object().filter(|s| !s.is_empty()).ok_or("the service has no selector")?;
    let mut picked: Vec<&Value> = pods
        .iter()
        .filter(|p| selector.iter().all(|(k, v)| &p["metadata"]["labels"][k] == v))
        .filter(|p| p["status"]["phase"] == "Running" && p["status"]["podIP"].is_string())
        .collect();
    picked.sort_by_key(|p| p["metadata"]["name"].as_str().unwrap_or_default().to_string());
    let pod = picked.first().ok_or("no running pod of the service has an IP")?;
    let ip = pod["status"]["podIP"].as_str().and_then(|ip| ip.parse().ok()).ok_or("the pod's IP does not parse")?;
    let target = match &chosen["targetPort"] {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(name) => pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_u64())
            .and_then(|n| u16::try_from(n).ok()),
        _ => chosen["port"].as_u64().and_then(|n| u16::try_from(n).ok()),
    };
    let target = target.ok_or_else(|| format!("the target port of port {port:?} is not on the pod"))?;
    Ok((ip, target))
}

/// Sends the request to the pod at `ip`:`port` and streams back its answer.
pub(crate) async fn forward(
    ip: IpAddr,
    port: u16,
    target: &ProxyTarget,
    method: Method,
    query: Option<&str>,
    headers: &http::HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let unreachable = |why: String| {
        status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!("error trying to reach {}: {why}", target.name),
        )
    };
    let stream = match tokio::net::TcpStream::connect((ip, port)).await {
        Ok(stream) => stream,
        Err(e) => return unreachable(e.to_string()),
    };
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(e) => return unreachable(e.to_string()),
        };
    tokio::spawn(connection);
    let uri = match query {
        Some(q) => format!("{}?{q}", target.path),
        None => target.path.clone(),
    };
    let host = std::net::SocketAddr::new(ip, port).to_string();
    let mut request = Request::builder().method(method).uri(uri);
    // The client's headers go on (a tap token, Accept), but never its credentials for this server,
    // nor the connection's own.
    for (name, value) in headers {
        if ![AUTHORIZATION, HOST, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING].contains(name) {
            request = request.header(name, value);
        }
    }
    let request = request.header(http::header::HOST, host).body(Full::new(body));
    let Ok(request) = request else { return unreachable("an invalid path".to_string()) };
    match sender.send_request(request).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            // Frames as they come; a broken stream just ends (the client sees it short).
            let frames = StreamExt::take_while(BodyStream::new(body), |f| std::future::ready(f.is_ok()))
                .filter_map(|f| std::future::ready(f.ok().map(Ok::<_, std::convert::Infallible>)));
            Response::from_parts(parts, BodyExt::boxed(StreamBody::new(frames)))
        }
        Err(e) => unreachable(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_path_names_the_pod_its_port_and_the_path_on_it() {
        let target = parse("/api/v1/namespaces/shop/pods/web-1:4191/proxy/metrics").unwrap();
        assert_eq!(
            target,
            ProxyTarget {
                via: Via::Pod,
                namespace: "shop".into(),
                name: "web-1".into(),
                port: "4191".into(),
                path: "/metrics".into()
            }
        );
        assert_eq!(parse("/api/v1/namespaces/shop/pods/web-1/proxy").unwrap().port, "80");
        assert!(parse("/api/v1/namespaces/shop/pods/web-1/status").is_none());
        assert!(parse("/api/v1/namespaces/shop/pods/web-1:x/proxy/").is_none());
    }

    #[test]
    fn a_service_proxy_goes_to_a_running_pod_of_its_selector_at_the_named_target_port() {
        let target = parse("/api/v1/namespaces/cnimesh/services/cnimesh-control:admin/proxy/tap?x").unwrap();
        assert_eq!(
            (target.via, target.name.as_str(), target.port.as_str()),
            (Via::Service, "cnimesh-control", "admin")
        );
        let service = serde_json::json!({"spec": {"selector": {"app": "control"},
            "ports": [{"name": "grpc", "port": 4190}, {"name": "admin", "port": 9990, "targetPort": "admin"}]}});
        let pod = |name: &str, app: &str, phase: &str, ip: &str| {
            serde_json::json!({
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"containers": [{"ports": [{"name": "admin", "containerPort": 9991}]}]},
            "status": {"phase": phase, "podIP": ip}})
        };
        let pods = [
            pod("b", "control", "Running", "10.0.0.2"),
            pod("a", "control", "Pending", "10.0.0.1"),
            pod("c", "other", "Running", "10.0.0.3"),
        ];
        assert_eq!(service_backend(&service, &pods, "admin"), Ok(("10.0.0.2".parse().unwrap(), 9991)));
        assert_eq!(service_backend(&service, &pods, "4190"), Ok(("10.0.0.2".parse().unwrap(), 4190)));
        assert!(service_backend(&service, &pods, "nope").unwrap_err().contains("no port"));
        assert!(service_backend(&service, &pods[1..2], "admin").unwrap_err().contains("no running pod"));
    }
}
