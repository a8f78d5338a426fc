//! `cnimesh-node run`: the DaemonSet's main loop.
//!
//! Start-up order is chosen so that no pod can start uncaptured: the decision socket is served
//! *before* the plugin is chained (a pod set up in between gets "try again later", not a pass),
//! and the node taint `cnimesh.io/agent-not-ready:NoSchedule` is removed only once the binary is
//! installed, the entry chained, the socket up and the pod cache synced.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use cnimesh_cni::spec::RedirectSpec;
use cnimesh_cni::state::StateStore;
use notify::Watcher;
use serde_json::{Value, json};

use crate::cluster::SharedCluster;
use crate::health::{self, Health, StatusSource};
use crate::metrics::AgentMetrics;
use crate::mounts;
use crate::rechain::{DEBOUNCE, Reconciler, State};
use crate::repair::{self, RepairMode};
use crate::server::{self, Decider};
use crate::{chain, install};

pub const NOT_READY_TAINT: &str = "cnimesh.io/agent-not-ready";
/// Where runtimes (containerd, CRI-O) put pod network namespaces; the DaemonSet mounts it.
pub const DEFAULT_NETNS_DIR: &str = "/var/run/netns";
/// How soon the loop looks again while anything is pending (not ready, the node taint still on,
/// the repair window after a write). Otherwise it sleeps until the next repair pass is due: the
/// config and bin dirs' changes wake it at once, so an idle node does no periodic work between
/// repair passes (which also re-check the plugin binary and the config, in case an inotify
/// event was missed).
const TICK: Duration = Duration::from_secs(5);
/// The longest a ready, idle agent sleeps whatever the repair interval: the plugin binary and
/// the config are re-checked at least this often even when an inotify event is missed (a
/// conflist symlinked from elsewhere and rewritten there, a filesystem that sends no events).
const SAFETY_LOOK: Duration = Duration::from_secs(30);
/// After our entry was (re)written, pods set up just before went through the primary CNI's
/// configuration without us and run uncaptured (docs/architecture.md, lesson 1): for this long, repair passes
/// run at every tick instead of once per repair interval, so those pods are found in seconds.
const REPAIR_AFTER_WRITE: Duration = Duration::from_secs(30);
/// Bound on each Kubernetes API call of the run loop, so a half-open API connection cannot stop
/// re-chaining.
const API_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct RunConfig {
    /// This node's name, as reported by `/status`.
    pub node_name: Option<String>,
    pub cni_bin_dir: PathBuf,
    pub cni_conf_dir: PathBuf,
    pub plugin_binary: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    /// The pod netns directory, whose mount propagation the agent checks (docs/architecture.md, lesson 17).
    pub netns_dir: PathBuf,
    pub ready_addr: SocketAddr,
    pub repair: RepairMode,
    pub repair_interval: Duration,
    /// Remove the plugin on exit. Off by default: an agent restart (rollout, eviction) then
    /// leaves the plugin chained, and pods set up meanwhile fail closed (code 11, retried) rather
    /// than start uncaptured. Set it for a final removal of the mesh from the node.
    pub uninstall_on_exit: bool,
    pub excluded_namespaces: Vec<String>,
    pub defaults: RedirectSpec,
}

impl RunConfig {
    /// The plugin object chained into the primary configuration.
    pub fn plugin_entry(&self) -> Value {
        chain::entry(&json!({
            "stateDir": self.state_dir,
            "excludeNamespaces": self.excluded_namespaces,
            "nodeAgent": {"socket": self.socket},
        }))
    }
}

/// Installs the binary and chains the entry once (`cnimesh-node install`).
pub fn install_once(cfg: &RunConfig) -> anyhow::Result<PathBuf> {
    install::install_binary(&cfg.plugin_binary, &cfg.cni_bin_dir)
        .with_context(|| format!("installing {} into {}", cfg.plugin_binary.display(), cfg.cni_bin_dir.display()))?;
    let (applied, _) = chain::apply(&cfg.cni_conf_dir, &cfg.plugin_entry())?;
    Ok(applied.file().to_path_buf())
}

/// Unchains the entry, then removes the binary (`cnimesh-node uninstall`). In that order, so no
/// configuration ever names a plugin that is not there.
pub fn uninstall(cfg: &RunConfig) -> anyhow::Result<Vec<PathBuf>> {
    let changed = chain::remove(&cfg.cni_conf_dir)?;
    install::remove_binary(&cfg.cni_bin_dir)
        .with_context(|| format!("removing the plugin from {}", cfg.cni_bin_dir.display()))?;
    Ok(changed)
}

fn describe(state: &State, dir: &std::path::Path) -> Option<String> {
    match state {
        State::Chained(_) => None,
        State::WaitingForPrimary => {
            Some(format!("waiting for the primary CNI to write its configuration in {}", dir.display()))
        }
        State::Loop(file) => Some(format!(
            "rewrite loop on {}: another writer keeps removing cnimesh-cni; not fighting it (check for a second agent or an exclusive primary CNI)",
            file.display()
        )),
        State::Failed(e) => Some(e.clone()),
    }
}

/// An explicit exclusion list replaces the default: say so when it would make the mesh's own
/// pods wait on this agent.
fn warn_unexcluded(excluded: &[String]) {
    let missing: Vec<&str> = cnimesh_common::names::DEFAULT_EXCLUDED_NAMESPACES
        .iter()
        .copied()
        .filter(|ns| !excluded.iter().any(|e| e == ns))
        .collect();
    if !missing.is_empty() {
        tracing::warn!(
            missing = ?missing,
            "namespaces excluded by default are not in --exclude-namespaces: their pods fail to start while this agent is down"
        );
    }
}

/// Runs until `shutdown` resolves; removes the plugin then only with `uninstall_on_exit`.
pub async fn run(
    cfg: RunConfig,
    cluster: SharedCluster,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let health = Arc::new(Health::default());
    health.set_pending(vec!["starting".into()]);
    // Not a readiness condition: decisions do not need the netns dir, and a node kept tainted
    // for a host setting would stop every pod. Logged, and shown by /ready and /status.
    if mounts::propagation(&cfg.netns_dir).is_private() {
        let message = mounts::private_message(&cfg.netns_dir);
        tracing::error!(path = %cfg.netns_dir.display(), "{message}");
        health.set_warnings(vec![message]);
    }
    warn_unexcluded(&cfg.excluded_namespaces);
    let metrics = Arc::new(AgentMetrics::default());
    let http = health::bind(cfg.ready_addr)
        .await
        .with_context(|| format!("binding the health endpoint {}", cfg.ready_addr))?;
    let source = Arc::new(StatusSource {
        node: cfg.node_name.clone(),
        cni_bin_dir: cfg.cni_bin_dir.clone(),
        cni_conf_dir: cfg.cni_conf_dir.clone(),
        socket: cfg.socket.clone(),
        state_dir: cfg.state_dir.clone(),
        netns_dir: cfg.netns_dir.clone(),
        cluster: cluster.clone(),
        metrics: metrics.clone(),
    });
    let health_task = tokio::spawn(health::serve(http, health.clone(), source));

    let listener =
        server::bind(&cfg.socket).with_context(|| format!("binding the decision socket {}", cfg.socket.display()))?;
    let decider = Arc::new(Decider { cluster: cluster.clone(), defaults: cfg.defaults.clone() });
    let server_task = tokio::spawn(server::serve(listener, decider, metrics.clone()));
    tracing::info!(socket = %cfg.socket.display(), "serving decisions");

    install::install_binary(&cfg.plugin_binary, &cfg.cni_bin_dir)
        .with_context(|| format!("installing {} into {}", cfg.plugin_binary.display(), cfg.cni_bin_dir.display()))?;

    std::fs::create_dir_all(&cfg.cni_conf_dir)?;
    let (tx, mut changes) = tokio::sync::mpsc::unbounded_channel();
    // Changes only: a reconcile opens and reads the files, and reacting to those accesses
    // would re-run it forever (a busy loop of reads on an idle node). The bin dir too, so a
    // plugin binary deleted or replaced on the host is put back at once, not at the next pass.
    // An error from the watch (an overflowed queue) counts as a change: look again.
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.as_ref().map_or(true, |e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    })?;
    watcher.watch(&cfg.cni_conf_dir, notify::RecursiveMode::NonRecursive)?;
    // The bin dir's watch is a speed-up, not a requirement (watches exhausted, a filesystem
    // without inotify): without it the loop looks every tick, as it did before the watch.
    let bin_watched = match watcher.watch(&cfg.cni_bin_dir, notify::RecursiveMode::NonRecursive) {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(dir = %cfg.cni_bin_dir.display(), %error, "cannot watch the CNI bin dir; checking it every {TICK:?}");
            false
        }
    };

    let mut reconciler =
        Reconciler::new(&cfg.cni_conf_dir, cfg.plugin_entry()).counting_writes(metrics.cni_config_writes.clone());
    // The first pass runs at once.
    let mut wait = Duration::ZERO;
    let mut taint_removed = false;
    let mut last_repair: Option<Instant> = None;
    let mut last_write: Option<Instant> = None;
    let mut repair_until: Option<Instant> = None;
    let store = StateStore::new(&cfg.state_dir);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(()) = changes.recv() => {
                tokio::time::sleep(DEBOUNCE).await;
                while changes.try_recv().is_ok() {}
            }
            _ = tokio::time::sleep(wait) => {}
        }
        let state = reconciler.reconcile(Instant::now());
        if reconciler.last_write() != last_write {
            last_write = reconciler.last_write();
            repair_until = last_write.map(|t| t + REPAIR_AFTER_WRITE);
        }
        let mut pending: Vec<String> = describe(&state, &cfg.cni_conf_dir).into_iter().collect();
        // The binary may have been deleted or replaced on the host: put ours back.
        match install::install_binary(&cfg.plugin_binary, &cfg.cni_bin_dir) {
            Ok(true) => {
                tracing::warn!(dir = %cfg.cni_bin_dir.display(), "cnimesh-cni binary was missing or different; reinstalled")
            }
            Ok(false) => {}
            Err(e) => pending.push(format!("cannot install the plugin binary into {}: {e}", cfg.cni_bin_dir.display())),
        }
        if !cluster.ready() {
            pending.push("pod cache not synced yet".into());
        }
        if let Some(p) = pending.iter().find(|p| p.starts_with("rewrite loop")) {
            tracing::error!("{p}");
        }
        health.set_pending(pending);
        if !health.is_ready() {
            wait = TICK;
            continue;
        }
        if !taint_removed {
            match tokio::time::timeout(API_TIMEOUT, cluster.remove_node_taint(NOT_READY_TAINT))
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out after {API_TIMEOUT:?}")))
            {
                Ok(removed) => {
                    taint_removed = true;
                    if removed {
                        tracing::info!(taint = NOT_READY_TAINT, "node taint removed");
                    }
                }
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "could not remove the node taint; retrying"),
            }
        }
        let due = last_repair.is_none_or(|t| t.elapsed() >= cfg.repair_interval)
            || repair_until.is_some_and(|until| Instant::now() < until);
        if cfg.repair != RepairMode::Off && due {
            last_repair = Some(Instant::now());
            if tokio::time::timeout(API_TIMEOUT * 3, repair_pass(&cfg, &cluster, &store, &metrics)).await.is_err() {
                tracing::warn!("repair pass timed out; will retry");
            }
        }
        let now = Instant::now();
        let busy = !taint_removed || !bin_watched || repair_until.is_some_and(|until| now < until);
        // With repair off, the interval still paces the safety re-check from now.
        let last = if cfg.repair == RepairMode::Off { Some(now) } else { last_repair };
        wait = next_look(busy, last, cfg.repair_interval, now);
    }

    tracing::info!(uninstall = cfg.uninstall_on_exit, "shutting down");
    drop(watcher);
    server_task.abort();
    health_task.abort();
    let _ = std::fs::remove_file(&cfg.socket);
    if cfg.uninstall_on_exit {
        let changed = uninstall(&cfg)?;
        tracing::info!(files = ?changed, "removed cnimesh-cni from the CNI configuration and bin dir");
    }
    Ok(())
}

/// How long a ready agent sleeps unless a change wakes it: [`TICK`] while `busy`, else until the
/// next repair pass is due (`repair_interval` after the last, which also re-checks the binary
/// and the config with repair off), and never longer than [`SAFETY_LOOK`].
fn next_look(busy: bool, last_repair: Option<Instant>, repair_interval: Duration, now: Instant) -> Duration {
    if busy {
        return TICK;
    }
    let due = last_repair.map_or(now, |t| t + repair_interval);
    due.saturating_duration_since(now).clamp(TICK, SAFETY_LOOK)
}

async fn repair_pass(cfg: &RunConfig, cluster: &SharedCluster, store: &StateStore, metrics: &AgentMetrics) {
    let pods = match cluster.node_pods().await {
        Ok(p) => p,
        Err(e) => return tracing::warn!(error = %format!("{e:#}"), "repair: cannot list pods"),
    };
    let records: Vec<_> = match store.list() {
        Ok(list) => list.into_iter().filter_map(|(_, r)| r.ok()).collect(),
        Err(e) => return tracing::warn!(error = %e, "repair: cannot read state records"),
    };
    let targets = repair::uncaptured(&pods, &records, &cfg.excluded_namespaces);
    if !targets.is_empty() {
        for (_, result) in repair::repair(cluster.as_ref(), cfg.repair, &targets).await {
            metrics.repaired(result.is_ok());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_agent_sleeps_until_its_next_repair_pass_and_ticks_only_while_busy() {
        let now = Instant::now();
        let minute = Duration::from_secs(60);
        let twenty = Duration::from_secs(20);
        assert_eq!(next_look(false, Some(now), twenty, now), twenty, "idle: until the next pass");
        let earlier = now - Duration::from_secs(10);
        assert_eq!(next_look(false, Some(earlier), twenty, now), Duration::from_secs(10));
        assert_eq!(next_look(false, Some(now), minute, now), SAFETY_LOOK, "idle: a safety look at most");
        assert_eq!(next_look(true, Some(now), minute, now), TICK, "busy: every tick");
        assert_eq!(next_look(false, None, minute, now), TICK, "a pass due now: at the next tick");
        let overdue = now - Duration::from_secs(600);
        assert_eq!(next_look(false, Some(overdue), minute, now), TICK, "never a busy loop when overdue");
    }
}
