//! The pod proxy subresource (`/api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH`), as the CLI
//! reads a pod's admin endpoint through the API server: the request goes over plain HTTP to the
//! pod's `status.podIP` (reachable from this host in local mode, where pods are network
//! namespaces on it).

use std::net::IpAddr;

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;

use crate::response::{Body, status};

/// What a pod proxy path names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ProxyTarget {
    pub(crate) namespace: String,
    pub(crate) pod: String,
    pub(crate) port: u16,
    /// The path on the pod, from its leading `/`.
    pub(crate) path: String,
}

pub(crate) fn parse(path: &str) -> Option<ProxyTarget> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (namespace, rest) = rest.split_once("/pods/")?;
    let (name_port, rest) = rest.split_once("/proxy")?;
    if namespace.contains('/') || name_port.contains('/') || !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    let (pod, port) = match name_port.rsplit_once(':') {
        Some((pod, port)) => (pod, port.parse().ok()?),
        None => (name_port, 80),
    };
    let path = if rest.is_empty() { "/".to_string() } else { rest.to_string() };
    Some(ProxyTarget { namespace: namespace.to_string(), pod: pod.to_string(), port, path })
}

/// Sends the request to the pod and returns its answer.
pub(crate) async fn forward(
    ip: IpAddr,
    target: &ProxyTarget,
    method: Method,
    query: Option<&str>,
    body: Bytes,
) -> Response<Body> {
    let unreachable = |why: String| {
        status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!("error trying to reach pod {}: {why}", target.pod),
        )
    };
    let stream = match tokio::net::TcpStream::connect((ip, target.port)).await {
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
    let host = std::net::SocketAddr::new(ip, target.port).to_string();
    let request = Request::builder().method(method).uri(uri).header(http::header::HOST, host).body(Full::new(body));
    let Ok(request) = request else { return unreachable("an invalid path".to_string()) };
    match sender.send_request(request).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            match body.collect().await {
                Ok(bytes) => Response::from_parts(parts, Full::new(bytes.to_bytes()).boxed()),
                Err(e) => unreachable(e.to_string()),
            }
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
            ProxyTarget { namespace: "shop".into(), pod: "web-1".into(), port: 4191, path: "/metrics".into() }
        );
        assert_eq!(parse("/api/v1/namespaces/shop/pods/web-1/proxy").unwrap().port, 80);
        assert!(parse("/api/v1/namespaces/shop/pods/web-1/status").is_none());
        assert!(parse("/api/v1/namespaces/shop/pods/web-1:x/proxy/").is_none());
    }
}
