//! Power-of-two-choices over peak-EWMA latency: pick two endpoints at random and send to the one
//! whose expected cost (latency estimate × outstanding requests) is lower. Peak EWMA reacts at
//! once to a slow response and forgets it over `DECAY`, so a slow endpoint sheds load quickly
//! and gets it back when it recovers.
//!
//! Forgetting over time alone starves an equal replica: the estimate of the endpoint not picked
//! only decays with time (e^-t/10 s), while the one picked stays at its latency, so whichever
//! answered its first request a little slower (a new connection, a scheduling hiccup) waits
//! seconds for its estimate to fall below the other's (a node saw 198 of 200 back-to-back
//! requests, and 54 of 60 at 4/s, go to one of two identical replicas). So an endpoint passed
//! over for a request that went elsewhere also forgets a share of its estimate
//! ([`PASSED_OVER`]): after a few lost comparisons it is tried again and its estimate is its
//! latency again. A truly slower endpoint is still tried only rarely: one 100 times slower, once
//! per ~20 requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Duration;

use parking_lot::Mutex;
// Tokio's clock (the system's outside tests): the balancing tests run on a paused clock, each
// answer's latency injected, so that what they see is the algorithm, not the machine's load.
use tokio::time::Instant;

use super::accrual::{Accruing, Health};

/// How fast an observed peak is forgotten (Linkerd's default).
const DECAY: Duration = Duration::from_secs(10);
/// What a failed request counts as.
const FAILURE_PENALTY: Duration = Duration::from_secs(1);
/// The estimate of an endpoint with no observations yet.
const DEFAULT_RTT: Duration = Duration::from_millis(30);
/// What is kept of an endpoint's estimate each time a request goes to the other endpoint it was
/// compared with: an estimate R times the other's is tried again after ln R / ln 1.25 requests
/// (a 3x hiccup after 5, a 100x slower endpoint after ~20: it gets ~5 % of the requests).
const PASSED_OVER: f64 = 0.8;

#[derive(Debug)]
pub struct Stats {
    pending: AtomicUsize,
    /// (estimate in seconds, when it was last updated).
    ewma: Mutex<(f64, Instant)>,
    /// Failure accrual ([`super::accrual`]): whether the balancer may pick it.
    pub health: Health,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            pending: AtomicUsize::new(0),
            ewma: Mutex::new((DEFAULT_RTT.as_secs_f64(), Instant::now())),
            health: Health::default(),
        }
    }
}

impl Stats {
    /// An endpoint whose estimate was `estimate` when last updated, `ago`.
    #[cfg(test)]
    pub(crate) fn last_observed(estimate: Duration, ago: Duration) -> Self {
        let since = Instant::now().checked_sub(ago).unwrap_or_else(Instant::now);
        Self {
            pending: AtomicUsize::new(0),
            ewma: Mutex::new((estimate.as_secs_f64(), since)),
            health: Health::default(),
        }
    }

    fn decayed(estimate: f64, since: Instant, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(since).as_secs_f64();
        estimate * (-elapsed / DECAY.as_secs_f64()).exp()
    }

    /// Expected cost of one more request here.
    pub fn cost(&self) -> f64 {
        let (estimate, since) = *self.ewma.lock();
        let pending = self.pending.load(Ordering::Relaxed) as f64;
        // The estimate decays toward zero between observations; a floor keeps pending counts
        // meaningful for an endpoint that has been idle a long time.
        Stats::decayed(estimate, since, Instant::now()).max(1e-6) * (pending + 1.0)
    }

    pub fn observe(&self, rtt: Duration) {
        let rtt = rtt.as_secs_f64();
        let now = Instant::now();
        let mut ewma = self.ewma.lock();
        let (estimate, since) = *ewma;
        let next = if rtt > estimate {
            rtt
        } else {
            let w = (-now.saturating_duration_since(since).as_secs_f64() / DECAY.as_secs_f64()).exp();
            estimate * w + rtt * (1.0 - w)
        };
        *ewma = (next, now);
    }

    /// A request went to the endpoint this one was compared with: its estimate, not refreshed
    /// meanwhile, counts for a little less.
    pub fn passed_over(&self) {
        self.ewma.lock().0 *= PASSED_OVER;
    }

    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}

/// One request (or opaque connection) in flight on an endpoint.
pub struct Load {
    stats: Arc<Stats>,
    start: Instant,
    /// Under failure accrual: how the request was let through, and its outcome when it ends.
    accruing: Option<Accruing>,
}

impl Load {
    pub fn start(stats: Arc<Stats>) -> Self {
        Self::accruing(stats, None)
    }

    /// A request whose outcome counts for its endpoint's failure accrual.
    pub fn accruing(stats: Arc<Stats>, accruing: Option<Accruing>) -> Self {
        stats.pending.fetch_add(1, Ordering::Relaxed);
        Self { stats, start: Instant::now(), accruing }
    }

    /// How the request ended, as [`crate::http::classify`] says (a failure stays one); recorded
    /// for failure accrual when the load ends. An outcome never told (an opaque connection, a
    /// tunnel) counts for nothing.
    pub fn outcome(&self, failed: bool) {
        if let Some(a) = &self.accruing {
            a.outcome(failed);
        }
    }

    /// Records the time to response headers.
    pub fn observe(&self) {
        self.stats.observe(self.start.elapsed());
    }

    /// Records a failure (refused, reset, timed out) as a slow answer: an endpoint that fails
    /// fast must not look like the fastest one.
    pub fn fail(&self) {
        self.stats.observe(self.start.elapsed().max(FAILURE_PENALTY));
        self.outcome(true);
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stats.pending.fetch_sub(1, Ordering::Relaxed);
        if let Some(a) = &self.accruing {
            a.finish(&self.stats.health);
        }
    }
}

/// A uniform index below `n` (balancing needs speed, not secrecy).
fn below(n: usize) -> usize {
    crate::transport::rng::with(|r| rand::Rng::random_range(r, 0..n))
}

/// Picks among `items` by power of two choices on `stats(item).cost()`; the other candidate,
/// if any, comes with it: the request sent to the pick passes it over ([`Stats::passed_over`]).
pub fn pick<T>(items: &[T], stats: impl Fn(&T) -> &Stats) -> Option<(&T, Option<&T>)> {
    match items.len() {
        0 => None,
        1 => items.first().map(|only| (only, None)),
        n => {
            let a = below(n);
            let b = (a + 1 + below(n - 1)) % n;
            let (x, y) = (&items[a], &items[b]);
            Some(if stats(y).cost() < stats(x).cost() { (y, Some(x)) } else { (x, Some(y)) })
        }
    }
}

/// [`pick`] among the items `eligible` admits (failure accrual's available endpoints): random
/// draws first, which nearly always hit when most are, then a scan. `None` when none is.
pub fn pick_where<T>(
    items: &[T],
    stats: impl Fn(&T) -> &Stats,
    eligible: impl Fn(&T) -> bool,
) -> Option<(&T, Option<&T>)> {
    let n = items.len();
    // One endpoint (a single replica): no draw, no comparison.
    if let [only] = items {
        return eligible(only).then_some((only, None));
    }
    let draw =
        |avoid: Option<usize>| (0..4).map(|_| below(n.max(1))).find(|&i| Some(i) != avoid && eligible(&items[i]));
    let scan = |avoid: Option<usize>| -> Option<usize> {
        let all: Vec<usize> = (0..n).filter(|&i| Some(i) != avoid && eligible(&items[i])).collect();
        (!all.is_empty()).then(|| all[below(all.len())])
    };
    if n == 0 {
        return None;
    }
    let a = draw(None).or_else(|| scan(None))?;
    let b = if n > 1 { draw(Some(a)).or_else(|| scan(Some(a))) } else { None };
    let x = &items[a];
    Some(match b.map(|b| &items[b]) {
        Some(y) if stats(y).cost() < stats(x).cost() => (y, Some(x)),
        other => (x, other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_endpoint_gets_less_traffic() {
        let endpoints: Vec<Arc<Stats>> = (0..3).map(|_| Arc::default()).collect();
        endpoints[0].observe(Duration::from_millis(200));
        endpoints[1].observe(Duration::from_millis(2));
        endpoints[2].observe(Duration::from_millis(2));
        let mut counts = [0usize; 3];
        for _ in 0..3000 {
            let picked = pick(&endpoints, |s| s).unwrap().0;
            let i = endpoints.iter().position(|s| Arc::ptr_eq(s, picked)).unwrap();
            counts[i] += 1;
        }
        assert!(counts[0] < counts[1] / 4 && counts[0] < counts[2] / 4, "{counts:?}");
        assert!(counts[1] + counts[2] > 2800, "the fast ones take the traffic: {counts:?}");
    }

    #[test]
    fn outstanding_requests_count_against_an_endpoint() {
        let endpoints: Vec<Arc<Stats>> = (0..2).map(|_| Arc::default()).collect();
        let _busy: Vec<Load> = (0..10).map(|_| Load::start(endpoints[0].clone())).collect();
        assert_eq!(endpoints[0].pending(), 10);
        for _ in 0..100 {
            assert!(Arc::ptr_eq(pick(&endpoints, |s| s).unwrap().0, &endpoints[1]));
        }
        drop(_busy);
        assert_eq!(endpoints[0].pending(), 0);
    }

    #[test]
    fn a_failing_endpoint_is_avoided() {
        let endpoints: Vec<Arc<Stats>> = (0..2).map(|_| Arc::default()).collect();
        endpoints[1].observe(Duration::from_millis(5));
        Load::start(endpoints[0].clone()).fail();
        for _ in 0..100 {
            assert!(Arc::ptr_eq(pick(&endpoints, |s| s).unwrap().0, &endpoints[1]));
        }
    }

    #[test]
    fn an_endpoint_passed_over_is_tried_again_after_a_few_requests() {
        let estimate = |ms| Arc::new(Stats::last_observed(Duration::from_millis(ms), Duration::ZERO));
        let endpoints = [estimate(3), estimate(1)];
        let mut passed_over = 0;
        // Requests to endpoint 1 that keep its estimate where it is, as back-to-back answers do.
        while let Some((picked, Some(other))) = pick(&endpoints, |s| s) {
            if Arc::ptr_eq(picked, &endpoints[0]) {
                break;
            }
            other.passed_over();
            passed_over += 1;
            assert!(passed_over < 10, "a 3 times higher estimate is forgotten within ~5 requests");
        }
        assert!(passed_over >= 3, "but not at once: {passed_over}");
    }

    #[test]
    fn p2c_never_picks_an_endpoint_that_is_not_eligible() {
        let endpoints: Vec<Arc<Stats>> = (0..3).map(|_| Arc::default()).collect();
        // Endpoint 0 is the cheapest, but out.
        endpoints[0].observe(Duration::from_micros(1));
        let out = |s: &Arc<Stats>| !Arc::ptr_eq(s, &endpoints[0]);
        let mut counts = [0usize; 3];
        for _ in 0..600 {
            let (picked, other) = pick_where(&endpoints, |s| s, out).unwrap();
            assert!(other.is_some_and(out), "the other candidate is eligible too");
            // As the balancer does: the candidate not taken forgets a little.
            other.unwrap().passed_over();
            counts[endpoints.iter().position(|s| Arc::ptr_eq(s, picked)).unwrap()] += 1;
        }
        assert_eq!(counts[0], 0, "{counts:?}");
        assert!(counts[1] > 100 && counts[2] > 100, "the others share the load: {counts:?}");
        let only_two = |s: &Arc<Stats>| Arc::ptr_eq(s, &endpoints[2]);
        let (picked, other) = pick_where(&endpoints, |s| s, only_two).unwrap();
        assert!(Arc::ptr_eq(picked, &endpoints[2]) && other.is_none(), "one eligible: no comparison");
        assert!(pick_where(&endpoints, |s| s, |_| false).is_none(), "none eligible: the caller decides");
    }

    #[test]
    fn peaks_are_taken_at_once_and_decay() {
        let s = Stats::default();
        s.observe(Duration::from_millis(500));
        assert!(s.cost() > 0.4);
        s.observe(Duration::from_millis(1));
        assert!(s.cost() > 0.4, "one fast answer right after does not erase the peak");
        assert!(pick::<Stats>(&[], |s| s).is_none());
    }
}
