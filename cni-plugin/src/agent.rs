//! The plugin ↔ node agent protocol: one JSON request line, one JSON answer line, over the agent's
//! Unix socket. The agent knows the cluster (pods, annotations); the plugin stays free of kube.
//!
//! Fail closed: when a node agent is configured and cannot answer, ADD fails with code 11 (try
//! again later), so a pod that should be meshed is never started uncaptured.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::spec::RedirectSpec;

pub const DEFAULT_TIMEOUT_MS: u64 = 2000;
pub const PROTOCOL_VERSION: u32 = 1;
/// Longest request or answer line either side accepts.
pub const MAX_LINE: usize = 64 * 1024;

/// The `nodeAgent` section of the plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentConfig {
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
}

fn default_socket() -> PathBuf {
    PathBuf::from(cnimesh_common::names::AGENT_SOCKET)
}

fn default_timeout() -> u64 {
    DEFAULT_TIMEOUT_MS
}

/// What the plugin asks about a pod being set up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionRequest {
    pub version: u32,
    pub pod_namespace: String,
    pub pod_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "podUID")]
    pub pod_uid: Option<String>,
    #[serde(rename = "containerID")]
    pub container_id: String,
}

/// The agent's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "decision")]
pub enum Decision {
    /// Program these rules.
    Capture { spec: RedirectSpec },
    /// Leave the pod alone (not meshed, or opted out); `reason` is logged.
    Skip { reason: String },
    /// The agent cannot decide; `retry` says whether asking again may help (the pod is not yet
    /// known) or not (its annotations are invalid).
    Error { message: String, retry: bool },
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot reach the cnimesh node agent at {socket}: {source}")]
    Unreachable { socket: String, source: std::io::Error },
    #[error("the cnimesh node agent at {socket} did not answer properly: {detail}")]
    BadAnswer { socket: String, detail: String },
}

/// Asks the agent for a decision, bounded by the configured timeout.
pub fn ask(config: &AgentConfig, request: &DecisionRequest) -> Result<Decision, AgentError> {
    let socket = config.socket.display().to_string();
    let timeout = Some(Duration::from_millis(config.timeout_ms.max(1)));
    let unreachable = |source| AgentError::Unreachable { socket: socket.clone(), source };
    let mut stream = UnixStream::connect(&config.socket).map_err(unreachable)?;
    stream.set_read_timeout(timeout).map_err(unreachable)?;
    stream.set_write_timeout(timeout).map_err(unreachable)?;
    let mut line = serde_json::to_vec(request).expect("request serialises");
    line.push(b'\n');
    stream.write_all(&line).map_err(unreachable)?;
    let mut answer = String::new();
    // Bounded, so a broken peer cannot make the plugin buffer without end.
    BufReader::new(stream.take(MAX_LINE as u64)).read_line(&mut answer).map_err(unreachable)?;
    serde_json::from_str(answer.trim())
        .map_err(|e| AgentError::BadAnswer { socket: socket.clone(), detail: format!("{e} in {:?}", answer.trim()) })
}

/// Whether `path` looks like a live agent socket (for STATUS).
pub fn socket_present(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn wire_format_is_tagged() {
        let d = Decision::Skip { reason: "not meshed".into() };
        assert_eq!(serde_json::to_string(&d).unwrap(), r#"{"decision":"skip","reason":"not meshed"}"#);
        let e: Decision = serde_json::from_str(r#"{"decision":"error","message":"x","retry":true}"#).unwrap();
        assert_eq!(e, Decision::Error { message: "x".into(), retry: true });
    }

    #[test]
    fn asks_over_a_socket_and_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&stream).read_line(&mut line).unwrap();
            let req: DecisionRequest = serde_json::from_str(&line).unwrap();
            assert_eq!(req.pod_name, "web-0");
            (&stream).write_all(b"{\"decision\":\"capture\",\"spec\":").unwrap();
            (&stream).write_all(serde_json::to_string(&RedirectSpec::default()).unwrap().as_bytes()).unwrap();
            (&stream).write_all(b"}\n").unwrap();
            // A second client that never gets an answer.
            let (_silent, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_millis(300));
        });
        let config = AgentConfig { socket: path.clone(), timeout_ms: 100 };
        let req = DecisionRequest {
            version: PROTOCOL_VERSION,
            pod_namespace: "default".into(),
            pod_name: "web-0".into(),
            pod_uid: None,
            container_id: "c".into(),
        };
        assert_eq!(ask(&config, &req).unwrap(), Decision::Capture { spec: RedirectSpec::default() });
        assert!(matches!(ask(&config, &req), Err(AgentError::Unreachable { .. })));
        server.join().unwrap();
        let gone = AgentConfig { socket: dir.path().join("nope.sock"), timeout_ms: 100 };
        assert!(ask(&gone, &req).unwrap_err().to_string().contains("nope.sock"));
    }
}
