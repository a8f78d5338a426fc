//! Which events of the merged streams the caller gets: the first `limit` requests (then the tap
//! ends once they have ended), at most `max-rps` new requests a second (a token bucket), and for
//! an admitted request all of its events, for a dropped one none. Errors always pass.
//!
//! Layer: model (pure): time comes in as an argument.

use std::collections::HashSet;
use std::time::Instant;

use cnimesh_model::tap::event::{Body, TapLine};

/// A request: the proxy's pod and its stream id (ids are unique per proxy only).
type Key = (String, String, String);

#[derive(Debug)]
pub struct Admission {
    limit: u32,
    max_rps: f64,
    admitted: u32,
    open: HashSet<Key>,
    tokens: f64,
    refilled: Instant,
}

impl Admission {
    /// `limit` and `max_rps` of 0 mean no limit.
    pub fn new(limit: u32, max_rps: f64, now: Instant) -> Self {
        Self { limit, max_rps, admitted: 0, open: HashSet::new(), tokens: max_rps.max(1.0), refilled: now }
    }

    /// Whether `line` is passed on.
    pub fn admit(&mut self, line: &TapLine, now: Instant) -> bool {
        let Some(at) = line.body.stream() else { return true };
        let key = (line.namespace.clone(), line.pod.clone(), at.id.clone());
        match line.body {
            Body::RequestInit { .. } => {
                if self.limit > 0 && self.admitted >= self.limit {
                    return false;
                }
                if self.max_rps > 0.0 {
                    let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
                    self.tokens = (self.tokens + elapsed * self.max_rps).min(self.max_rps.max(1.0));
                    self.refilled = now;
                    if self.tokens < 1.0 {
                        return false;
                    }
                    self.tokens -= 1.0;
                }
                self.admitted += 1;
                self.open.insert(key);
                true
            }
            Body::ResponseInit { .. } => self.open.contains(&key),
            Body::ResponseEnd { .. } => self.open.remove(&key),
            Body::Error { .. } => true,
        }
    }

    /// A pod's stream ended: its requests will not end any more.
    pub fn pod_ended(&mut self, namespace: &str, pod: &str) {
        self.open.retain(|(ns, p, _)| !(ns == namespace && p == pod));
    }

    /// The limit is reached and every admitted request has ended.
    pub fn done(&self) -> bool {
        self.limit > 0 && self.admitted >= self.limit && self.open.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use cnimesh_model::tap::event::Stream;

    fn line(pod: &str, id: u32, kind: &str) -> TapLine {
        let at = Stream { id: format!("1:{id}"), direction: "inbound".into(), ..Default::default() };
        let body = match kind {
            "req" => Body::RequestInit {
                at,
                method: "GET".into(),
                scheme: "http".into(),
                authority: "a".into(),
                path: "/".into(),
                headers: vec![],
            },
            "rsp" => Body::ResponseInit { at, since_request_init_us: 1, http_status: 200 },
            _ => Body::ResponseEnd {
                at,
                since_request_init_us: 2,
                since_response_init_us: 1,
                response_bytes: 0,
                grpc_status: None,
                reset_code: None,
            },
        };
        TapLine { namespace: "demo".into(), pod: pod.into(), body }
    }

    #[test]
    fn the_limit_admits_whole_requests_and_ends_when_they_have_ended() {
        let now = Instant::now();
        let mut a = Admission::new(2, 0.0, now);
        assert!(a.admit(&line("w1", 1, "req"), now));
        assert!(a.admit(&line("w2", 1, "req"), now), "ids are per pod");
        assert!(!a.admit(&line("w1", 2, "req"), now), "over the limit");
        assert!(!a.admit(&line("w1", 2, "rsp"), now) && !a.admit(&line("w1", 2, "end"), now));
        assert!(a.admit(&line("w1", 1, "rsp"), now) && a.admit(&line("w1", 1, "end"), now));
        assert!(!a.done(), "w2's request is still open");
        assert!(a.admit(&TapLine::error("demo", "w3", "unreachable"), now));
        a.pod_ended("demo", "w2");
        assert!(a.done());
    }

    #[test]
    fn max_rps_drops_requests_over_the_rate_and_refills() {
        let start = Instant::now();
        let mut a = Admission::new(0, 2.0, start);
        let admitted = (0..5).filter(|i| a.admit(&line("w", *i, "req"), start)).count();
        assert_eq!(admitted, 2, "a burst of the rate");
        assert!(!a.admit(&line("w", 3, "end"), start), "a dropped request's events are dropped");
        let later = start + Duration::from_millis(500);
        assert!(a.admit(&line("w", 10, "req"), later), "one token back after half a second");
        assert!(!a.admit(&line("w", 11, "req"), later));
        assert!(!a.done(), "no limit: never done");
        let mut unlimited = Admission::new(0, 0.0, start);
        assert_eq!((0..1000).filter(|i| unlimited.admit(&line("w", *i, "req"), start)).count(), 1000);
    }
}
