//! `cnimesh-node run` as its own process, as the DaemonSet runs it: pods from the cluster's API
//! server ([`Cluster`], served on the host's loopback, as the agent runs in the host's network
//! namespace), its CNI dirs, state dir and socket on temp paths. It can be killed with SIGKILL
//! and started again over the same directories and the same cluster.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::cluster::Cluster;
use crate::cni::{Bins, Network};

pub const NODE: &str = "node-1";

pub struct Agent {
    binary: PathBuf,
    plugin: PathBuf,
    dir: TempDir,
    state_dir: PathBuf,
    ready_port: u16,
    repair: &'static str,
    child: Option<Child>,
    /// The cluster whose pods the agent watches (and repair deletes or labels).
    pub cluster: Cluster,
}

/// A pod of this node as the API server would list it; `meshed` adds the proxy container.
pub fn kube_pod(namespace: &str, name: &str, meshed: bool) -> Value {
    let mut containers = vec![json!({"name": "app"})];
    if meshed {
        containers.push(json!({"name": "cnimesh-proxy"}));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "uid": format!("uid-{name}")},
        "spec": {"nodeName": NODE, "containers": containers},
        "status": {"phase": "Running"}
    })
}

/// A free TCP port on loopback (for the agent's health endpoint).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

impl Agent {
    /// An agent on temp dirs, not started yet (see [`Agent::start`]): the plugin's records go to
    /// [`Agent::state_dir`], and the primary CNI's configuration must be written first
    /// ([`Agent::write_primary`]). `repair` is `delete`, `label` or `off`.
    pub fn new(binary: &Path, plugin: &Path, repair: &'static str) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("cnimesh-agent").tempdir()?;
        std::fs::create_dir_all(dir.path().join("net.d"))?;
        Ok(Self {
            binary: binary.into(),
            plugin: plugin.into(),
            state_dir: dir.path().join("state"),
            dir,
            ready_port: free_port(),
            repair,
            child: None,
            cluster: Cluster::serve_on_host()?,
        })
    }

    /// A bridge network whose chained plugin asks this agent and keeps its records where the
    /// agent reads them; its primary plugin list becomes the primary CNI's file in the conf dir.
    pub fn network(&self, bins: &Bins) -> anyhow::Result<Network> {
        let net = Network::bridge(
            bins,
            json!({"stateDir": self.state_dir, "nodeAgent": {"socket": self.socket(), "timeoutMs": 2000}}),
        )?;
        self.write_primary(&net.primary_conflist())?;
        Ok(net)
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("node.sock")
    }

    pub fn conf_dir(&self) -> PathBuf {
        self.dir.path().join("net.d")
    }

    /// The primary CNI's file in the conf dir.
    pub fn primary_file(&self) -> PathBuf {
        self.conf_dir().join("10-bridge.conflist")
    }

    /// Writes the primary CNI's configuration as the primary CNI does (atomically, replacing).
    pub fn write_primary(&self, conflist: &Value) -> anyhow::Result<()> {
        cnimesh_common::fs::write_atomic(&self.primary_file(), conflist.to_string().as_bytes(), None)?;
        Ok(())
    }

    /// Puts a pod into the cluster, for the agent's watch to see.
    pub fn add_pod(&self, pod: &Value) -> anyhow::Result<()> {
        self.cluster.api.put(pod.clone());
        Ok(())
    }

    /// Whether the pod's object still exists (repair deletes uncaptured meshed pods).
    pub fn has_pod(&self, namespace: &str, name: &str) -> bool {
        self.cluster.api.get("v1", "Pod", namespace, name).is_some()
    }

    /// Starts the agent and waits (bounded) until it answers `/ready` with 200.
    pub fn start(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "the agent is already running");
        let d = self.dir.path();
        let child = Command::new(&self.binary)
            .arg("run")
            .arg("--cni-bin-dir")
            .arg(d.join("bin"))
            .arg("--cni-conf-dir")
            .arg(d.join("net.d"))
            .arg("--socket")
            .arg(self.socket())
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--plugin-binary")
            .arg(&self.plugin)
            .args(["--node-name", NODE, "--ready-addr", &format!("127.0.0.1:{}", self.ready_port)])
            .args(["--repair", self.repair])
            .env("KUBECONFIG", self.cluster.kubeconfig())
            .env("CNIMESH_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.ready() {
            anyhow::ensure!(Instant::now() < deadline, "the node agent did not become ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Whether `/ready` answers 200.
    pub fn ready(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.ready_port)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.write_all(b"GET /ready HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n");
        let mut response = String::new();
        let _ = s.read_to_string(&mut response);
        response.starts_with("HTTP/1.1 200")
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`): an agent too busy to react for a while.
    pub fn freeze(&self, frozen: bool) {
        use nix::sys::signal::{Signal, kill};
        if let Some(child) = &self.child {
            let signal = if frozen { Signal::SIGSTOP } else { Signal::SIGCONT };
            let _ = kill(nix::unistd::Pid::from_raw(child.id() as i32), signal);
        }
    }

    /// SIGKILL: no shutdown path runs (the socket file stays, nothing is unchained).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}
