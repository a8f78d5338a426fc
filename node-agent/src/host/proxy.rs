//! The proxy as the agent's child: started under the proxy's UID (the one UID the capture rules
//! let out unredirected), restarted with backoff whenever it exits, stopped on shutdown.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use command_fds::CommandFdExt;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::oneshot;

use super::listeners::ProxyListeners;

/// First restart delay; doubled after each quick exit up to [`MAX_BACKOFF`].
pub const MIN_BACKOFF: Duration = Duration::from_millis(200);
/// The longest wait between restarts; a proxy that ran at least this long starts over at
/// [`MIN_BACKOFF`].
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// After SIGTERM the proxy drains (its shutdown delay and grace, 25 s by default); then SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(30);

/// How to start the proxy.
#[derive(Debug, Clone)]
pub struct ProxyCommand {
    pub binary: PathBuf,
    pub args: Vec<OsString>,
    /// Added to (or overriding) the agent's own environment, which the proxy inherits.
    pub env: Vec<(OsString, OsString)>,
    pub uid: u32,
    pub gid: u32,
    /// The proxy's working directory (its state directory, if any).
    pub dir: PathBuf,
}

/// A started proxy: its pid and the exit status its waiter thread reports.
struct Running {
    pid: u32,
    started: Instant,
    exit: oneshot::Receiver<std::io::Result<ExitStatus>>,
}

impl ProxyCommand {
    /// Starts the proxy with the agent's listeners as its fds 3.. (it adopts them, never binds).
    fn spawn(&self, now: Instant, listeners: &ProxyListeners) -> std::io::Result<Running> {
        let mut command = Command::new(&self.binary);
        command
            .fd_mappings(listeners.mappings()?)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let mut child = command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(listeners.env())
            .current_dir(&self.dir)
            // std drops the supplementary groups too when a root parent sets the UID.
            .uid(self.uid)
            .gid(self.gid)
            .stdin(Stdio::null())
            .spawn()?;
        let pid = child.id();
        let (tx, exit) = oneshot::channel();
        // One thread per proxy run, blocked in waitpid: no polling, and the child is reaped.
        std::thread::Builder::new().name("proxy-wait".into()).spawn(move || {
            let _ = tx.send(child.wait());
        })?;
        Ok(Running { pid, started: now, exit })
    }
}

/// The next restart delay after a run of `ran`, given the previous delay.
pub fn next_backoff(previous: Duration, ran: Duration) -> Duration {
    if ran >= MAX_BACKOFF { MIN_BACKOFF } else { (previous * 2).clamp(MIN_BACKOFF, MAX_BACKOFF) }
}

/// What `/status` shows of the proxy.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ProxyState {
    pub running: bool,
    pub pid: Option<u32>,
    /// Starts after the first.
    pub restarts: u64,
    pub last_exit: Option<String>,
    /// Seconds until the next start, while waiting for one.
    pub next_start_in_seconds: Option<f64>,
}

/// The running child (if any) and the restart schedule.
pub struct Supervisor {
    command: ProxyCommand,
    listeners: ProxyListeners,
    child: Option<Running>,
    backoff: Duration,
    next_start: Option<Instant>,
    pub state: ProxyState,
    started_once: bool,
}

impl Supervisor {
    pub fn new(command: ProxyCommand, listeners: ProxyListeners) -> Self {
        Self {
            command,
            listeners,
            child: None,
            backoff: Duration::ZERO,
            next_start: Some(Instant::now()),
            state: ProxyState::default(),
            started_once: false,
        }
    }

    /// When the next start is due, if the proxy is not running.
    pub fn next_start(&self) -> Option<Instant> {
        self.next_start
    }

    /// Starts the proxy if a start is due; a failed spawn is scheduled again like an exit.
    pub fn start_if_due(&mut self, now: Instant) {
        if self.child.is_some() || self.next_start.is_none_or(|at| at > now) {
            return;
        }
        self.next_start = None;
        if self.started_once {
            self.state.restarts += 1;
        }
        self.started_once = true;
        match self.command.spawn(now, &self.listeners) {
            Ok(child) => {
                self.state.pid = Some(child.pid);
                self.state.running = true;
                self.state.next_start_in_seconds = None;
                tracing::info!(pid = child.pid, binary = %self.command.binary.display(), uid = self.command.uid, "proxy started");
                self.child = Some(child);
            }
            Err(error) => {
                let why = format!("cannot start {}: {error}", self.command.binary.display());
                tracing::error!("{why}");
                self.schedule(why, Duration::ZERO, now);
            }
        }
    }

    fn schedule(&mut self, why: String, ran: Duration, now: Instant) {
        self.backoff = next_backoff(self.backoff, ran);
        self.next_start = Some(now + self.backoff);
        self.state.running = false;
        self.state.pid = None;
        self.state.last_exit = Some(why);
        self.state.next_start_in_seconds = Some(self.backoff.as_secs_f64());
    }

    /// Waits until the running proxy exits (forever when none runs), then schedules its restart.
    pub async fn exited(&mut self) {
        let Some(child) = self.child.as_mut() else { return std::future::pending().await };
        let status = (&mut child.exit).await.unwrap_or_else(|_| Err(std::io::Error::other("waiter thread ended")));
        let started = child.started;
        self.child = None;
        let now = Instant::now();
        let why = describe_exit(status);
        tracing::warn!(exit = %why, ran = ?now - started, "proxy exited; restarting with backoff");
        self.schedule(why, now - started, now);
    }

    /// SIGTERM, up to [`STOP_GRACE`] to drain, then SIGKILL. No restart follows.
    pub async fn stop(&mut self) {
        self.next_start = None;
        let Some(mut child) = self.child.take() else { return };
        let pid = Pid::from_raw(child.pid as i32);
        if let Ok(status) = child.exit.try_recv() {
            // Already exited and reaped: its pid may be another process's now.
            tracing::info!(exit = %describe_exit(status), "proxy had already stopped");
            self.state.running = false;
            self.state.pid = None;
            return;
        }
        let _ = kill(pid, Signal::SIGTERM);
        match tokio::time::timeout(STOP_GRACE, &mut child.exit).await {
            Ok(status) => {
                let status = status.unwrap_or_else(|_| Err(std::io::Error::other("waiter thread ended")));
                tracing::info!(exit = %describe_exit(status), "proxy stopped")
            }
            Err(_) => {
                tracing::warn!("proxy did not stop within {STOP_GRACE:?}; killing it");
                let _ = kill(pid, Signal::SIGKILL);
                let _ = child.exit.await;
            }
        }
        self.state.running = false;
        self.state.pid = None;
    }
}

fn describe_exit(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(e) => format!("cannot wait for it: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_exponentially_and_start_over_after_a_long_run() {
        let quick = Duration::from_millis(10);
        let mut delay = next_backoff(Duration::ZERO, quick);
        assert_eq!(delay, MIN_BACKOFF);
        delay = next_backoff(delay, quick);
        assert_eq!(delay, MIN_BACKOFF * 2);
        for _ in 0..20 {
            delay = next_backoff(delay, quick);
        }
        assert_eq!(delay, MAX_BACKOFF, "capped");
        assert_eq!(next_backoff(delay, MAX_BACKOFF), MIN_BACKOFF, "a proxy that ran long starts over");
    }
}
