//! The agent's health listener: readiness and liveness for the DaemonSet's probes, `/status`, the
//! JSON the operator CLI's `cnimesh check` reads from every node, and `/metrics` (Prometheus).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use http::{Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpListener;

use crate::cluster::SharedCluster;
use crate::debug::{self, Verdict};
use crate::mounts::{self, Propagation};

/// What the agent still waits for before it is ready (empty when ready), and problems that do not
/// stop it from serving decisions but that an operator must fix (e.g. a private netns mount).
#[derive(Default)]
pub struct Health {
    pending: Mutex<Vec<String>>,
    warnings: Mutex<Vec<String>>,
    /// One `/status` computation at a time: each runs a process and enters every pod's netns,
    /// and the port is reachable from the node's network.
    status_gate: tokio::sync::Mutex<()>,
}

impl Health {
    pub fn set_pending(&self, pending: Vec<String>) {
        *self.pending.lock() = pending;
    }

    pub fn pending(&self) -> Vec<String> {
        self.pending.lock().clone()
    }

    pub fn is_ready(&self) -> bool {
        self.pending().is_empty()
    }

    pub fn set_warnings(&self, warnings: Vec<String>) {
        *self.warnings.lock() = warnings;
    }

    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().clone()
    }
}

/// What `/status` is computed from: the agent's own paths and its view of the cluster.
pub struct StatusSource {
    pub node: Option<String>,
    pub cni_bin_dir: PathBuf,
    pub cni_conf_dir: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub netns_dir: PathBuf,
    pub cluster: SharedCluster,
    /// What `/metrics` shows.
    pub metrics: Arc<crate::metrics::AgentMetrics>,
}

/// The body of `GET /status`. Its field names are a contract with `cnimesh check` (control/):
/// rename nothing without changing the reader.
#[derive(Debug, Clone, Serialize)]
pub struct AgentStatus {
    pub node: Option<String>,
    pub ready: bool,
    pub pending: Vec<String>,
    pub status: debug::Status,
    pub healthy: bool,
    pub mount_propagation: Propagation,
    pub verify: Vec<Verdict>,
}

/// Computes the status now. Blocking: it runs the plugin binary (VERSION) and enters every
/// captured pod's netns, so callers in async code run it with `spawn_blocking`.
pub fn agent_status(health: &Health, source: &StatusSource) -> AgentStatus {
    // The agent is the API client; what it can tell cheaply is whether its pod cache is synced.
    let kube = if source.cluster.ready() { "pod cache synced" } else { "pod cache not synced yet" };
    let status =
        debug::status(&source.cni_bin_dir, &source.cni_conf_dir, &source.socket, &source.state_dir, kube.to_string());
    let verify = debug::verify(&source.state_dir, None).unwrap_or_else(|e| {
        // Keep the shape: an unreadable state dir shows up as a failed verdict, not as "no pods".
        vec![Verdict {
            pod: "(attachment records)".into(),
            container_id: String::new(),
            ok: false,
            drift: vec![format!("{e:#}")],
        }]
    });
    AgentStatus {
        node: source.node.clone(),
        ready: health.is_ready(),
        pending: health.pending(),
        healthy: status.healthy(),
        status,
        mount_propagation: mounts::propagation(&source.netns_dir),
        verify,
    }
}

pub fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}

fn with_warnings(mut body: String, warnings: &[String]) -> String {
    for w in warnings {
        body.push_str(&format!("warning: {w}\n"));
    }
    body
}

/// `/live`: the process answers.
pub fn live() -> Response<Full<Bytes>> {
    text(StatusCode::OK, "live\n".into())
}

/// `/metrics` in the OpenMetrics text format.
pub fn metrics(body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}

/// `/ready`: 200 `ready` or 503 `not ready: <what is pending>`, with the warnings.
pub fn ready(health: &Health) -> Response<Full<Bytes>> {
    match health.pending() {
        p if p.is_empty() => text(StatusCode::OK, with_warnings("ready\n".into(), &health.warnings())),
        p => text(
            StatusCode::SERVICE_UNAVAILABLE,
            with_warnings(format!("not ready: {}\n", p.join("; ")), &health.warnings()),
        ),
    }
}

/// A JSON body.
pub fn json<T: Serialize>(value: &T) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(value).expect("serialisable"))))
        .expect("valid response")
}

async fn respond(health: Arc<Health>, source: Arc<StatusSource>, path: String) -> Response<Full<Bytes>> {
    match path.as_str() {
        "/live" => live(),
        "/metrics" => metrics(source.metrics.encode()),
        "/ready" => ready(&health),
        "/status" => {
            let gate = health.status_gate.lock().await;
            // Off the reactor: netns threads and a child process per request.
            let computed = tokio::task::spawn_blocking({
                let health = health.clone();
                move || agent_status(&health, &source)
            })
            .await;
            drop(gate);
            match computed {
                Ok(status) => json(&status),
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("status failed: {e}\n")),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// Serves `/ready`, `/live`, `/status` and `/metrics` on `listener` until dropped.
pub async fn serve(listener: TcpListener, health: Arc<Health>, source: Arc<StatusSource>) {
    serve_with(listener, move |path| respond(health.clone(), source.clone(), path)).await
}

/// The admin listener's accept loop (HTTP/1, GET by path), answering with `respond(path)`: the
/// DaemonSet agent's endpoints and host mode's.
pub async fn serve_with<F, Fut>(listener: TcpListener, respond: F)
where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // e.g. EMFILE: back off instead of spinning.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let respond = respond.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let answer = respond(req.uri().path().to_string());
                async move { Ok::<_, std::convert::Infallible>(answer.await) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
