//! The election's timing on a paused clock, at the production scale (a 30 s Lease renewed every
//! 2 s), against the in-memory API server: a follower takes a Lease only a full lease duration
//! after it last saw it change, a renewing holder keeps it however long, and a leader whose
//! renewals hang stops leading exactly when its fence (two thirds of the lease) passes. Time
//! moves only by the election's own timers, so the instants asserted are exact, not bounds.

mod ha_mock;

use std::sync::Arc;
use std::time::Duration;

use cnimesh_model::metrics::Metrics;
use cnimesh_runtime::leader::{self, DEFAULT_LEASE_DURATION, DEFAULT_RENEW_INTERVAL, ElectionConfig, Leadership};
use ha_mock::{Faults, Store};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

const ROLE: &str = leader::WEBHOOK_WRITE;
const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/cnimesh/leases/cnimesh-control-webhook-write";

struct Replica {
    identity: String,
    faults: Arc<Faults>,
    leadership: Leadership,
    _stop: watch::Sender<bool>,
}

/// A replica electing with the production defaults.
fn replica(store: &Arc<Store>) -> Replica {
    let identity = ElectionConfig::unique_identity("a");
    let faults = Arc::new(Faults::default());
    *faults.identity.lock() = identity.clone();
    let config = ElectionConfig {
        namespace: "cnimesh".into(),
        identity: identity.clone(),
        lease_duration: DEFAULT_LEASE_DURATION,
        renew_interval: DEFAULT_RENEW_INTERVAL,
    };
    let (stop, stopped) = watch::channel(false);
    let client = store.client(faults.clone());
    let (leadership, _elector) = leader::spawn(client, ROLE, config, Arc::new(Metrics::default()), stopped);
    Replica { identity, faults, leadership, _stop: stop }
}

/// The Lease as `holder` last wrote it (each write is a new resourceVersion).
fn held_by(holder: &str) -> serde_json::Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": leader::lease_name(ROLE), "namespace": "cnimesh"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 30},
    })
}

fn holder(store: &Store) -> String {
    store.get(LEASE).unwrap()["spec"]["holderIdentity"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(start_paused = true)]
async fn a_renewed_lease_is_never_taken_and_an_unrenewed_one_is_taken_a_lease_duration_after_its_last_change() {
    let store = Store::new();
    store.insert(LEASE, held_by("b"));
    let a = replica(&store);
    // `b` renews every 10 s for two minutes: `a` looks every 2 s and never takes it.
    for _ in 0..12 {
        sleep(Duration::from_secs(10)).await;
        assert!(!a.leadership.is_leading());
        store.insert(LEASE, held_by("b"));
    }
    let last_renewal = Instant::now();
    // `b` is gone. `a` first sees the last renewal at its next look, within one renew interval,
    // and takes the Lease a full lease duration after that look, not before.
    sleep(DEFAULT_LEASE_DURATION - Duration::from_millis(1)).await;
    assert!(!a.leadership.is_leading(), "taken before a lease duration had passed since it was last seen to change");
    assert_eq!(holder(&store), "b");
    sleep(DEFAULT_RENEW_INTERVAL + Duration::from_millis(2)).await;
    assert!(a.leadership.is_leading(), "not taken a lease duration and a renew interval after the last renewal");
    assert_eq!(holder(&store), a.identity);
    assert!(Instant::now() - last_renewal < DEFAULT_LEASE_DURATION + DEFAULT_RENEW_INTERVAL * 2);
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewals_hang_stops_leading_exactly_when_its_fence_passes() {
    let store = Store::new();
    let started = Instant::now();
    let a = replica(&store);
    let mut watching = a.leadership.clone();
    let lost = tokio::spawn(async move {
        watching.acquired().await;
        watching.lost().await;
        Instant::now()
    });
    // The Lease is created on the first round (at 0 s) and renewed every 2 s.
    sleep(Duration::from_secs(5)).await;
    assert!(a.leadership.is_leading());
    assert_eq!(holder(&store), a.identity);
    // From 5 s every Lease call hangs: the last renewal that went through began at 4 s.
    a.faults.hang_leases.store(true, std::sync::atomic::Ordering::SeqCst);
    let fence = started + Duration::from_secs(4) + DEFAULT_LEASE_DURATION * 2 / 3;
    sleep(fence - Instant::now() - Duration::from_millis(1)).await;
    assert!(a.leadership.is_leading(), "leads until its fence, renewals hanging or not");
    let lost_at = lost.await.unwrap();
    assert_eq!(lost_at, fence, "leadership ends when the fence passes, not when a hung call gives up");
    assert!(!a.leadership.is_leading());
}
