//! The admin listener: `/metrics` for Prometheus, `/live` and `/ready` for the kubelet. Plain
//! HTTP/1, nothing secret: the mirror serves nothing else to anyone.
//!
//! Layer: runtime.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
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
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let response = respond(&metrics, req.uri().path());
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
