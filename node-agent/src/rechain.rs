//! Keeping our entry chained while the primary CNI rewrites its configuration.
//!
//! Every change in the config dir triggers a (debounced) re-apply. Re-applies that *write* are
//! counted: if our entry has to be written back more than [`LOOP_LIMIT`] times within
//! [`LOOP_WINDOW`], something else (another agent, a primary CNI in exclusive mode) keeps removing
//! it. Instead of fighting forever, the agent reports the loop, marks itself unready, and stops
//! writing until the window has passed.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::chain::{self, Applied, ChainError};

pub const LOOP_LIMIT: usize = 5;
pub const LOOP_WINDOW: Duration = Duration::from_secs(60);
/// Events closer together than this are handled as one.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// Counts our writes to detect a rewrite loop.
#[derive(Debug)]
pub struct LoopGuard {
    writes: VecDeque<Instant>,
    limit: usize,
    window: Duration,
}

impl LoopGuard {
    pub fn new(limit: usize, window: Duration) -> Self {
        Self { writes: VecDeque::new(), limit, window }
    }

    fn prune(&mut self, now: Instant) {
        while self.writes.front().is_some_and(|t| now.duration_since(*t) > self.window) {
            self.writes.pop_front();
        }
    }

    /// Whether writing now would exceed the budget (a loop is in progress).
    pub fn looping(&mut self, now: Instant) -> bool {
        self.prune(now);
        self.writes.len() >= self.limit
    }

    pub fn record(&mut self, now: Instant) {
        self.writes.push_back(now);
    }
}

/// The outcome of one reconcile pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Our entry is in the file libcni uses.
    Chained(PathBuf),
    /// No primary configuration yet; the agent waits for the primary CNI.
    WaitingForPrimary,
    /// Another writer keeps removing our entry from this file.
    Loop(PathBuf),
    Failed(String),
}

pub struct Reconciler {
    dir: PathBuf,
    entry: Value,
    guard: LoopGuard,
    /// Counts our writes (`cnimesh_node_cni_config_writes_total`).
    writes: prometheus_client::metrics::counter::Counter,
}

impl Reconciler {
    pub fn new(dir: &Path, entry: Value) -> Self {
        Self {
            dir: dir.to_path_buf(),
            entry,
            guard: LoopGuard::new(LOOP_LIMIT, LOOP_WINDOW),
            writes: Default::default(),
        }
    }

    /// Counts every write of the entry in `writes` (a handle to the agent's metric).
    pub fn counting_writes(self, writes: prometheus_client::metrics::counter::Counter) -> Self {
        Self { writes, ..self }
    }

    /// When our entry was last written (restored after the primary CNI rewrote its file, or
    /// first chained): pods set up just before ran through a configuration without us.
    pub fn last_write(&self) -> Option<Instant> {
        self.guard.writes.back().copied()
    }

    /// Re-applies our entry (a no-op write-wise when nothing changed: the generated list follows
    /// its source and a changed entry is rewritten) unless a rewrite loop is in progress.
    pub fn reconcile(&mut self, now: Instant) -> State {
        if self.guard.looping(now) {
            if let Some(file) = chain::is_chained(&self.dir) {
                return State::Chained(file);
            }
            let file = chain::scan(&self.dir).ok().and_then(|s| s.primary).unwrap_or_else(|| self.dir.clone());
            return State::Loop(file);
        }
        match chain::apply(&self.dir, &self.entry) {
            Ok((applied, scan)) => {
                for (path, why) in &scan.invalid {
                    tracing::warn!(file = %path.display(), why, "ignoring invalid CNI configuration (left untouched)");
                }
                if applied.wrote() {
                    self.guard.record(now);
                    self.writes.inc();
                    match &applied {
                        Applied::Generated { file, source } => {
                            tracing::info!(file = %file.display(), source = %source.display(), "chained cnimesh-cni (generated list)")
                        }
                        other => tracing::info!(file = %other.file().display(), "chained cnimesh-cni"),
                    }
                }
                State::Chained(applied.file().to_path_buf())
            }
            Err(ChainError::NoPrimary(_)) => State::WaitingForPrimary,
            Err(e) => State::Failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FLANNEL: &str = r#"{"name":"cbr0","cniVersion":"0.3.1","plugins":[{"type":"flannel"},{"type":"portmap"}]}"#;

    #[test]
    fn guard_counts_within_the_window() {
        let mut g = LoopGuard::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(!g.looping(t0 + Duration::from_secs(i)));
            g.record(t0 + Duration::from_secs(i));
        }
        assert!(g.looping(t0 + Duration::from_secs(3)));
        assert!(!g.looping(t0 + Duration::from_secs(12)), "old writes age out");
    }

    #[test]
    fn a_write_back_is_reported_and_a_no_op_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("10-flannel.conflist");
        std::fs::write(&file, FLANNEL).unwrap();
        let mut r = Reconciler::new(dir.path(), chain::entry(&json!({})));
        assert_eq!(r.last_write(), None);
        let t0 = Instant::now();
        r.reconcile(t0);
        assert_eq!(r.last_write(), Some(t0), "first chaining");
        r.reconcile(t0 + Duration::from_secs(1));
        assert_eq!(r.last_write(), Some(t0), "nothing written while chained");
        std::fs::write(&file, FLANNEL).unwrap();
        let t2 = t0 + Duration::from_secs(2);
        r.reconcile(t2);
        assert_eq!(r.last_write(), Some(t2), "the primary CNI rewrote its file: written back");
    }

    #[test]
    fn rewrites_are_repatched_and_a_fight_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("10-flannel.conflist");
        std::fs::write(&file, FLANNEL).unwrap();
        let mut r = Reconciler::new(dir.path(), chain::entry(&json!({})));
        let t0 = Instant::now();
        assert_eq!(r.reconcile(t0), State::Chained(file.clone()));
        // Nothing to do while chained: no write is counted.
        for i in 0..20 {
            assert_eq!(r.reconcile(t0 + Duration::from_millis(i)), State::Chained(file.clone()));
        }
        // Another agent keeps restoring its own version: we re-patch a few times, then report.
        let mut states = Vec::new();
        for i in 0..10 {
            std::fs::write(&file, FLANNEL).unwrap();
            states.push(r.reconcile(t0 + Duration::from_secs(1 + i)));
        }
        let chained = states.iter().filter(|s| matches!(s, State::Chained(_))).count();
        assert_eq!(chained, LOOP_LIMIT - 1, "{states:?}");
        assert_eq!(states.last(), Some(&State::Loop(file.clone())));
        // Once the other writer stops and the window passes, we chain again.
        assert_eq!(r.reconcile(t0 + Duration::from_secs(200)), State::Chained(file.clone()));
    }

    #[test]
    fn the_generated_list_follows_its_source_and_goes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("05-cilium.conf");
        std::fs::write(&conf, r#"{"cniVersion":"0.3.1","name":"cilium","type":"cilium-cni","mtu":1500}"#).unwrap();
        let mut r = Reconciler::new(dir.path(), chain::entry(&json!({})));
        let State::Chained(generated) = r.reconcile(Instant::now()) else { panic!() };
        std::fs::write(&conf, r#"{"cniVersion":"0.3.1","name":"cilium","type":"cilium-cni","mtu":9000}"#).unwrap();
        assert_eq!(r.reconcile(Instant::now()), State::Chained(generated.clone()));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&generated).unwrap()).unwrap();
        assert_eq!(v["plugins"][0]["mtu"], 9000, "re-derived from the changed source");
        // The primary CNI removes its configuration on purpose: our copy must not outlive it.
        std::fs::remove_file(&conf).unwrap();
        assert_eq!(r.reconcile(Instant::now()), State::WaitingForPrimary);
        assert!(!generated.exists());
    }

    #[test]
    fn a_changed_entry_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("10-flannel.conflist");
        std::fs::write(&file, FLANNEL).unwrap();
        Reconciler::new(dir.path(), chain::entry(&json!({"nodeAgent": {"socket": "/old.sock"}})))
            .reconcile(Instant::now());
        Reconciler::new(dir.path(), chain::entry(&json!({"nodeAgent": {"socket": "/new.sock"}})))
            .reconcile(Instant::now());
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(v["plugins"][2]["nodeAgent"]["socket"], "/new.sock");
    }

    #[test]
    fn waits_for_a_primary() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Reconciler::new(dir.path(), chain::entry(&json!({})));
        assert_eq!(r.reconcile(Instant::now()), State::WaitingForPrimary);
        std::fs::write(dir.path().join("10-flannel.conflist"), FLANNEL).unwrap();
        assert!(matches!(r.reconcile(Instant::now()), State::Chained(_)));
    }
}
