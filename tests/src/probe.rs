//! Traffic probes: listeners and clients in pod namespaces (the `cnimesh-probe` binary), reporting
//! which listener accepted a connection and its SO_ORIGINAL_DST.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde::{Deserialize, Serialize};

/// What a listener tells each client, which the client prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The name the listener was started with (e.g. the pod's role).
    pub name: String,
    /// The address the accepting socket was bound to.
    pub listener: String,
    pub local: String,
    pub peer: String,
    /// SO_ORIGINAL_DST, when the connection has a conntrack entry.
    pub orig_dst: Option<String>,
}

/// A listener process inside a netns; killed on drop.
pub struct Listener {
    child: Child,
}

impl Listener {
    pub fn start(probe: &Path, name: &str, netns: &Path, addrs: &[SocketAddr]) -> anyhow::Result<Self> {
        let mut cmd = Command::new(probe);
        cmd.arg("listen").arg(name).arg(netns);
        cmd.args(addrs.iter().map(ToString::to_string));
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("piped")).read_line(&mut line)?;
        if line.trim() != "ready" {
            let _ = child.kill();
            anyhow::bail!("listener {name} did not start: {line:?}");
        }
        Ok(Self { child })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects from inside `netns` (as `uid`, if given) and returns the answering listener's report.
pub fn connect(probe: &Path, netns: &Path, to: SocketAddr, uid: Option<u32>) -> anyhow::Result<Report> {
    let mut cmd = Command::new(probe);
    cmd.arg("connect").arg(netns).arg(to.to_string());
    if let Some(uid) = uid {
        cmd.arg(uid.to_string());
    }
    let out = cmd.output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        anyhow::bail!("connect to {to} failed: {}{}", stdout.trim(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(serde_json::from_str(stdout.trim())?)
}
