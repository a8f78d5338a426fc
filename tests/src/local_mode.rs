//! A local mode instance for end-to-end tests: `cnimesh-local up` with names and a subnet of its
//! own (so tests of different files and slots never collide), `down` on drop so a failed assertion
//! leaves nothing behind, and a list of what it left on the host.
//!
//! The binaries' paths come from the test crate (`CARGO_BIN_EXE_*` exist only there), through
//! [`local_bins!`](crate::local_bins).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::cni::Bins;

/// What `up` runs: `cnimesh-local` itself, the node agent, the CLI, and the mesh's binaries.
pub struct LocalBins {
    pub local: PathBuf,
    pub node: PathBuf,
    pub cli: PathBuf,
    /// `cnimesh-mirror`, which `up --clusters 2` runs.
    pub mirror: PathBuf,
    pub mesh: Bins,
}

/// The [`LocalBins`] of the calling test crate, built from the current sources.
#[macro_export]
macro_rules! local_bins {
    () => {
        $crate::local_mode::LocalBins {
            local: env!("CARGO_BIN_EXE_cnimesh-local-e2e").into(),
            node: env!("CARGO_BIN_EXE_cnimesh-node-e2e").into(),
            cli: env!("CARGO_BIN_EXE_cnimesh-cli-e2e").into(),
            mirror: env!("CARGO_BIN_EXE_cnimesh-mirror-e2e").into(),
            mesh: $crate::bins!(),
        }
    };
}

/// One local mode instance: its directory, its name prefix (netns, bridge) and its pod subnet.
pub struct LocalMode {
    pub root: PathBuf,
    pub prefix: String,
    pub subnet: String,
    bins: LocalBins,
}

impl LocalMode {
    /// `prefix` names everything `up` creates; `subnet` is its pods' network.
    pub fn new(prefix: String, subnet: String, bins: LocalBins) -> Self {
        Self { root: std::env::temp_dir().join(format!("{prefix}-root")), prefix, subnet, bins }
    }

    /// `up` with JSON output and a one-second demo load, ready for more arguments.
    pub fn up_command(&self) -> Command {
        let b = &self.bins;
        let mut cmd = Command::new(&b.local);
        cmd.args(["-o", "json", "up", "--traffic-seconds", "1"])
            .arg("--dir")
            .arg(&self.root)
            .args(["--prefix", &self.prefix, "--subnet", &self.subnet])
            .arg("--node")
            .arg(&b.node)
            .arg("--cni-plugin")
            .arg(&b.mesh.plugin)
            .arg("--proxy")
            .arg(&b.mesh.proxy)
            .arg("--control")
            .arg(&b.mesh.control)
            .arg("--mirror")
            .arg(&b.mirror)
            .arg("--cli")
            .arg(&b.cli);
        cmd
    }

    /// Runs `up` with `workloads` as its workloads file (`--workloads`); returns its output,
    /// whether it succeeded or not.
    pub fn up_with_workloads(&self, workloads: &str) -> Output {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), workloads).unwrap();
        self.up_command().arg("--workloads").arg(file.path()).output().unwrap()
    }

    /// Runs `up` and panics with its stderr when it fails.
    pub fn up(&self) -> Output {
        let out = self.up_command().output().unwrap();
        assert!(out.status.success(), "up failed: {}", String::from_utf8_lossy(&out.stderr));
        out
    }

    pub fn down(&self) -> Output {
        Command::new(&self.bins.local)
            .args(["down", "--dir"])
            .arg(&self.root)
            .args(["--prefix", &self.prefix])
            .output()
            .unwrap()
    }

    /// `kubectl --kubeconfig DIR/kubeconfig ARGS` with `input` on stdin (local mode's cluster, as
    /// its administrator); panics with kubectl's stderr when it fails, returns its stdout.
    pub fn kubectl(&self, args: &[&str], input: &str) -> String {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.root.join("kubeconfig"))
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl must be installed (scripts/setup.sh)");
        child.stdin.take().expect("piped").write_all(input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// The network namespace of the demo pod `pod`.
    pub fn netns(&self, pod: &str) -> PathBuf {
        Path::new("/run/netns").join(format!("{}-{pod}", self.prefix))
    }

    /// Everything of this instance still on the host; empty when it is gone.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left: Vec<String> = std::fs::read_dir("/var/run/netns")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(&format!("{}-", self.prefix)))
            .map(|n| format!("netns {n}"))
            .collect();
        if Path::new("/sys/class/net").join(format!("{}0", self.prefix)).exists() {
            left.push(format!("link {}0", self.prefix));
        }
        if self.root.exists() {
            left.push(format!("dir {}", self.root.display()));
        }
        let table = format!("cnimesh-local-{}-egress", self.prefix);
        let tables = std::process::Command::new("nft").args(["list", "tables"]).output().map(|o| o.stdout);
        if String::from_utf8_lossy(&tables.unwrap_or_default()).lines().any(|l| l.trim() == format!("table ip {table}"))
        {
            left.push(format!("nftables table ip {table}"));
        }
        let root = self.root.display().to_string();
        let marker = format!("CNIMESH_LOCAL_ROOT={root}");
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
            let cmdline = String::from_utf8_lossy(&std::fs::read(entry.path().join("cmdline")).unwrap_or_default())
                .replace('\0', " ");
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            let marked = environ.split(|b| *b == 0).any(|v| v == marker.as_bytes());
            if pid != std::process::id() && (cmdline.contains(&root) || marked) {
                left.push(format!("process {pid}: {cmdline}"));
            }
        }
        left
    }
}

impl Drop for LocalMode {
    fn drop(&mut self) {
        let _ = self.down();
    }
}
