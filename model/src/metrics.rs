//! Prometheus metrics for the admin listener. Names follow the `identity_` prefix so that a
//! dashboard can tell the Identity half from the Destination half later.
//!
//! Layer: model: depends on nothing else in the crate, so every layer may report to it.

use std::time::{Duration, SystemTime};

use prometheus_client::encoding::{EncodeLabelSet, text::encode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// How a Certify call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertifyResult {
    Ok,
    /// Unauthenticated or PermissionDenied: the token did not prove the identity.
    Denied,
    /// InvalidArgument: a malformed request or CSR.
    Invalid,
    /// Anything on our side: no issuer yet, API server unreachable, signing failed.
    Error,
}

impl CertifyResult {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Denied => "denied",
            Self::Invalid => "invalid",
            Self::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    role: String,
}

/// An open tap in `tap_sessions_open`, for as long as it lives.
#[derive(Debug)]
pub struct TapSession(Gauge);

impl Drop for TapSession {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    certify: Family<ResultLabel, Counter>,
    certify_duration: Histogram,
    issuer_reloads: Family<ResultLabel, Counter>,
    issuer_expiry: Gauge,
    leader: Family<RoleLabel, Gauge>,
    tap_requests: Family<ResultLabel, Counter>,
    tap_sessions: Gauge,
    tap_unreachable: Counter,
    grpc_refused: Family<ReasonLabel, Counter>,
    rejected: Family<KindLabel, Counter>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Every reason the gRPC port refuses a connection or call for (`cnimesh_control::grpc::limits` and
/// `cnimesh_control::grpc::peer`), present from the start so that rates over them are 0, not "no data".
const GRPC_REFUSAL_REASONS: [&str; 5] =
    ["unauthenticated", "connections_per_peer", "streams_per_peer", "streams_per_identity", "streams"];

/// How a tap request was answered, from its HTTP status.
fn tap_result(status: u16) -> &'static str {
    match status {
        200..=299 => "ok",
        400 => "invalid",
        401 => "unauthenticated",
        403 => "forbidden",
        404 => "not_found",
        _ => "unavailable",
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let certify = Family::<ResultLabel, Counter>::default();
        // Every outcome is present from the start, so that a rate over an absent series is 0,
        // not "no data".
        for result in [CertifyResult::Ok, CertifyResult::Denied, CertifyResult::Invalid, CertifyResult::Error] {
            let _ = certify.get_or_create(&ResultLabel { result: result.label() });
        }
        registry.register("identity_certify", "Certify requests by result", certify.clone());
        // 100 µs .. ~3 s: signing alone is sub-millisecond; a TokenReview adds an API round trip.
        let certify_duration = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register_with_unit(
            "identity_certify_duration",
            "Time to answer a Certify request",
            Unit::Seconds,
            certify_duration.clone(),
        );
        let issuer_reloads = Family::<ResultLabel, Counter>::default();
        for result in ["ok", "rejected"] {
            let _ = issuer_reloads.get_or_create(&ResultLabel { result });
        }
        registry.register("identity_issuer_reload", "Issuer loads by result", issuer_reloads.clone());
        let issuer_expiry = Gauge::default();
        registry.register_with_unit(
            "identity_issuer_expiry_timestamp",
            "When the current issuer certificate expires (Unix time)",
            Unit::Seconds,
            issuer_expiry.clone(),
        );
        let leader = Family::<RoleLabel, Gauge>::default();
        registry.register("control_leader", "1 while this replica holds the writer Lease of a role", leader.clone());
        let tap_requests = Family::<ResultLabel, Counter>::default();
        for status in [200, 400, 401, 403, 404, 503] {
            let _ = tap_requests.get_or_create(&ResultLabel { result: tap_result(status) });
        }
        registry.register("tap_requests", "Tap requests to the relay by result", tap_requests.clone());
        let tap_sessions = Gauge::default();
        registry.register("tap_sessions_open", "Taps the relay is streaming now", tap_sessions.clone());
        let tap_unreachable = Counter::default();
        registry.register(
            "tap_proxy_unreachable",
            "Proxies a tap could not open or whose stream broke",
            tap_unreachable.clone(),
        );
        let grpc_refused = Family::<ReasonLabel, Counter>::default();
        for reason in GRPC_REFUSAL_REASONS {
            let _ = grpc_refused.get_or_create(&ReasonLabel { reason });
        }
        registry.register(
            "grpc_refused",
            "Connections and calls the gRPC port refused, by reason: no mesh client certificate, or a bound reached",
            grpc_refused.clone(),
        );
        let rejected = Family::<KindLabel, Counter>::default();
        registry.register(
            "cluster_objects_rejected",
            "Cluster objects refused as invalid, by kind (file: a manifest file that cannot be read or parsed); the last good version of each stays",
            rejected.clone(),
        );
        Self {
            registry,
            rejected,
            certify,
            certify_duration,
            issuer_reloads,
            issuer_expiry,
            leader,
            tap_requests,
            tap_sessions,
            tap_unreachable,
            grpc_refused,
        }
    }
}

impl Metrics {
    pub fn certified(&self, result: CertifyResult, took: Duration) {
        self.certify.get_or_create(&ResultLabel { result: result.label() }).inc();
        self.certify_duration.observe(took.as_secs_f64());
    }

    /// Takes the expiry rather than the issuer, so that metrics sit below identity and depend on
    /// nothing of the crate (the issuer reports to metrics, not the other way round).
    pub fn issuer_loaded(&self, not_after: SystemTime) {
        self.issuer_reloads.get_or_create(&ResultLabel { result: "ok" }).inc();
        let expiry = not_after.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.issuer_expiry.set(i64::try_from(expiry.as_secs()).unwrap_or(i64::MAX));
    }

    /// An object of `kind` (`file`: a whole manifest file) was refused as invalid: what a test or
    /// an operator waits for after writing a bad object, instead of waiting for a log line.
    pub fn object_rejected(&self, kind: &'static str) {
        self.rejected.get_or_create(&KindLabel { kind }).inc();
    }

    pub fn issuer_rejected(&self) {
        self.issuer_reloads.get_or_create(&ResultLabel { result: "rejected" }).inc();
    }

    /// Leadership of a writer role (`cnimesh_runtime::leader`) changed.
    pub fn set_leader(&self, role: &str, leading: bool) {
        self.leader.get_or_create(&RoleLabel { role: role.to_string() }).set(i64::from(leading));
    }

    /// The tap relay answered a request with `status`.
    pub fn tap_answered(&self, status: u16) {
        self.tap_requests.get_or_create(&ResultLabel { result: tap_result(status) }).inc();
    }

    /// One more tap streaming; the guard counts it down when dropped.
    pub fn tap_session(&self) -> TapSession {
        self.tap_sessions.inc();
        TapSession(self.tap_sessions.clone())
    }

    /// A tapped proxy could not be reached, or its stream broke.
    pub fn tap_proxy_unreachable(&self) {
        self.tap_unreachable.inc();
    }

    /// The gRPC port refused a connection or call; `reason` is one of [`GRPC_REFUSAL_REASONS`].
    pub fn grpc_refused(&self, reason: &'static str) {
        self.grpc_refused.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Read back by tests; the admin listener only ever encodes.
    #[cfg(any(test, feature = "test-util"))]
    pub fn issuer_rejections(&self) -> u64 {
        self.issuer_reloads.get_or_create(&ResultLabel { result: "rejected" }).get()
    }

    #[cfg(any(test, feature = "test-util"))]
    pub fn certify_count(&self, result: CertifyResult) -> u64 {
        self.certify.get_or_create(&ResultLabel { result: result.label() }).get()
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
