//! A `cnimesh-proxy` running in a pod namespace as the proxy UID, as the injected sidecar would.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::Netns;

pub const PROXY_UID: u32 = 2102;

pub struct Sidecar {
    child: Child,
    netns: std::path::PathBuf,
}

/// An HTTP/1.1 response as received.
#[derive(Debug, Default)]
pub struct Reply {
    pub status: u16,
    /// The status line and headers, as sent.
    pub head: String,
    pub body: String,
}

impl Reply {
    /// The value of header `name` (case-insensitive), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// One HTTP/1.1 request over a fresh connection inside `netns`; returns the whole response.
pub fn http_reply_in(netns: &Path, addr: &str, method: &str, path: &str, body: &str) -> anyhow::Result<Reply> {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    raw_reply_in(netns, addr, request)
}

/// Writes `request` as it is over a fresh connection to `addr` inside `netns`, and reads the
/// whole response (the request must ask the server to close).
pub fn raw_reply_in(netns: &Path, addr: &str, request: String) -> anyhow::Result<Reply> {
    let addr = addr.to_string();
    cnimesh_cni::netns::run_in(netns, move || {
        let mut s = TcpStream::connect(&addr)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(request.as_bytes())?;
        let mut response = String::new();
        s.read_to_string(&mut response)?;
        let status = response.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        anyhow::Ok(Reply { status, head: head.to_string(), body: body.to_string() })
    })?
}

/// A gRPC call's answer: HTTP status, response headers and trailers.
pub type GrpcReply = (u16, http::HeaderMap, http::HeaderMap);

/// One gRPC call (HTTP/2 with prior knowledge, `application/grpc`, one empty message) to `path`
/// (`/package.Service/Method`) over a fresh connection inside `netns`.
pub fn grpc_in(netns: &Path, addr: &str, path: &str) -> anyhow::Result<GrpcReply> {
    grpc_with_headers_in(netns, addr, path, &[])
}

/// [`grpc_in`] with extra request `headers` (e.g. trace context).
pub fn grpc_with_headers_in(
    netns: &Path,
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<GrpcReply> {
    let (addr, uri) = (addr.to_string(), format!("http://{addr}{path}"));
    let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    cnimesh_cni::netns::run_in(netns, move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async {
            let tcp = tokio::net::TcpStream::connect(&addr).await?;
            let (mut sender, conn) = hyper::client::conn::http2::handshake(
                hyper_util::rt::TokioExecutor::new(),
                hyper_util::rt::TokioIo::new(tcp),
            )
            .await?;
            tokio::spawn(conn);
            let mut req = http::Request::post(uri)
                .version(http::Version::HTTP_2)
                .header("content-type", "application/grpc")
                .header("te", "trailers");
            for (k, v) in &headers {
                req = req.header(k.as_str(), v.as_str());
            }
            let req = req.body(http_body_util::Full::new(bytes::Bytes::from_static(&[0, 0, 0, 0, 0])))?;
            let call = async {
                let response = sender.send_request(req).await?;
                let (parts, body) = response.into_parts();
                let collected = http_body_util::BodyExt::collect(body).await?;
                let trailers = collected.trailers().cloned().unwrap_or_default();
                anyhow::Ok((parts.status.as_u16(), parts.headers, trailers))
            };
            tokio::time::timeout(Duration::from_secs(10), call).await?
        })
    })?
}

/// One HTTP/1.1 request over a fresh connection inside `netns`; returns (status, body).
pub fn http_in(netns: &Path, addr: &str, method: &str, path: &str, body: &str) -> anyhow::Result<(u16, String)> {
    http_reply_in(netns, addr, method, path, body).map(|r| (r.status, r.body))
}

impl Sidecar {
    /// Starts the proxy in `netns` as UID/GID 2102 with extra `CNIMESH_PROXY_*` settings, and
    /// waits (bounded) until its `/ready` answers 200.
    pub fn start(proxy: &Path, netns: &Netns, env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let sidecar = Self::spawn(proxy, netns, env)?;
        sidecar.wait_ready()?;
        Ok(sidecar)
    }

    /// Like [`Sidecar::start`], with the proxy's open-file limit (soft and hard) set to
    /// `open_files` (util-linux `prlimit`), as a pod's runtime would set it.
    pub fn start_with_open_files(
        proxy: &Path,
        netns: &Netns,
        env: &[(&str, &str)],
        open_files: u64,
    ) -> anyhow::Result<Self> {
        let limit = format!("--nofile={open_files}:{open_files}");
        let sidecar = Self::spawn_wrapped(proxy, netns, env, &["prlimit", &limit, "--"])?;
        sidecar.wait_ready()?;
        Ok(sidecar)
    }

    /// Like [`Sidecar::start`], through `wrapper` (a command that runs its arguments, e.g.
    /// valgrind or prlimit), waiting up to `ready_within` for `/ready` (an instrumented proxy
    /// starts slower).
    pub fn start_wrapped(
        proxy: &Path,
        netns: &Netns,
        env: &[(&str, &str)],
        wrapper: &[&str],
        ready_within: Duration,
    ) -> anyhow::Result<Self> {
        let sidecar = Self::spawn_wrapped(proxy, netns, env, wrapper)?;
        sidecar.wait_ready_within(ready_within)?;
        Ok(sidecar)
    }

    /// Starts the proxy without waiting for it to be ready.
    pub fn spawn(proxy: &Path, netns: &Netns, env: &[(&str, &str)]) -> anyhow::Result<Self> {
        Self::spawn_wrapped(proxy, netns, env, &[])
    }

    /// Starts the proxy through `wrapper` (a command that execs its arguments), so the pid is
    /// still the proxy's.
    fn spawn_wrapped(proxy: &Path, netns: &Netns, env: &[(&str, &str)], wrapper: &[&str]) -> anyhow::Result<Self> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", netns.name(), "setpriv", "--reuid=2102", "--regid=2102", "--clear-groups"])
            .args(wrapper)
            .arg(proxy)
            .env("CNIMESH_PROXY_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = cmd.spawn()?;
        Ok(Self { child, netns: netns.path() })
    }

    /// Waits (bounded) until `/ready` answers 200.
    pub fn wait_ready(&self) -> anyhow::Result<()> {
        self.wait_ready_within(Duration::from_secs(20))
    }

    /// Waits until `/ready` answers 200, at most `within`.
    pub fn wait_ready_within(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if matches!(self.admin("GET", "/ready", ""), Ok((200, _))) {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "proxy in {} did not become ready", self.netns.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The value of one unlabelled or labelled sample in `/metrics`, summed over matching lines.
    pub fn metric(&self, prefix: &str) -> f64 {
        metric_sum(&self.metrics(), prefix)
    }

    /// What this proxy counted of its control plane's `stream` (`inbound_policy`,
    /// `outbound_policy`, `endpoints`, `profile`): `"messages"` received or `"failures"`
    /// (`control_stream_{counted}_total`).
    pub fn streamed(&self, counted: &str, stream: &str) -> f64 {
        metric_with(&self.metrics(), &format!("control_stream_{counted}_total"), &[&format!("stream=\"{stream}\"")])
    }

    /// Waits until every bucket of the rate limit on inbound `port` has refilled (its
    /// `/policy.json` says `full`), so a measured run starts with the whole burst. Refilling takes
    /// about a second after the last request; the patience is generous as the other waits'.
    pub fn wait_rate_limit_full(&self, port: u16) {
        crate::wait::eventually(&format!("port {port}'s rate limit refilled"), Duration::from_secs(30), || {
            let Ok((200, body)) = self.admin("GET", "/policy.json", "") else { return false };
            let page: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            page["ports"].as_array().into_iter().flatten().any(|p| p["port"] == port && p["rate_limit"]["full"] == true)
        });
    }

    /// Waits until this proxy's `stream` has counted more `counted` than `since` (a value of
    /// [`Self::streamed`] read before the change): the change has reached the proxy (messages),
    /// or the proxy has noticed its control plane gone (failures). What a test waits on instead
    /// of a sleep for things to settle.
    pub fn wait_streamed(&self, counted: &str, stream: &str, since: f64) {
        crate::wait::eventually(&format!("{stream} {counted} counted past {since}"), Duration::from_secs(30), || {
            self.streamed(counted, stream) > since
        });
    }

    /// A request to the admin server over loopback inside the pod.
    pub fn admin(&self, method: &str, path: &str, body: &str) -> anyhow::Result<(u16, String)> {
        http_in(&self.netns, "127.0.0.1:4191", method, path, body)
    }

    pub fn metrics(&self) -> String {
        self.admin("GET", "/metrics", "").map(|(_, b)| b).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Descriptors the proxy holds open now.
    pub fn open_fds(&self) -> usize {
        crate::bench::open_fds(self.child.id())
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it exited cleanly.
    pub fn terminate(&mut self) -> bool {
        self.sigterm();
        self.child.wait().is_ok_and(|s| s.success())
    }

    /// Sends SIGTERM without waiting, as the kubelet does when the pod starts terminating.
    pub fn sigterm(&self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }

    pub fn wait(&mut self) -> bool {
        self.child.wait().is_ok_and(|s| s.success())
    }

    /// SIGKILL, and waits for the process to be gone (its listeners closed).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sums the samples of a Prometheus text exposition whose line starts with `prefix`.
pub fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// Sums the samples of metric `name` whose labels include every one of `labels` (each written
/// `key="value"`), whatever its other labels.
pub fn metric_with(text: &str, name: &str, labels: &[&str]) -> f64 {
    let prefix = format!("{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix) && labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
