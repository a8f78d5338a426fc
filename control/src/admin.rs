//! The admin listener: `/metrics` for Prometheus, `/ready` and `/live` for the kubelet, and
//! `/tap` (the tap relay, [`crate::tap`]). Plain HTTP/1: probes, scrapers and the API server's
//! service proxy speak nothing else; nothing here is secret but tap, which checks a token.
//!
//! Layer: runtime: the admin HTTP listener `serve` starts beside gRPC.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::identity::IssuerRx;
use crate::metrics::Metrics;
use crate::tap::{AdminBody, Relay};

/// What the admin endpoints report on.
#[derive(Clone)]
pub struct AdminState {
    pub metrics: Arc<Metrics>,
    /// Ready once an issuer has loaded: before that every Certify would fail.
    pub issuer: IssuerRx,
    /// With Destination: ready once every kind of object has been loaded once (earlier answers
    /// could call an existing service unknown).
    pub index: Option<crate::destination::Index>,
    /// `/tap`; `None`: 404 like any unknown path.
    pub tap: Option<Relay>,
}

fn respond(state: &AdminState, path: &str) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/metrics" => {
            (StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", state.metrics.encode())
        }
        "/live" => (StatusCode::OK, "text/plain", "live\n".into()),
        "/ready" if state.issuer.borrow().is_none() => {
            (StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready: no issuer loaded\n".into())
        }
        "/ready" if state.index.as_ref().is_some_and(|i| !i.is_ready()) => {
            (StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready: cluster state not loaded yet\n".into())
        }
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
pub async fn serve(listener: TcpListener, state: AdminState, shutdown: impl Future<Output = ()>) {
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
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let state = state.clone();
                async move {
                    let response: Response<AdminBody> = match (&state.tap, req.uri().path()) {
                        (Some(tap), "/tap") => tap.handle(req.headers(), req.uri().query()).await,
                        (_, path) => respond(&state, path).map(BodyExt::boxed_unsync),
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
