//! The admin listener: `/metrics` for Prometheus, `/live` and `/ready` for the kubelet. Plain
//! HTTP/1, nothing secret: the mirror serves nothing else to anyone.
//!
//! Layer: runtime.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::Full;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

fn respond(metrics: &Metrics, path: &str) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/metrics" => (StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", metrics.encode()),
        "/live" => (StatusCode::OK, "text/plain", "live\n".into()),
        // Nothing is served from the mirror's state: running is ready.
        "/ready" => (StatusCode::OK, "text/plain", "ready\n".into()),
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    };
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

/// Serves the admin endpoints on `listener` until `shutdown` resolves.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, shutdown: impl Future<Output = ()>) {
    cnimesh_runtime::admin_http::serve_http(listener, shutdown, move |req: http::Request<hyper::body::Incoming>| {
        let response = respond(&metrics, req.uri().path());
        async move { response }
    })
    .await
}
