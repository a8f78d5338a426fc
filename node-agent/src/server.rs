//! The decision socket: the plugin asks, per pod sandbox, whether and how to capture.
//!
//! The socket is created 0600 and owned by root: the answer decides whether a pod's traffic goes
//! through its proxy, so only root (the runtime running the plugin) may ask.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cnimesh_cni::agent::{Decision, DecisionRequest, MAX_LINE, PROTOCOL_VERSION};
use cnimesh_cni::spec::RedirectSpec;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::cluster::SharedCluster;
use crate::decide;
use crate::metrics::{AgentMetrics, SocketError};

/// How long one plugin connection may take before the agent drops it.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);

pub struct Decider {
    pub cluster: SharedCluster,
    pub defaults: RedirectSpec,
}

impl Decider {
    pub async fn decide(&self, req: &DecisionRequest) -> Decision {
        if req.version != PROTOCOL_VERSION {
            return Decision::Error {
                message: format!(
                    "protocol version {} is not {PROTOCOL_VERSION}: upgrade the plugin and agent together",
                    req.version
                ),
                retry: false,
            };
        }
        let key = format!("{}/{}", req.pod_namespace, req.pod_name);
        match self.cluster.pod(&req.pod_namespace, &req.pod_name).await {
            Ok(Some(pod)) => {
                if let (Some(want), Some(have)) = (&req.pod_uid, &pod.metadata.uid)
                    && want != have
                {
                    return Decision::Error {
                        message: format!("pod {key} has uid {have}, not {want} (cache not yet updated)"),
                        retry: true,
                    };
                }
                decide::decide(&pod, &self.defaults)
            }
            Ok(None) => {
                Decision::Error { message: format!("pod {key} is not known to the API server yet"), retry: true }
            }
            Err(e) => Decision::Error { message: format!("cannot read pod {key}: {e:#}"), retry: true },
        }
    }
}

/// Binds the socket (replacing a stale one), 0600.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

async fn answer(stream: UnixStream, decider: &Decider, metrics: &AgentMetrics) -> anyhow::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read.take(MAX_LINE as u64)).read_line(&mut line).await?;
    let started = std::time::Instant::now();
    let decision = match serde_json::from_str::<DecisionRequest>(line.trim()) {
        Ok(req) => {
            let decision = decider.decide(&req).await;
            metrics.decided(&decision, started.elapsed());
            tracing::info!(pod = %format!("{}/{}", req.pod_namespace, req.pod_name), container = %req.container_id, ?decision, "decision");
            decision
        }
        Err(e) => {
            metrics.socket_error(SocketError::Malformed);
            Decision::Error { message: format!("malformed request: {e}"), retry: false }
        }
    };
    let mut out = serde_json::to_vec(&decision)?;
    out.push(b'\n');
    write.write_all(&out).await?;
    Ok(())
}

/// Serves decisions until the task is dropped, counting them in `metrics`.
pub async fn serve(listener: UnixListener, decider: Arc<Decider>, metrics: Arc<AgentMetrics>) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                metrics.socket_error(SocketError::Accept);
                tracing::warn!(error = %e, "accept on the decision socket failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (decider, metrics) = (decider.clone(), metrics.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(CONNECTION_DEADLINE, answer(stream, &decider, &metrics)).await {
                Ok(Err(e)) => {
                    metrics.socket_error(SocketError::Io);
                    tracing::warn!(error = %e, "decision connection failed")
                }
                Err(_) => {
                    metrics.socket_error(SocketError::Timeout);
                    tracing::warn!("decision connection timed out")
                }
                Ok(Ok(())) => {}
            }
        });
    }
}
