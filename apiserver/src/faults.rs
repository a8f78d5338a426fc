//! Fault injection: what a cluster's API server does when it is in trouble, switched on by a test
//! (or by local mode, to rehearse an outage) while clients keep talking to it.
//!
//! - refusing: every open watch ends and every request is answered 503;
//! - a delay before every answer (a slow or hung API server);
//! - the next N writes answered 409 Conflict (a racing writer);
//! - the next N requests answered 500;
//! - resources not served (404), as a cluster without a CRD answers for its kind.
//!
//! Each can be limited to paths containing a string (`/leases/`), so one kind can fail while
//! the rest works.

use std::time::Duration;

use http::{Method, StatusCode};

/// The faults in force.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    pub refusing: bool,
    pub delay: Option<Duration>,
    pub conflicting_writes: usize,
    pub failing_requests: usize,
    /// Only requests whose path contains this are affected by the delay, conflicts and failures;
    /// empty: every request.
    pub only_paths_containing: String,
    /// Plurals answered 404 whatever the request (`grpcroutes`: the Gateway API's CRD missing).
    pub unserved: Vec<String>,
}

/// What a fault makes of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Refused,
    Conflict,
    Failed,
    Unserved,
}

impl Faults {
    fn applies(&self, path: &str) -> bool {
        self.only_paths_containing.is_empty() || path.contains(&self.only_paths_containing)
    }

    /// The delay before answering a request to `path`.
    pub(crate) fn delay_for(&self, path: &str) -> Option<Duration> {
        self.delay.filter(|_| self.applies(path))
    }

    /// Whether a fault answers this request instead of the server; counts it down.
    pub(crate) fn take(&mut self, method: &Method, path: &str) -> Option<(Verdict, StatusCode)> {
        if self.refusing {
            return Some((Verdict::Refused, StatusCode::SERVICE_UNAVAILABLE));
        }
        let segments: Vec<&str> = path.split('/').collect();
        if self.unserved.iter().any(|u| segments.contains(&u.as_str())) {
            return Some((Verdict::Unserved, StatusCode::NOT_FOUND));
        }
        if !self.applies(path) {
            return None;
        }
        if self.failing_requests > 0 {
            self.failing_requests -= 1;
            return Some((Verdict::Failed, StatusCode::INTERNAL_SERVER_ERROR));
        }
        let write = matches!(*method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE);
        if write && self.conflicting_writes > 0 {
            self.conflicting_writes -= 1;
            return Some((Verdict::Conflict, StatusCode::CONFLICT));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_count_down_on_writes_to_the_chosen_paths_only() {
        let mut faults =
            Faults { conflicting_writes: 1, only_paths_containing: "/leases/".into(), ..Faults::default() };
        assert_eq!(faults.take(&Method::PUT, "/api/v1/namespaces/a/pods/p"), None);
        assert_eq!(faults.take(&Method::GET, "/apis/coordination.k8s.io/v1/namespaces/a/leases/l"), None);
        let lease = "/apis/coordination.k8s.io/v1/namespaces/a/leases/l";
        assert_eq!(faults.take(&Method::PUT, lease).map(|v| v.0), Some(Verdict::Conflict));
        assert_eq!(faults.take(&Method::PUT, lease), None);
    }
}
