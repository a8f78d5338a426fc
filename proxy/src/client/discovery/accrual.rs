//! Failure accrual (circuit breaking) per endpoint of a balanced service, as Linkerd's
//! `ConsecutiveFailures`: after `max_failures` failed responses in a row (failures as
//! [`crate::http::classify`] decides them, and connection errors), an endpoint is *unavailable*:
//! the balancer no longer picks it. When its penalty is over it is on *probation*: exactly one
//! request is let through; a success makes it *available* again (its count reset), a failure
//! makes it unavailable for the next, longer penalty (exponential from the policy's minimum to
//! its maximum, jittered: [`cnimesh_common::backoff::backoff_between`]).
//!
//! The state lives with the endpoint's balancing statistics ([`super::Stats`]), so it is per
//! proxy and per endpoint, and survives endpoint updates. Which policy applies is the caller's
//! (the outbound policy of the Service, read per request), so a Service whose annotation is
//! removed stops accruing at once. When no endpoint may be picked, the balancer picks among all
//! of them as if none were failed ([`Admission::Fallback`]): a service whose endpoints all fail
//! still gets its requests tried, never a proxy-made blackout; such a request that succeeds
//! puts its endpoint back at once.
//!
//! Times are arguments (`now`), so the state machine is tested with a made-up clock.
//!
//! What a healthy endpoint pays per request is kept to atomics (the feature configured but idle
//! must cost within noise): the pick reads one flag ([`Health::is_available`]) and
//! reads no clock; a success on an available endpoint stores the failure count only if it was
//! not already 0 ([`Health::success_while_available`]): no lock, no clock, no random draw.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::ServiceLabels;

/// A Service's failure accrual, from its outbound policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConsecutiveFailures {
    /// Failures in a row that take an endpoint out (at least 1).
    pub max_failures: u32,
    pub min_penalty: Duration,
    pub max_penalty: Duration,
    /// Up to this share of each penalty is taken off at random (0–1), so the endpoints that
    /// failed together are not probed in lockstep. Linkerd adds it on top; taking it off keeps
    /// `max_penalty` the longest an endpoint is out.
    pub jitter_ratio: f64,
}

impl ConsecutiveFailures {
    /// The penalty after `previous` (`ZERO`: the first) and how long to wait now, for a random
    /// `draw` in 0..1.
    fn penalty(&self, previous: Duration, draw: f64) -> (Duration, Duration) {
        let fraction = 1.0 - self.jitter_ratio.clamp(0.0, 1.0) * draw.clamp(0.0, 1.0);
        cnimesh_common::backoff::backoff_between(previous, self.min_penalty, self.max_penalty, fraction)
    }
}

/// An endpoint's state, as the metrics label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
pub enum EndpointState {
    #[allow(non_camel_case_types)]
    available,
    #[allow(non_camel_case_types)]
    unavailable,
    #[allow(non_camel_case_types)]
    probation,
}

/// How a request was let through to its endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The endpoint is available.
    Normal,
    /// The single request of an endpoint on probation.
    Probe,
    /// No endpoint could be picked: this one was, as if none were failed.
    Fallback,
}

#[derive(Debug, Clone, Copy)]
enum Inner {
    /// Its failures in a row are [`Health::failures`], outside the lock.
    Available,
    /// Out until `until`; then one probe (`probing` while it is out).
    Unavailable { until: Instant, penalty: Duration, probing: bool },
}

/// One endpoint's accrual state.
#[derive(Debug)]
pub struct Health {
    /// Whether it is available: read on every pick without the lock.
    available: AtomicBool,
    /// Failures in a row while available: raised under the lock, reset without it by a
    /// success (a healthy endpoint's requests never take the lock).
    failures: AtomicU32,
    inner: Mutex<Inner>,
}

impl Default for Health {
    fn default() -> Self {
        Self { available: AtomicBool::new(true), failures: AtomicU32::new(0), inner: Mutex::new(Inner::Available) }
    }
}

impl Health {
    pub fn is_available(&self) -> bool {
        self.available.load(Ordering::Relaxed)
    }

    /// A success on an endpoint that is available: its count of failures in a row starts over
    /// (a store only when it was not 0 already, so a healthy endpoint's cache line stays
    /// shared among cores). `false` when the endpoint is out: the caller records the success
    /// under the lock ([`Health::record`]), where it may bring the endpoint back.
    pub fn success_while_available(&self) -> bool {
        if !self.is_available() {
            return false;
        }
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        true
    }

    /// Whether a pick may choose it at `now`: available, or on probation with no probe out.
    pub fn eligible(&self, now: Instant) -> bool {
        self.is_available()
            || matches!(*self.inner.lock(), Inner::Unavailable { until, probing: false, .. } if until <= now)
    }

    /// Lets one request through at `now`, if it may go: a probe claims the endpoint's one slot
    /// (and enters probation).
    pub fn admit(&self, now: Instant) -> Option<Admission> {
        if self.is_available() {
            return Some(Admission::Normal);
        }
        match &mut *self.inner.lock() {
            Inner::Available => Some(Admission::Normal),
            Inner::Unavailable { until, probing, .. } if !*probing && *until <= now => {
                *probing = true;
                Some(Admission::Probe)
            }
            Inner::Unavailable { .. } => None,
        }
    }

    /// Records how a request let through by `admission` ended, at `now`; `draw` (0..1) jitters a
    /// new penalty. Returns the state entered, if it changed.
    pub fn record(
        &self,
        policy: &ConsecutiveFailures,
        admission: Admission,
        failed: bool,
        now: Instant,
        draw: f64,
    ) -> Option<EndpointState> {
        if !failed && self.success_while_available() {
            return None;
        }
        let mut inner = self.inner.lock();
        let next = match (*inner, admission) {
            (Inner::Available, _) if !failed => {
                self.failures.store(0, Ordering::Relaxed);
                return None;
            }
            (Inner::Available, _) => {
                // Under the lock: concurrent failures each count, and only one trips it.
                let failures = self.failures.load(Ordering::Relaxed).saturating_add(1);
                if failures < policy.max_failures.max(1) {
                    self.failures.store(failures, Ordering::Relaxed);
                    return None;
                }
                self.failures.store(0, Ordering::Relaxed);
                let (penalty, wait) = policy.penalty(Duration::ZERO, draw);
                Inner::Unavailable { until: now + wait, penalty, probing: false }
            }
            (Inner::Unavailable { penalty, .. }, Admission::Probe) if failed => {
                let (penalty, wait) = policy.penalty(penalty, draw);
                Inner::Unavailable { until: now + wait, penalty, probing: false }
            }
            (Inner::Unavailable { .. }, Admission::Probe | Admission::Fallback) if !failed => {
                self.failures.store(0, Ordering::Relaxed);
                Inner::Available
            }
            // A request sent before the endpoint went out, or a fallback that failed too: the
            // penalty runs on.
            (Inner::Unavailable { .. }, _) => return None,
        };
        *inner = next;
        let available = matches!(next, Inner::Available);
        self.available.store(available, Ordering::Relaxed);
        Some(if available { EndpointState::available } else { EndpointState::unavailable })
    }

    /// A probe that ended without an outcome (the request was dropped, or became a tunnel): the
    /// next request may probe instead.
    pub fn release(&self, admission: Admission) {
        if admission == Admission::Probe
            && let Inner::Unavailable { probing, .. } = &mut *self.inner.lock()
        {
            *probing = false;
        }
    }
}

/// `outbound_http_balancer_endpoint_state_changes_total`'s labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct StateChangeLabels {
    pub authority: String,
    pub state: EndpointState,
}

/// The balancer's accrual families: state changes by the state entered, and endpoints out of
/// rotation now (unavailable or on probation), per service.
#[derive(Debug, Clone, Default)]
pub struct AccrualMetrics {
    pub state_changes: Family<StateChangeLabels, Counter>,
    pub unavailable: Family<ServiceLabels, Gauge>,
}

/// One service's accrual series, made on its first state change (a service that never trips
/// adds none).
#[derive(Debug, Default)]
pub struct ServiceAccrual {
    metrics: AccrualMetrics,
    authority: String,
    touched: AtomicBool,
}

impl ServiceAccrual {
    pub fn new(metrics: AccrualMetrics, authority: String) -> Self {
        Self { metrics, authority, touched: AtomicBool::new(false) }
    }

    /// Counts a change into `state`; entering or leaving `unavailable` moves the gauge.
    pub fn changed(&self, state: EndpointState, from_available: bool) {
        self.touched.store(true, Ordering::Relaxed);
        let labels = StateChangeLabels { authority: self.authority.clone(), state };
        self.metrics.state_changes.get_or_create(&labels).inc();
        let gauge = || self.metrics.unavailable.get_or_create(&ServiceLabels { authority: self.authority.clone() });
        match state {
            EndpointState::unavailable if from_available => {
                gauge().inc();
            }
            EndpointState::available => {
                gauge().dec();
            }
            _ => {}
        }
    }

    /// Sets the gauge to `out` endpoints after the set changed (endpoints that left take
    /// their state with them).
    pub fn recount(&self, out: usize) {
        if self.touched.load(Ordering::Relaxed) {
            let labels = ServiceLabels { authority: self.authority.clone() };
            self.metrics.unavailable.get_or_create(&labels).set(i64::try_from(out).unwrap_or(i64::MAX));
        }
    }

    /// Removes the service's series (its discovery stream ended).
    pub fn remove(&self) {
        if self.touched.load(Ordering::Relaxed) {
            for state in [EndpointState::available, EndpointState::unavailable, EndpointState::probation] {
                self.metrics.state_changes.remove(&StateChangeLabels { authority: self.authority.clone(), state });
            }
            self.metrics.unavailable.remove(&ServiceLabels { authority: self.authority.clone() });
        }
    }
}

/// What a request's [`super::balance::Load`] carries under accrual: its outcome is recorded
/// when it ends.
#[derive(Debug)]
pub struct Accruing {
    pub policy: ConsecutiveFailures,
    pub admission: Admission,
    pub service: Arc<ServiceAccrual>,
    /// The endpoint the request went to: the state-change log names it, so an operator sees
    /// which one is out.
    pub endpoint: SocketAddr,
    /// 0: no outcome yet, 1: success, 2: failure (a failure stays one).
    outcome: AtomicU8,
}

const SUCCESS: u8 = 1;
const FAILURE: u8 = 2;

impl Accruing {
    pub fn new(
        policy: ConsecutiveFailures,
        admission: Admission,
        service: Arc<ServiceAccrual>,
        endpoint: SocketAddr,
    ) -> Self {
        if admission == Admission::Probe {
            service.changed(EndpointState::probation, false);
        }
        Self { policy, admission, service, endpoint, outcome: AtomicU8::new(0) }
    }

    /// How the request ended (its last word: a failure already seen stays one).
    pub fn outcome(&self, failed: bool) {
        if failed {
            self.outcome.store(FAILURE, Ordering::Relaxed);
        } else {
            let _ = self.outcome.compare_exchange(0, SUCCESS, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Records the outcome on `health` (the request is over). A success on an available
    /// endpoint, every request of a healthy service, reads no clock and draws nothing.
    pub fn finish(&self, health: &Health) {
        let failed = match self.outcome.load(Ordering::Relaxed) {
            SUCCESS => false,
            FAILURE => true,
            _ => return health.release(self.admission),
        };
        if !failed && health.success_while_available() {
            return;
        }
        let from_available = health.is_available();
        let draw = crate::transport::rng::with(|r| rand::Rng::random_range(r, 0.0..1.0));
        if let Some(state) = health.record(&self.policy, self.admission, failed, Instant::now(), draw) {
            tracing::info!(
                service = %self.service.authority,
                endpoint = %self.endpoint,
                ?state,
                "endpoint state changed (failure accrual)"
            );
            self.service.changed(state, from_available);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: ConsecutiveFailures = ConsecutiveFailures {
        max_failures: 3,
        min_penalty: Duration::from_secs(1),
        max_penalty: Duration::from_secs(4),
        jitter_ratio: 0.5,
    };

    const ENDPOINT: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 0, 7)), 8080);

    #[test]
    fn an_endpoint_goes_out_after_max_failures_in_a_row_and_a_success_resets_the_count() {
        let (h, t0) = (Health::default(), Instant::now());
        let fail = |now| h.record(&POLICY, Admission::Normal, true, now, 0.0);
        assert_eq!(fail(t0), None);
        assert_eq!(fail(t0), None);
        assert_eq!(h.record(&POLICY, Admission::Normal, false, t0, 0.0), None, "a success in between");
        assert_eq!(fail(t0), None);
        assert_eq!(fail(t0), None);
        assert!(h.eligible(t0));
        assert_eq!(fail(t0), Some(EndpointState::unavailable), "the third in a row");
        assert!(!h.is_available() && !h.eligible(t0));
        assert_eq!(h.admit(t0), None, "not picked while its penalty runs");
    }

    #[test]
    fn a_success_on_a_healthy_endpoint_takes_no_lock_and_changes_no_state() {
        let health = Arc::new(Health::default());
        let service = Arc::new(ServiceAccrual::new(AccrualMetrics::default(), "web.shop.svc.cluster.local:80".into()));
        let before = format!("{health:?}");
        // The lock is held here: a success that needed it would wait until the timeout below.
        let held = health.inner.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let (h, s) = (health.clone(), service.clone());
        std::thread::spawn(move || {
            let request = Accruing::new(POLICY, Admission::Normal, s, ENDPOINT);
            request.outcome(false);
            request.finish(&h);
            let recorded = h.record(&POLICY, Admission::Normal, false, Instant::now(), 0.0);
            tx.send((recorded, h.is_available(), h.failures.load(Ordering::Relaxed))).unwrap();
        });
        let done = rx.recv_timeout(Duration::from_secs(30));
        drop(held);
        assert_eq!(done, Ok((None, true, 0)), "recorded without the lock, still available, no failure");
        assert_eq!(format!("{health:?}"), before, "nothing changed");
        assert!(!service.touched.load(Ordering::Relaxed), "no state change counted, no series made");
    }

    #[test]
    fn after_its_penalty_exactly_one_probe_goes_and_its_success_brings_the_endpoint_back() {
        let (h, t0) = (Health::default(), Instant::now());
        for _ in 0..3 {
            h.record(&POLICY, Admission::Normal, true, t0, 0.0);
        }
        // Draw 0: no jitter, the full minimum penalty.
        let later = t0 + Duration::from_secs(1);
        assert!(!h.eligible(later - Duration::from_millis(1)));
        assert!(h.eligible(later));
        assert_eq!(h.admit(later), Some(Admission::Probe));
        assert!(!h.eligible(later), "one probe at a time");
        assert_eq!(h.admit(later), None);
        assert_eq!(h.record(&POLICY, Admission::Probe, false, later, 0.0), Some(EndpointState::available));
        assert!(h.is_available());
        assert_eq!(h.record(&POLICY, Admission::Normal, true, later, 0.0), None, "its count starts over");
    }

    #[test]
    fn a_failed_probe_doubles_the_penalty_up_to_the_maximum_with_jitter_taken_off() {
        let (h, mut now) = (Health::default(), Instant::now());
        for _ in 0..3 {
            h.record(&POLICY, Admission::Normal, true, now, 0.0);
        }
        let mut waits = Vec::new();
        let mut out_since = now;
        for _ in 0..4 {
            // Step the clock until the endpoint may be probed.
            while !h.eligible(now) {
                now += Duration::from_millis(50);
            }
            waits.push(now - out_since);
            assert_eq!(h.admit(now), Some(Admission::Probe));
            assert_eq!(h.record(&POLICY, Admission::Probe, true, now, 0.0), Some(EndpointState::unavailable));
            out_since = now;
        }
        let secs: Vec<u64> = waits.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 4], "min, doubled, capped at max");
        // Full jitter (draw 1, ratio 0.5) takes half off.
        let (_, wait) = POLICY.penalty(Duration::from_secs(2), 1.0);
        assert_eq!(wait, Duration::from_secs(2));
    }

    #[test]
    fn a_probe_that_ends_without_an_outcome_lets_the_next_request_probe() {
        let (h, t0) = (Health::default(), Instant::now());
        for _ in 0..3 {
            h.record(&POLICY, Admission::Normal, true, t0, 0.0);
        }
        let later = t0 + Duration::from_secs(2);
        assert_eq!(h.admit(later), Some(Admission::Probe));
        h.release(Admission::Probe);
        assert_eq!(h.admit(later), Some(Admission::Probe));
    }

    #[test]
    fn a_fallback_success_brings_an_endpoint_back_and_a_fallback_failure_changes_nothing() {
        let (h, t0) = (Health::default(), Instant::now());
        for _ in 0..3 {
            h.record(&POLICY, Admission::Normal, true, t0, 0.0);
        }
        assert_eq!(h.record(&POLICY, Admission::Fallback, true, t0, 0.0), None);
        assert!(!h.eligible(t0), "its penalty runs on");
        assert_eq!(
            h.record(&POLICY, Admission::Normal, false, t0, 0.0),
            None,
            "an old request's answer is not a probe"
        );
        assert_eq!(h.record(&POLICY, Admission::Fallback, false, t0, 0.0), Some(EndpointState::available));
        assert!(h.is_available());
    }

    #[test]
    fn the_state_change_log_line_names_the_endpoint_that_went_out() {
        // The log goes through a pipe, read once the subscriber (its only writer) is gone.
        let (mut reader, writer) = std::io::pipe().unwrap();
        let subscriber =
            tracing_subscriber::fmt().with_writer(Arc::new(writer)).with_ansi(false).without_time().finish();
        let (health, service) = (
            Health::default(),
            Arc::new(ServiceAccrual::new(AccrualMetrics::default(), "web.shop.svc.cluster.local:80".into())),
        );
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..POLICY.max_failures {
                let request = Accruing::new(POLICY, Admission::Normal, service.clone(), ENDPOINT);
                request.outcome(true);
                request.finish(&health);
            }
        });
        assert!(!health.is_available());
        let mut text = String::new();
        std::io::Read::read_to_string(&mut reader, &mut text).unwrap();
        let line = text.lines().find(|l| l.contains("endpoint state changed")).unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains("endpoint=10.244.0.7:8080"), "{line}");
        assert!(line.contains("service=web.shop.svc.cluster.local:80"), "{line}");
        assert!(line.contains("state=unavailable"), "{line}");
    }
}
