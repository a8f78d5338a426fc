//! `cnimesh-node host`: the node agent on a Linux host outside Kubernetes (a VM, bare metal).
//!
//! It does for the host what the CNI plugin and the DaemonSet agent do for a pod, with no kubelet
//! and no Kubernetes API: installs the capture rules of the pod ruleset in the host's own network
//! namespace (inbound TCP to the proxy's inbound port, outbound TCP to its outbound port, the
//! proxy's UID let out, the configured ports and subnets skipped), starts the proxy as its child
//! under that UID and restarts it with backoff, puts the rules back whenever they are flushed or
//! changed, and serves `/ready`, `/live`, `/status` and `/metrics` like the DaemonSet agent.
//!
//! Fail closed while running: the rules go in *before* the proxy starts and stay in while it is
//! down (crashed, restarting, not started yet), so captured connections are refused rather than
//! sent around the proxy; and if the agent itself dies (SIGKILL, crash) the rules stay too.
//! An orderly stop (SIGTERM/SIGINT: `systemctl stop`, `restart`, an upgrade) stops the proxy and
//! leaves the rules too, so no connection passes uncaptured while the agent is away; the rules
//! are removed only on purpose: `cnimesh-node host uninstall` (the host leaves the mesh) or
//! `--remove-rules-on-exit`.

pub mod capture;
pub mod files;
pub mod listeners;
pub mod proxy;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use cnimesh_cni::spec::RedirectSpec;
use http::StatusCode;
use parking_lot::Mutex;
use serde::Serialize;

use crate::health::{self, Health};
use crate::metrics::HostMetrics;
use capture::HostCapture;
use proxy::{ProxyCommand, ProxyState, Supervisor};

/// The longest an idle agent sleeps: the rules are re-checked at least this often even if an
/// nf_tables notification was lost. The DaemonSet agent's safety look, for the same reason.
const SAFETY_LOOK: Duration = Duration::from_secs(30);
/// The proxy's settings the agent provides (an environment file or `--proxy-env` overrides them).
const IDENTITY_STATE_DIR_ENV: &str = "CNIMESH_PROXY_IDENTITY_STATE_DIR";
const JOIN_TOKEN_FILE_ENV: &str = "CNIMESH_PROXY_IDENTITY_JOIN_TOKEN_FILE";
/// The user database the proxy's UID is looked up in.
const PASSWD: &str = "/etc/passwd";
/// Without change notifications (the subscription failed), the rules are checked this often.
const FALLBACK_LOOK: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The capture: proxy ports and UID, skipped ports and subnets.
    pub spec: RedirectSpec,
    pub proxy: ProxyCommand,
    /// `KEY=VALUE` lines for the proxy's environment (0600, root's); `proxy.env` overrides them.
    pub proxy_env_file: Option<PathBuf>,
    /// Created 0700 and owned by the proxy's UID at every start; the proxy's working directory
    /// and its identity state directory (`CNIMESH_PROXY_IDENTITY_STATE_DIR`).
    pub proxy_state_dir: Option<PathBuf>,
    /// The operator's join token (root's, 0600), handed to the proxy as a copy in its state
    /// directory (`CNIMESH_PROXY_IDENTITY_JOIN_TOKEN_FILE`).
    pub join_token_file: Option<PathBuf>,
    pub ready_addr: SocketAddr,
    /// Remove the rules on an orderly stop (taking the host out of the mesh); off by default.
    pub remove_rules_on_exit: bool,
}

/// The rules' side of `/status`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RulesState {
    pub table: &'static str,
    pub in_place: bool,
    /// What differed at the last check that found drift (repaired since if `in_place`).
    pub last_drift: Vec<String>,
    pub repairs: u64,
    pub error: Option<String>,
}

/// The body of `GET /status` in host mode.
#[derive(Debug, Clone, Serialize)]
pub struct HostStatus {
    pub mode: &'static str,
    pub ready: bool,
    pub pending: Vec<String>,
    pub rules: RulesState,
    pub proxy: ProxyState,
    pub spec: RedirectSpec,
}

struct Shared {
    health: Health,
    rules: Mutex<RulesState>,
    proxy: Mutex<ProxyState>,
    spec: RedirectSpec,
    metrics: HostMetrics,
}

impl Shared {
    fn update_pending(&self) {
        let mut pending = Vec::new();
        let rules = self.rules.lock().clone();
        if !rules.in_place {
            let why = rules.error.clone().unwrap_or_else(|| rules.last_drift.join("; "));
            pending.push(format!("capture rules not in place: {why}"));
        }
        let proxy = self.proxy.lock().clone();
        self.metrics.proxy_up.set(i64::from(proxy.running));
        if !proxy.running {
            pending.push(match proxy.last_exit {
                Some(exit) => format!("proxy not running (last exit: {exit}; restarting)"),
                None => "proxy not started yet".into(),
            });
        }
        self.health.set_pending(pending);
    }

    fn status(&self) -> HostStatus {
        HostStatus {
            mode: "host",
            ready: self.health.is_ready(),
            pending: self.health.pending(),
            rules: self.rules.lock().clone(),
            proxy: self.proxy.lock().clone(),
            spec: self.spec.clone(),
        }
    }
}

async fn respond(shared: Arc<Shared>, path: String) -> http::Response<http_body_util::Full<hyper::body::Bytes>> {
    match path.as_str() {
        "/live" => health::live(),
        "/ready" => health::ready(&shared.health),
        "/metrics" => health::metrics(shared.metrics.encode()),
        "/status" => health::json(&shared.status()),
        _ => health::text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// Checks the rules and puts them back on drift, recording what was found.
fn check_rules(capture: &HostCapture, shared: &Shared) {
    let result = capture.repair();
    let mut rules = shared.rules.lock();
    match result {
        Ok(drift) if drift.is_empty() => {
            rules.in_place = true;
            rules.error = None;
        }
        Ok(drift) => {
            tracing::warn!(?drift, "the capture rules were changed or flushed; reinstalled");
            shared.metrics.rule_repaired(true);
            rules.repairs += 1;
            rules.in_place = true;
            rules.error = None;
            rules.last_drift = drift;
        }
        Err(error) => {
            tracing::error!(%error, "cannot check or reinstall the capture rules");
            shared.metrics.rule_repaired(false);
            rules.in_place = false;
            rules.error = Some(error.to_string());
        }
    }
}

/// Everything that can be refused is checked before the first change to the host: a bad
/// setting or file leaves no rules and starts no proxy.
fn prepare(cfg: &HostConfig) -> anyhow::Result<ProxyCommand> {
    cfg.spec.validate().map_err(|e| anyhow::anyhow!("capture settings: {e}"))?;
    if cfg.spec.proxy_uid == 0 {
        anyhow::bail!("--proxy-uid 0: the proxy's UID is never captured, and root's traffic must be");
    }
    files::check_proxy_uid(cfg.spec.proxy_uid, std::path::Path::new(PASSWD))?;
    files::check_proxy_binary(&cfg.proxy.binary)?;
    let mut command = cfg.proxy.clone();
    // Lowest first: what the agent sets, then the env file, then `--proxy-env`.
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    if let Some(file) = &cfg.proxy_env_file {
        env.extend(files::read_env_file(file)?);
    }
    if let Some(dir) = &cfg.proxy_state_dir {
        files::prepare_state_dir(dir, command.uid, command.gid)?;
        command.dir = dir.clone();
        env.insert(0, (IDENTITY_STATE_DIR_ENV.into(), dir.into()));
        if let Some(token) = &cfg.join_token_file {
            let copy = files::install_join_token(token, dir, command.uid, command.gid)?;
            env.insert(1, (JOIN_TOKEN_FILE_ENV.into(), copy.into()));
        }
    }
    env.extend(command.env);
    command.env = env;
    Ok(command)
}

/// Runs until `shutdown` resolves, then stops the proxy; the rules stay unless
/// `remove_rules_on_exit`.
pub async fn run(cfg: HostConfig, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    let command = prepare(&cfg)?;
    let http =
        health::bind(cfg.ready_addr).await.with_context(|| format!("binding the admin endpoint {}", cfg.ready_addr))?;
    // The proxy's ports are taken before any traffic is redirected to them, and kept while the
    // proxy is down, so no local user can bind them and receive what is redirected.
    let listeners = listeners::ProxyListeners::bind(cfg.spec.inbound_proxy_port, cfg.spec.outbound_proxy_port)?;
    tracing::info!(addrs = ?listeners.addrs(), "the proxy's listeners bound; every proxy started inherits them");
    let capture = HostCapture::new(&cfg.spec);
    capture.install().context("installing the capture rules (table inet cnimesh)")?;
    tracing::info!(
        rules = capture.ruleset().rule_count(),
        uid = cfg.spec.proxy_uid,
        "capture rules installed in the host's network namespace"
    );

    let shared = Arc::new(Shared {
        health: Health::default(),
        rules: Mutex::new(RulesState { table: "inet cnimesh", in_place: true, ..Default::default() }),
        proxy: Mutex::new(ProxyState::default()),
        spec: cfg.spec.clone(),
        metrics: HostMetrics::default(),
    });
    shared.update_pending();
    let admin = tokio::spawn(health::serve_with(http, {
        let shared = shared.clone();
        move |path| respond(shared.clone(), path)
    }));

    let mut changes = match capture::watch_changes() {
        Ok(rx) => Some(rx),
        Err(error) => {
            tracing::warn!(%error, "cannot watch nf_tables changes; checking the rules every {FALLBACK_LOOK:?}");
            None
        }
    };
    let mut supervisor = Supervisor::new(command, listeners);
    let mut last_look = Instant::now();
    tokio::pin!(shutdown);
    loop {
        supervisor.start_if_due(Instant::now());
        *shared.proxy.lock() = supervisor.state.clone();
        shared.update_pending();
        let look = if changes.is_some() { SAFETY_LOOK } else { FALLBACK_LOOK };
        let mut wake = last_look + look;
        if let Some(start) = supervisor.next_start() {
            wake = wake.min(start);
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = supervisor.exited() => shared.metrics.proxy_exited(),
            changed = async {
                match changes.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                match changed {
                    Some(()) => {
                        tokio::time::sleep(capture::DEBOUNCE).await;
                        if let Some(rx) = changes.as_mut() {
                            while rx.try_recv().is_ok() {}
                        }
                    }
                    None => changes = None,
                }
                last_look = Instant::now();
                check_rules(&capture, &shared);
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                if Instant::now() >= last_look + look {
                    last_look = Instant::now();
                    check_rules(&capture, &shared);
                }
            }
        }
    }

    tracing::info!(remove_rules = cfg.remove_rules_on_exit, "shutting down: stopping the proxy");
    supervisor.stop().await;
    admin.abort();
    if cfg.remove_rules_on_exit {
        capture.remove().context("removing the capture rules")?;
        tracing::info!("capture rules removed");
    } else {
        tracing::info!(
            "capture rules left in place: captured traffic fails until the agent is back \
             (`cnimesh-node host uninstall` removes them)"
        );
    }
    Ok(())
}

/// `cnimesh-node host uninstall`: removes the capture rules from this network namespace; succeeds
/// when there are none.
pub fn uninstall() -> anyhow::Result<()> {
    capture::remove_here().context("removing the capture rules (table inet cnimesh)")
}

/// The proxy's command line from the flags: trailing arguments and `KEY=VALUE` environment.
pub fn parse_env_pair(text: &str) -> Result<(OsString, OsString), String> {
    match files::parse_env(text) {
        Ok(mut pairs) if pairs.len() == 1 => Ok(pairs.remove(0)),
        Ok(_) => Err(format!("{text:?}: expected KEY=VALUE")),
        Err((_, why)) => Err(why),
    }
}
