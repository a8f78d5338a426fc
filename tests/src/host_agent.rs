//! Host mode's harness: a "host" network namespace (a VM's or bare-metal machine's network, outside
//! any CNI chain) with a veth to a "remote" namespace, and `cnimesh-node host` running inside the
//! host namespace as its own process, as systemd would run it. The agent is stopped on drop.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use std::time::Duration;

use tempfile::TempDir;

use crate::host::{run, unique_name};
use crate::netns::Netns;
use crate::wait::eventually;

/// The host's address on its link to the remote namespace.
pub const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);
/// The remote namespace's address (another machine on the host's network).
pub const REMOTE_IP: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
/// The agent's admin listener inside the host namespace.
pub const ADMIN: &str = "127.0.0.1:4192";

/// A host namespace and a remote one, linked by a veth pair.
pub struct HostNet {
    pub host: Netns,
    pub remote: Netns,
}

impl HostNet {
    pub fn new() -> anyhow::Result<Self> {
        let host = Netns::new()?;
        let remote = Netns::new()?;
        let (a, b) = (unique_name("hv"), unique_name("hv"));
        run(
            "ip",
            &["link", "add", &a, "netns", host.name(), "type", "veth", "peer", "name", &b, "netns", remote.name()],
        )?;
        for (ns, dev, ip) in [(&host, &a, HOST_IP), (&remote, &b, REMOTE_IP)] {
            ns.exec("ip", &["link", "set", "lo", "up"])?;
            ns.exec("ip", &["addr", "add", &format!("{ip}/24"), "dev", dev])?;
            ns.exec("ip", &["link", "set", dev, "up"])?;
        }
        Ok(Self { host, remote })
    }
}

/// `cnimesh-node host` running in a namespace; SIGTERM then SIGKILL on drop.
pub struct HostAgent {
    child: Option<Child>,
    netns: PathBuf,
    pub state_dir: TempDir,
}

impl HostAgent {
    /// Starts `agent host ARGS…` inside `netns` with its state under a fresh temp dir.
    pub fn start(agent: &Path, netns: &Netns, args: &[&str]) -> anyhow::Result<Self> {
        Self::start_in(agent, netns, tempfile::Builder::new().prefix("cnimesh-host").tempdir()?, args)
    }

    /// Like [`HostAgent::start`], over a state dir the test prepared.
    pub fn start_in(agent: &Path, netns: &Netns, state_dir: TempDir, args: &[&str]) -> anyhow::Result<Self> {
        let child = Self::command(agent, netns, state_dir.path(), args).stderr(Stdio::inherit()).spawn()?;
        Ok(Self { child: Some(child), netns: netns.path(), state_dir })
    }

    /// Like [`HostAgent::start`], its log and its proxy's (stderr) written to `log`.
    pub fn start_logged(agent: &Path, netns: &Netns, args: &[&str], log: &Path) -> anyhow::Result<Self> {
        let state_dir = tempfile::Builder::new().prefix("cnimesh-host").tempdir()?;
        let file = std::fs::File::create(log)?;
        let child = Self::command(agent, netns, state_dir.path(), args).stderr(file).spawn()?;
        Ok(Self { child: Some(child), netns: netns.path(), state_dir })
    }

    /// Runs the agent to completion (for configurations it must refuse): its output. An agent
    /// still running after 20 s accepted the configuration: it is stopped and that is an error.
    pub fn run_to_exit(agent: &Path, netns: &Netns, state_dir: &Path, args: &[&str]) -> anyhow::Result<Output> {
        let mut child = Self::command(agent, netns, state_dir, args).stderr(Stdio::piped()).spawn()?;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while child.try_wait()?.is_none() {
            if std::time::Instant::now() > deadline {
                let pid = nix::unistd::Pid::from_raw(child.id() as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                let out = child.wait_with_output()?;
                anyhow::bail!("the agent accepted {args:?} and kept running: {}", String::from_utf8_lossy(&out.stderr));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(child.wait_with_output()?)
    }

    fn command(agent: &Path, netns: &Netns, state_dir: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", netns.name()])
            .arg(agent)
            .arg("--state-dir")
            .arg(state_dir)
            .arg("host")
            .args(["--ready-addr", ADMIN])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        cmd
    }

    /// `GET path` on the agent's admin listener: (status code, body); `None` if it does not answer.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        get_in(&self.netns, ADMIN.parse().expect("valid"), path)
    }

    /// `/status` as JSON.
    pub fn status(&self) -> serde_json::Value {
        let (_, body) = self.get("/status").expect("the agent answers /status");
        serde_json::from_str(&body).expect("/status is JSON")
    }

    /// Waits until `/ready` answers 200.
    pub fn wait_ready(&self) {
        eventually("the host agent is ready", Duration::from_secs(30), || {
            self.get("/ready").is_some_and(|(code, _)| code == 200)
        });
    }

    /// The agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends SIGTERM and waits for the agent to exit; its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        child.wait().expect("wait for the agent")
    }

    /// SIGKILL: the agent dies without cleaning up, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for HostAgent {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.terminate();
        }
    }
}

/// A plain HTTP/1.0 GET from inside `netns`.
pub fn get_in(netns: &Path, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    cnimesh_cni::netns::run_in(netns, || -> Option<(u16, String)> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: admin\r\n\r\n").ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).ok()?;
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Some((code, body))
    })
    .ok()
    .flatten()
}

/// Processes running as `uid` (from /proc), with their command lines.
pub fn processes_of(uid: u32) -> Vec<(u32, String)> {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let meta = std::fs::metadata(e.path()).ok()?;
            (meta.uid() == uid).then(|| {
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                (pid, String::from_utf8_lossy(&cmd).replace('\0', " "))
            })
        })
        .collect()
}
