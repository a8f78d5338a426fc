//! Leader election between replicas against the in-memory API server: exactly one writer at a
//! time through a forced lease expiry, renew failures, a partition of the leader and a 409
//! conflict; and (opt-in, `--run-ignored only`) failover times over 20 trials.

mod ha_mock;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cnimesh_model::metrics::Metrics;
use cnimesh_runtime::leader::{self, ElectionConfig, Leadership, WEBHOOK_WRITE};
use ha_mock::{Faults, Store};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/cnimesh/leases/cnimesh-control-webhook-write";
const WRITES: &str = "/api/v1/namespaces/cnimesh/configmaps/ha-writes";
/// Test scale: a 600 ms lease renewed every 40 ms (the fence is 400 ms: a loaded machine may
/// delay a renewal by a lot before a transient failure costs the leadership).
const LEASE_DURATION: Duration = Duration::from_millis(600);
const RENEW: Duration = Duration::from_millis(40);

struct Replica {
    identity: String,
    faults: Arc<Faults>,
    leadership: Leadership,
    metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
    elector: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
}

impl Replica {
    fn start(store: &Arc<Store>, name: &str) -> Self {
        let identity = ElectionConfig::unique_identity(name);
        let faults = Arc::new(Faults::default());
        *faults.identity.lock() = identity.clone();
        let client = store.client(faults.clone());
        let config = ElectionConfig {
            namespace: "cnimesh".into(),
            identity: identity.clone(),
            lease_duration: LEASE_DURATION,
            renew_interval: RENEW,
        };
        let metrics = Arc::new(Metrics::default());
        let (stop, stopped) = watch::channel(false);
        let (leadership, elector) = leader::spawn(client.clone(), WEBHOOK_WRITE, config, metrics.clone(), stopped);
        // The writer: a write every 2 ms while leading, checked right before it is sent.
        let writer = {
            let (leadership, identity) = (leadership.clone(), identity.clone());
            tokio::spawn(async move {
                let api: Api<ConfigMap> = Api::namespaced(client, "cnimesh");
                loop {
                    if leadership.is_leading() {
                        let patch = json!({"data": {"writer": identity}});
                        let _ = api.patch("ha-writes", &PatchParams::default(), &Patch::Merge(&patch)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        };
        Self { identity, faults, leadership, metrics, stop, elector, writer }
    }

    /// A crash: no release, the Lease runs out.
    fn kill(&self) {
        self.elector.abort();
        self.writer.abort();
    }
}

/// Samples every replica at one instant, every 500 µs: two leaders at once is a split brain.
fn monitor(leaderships: Vec<Leadership>) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let overlaps = Arc::new(AtomicUsize::new(0));
    let task = {
        let overlaps = overlaps.clone();
        tokio::spawn(async move {
            loop {
                let now = Instant::now();
                if leaderships.iter().filter(|l| l.leading_at(now)).count() > 1 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
        })
    };
    (overlaps, task)
}

fn store() -> Arc<Store> {
    let store = Store::new();
    store.insert(WRITES, json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ha-writes", "namespace": "cnimesh"}, "data": {}}));
    *store.guard.lock() = Some(LEASE.to_string());
    store
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The replica writing now, once the store has seen a write from it after `since`.
async fn writing_since(store: &Store, replicas: &[&Replica], since: Instant) -> usize {
    let mut who = None;
    wait_for("a writer", || {
        who = store
            .writes_to(WRITES)
            .iter()
            .rev()
            .find(|w| w.at > since)
            .and_then(|w| replicas.iter().position(|r| r.identity == w.by));
        who.is_some()
    })
    .await;
    who.unwrap()
}

/// Waits for a write by `identity` after `since`.
async fn written_by(store: &Store, identity: &str, since: Instant) {
    wait_for("a write by the new leader", || store.writes_to(WRITES).iter().any(|w| w.at > since && w.by == identity))
        .await;
}

fn holder(store: &Store) -> String {
    store.get(LEASE).unwrap()["spec"]["holderIdentity"].as_str().unwrap_or_default().to_string()
}

fn transitions(store: &Store) -> i64 {
    store.get(LEASE).unwrap()["spec"]["leaseTransitions"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_writer_through_expiry_renew_failures_partition_and_conflict() {
    let store = store();
    let a = Replica::start(&store, "a");
    let b = Replica::start(&store, "b");
    let (overlaps, monitor) = monitor(vec![a.leadership.clone(), b.leadership.clone()]);
    let replicas = [&a, &b];

    let first = writing_since(&store, &replicas, Instant::now()).await;
    let (leader, follower) = (replicas[first], replicas[1 - first]);
    assert_eq!(holder(&store), leader.identity);
    let metrics = leader.metrics.encode();
    assert!(metrics.contains("control_leader{role=\"webhook-write\"} 1"), "{metrics}");
    assert!(follower.metrics.encode().contains("control_leader{role=\"webhook-write\"} 0"));

    // 1. Forced expiry: the leader's Lease calls hang; its fence passes, the follower takes over.
    leader.faults.hang_leases.store(true, Ordering::SeqCst);
    let since = Instant::now();
    wait_for("the follower to lead", || follower.leadership.is_leading()).await;
    assert!(!leader.leadership.is_leading());
    written_by(&store, &follower.identity, since).await;
    // Its hung calls go through stale: the old leader stays a follower.
    leader.faults.hang_leases.store(false, Ordering::SeqCst);
    tokio::time::sleep(LEASE_DURATION).await;
    assert_eq!(holder(&store), follower.identity);
    assert!(!leader.leadership.is_leading());
    let (leader, follower) = (follower, leader);

    // 2. A renew failure or two: the fence outlasts them; the leader keeps the Lease.
    let before = transitions(&store);
    leader.faults.fail_lease_writes.store(3, Ordering::SeqCst);
    wait_for("the failures to be used", || leader.faults.fail_lease_writes.load(Ordering::SeqCst) == 0).await;
    tokio::time::sleep(LEASE_DURATION).await;
    assert_eq!(transitions(&store), before, "transient renew failures cost the leadership");
    assert!(leader.leadership.is_leading());
    // Renewals failing for good: the leader steps down, then the follower takes over.
    leader.faults.fail_lease_writes.store(usize::MAX, Ordering::SeqCst);
    let since = Instant::now();
    wait_for("the follower to lead", || follower.leadership.is_leading()).await;
    written_by(&store, &follower.identity, since).await;
    leader.faults.fail_lease_writes.store(0, Ordering::SeqCst);
    let (leader, follower) = (follower, leader);

    // 3. A partition of the leader: every call fails; it stops by its own clock.
    leader.faults.partitioned.store(true, Ordering::SeqCst);
    let since = Instant::now();
    wait_for("the follower to lead", || follower.leadership.is_leading()).await;
    assert!(!leader.leadership.is_leading());
    written_by(&store, &follower.identity, since).await;
    leader.faults.partitioned.store(false, Ordering::SeqCst);
    tokio::time::sleep(LEASE_DURATION).await;
    assert_eq!(holder(&store), follower.identity, "the healed replica took the Lease back");
    let (leader, _follower) = (follower, leader);

    // 4. A 409 on renewal: someone else wrote the Lease; the leader stops at once, not at its
    // fence: `lost()` resolves before the renewal after next.
    let conflicts = store.conflicts.load(Ordering::SeqCst);
    let mut watching = leader.leadership.clone();
    leader.faults.conflict_lease_writes.store(1, Ordering::SeqCst);
    watching.lost().await;
    assert!(store.conflicts.load(Ordering::SeqCst) > conflicts);
    // The Lease was not changed by anyone else, so the next round renews it again.
    wait_for("the leader to renew again", || leader.leadership.is_leading()).await;

    monitor.abort();
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two replicas led at the same instant");
    let violations = store.violations.lock().clone();
    assert!(violations.is_empty(), "writes by a replica not holding the Lease: {violations:#?}");
    for replica in replicas {
        replica.stop.send_replace(true);
    }
    for replica in [a, b] {
        replica.writer.abort();
        tokio::time::timeout(Duration::from_secs(5), replica.elector).await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_candidates_racing_for_a_free_lease_one_wins_by_conflict() {
    let store = store();
    let replicas: Vec<Replica> = (0..3).map(|i| Replica::start(&store, &format!("r{i}"))).collect();
    let (overlaps, monitor) = monitor(replicas.iter().map(|r| r.leadership.clone()).collect());
    let refs: Vec<&Replica> = replicas.iter().collect();
    let first = writing_since(&store, &refs, Instant::now()).await;
    // The leader crashes: the other two see the same record expire and race for it.
    replicas[first].kill();
    let since = Instant::now();
    let next = writing_since(&store, &refs, since).await;
    assert_ne!(next, first);
    tokio::time::sleep(LEASE_DURATION).await;
    monitor.abort();
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert!(store.violations.lock().is_empty());
    for replica in &replicas {
        replica.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_releases_and_the_follower_takes_over_within_a_renew_interval() {
    let store = store();
    let a = Replica::start(&store, "a");
    let b = Replica::start(&store, "b");
    let replicas = [&a, &b];
    let first = writing_since(&store, &replicas, Instant::now()).await;
    let (leader, follower) = (replicas[first], replicas[1 - first]);
    leader.stop.send_replace(true);
    wait_for("the release", || holder(&store) != leader.identity).await;
    wait_for("the follower to lead", || follower.leadership.is_leading()).await;
    assert!(!leader.leadership.is_leading());
    a.kill();
    b.kill();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

/// Failover (leader gone → new leader writing), 20 trials each for a crash and a graceful stop.
/// Prints p50/p99; asserts nothing about time. `cargo nextest run -p cnimesh-control --test
/// ha_leader --run-ignored only --no-capture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run with --run-ignored only --no-capture"]
async fn failover_times() {
    for (how, crash) in [("crash (lease runs out)", true), ("graceful stop (release)", false)] {
        let mut times = Vec::new();
        for _ in 0..20 {
            let store = store();
            let a = Replica::start(&store, "a");
            let b = Replica::start(&store, "b");
            let replicas = [&a, &b];
            let first = writing_since(&store, &replicas, Instant::now()).await;
            // Let a few renewals pass so the follower has seen the record for a while.
            tokio::time::sleep(RENEW * 3).await;
            let leader = replicas[first];
            let gone = Instant::now();
            if crash {
                leader.kill();
            } else {
                leader.stop.send_replace(true);
                leader.writer.abort();
            }
            let next = replicas[1 - first];
            written_by(&store, &next.identity, gone).await;
            let first_write = store.writes_to(WRITES).iter().find(|w| w.at > gone && w.by == next.identity).unwrap().at;
            times.push(first_write - gone);
            a.kill();
            b.kill();
        }
        times.sort();
        println!(
            "failover after a {how}: lease {LEASE_DURATION:?}, renew {RENEW:?}, 20 trials: p50 {:?}, p99 {:?}, min {:?}, max {:?}",
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            times[0],
            times[times.len() - 1]
        );
    }
}
