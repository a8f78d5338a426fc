//! Server-side rate limiting (HTTPLocalRateLimitPolicy): the limits a Server's policy
//! carries, and the buckets that enforce them for every connection to the port.
//!
//! Each limit is a GCRA bucket (the generic cell rate algorithm, a token bucket kept as one
//! number: the "theoretical arrival time" of the next request). A limit of `r` requests per
//! second admits one request every `1/r` s and a burst of `r` requests (one second's worth) after
//! an idle second, so a client at a steady rate above the limit gets `r` per second plus one
//! burst at the start.
//!
//! Scopes, as linkerd2-proxy applies them: `total` (all clients together), then for a client
//! named in an override the override's bucket (one per override, shared by the clients it
//! names), else its identity's own bucket when `identity` is set. Clients without a mesh identity
//! share one identity bucket. A request is admitted only when every bucket that applies admits
//! it, and only then do they all count it: a request refused by one scope does not spend the
//! others.
//!
//! The per-identity buckets are a bounded map ([`MAX_IDENTITIES`]): the mesh issues identities
//! only to its own workloads, but a client that could present many (a compromised CA, a bug)
//! must not grow the proxy's memory. A bucket that has refilled completely is the same as no
//! bucket, so those are dropped first (nothing is lost); only when every tracked identity is
//! mid-burst does the fullest go, which at worst grants that identity one burst more.
//!
//! Requests on the kubelet probe route never reach the limiter ([`super::enforce`]): they are
//! outside every limit, as they are outside authorization.
//!
//! Limits apply per proxy: N replicas of a Server admit N times the limit. A policy update keeps
//! the buckets (their state carries into the new rates) unless the limits changed scope.
//!
//! Per request (the feature configured but idle must cost within noise): one clock
//! read, one uncontended lock, the total bucket; the per-client scopes only when the policy has
//! them (an override map looked up only when it has entries), and an identity's bucket is found
//! by the `&str` the connection already holds: a key is allocated once, when the identity is
//! first seen, never per request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::metrics::Resource;

/// Identities with a bucket of their own at once (see the module docs).
pub const MAX_IDENTITIES: usize = 10_000;

/// A Server's limits as the control plane sent them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// The HTTPLocalRateLimitPolicy, for the metrics' `ratelimit_*` labels.
    pub meta: Resource,
    pub total: Option<u32>,
    pub identity: Option<u32>,
    /// Per override: its rate and the client identities it names.
    pub overrides: Vec<(u32, Vec<Arc<str>>)>,
}

/// Which limit refused a request: the metrics' `ratelimit_scope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    Total,
    Identity,
    Override,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Total => "total",
            Scope::Identity => "identity",
            Scope::Override => "override",
        }
    }
}

/// One GCRA bucket (the default: full).
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// When the bucket would be full again, as time since the limiter's epoch.
    tat: Duration,
}

/// A rate: the interval between requests and the burst tolerance (one second less one interval).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rate {
    interval: Duration,
    tolerance: Duration,
}

impl Rate {
    fn per_second(rps: u32) -> Self {
        let interval = Duration::from_secs(1) / rps.max(1);
        Self { interval, tolerance: Duration::from_secs(1).saturating_sub(interval) }
    }

    /// Whether a request at `now` fits, and the bucket's state after counting it.
    fn admit(self, bucket: Bucket, now: Duration) -> Option<Bucket> {
        let tat = bucket.tat.max(now);
        (tat <= now + self.tolerance).then_some(Bucket { tat: tat + self.interval })
    }
}

/// The buckets of one Server's port, shared by every connection to it; kept across policy
/// updates ([`Limiter::configure`]).
#[derive(Debug)]
pub struct Limiter {
    epoch: Instant,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    total: Option<(Rate, Bucket)>,
    identity: Option<Rate>,
    /// Per identity, looked up by `&str` (`Arc<str>: Borrow<str>`).
    identities: HashMap<Arc<str>, Bucket>,
    /// The one bucket clients without an identity share (under `identity`).
    unauthenticated: Bucket,
    /// Per override: its rate and bucket; `override_of` maps a client to its override.
    overrides: Vec<(Rate, Bucket)>,
    override_of: HashMap<Arc<str>, usize>,
}

impl Limiter {
    pub fn new(limit: &RateLimit) -> Self {
        Self::starting_at(limit, Instant::now())
    }

    /// A limiter whose clock starts at `epoch` (tests pass their own instants to
    /// [`Limiter::check_at`]).
    pub fn starting_at(limit: &RateLimit, epoch: Instant) -> Self {
        let limiter = Self { epoch, state: Mutex::default() };
        limiter.configure(limit);
        limiter
    }

    /// Takes new limits. A scope that stays keeps its buckets' state (a client mid-burst stays
    /// mid-burst); a scope that goes drops them; a new one starts full.
    pub fn configure(&self, limit: &RateLimit) {
        let mut s = self.state.lock();
        let fresh = Bucket { tat: Duration::ZERO };
        let kept_total = s.total.map_or(fresh, |(_, b)| b);
        s.total = limit.total.map(|rps| (Rate::per_second(rps), kept_total));
        s.identity = limit.identity.map(Rate::per_second);
        if s.identity.is_none() {
            s.identities.clear();
            s.unauthenticated = fresh;
        }
        let kept = std::mem::take(&mut s.overrides);
        s.override_of.clear();
        for (i, (rps, clients)) in limit.overrides.iter().enumerate() {
            s.overrides.push((Rate::per_second(*rps), kept.get(i).map_or(fresh, |(_, b)| *b)));
            for client in clients {
                s.override_of.entry(client.clone()).or_insert(i);
            }
        }
    }

    /// `Err(scope)` when a request from `identity` now is over a limit.
    pub fn check(&self, identity: Option<&str>) -> Result<(), Scope> {
        self.check_at(identity, Instant::now())
    }

    pub fn check_at(&self, identity: Option<&str>, now: Instant) -> Result<(), Scope> {
        let now = now.saturating_duration_since(self.epoch);
        let mut s = self.state.lock();
        let State { total, identity: identity_rate, identities, unauthenticated, overrides, override_of } = &mut *s;
        let total_after = match total {
            Some((rate, bucket)) => Some(rate.admit(*bucket, now).ok_or(Scope::Total)?),
            None => None,
        };
        let own = match identity {
            Some(id) if !override_of.is_empty() => override_of.get(id).copied(),
            _ => None,
        };
        // The per-client bucket that applies, and its state once it counts this request.
        let per_client = match (own, *identity_rate) {
            (Some(i), _) => {
                let (rate, bucket) = &mut overrides[i];
                let after = rate.admit(*bucket, now).ok_or(Scope::Override)?;
                Some((PerClient::Bucket(bucket), after))
            }
            (None, Some(rate)) => {
                let slot = match identity {
                    Some(id) => identities.get_mut(id).map_or(PerClient::New, PerClient::Bucket),
                    None => PerClient::Bucket(unauthenticated),
                };
                let bucket = match &slot {
                    PerClient::Bucket(b) => **b,
                    PerClient::New => Bucket::default(),
                };
                Some((slot, rate.admit(bucket, now).ok_or(Scope::Identity)?))
            }
            (None, None) => None,
        };
        // Every scope admitted: now they all count it.
        if let (Some(after), Some((_, bucket))) = (total_after, total.as_mut()) {
            *bucket = after;
        }
        match per_client {
            Some((PerClient::Bucket(bucket), after)) => *bucket = after,
            Some((PerClient::New, after)) => {
                if identities.len() >= MAX_IDENTITIES {
                    make_room(identities, now);
                }
                identities.insert(Arc::from(identity.unwrap_or_default()), after);
            }
            None => {}
        }
        Ok(())
    }

    /// Whether every bucket has refilled completely: nothing spent is still owed, so the next
    /// burst gets the whole limit. Refilling is time-based, so this is read, never pushed:
    /// `/policy.json` shows it, and a test measuring the limit waits on it before its run.
    pub fn full(&self) -> bool {
        self.full_at(Instant::now())
    }

    pub fn full_at(&self, now: Instant) -> bool {
        let now = now.saturating_duration_since(self.epoch);
        let s = self.state.lock();
        let mut buckets = s
            .total
            .iter()
            .map(|(_, b)| b)
            .chain(s.identities.values())
            .chain(std::iter::once(&s.unauthenticated))
            .chain(s.overrides.iter().map(|(_, b)| b));
        buckets.all(|b| b.tat <= now)
    }

    /// Identities with a bucket of their own (tests, and the bound's check).
    pub fn tracked_identities(&self) -> usize {
        self.state.lock().identities.len()
    }
}

/// Where a request's per-client bucket is: kept already, or a new identity's (its key made
/// only if the request is admitted).
enum PerClient<'a> {
    Bucket(&'a mut Bucket),
    New,
}

/// Drops the buckets that have refilled (losing nothing); if none has, the fullest one.
fn make_room(identities: &mut HashMap<Arc<str>, Bucket>, now: Duration) {
    identities.retain(|_, b| b.tat > now);
    if identities.len() >= MAX_IDENTITIES
        && let Some(key) = identities.iter().min_by_key(|(_, b)| b.tat).map(|(k, _)| k.clone())
    {
        identities.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(total: Option<u32>, identity: Option<u32>, overrides: Vec<(u32, Vec<&str>)>) -> RateLimit {
        RateLimit {
            meta: Resource::new("policy.cnimesh.io", "httplocalratelimitpolicy", "rl"),
            total,
            identity,
            overrides: overrides.into_iter().map(|(r, ids)| (r, ids.into_iter().map(Arc::from).collect())).collect(),
        }
    }

    /// Requests from `id` every `every` for `for_` on the fake clock from `start`: how many
    /// were admitted.
    fn offer(l: &Limiter, id: Option<&str>, start: Instant, every: Duration, for_: Duration) -> usize {
        let mut admitted = 0;
        let mut t = Duration::ZERO;
        while t < for_ {
            admitted += usize::from(l.check_at(id, start + t).is_ok());
            t += every;
        }
        admitted
    }

    #[test]
    fn a_steady_rate_above_the_limit_gets_the_limit_plus_one_burst() {
        let epoch = Instant::now();
        let l = Limiter::starting_at(&limit(Some(100), None, vec![]), epoch);
        // 200 requests a second for 10 s: 100 per second, plus the first second's burst.
        let admitted = offer(&l, None, epoch, Duration::from_millis(5), Duration::from_secs(10));
        assert!((1095..=1101).contains(&admitted), "{admitted}");
        // Idle for a second: a full burst again, then nothing.
        let later = epoch + Duration::from_secs(11);
        assert_eq!((0..150).filter(|_| l.check_at(None, later).is_ok()).count(), 100);
        assert_eq!(l.check_at(None, later), Err(Scope::Total));
    }

    #[test]
    fn identities_get_their_own_buckets_and_overrides_their_own_rate() {
        let epoch = Instant::now();
        let l = Limiter::starting_at(&limit(None, Some(10), vec![(30, vec!["vip"])]), epoch);
        let burst = |id| (0..100).filter(|_| l.check_at(id, epoch).is_ok()).count();
        assert_eq!(burst(Some("a")), 10);
        assert_eq!(burst(Some("b")), 10, "another identity, another bucket");
        assert_eq!(burst(None), 10, "clients without identity share one bucket");
        assert_eq!(burst(None), 0);
        assert_eq!(burst(Some("vip")), 30, "the override's rate replaces identity's");
        assert_eq!(l.check_at(Some("vip"), epoch), Err(Scope::Override));
        assert_eq!(l.check_at(Some("a"), epoch), Err(Scope::Identity));
    }

    #[test]
    fn a_request_refused_by_one_scope_spends_no_other() {
        let epoch = Instant::now();
        let l = Limiter::starting_at(&limit(Some(20), Some(5), vec![]), epoch);
        assert_eq!((0..50).filter(|_| l.check_at(Some("a"), epoch).is_ok()).count(), 5);
        // a's 45 refusals did not spend the total: b still gets its 5, and so on up to 20.
        let others =
            ["b", "c", "d", "e"].iter().map(|id| (0..10).filter(|_| l.check_at(Some(*id), epoch).is_ok()).count());
        assert_eq!(others.sum::<usize>(), 15);
        assert_eq!(l.check_at(Some("f"), epoch), Err(Scope::Total));
    }

    #[test]
    fn only_an_identity_limit_tracks_identities_and_clients_without_one_have_their_own_slot() {
        let epoch = Instant::now();
        let total_only = Limiter::starting_at(&limit(Some(1000), None, vec![]), epoch);
        for id in [Some("a"), Some("b"), None] {
            total_only.check_at(id, epoch).unwrap();
        }
        assert_eq!(total_only.tracked_identities(), 0, "no per-client scope: no per-client state");
        let per_identity = Limiter::starting_at(&limit(None, Some(2), vec![]), epoch);
        assert_eq!((0..5).filter(|_| per_identity.check_at(None, epoch).is_ok()).count(), 2);
        assert_eq!(per_identity.tracked_identities(), 0, "the unauthenticated bucket is not in the bounded map");
        assert_eq!((0..5).filter(|_| per_identity.check_at(Some("a"), epoch).is_ok()).count(), 2);
        assert_eq!(per_identity.tracked_identities(), 1, "one key per identity, made once");
    }

    #[test]
    fn the_limiter_is_full_until_a_request_spends_and_again_once_every_bucket_refilled() {
        let epoch = Instant::now();
        let l = Limiter::starting_at(&limit(Some(10), Some(5), vec![(20, vec!["vip"])]), epoch);
        assert!(l.full_at(epoch), "new buckets start full");
        for id in [Some("a"), None, Some("vip")] {
            l.check_at(id, epoch).unwrap();
            assert!(!l.full_at(epoch), "{id:?} spent a token");
        }
        // The total (10 rps) owes 300 ms, the identity buckets (5 rps) 200 ms each.
        assert!(!l.full_at(epoch + Duration::from_millis(250)), "the total is still owed");
        assert!(l.full_at(epoch + Duration::from_millis(300)));
        let spent = Limiter::starting_at(&limit(None, Some(5), vec![]), epoch);
        spent.check_at(Some("a"), epoch).unwrap();
        assert!(!spent.full_at(epoch + Duration::from_millis(150)), "an identity's own bucket counts");
        assert!(spent.full_at(epoch + Duration::from_millis(200)));
    }

    #[test]
    fn new_limits_keep_the_buckets_state() {
        let epoch = Instant::now();
        let l = Limiter::starting_at(&limit(Some(10), None, vec![]), epoch);
        assert_eq!((0..20).filter(|_| l.check_at(None, epoch).is_ok()).count(), 10);
        l.configure(&limit(Some(20), None, vec![]));
        assert!(l.check_at(None, epoch).is_err(), "the spent burst stays spent");
        assert!(l.check_at(None, epoch + Duration::from_millis(60)).is_ok(), "refilled at the new rate");
        l.configure(&limit(None, Some(1), vec![]));
        assert!(l.check_at(None, epoch + Duration::from_millis(60)).is_ok(), "no total any more");
    }

    #[test]
    fn the_identity_map_is_bounded_and_idle_identities_go_first() {
        let epoch = Instant::now();
        let l = Limiter::starting_at(&limit(None, Some(1), vec![]), epoch);
        for i in 0..MAX_IDENTITIES {
            l.check_at(Some(&format!("id-{i}")), epoch).unwrap();
        }
        assert_eq!(l.tracked_identities(), MAX_IDENTITIES);
        l.check_at(Some("one-more"), epoch).unwrap();
        assert_eq!(l.tracked_identities(), MAX_IDENTITIES, "the fullest went");
        // Seconds later every bucket has refilled: at the cap, all of them go at once.
        l.check_at(Some("late"), epoch + Duration::from_secs(2)).unwrap();
        assert_eq!(l.tracked_identities(), 1, "idle buckets are dropped, losing nothing");
    }
}
