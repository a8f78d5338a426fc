//! The cache of resolved targets: a target (an original destination, or a service a request
//! names) is resolved once — profile, route, balancer, per-endpoint clients — and then shared by
//! every connection and request to it, until it has been idle a while. Looked up once per
//! connection; requests reach their clients through the target they hold. A full cache makes
//! room one entry at a time, the least recently used first (one no connection holds before one
//! that is held), so its hot targets stay resolved; clearing it all at once would make every
//! connection re-resolve together.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;
use tower::retry::budget::TpsBudget;

use crate::client::discovery::Profile;
use crate::client::target::Route;
use crate::transport::labels::{TargetCluster, TlsLabel};

/// A resolved target.
pub struct Target {
    pub route: Route,
    pub tls: TlsLabel,
    /// The linked cluster its endpoints are in (a mirror), for metric labels.
    pub cluster: TargetCluster,
    /// What a side attaches to its targets, opaque to the clients: the outbound side's policy
    /// watch ([`crate::outbound::policy_of`]).
    pub extensions: http::Extensions,
    /// Bounds the retries of every request to it (made on first use: only routes retry).
    retry_budget: std::sync::OnceLock<TpsBudget>,
}

impl Target {
    pub fn new(route: Route) -> Arc<Self> {
        Self::with_extensions(route, http::Extensions::new())
    }

    pub fn with_extensions(route: Route, extensions: http::Extensions) -> Arc<Self> {
        let tls = route.tls_label();
        let cluster = TargetCluster(route.target_cluster());
        Arc::new(Self { route, tls, cluster, extensions, retry_budget: std::sync::OnceLock::new() })
    }

    /// Linkerd's default budget: retries may add 20 % to the requests, plus 10 per second, as
    /// counted over the last 10 s; so retries never multiply an outage.
    pub fn retry_budget(&self) -> &TpsBudget {
        self.retry_budget.get_or_init(|| TpsBudget::new(Duration::from_secs(10), 10, 0.2))
    }
}

struct Entry {
    target: Arc<Target>,
    used: Instant,
    /// The profile the target was resolved from: a new answer means resolving again.
    profile: Option<watch::Receiver<Option<Profile>>>,
}

/// Targets kept; beyond, the least recently used makes room (its idle connections then close).
const MAX_TARGETS: usize = 4096;

pub struct Targets<K> {
    map: Mutex<HashMap<K, Entry>>,
    capacity: usize,
}

impl<K> Default for Targets<K> {
    fn default() -> Self {
        Self::with_capacity(MAX_TARGETS)
    }
}

impl<K> Targets<K> {
    fn with_capacity(capacity: usize) -> Self {
        Self { map: Mutex::default(), capacity }
    }
}

impl<K: Hash + Eq + Clone> Targets<K> {
    /// The cached target for `key`, if its profile has not changed since.
    pub fn get(&self, key: &K) -> Option<Arc<Target>> {
        let mut map = self.map.lock();
        let entry = map.get_mut(key)?;
        if entry.profile.as_ref().is_some_and(|p| p.has_changed().unwrap_or(true)) {
            map.remove(key);
            return None;
        }
        entry.used = Instant::now();
        Some(entry.target.clone())
    }

    pub fn insert(&self, key: K, target: Arc<Target>, profile: Option<watch::Receiver<Option<Profile>>>) {
        let mut map = self.map.lock();
        if map.len() >= self.capacity && !map.contains_key(&key) {
            // One scan of a full cache per new target: cheap beside the resolution that
            // follows, and no second structure to keep in step with the map.
            let coldest =
                map.iter().min_by_key(|(_, e)| (Arc::strong_count(&e.target) > 1, e.used)).map(|(k, _)| k.clone());
            if let Some(coldest) = coldest {
                map.remove(&coldest);
            }
        }
        map.insert(key, Entry { target, used: Instant::now(), profile });
    }

    /// Drops targets no connection holds and none has asked for within `idle`: their pooled
    /// connections close, their discovery streams end.
    pub fn evict_idle(&self, idle: Duration) {
        self.map.lock().retain(|_, e| Arc::strong_count(&e.target) > 1 || e.used.elapsed() < idle);
    }

    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn targets_are_shared_until_idle_or_their_profile_changes() {
        let targets = Targets::<u16>::default();
        let route = || Route::fixed("127.0.0.1:1".parse().unwrap(), None, Duration::from_secs(1));
        let (tx, rx) = watch::channel(None);
        targets.insert(1, Target::new(route()), Some(rx));
        targets.insert(2, Target::new(route()), None);
        let held = targets.get(&1).expect("cached");
        assert!(Arc::ptr_eq(&held, &targets.get(&1).unwrap()), "one target for every connection");
        targets.evict_idle(Duration::ZERO);
        assert_eq!(targets.len(), 1, "the held target stays, the idle one goes");
        tx.send(Some(Profile::default())).unwrap();
        assert!(targets.get(&1).is_none(), "a new profile resolves again");
        assert!(targets.is_empty());
    }

    #[tokio::test]
    async fn a_full_cache_makes_room_one_entry_at_a_time_and_keeps_its_hot_targets() {
        let targets = Targets::<u16>::with_capacity(3);
        let route = || Route::fixed("127.0.0.1:1".parse().unwrap(), None, Duration::from_secs(1));
        for key in 1..=3 {
            targets.insert(key, Target::new(route()), None);
        }
        // 1 is asked for again (hot); 2 is held by a connection; 3 is the coldest.
        assert!(targets.get(&1).is_some());
        let held = targets.get(&2).unwrap();
        targets.get(&1).unwrap();
        targets.insert(4, Target::new(route()), None);
        assert_eq!(targets.len(), 3, "one entry made room, not the whole cache");
        assert!(targets.get(&3).is_none(), "the least recently used one went");
        // 1 stays hot: the next to go is 4, not yet asked for again.
        targets.get(&1).unwrap();
        targets.insert(5, Target::new(route()), None);
        assert!(targets.get(&4).is_none());
        assert!(targets.get(&1).is_some(), "the hot target stays resolved");
        assert!(targets.get(&2).is_some_and(|t| Arc::ptr_eq(&t, &held)), "a held target outlives idle ones");
        assert_eq!(targets.len(), 3);
    }
}
