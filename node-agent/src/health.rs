//! Readiness and liveness over HTTP, for the DaemonSet's probes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// What the agent still waits for before it is ready; empty when ready.
#[derive(Default)]
pub struct Health {
    pending: Mutex<Vec<String>>,
}

impl Health {
    pub fn set_pending(&self, pending: Vec<String>) {
        *self.pending.lock().expect("not poisoned") = pending;
    }

    pub fn pending(&self) -> Vec<String> {
        self.pending.lock().expect("not poisoned").clone()
    }

    pub fn is_ready(&self) -> bool {
        self.pending().is_empty()
    }
}

fn respond(health: &Health, path: &str) -> Response<Full<Bytes>> {
    let (status, body) = match path {
        "/live" => (StatusCode::OK, "live\n".to_string()),
        "/ready" => match health.pending() {
            p if p.is_empty() => (StatusCode::OK, "ready\n".to_string()),
            p => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", p.join("; "))),
        },
        _ => (StatusCode::NOT_FOUND, "not found\n".to_string()),
    };
    Response::builder().status(status).body(Full::new(Bytes::from(body))).expect("valid response")
}

/// Serves `/ready` and `/live` on `listener` until dropped.
pub async fn serve(listener: TcpListener, health: Arc<Health>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // e.g. EMFILE: back off instead of spinning.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let health = health.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let response = respond(&health, req.uri().path());
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
