//! Golden metrics with Linkerd's names, so existing dashboards and `linkerd viz`-style queries
//! work. Labels stay bounded: no paths, and authorities are capped in length and count.

use std::sync::{Arc, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub use crate::client::discovery::accrual::AccrualMetrics;
pub use crate::client::discovery::follow::StreamMetrics;
pub use crate::client::discovery::{DiscoveryMetrics, ServiceLabels};
pub use crate::http::tap::registry::TapMetrics;
pub use crate::inbound::policy::metrics::{AuthzLabels, AuthzMetrics, Resource};
pub use crate::outbound::routes::metrics::{
    RouteBackendLabels, RouteHandles, RouteLabels, RouteMetrics, route_duration_histogram,
};
pub use crate::transport::identity::refresh::{IdentityMetrics, RefreshLabels};
pub use crate::transport::labels::{
    AcceptError, AcceptErrorLabels, Bounded, ConnMetrics, DecidedBy, Direction, DstKind, ProtocolLabels, TargetCluster,
    TcpLabels, TlsLabel,
};

/// Distinct `authority` label values kept, per direction, before the rest are reported as
/// `other` (per direction, so junk Host headers from inbound clients cannot crowd out outbound
/// authorities).
const MAX_AUTHORITIES: usize = 256;
const MAX_AUTHORITY_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RequestLabels {
    pub direction: Direction,
    pub target_addr: String,
    /// `dst_kind="egress"` on egress traffic only ([`DstKind`]).
    #[prometheus(flatten)]
    pub dst_kind: DstKind,
    /// `target_cluster_name` on traffic to a linked cluster only ([`TargetCluster`]).
    #[prometheus(flatten)]
    pub target_cluster: TargetCluster,
    pub authority: String,
    #[prometheus(flatten)]
    pub tls: TlsLabel,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ResponseLabels {
    pub direction: Direction,
    pub target_addr: String,
    #[prometheus(flatten)]
    pub dst_kind: DstKind,
    /// `target_cluster_name` on traffic to a linked cluster only ([`TargetCluster`]).
    #[prometheus(flatten)]
    pub target_cluster: TargetCluster,
    pub authority: String,
    #[prometheus(flatten)]
    pub tls: TlsLabel,
    pub status_code: String,
    pub classification: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new([
        1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 100.0, 200.0, 300.0, 400.0, 500.0, 1000.0, 2000.0,
        5000.0, 10000.0, 30000.0,
    ])
}

pub struct Metrics {
    pub registry: Registry,
    pub request_total: Family<RequestLabels, Counter>,
    pub response_total: Family<ResponseLabels, Counter>,
    pub response_latency_ms: Family<RequestLabels, Histogram, fn() -> Histogram>,
    pub tcp_open_total: Family<TcpLabels, Counter>,
    pub tcp_close_total: Family<TcpLabels, Counter>,
    pub tcp_open_connections: Family<TcpLabels, Gauge>,
    pub tcp_read_bytes_total: Family<TcpLabels, Counter>,
    pub tcp_write_bytes_total: Family<TcpLabels, Counter>,
    pub outbound_endpoints: Family<ServiceLabels, Gauge>,
    /// Requests sent to another endpoint because none could be connected to, per service.
    pub outbound_connect_retries: Family<ServiceLabels, Counter>,
    /// `control_stream_messages_total` and `control_stream_failures_total`.
    pub control_streams: StreamMetrics,
    /// Failure accrual's endpoint state changes and endpoints out of rotation, per service.
    pub balancer_accrual: AccrualMetrics,
    pub identity_cert_expiration_timestamp_seconds: Gauge,
    pub identity_cert_refresh_total: Family<RefreshLabels, Counter>,
    /// Re-read trust-anchor bundles not taken (unparsable, or without a valid endorsement).
    pub identity_trust_anchors_refused_total: Counter,
    /// The inbound authorization families ([`crate::inbound::policy::enforce`]), registered here.
    pub authz: AuthzMetrics,
    pub connection_protocol_total: Family<ProtocolLabels, Counter>,
    /// Tap ([`crate::http::tap`]): sessions open now, events sent to and dropped for tap clients
    /// (a full queue: the client reads too slowly), calls refused to unauthorized clients.
    pub tap_sessions_open: Gauge,
    pub tap_events_sent_total: Counter,
    pub tap_events_dropped_total: Counter,
    pub tap_denied_total: Counter,
    authorities: [Bounded; 2],
    /// The refusal counters and bounded `target_addr` labels both sides and the accept loop use.
    pub conn: ConnMetrics,
    /// The route families, with their series bound, for the outbound side.
    pub routes: Arc<RouteMetrics>,
    /// Egress by hostname (`outbound_egress_*`).
    pub egress: Arc<crate::outbound::egress::EgressMetrics>,
    /// `trace_spans_exported_total`, `trace_spans_dropped_total`: read from the trace exporter at
    /// each scrape (0 while tracing is off); `trace_span_budget_full`, read from the span budget.
    pub trace: TraceCounts,
    /// A multicluster gateway's refusals and admitted connections.
    pub gateway: Arc<crate::gateway::GatewayMetrics>,
}

/// The trace exporter's counts as counters, and whether the span budget has refilled as a gauge
/// (1: the next requests get the whole burst; refilling is time-based, so it is read at each
/// scrape, and a test measuring the budget waits on it). The exporter is made after the registry
/// (it needs the runtime and the configuration), so it is set here once it runs.
#[derive(Debug, Clone, Default)]
pub struct TraceCounts(Arc<OnceLock<(cnimesh_trace::Exporter, Arc<crate::inbound::policy::ratelimit::Limiter>)>>);

impl TraceCounts {
    /// Reads `exporter`'s counts and `budget`'s state from now on (the first ones set win).
    pub fn set(&self, exporter: cnimesh_trace::Exporter, budget: Arc<crate::inbound::policy::ratelimit::Limiter>) {
        let _ = self.0.set((exporter, budget));
    }
}

impl prometheus_client::collector::Collector for TraceCounts {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        let counts = self.0.get().map(|(e, _)| e.counts()).unwrap_or_default();
        for (name, help, value) in [
            ("trace_spans_exported", "Spans the trace collector accepted", counts.exported),
            (
                "trace_spans_dropped",
                "Spans lost: the export queue was full or the collector failed for good",
                counts.dropped,
            ),
        ] {
            let metric =
                encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Counter)?;
            prometheus_client::metrics::counter::ConstCounter::new(value).encode(metric)?;
        }
        if let Some((_, budget)) = self.0.get() {
            let metric = encoder.encode_descriptor(
                "trace_span_budget_full",
                "1 when the span budget has refilled completely, else 0",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            prometheus_client::metrics::gauge::ConstGauge::new(i64::from(budget.full())).encode(metric)?;
        }
        Ok(())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            request_total: Family::default(),
            response_total: Family::default(),
            response_latency_ms: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            tcp_open_total: Family::default(),
            tcp_close_total: Family::default(),
            tcp_open_connections: Family::default(),
            tcp_read_bytes_total: Family::default(),
            tcp_write_bytes_total: Family::default(),
            outbound_endpoints: Family::default(),
            outbound_connect_retries: Family::default(),
            control_streams: StreamMetrics::default(),
            balancer_accrual: AccrualMetrics::default(),
            identity_cert_expiration_timestamp_seconds: Gauge::default(),
            identity_trust_anchors_refused_total: Counter::default(),
            identity_cert_refresh_total: Family::default(),
            authz: AuthzMetrics::default(),
            connection_protocol_total: Family::default(),
            tap_sessions_open: Gauge::default(),
            tap_events_sent_total: Counter::default(),
            tap_events_dropped_total: Counter::default(),
            tap_denied_total: Counter::default(),
            authorities: Default::default(),
            conn: ConnMetrics::new(Family::default(), Default::default()),
            routes: Arc::new(RouteMetrics::new(
                Family::new_with_constructor(route_duration_histogram as fn() -> Histogram),
                Family::default(),
                Family::default(),
                Family::default(),
                Family::default(),
            )),
            egress: Arc::default(),
            registry: Registry::default(),
            trace: TraceCounts::default(),
            gateway: Arc::default(),
        };
        // prometheus-client appends `_total` to counters itself.
        registry.register("request", "HTTP requests", m.request_total.clone());
        registry.register(
            "gateway_refused",
            "Connections a multicluster gateway refused, by reason",
            m.gateway.refused_total.clone(),
        );
        registry.register(
            "gateway_connections",
            "Connections a multicluster gateway admitted, by client identity and target",
            m.gateway.connections_total.clone(),
        );
        registry.register("response", "HTTP responses", m.response_total.clone());
        registry.register(
            "response_latency_ms",
            "Time to response headers, in milliseconds",
            m.response_latency_ms.clone(),
        );
        registry.register("tcp_open", "TCP connections opened", m.tcp_open_total.clone());
        registry.register("tcp_close", "TCP connections closed", m.tcp_close_total.clone());
        registry.register("tcp_open_connections", "TCP connections open now", m.tcp_open_connections.clone());
        registry.register("tcp_read_bytes", "Bytes read from peers", m.tcp_read_bytes_total.clone());
        registry.register("tcp_write_bytes", "Bytes written to peers", m.tcp_write_bytes_total.clone());
        registry.register("tcp_refused", "TCP connections refused by mTLS policy", m.conn.tcp_refused_total.clone());
        registry.register(
            "tcp_connection_errors",
            "Connections that ended in an error, by direction and reason",
            m.conn.tcp_connection_errors_total.clone(),
        );
        for (name, direction) in [("inbound_tcp_accept_errors", 0), ("outbound_tcp_accept_errors", 1)] {
            registry.register(
                name,
                "Connections closed before they were served: shed over a limit, or detection timed out",
                m.conn.tcp_accept_errors_total[direction].clone(),
            );
        }
        registry.register(
            "outbound_endpoints",
            "Endpoints discovery currently knows for a service the proxy talks to",
            m.outbound_endpoints.clone(),
        );
        registry.register(
            "outbound_connect_retries",
            "HTTP requests sent to another endpoint of a service because no connection to the one picked could be made (nothing of the request was sent)",
            m.outbound_connect_retries.clone(),
        );
        for (name, help, family) in [
            (
                "control_stream_messages",
                "Messages received on the control plane's streams (policies, endpoints, profiles), applied or refused, by kind of stream",
                &m.control_streams.messages,
            ),
            (
                "control_stream_failures",
                "Control plane streams that broke or could not be opened (the last answers stay in force), by kind of stream",
                &m.control_streams.failures,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        registry.register(
            "outbound_http_balancer_endpoint_state_changes",
            "Endpoints entering a failure accrual state (available, unavailable, probation), per service",
            m.balancer_accrual.state_changes.clone(),
        );
        registry.register(
            "outbound_http_balancer_endpoints_unavailable",
            "Endpoints failure accrual keeps out of a service's balancer now (unavailable or on probation)",
            m.balancer_accrual.unavailable.clone(),
        );
        registry.register(
            "identity_cert_expiration_timestamp_seconds",
            "When the proxy's current certificate expires (Unix time)",
            m.identity_cert_expiration_timestamp_seconds.clone(),
        );
        registry.register(
            "identity_cert_refresh",
            "Certificate requests to the Identity service, by result",
            m.identity_cert_refresh_total.clone(),
        );
        registry.register(
            "identity_trust_anchors_refused",
            "Re-read trust-anchor bundles not taken: unparsable, or not endorsed by the control plane",
            m.identity_trust_anchors_refused_total.clone(),
        );
        for (name, help, family) in [
            ("inbound_http_authz_allow", "HTTP requests authorized by policy", &m.authz.inbound_http_authz_allow_total),
            ("inbound_http_authz_deny", "HTTP requests denied by policy", &m.authz.inbound_http_authz_deny_total),
            ("inbound_tcp_authz_allow", "Connections authorized by policy", &m.authz.inbound_tcp_authz_allow_total),
            ("inbound_tcp_authz_deny", "Connections denied by policy", &m.authz.inbound_tcp_authz_deny_total),
            (
                "inbound_http_route_not_found",
                "HTTP requests matching no route of their Server",
                &m.authz.inbound_http_route_not_found_total,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        // Rate limiting
        registry.register(
            "inbound_http_local_ratelimit",
            "HTTP requests refused by their Server's rate limit",
            m.authz.inbound_http_local_ratelimit_total.clone(),
        );
        registry.register(
            "outbound_http_route_request_duration_seconds",
            "Time from a routed request to its response headers, per route",
            m.routes.outbound_http_route_request_duration_seconds.clone(),
        );
        registry.register(
            "outbound_http_route_request_statuses",
            "Responses to routed requests, per route, by HTTP status and whether the proxy answered",
            m.routes.outbound_http_route_request_statuses_total.clone(),
        );
        registry.register(
            "outbound_http_route_backend_requests",
            "Requests dispatched to each backend of each route",
            m.routes.outbound_http_route_backend_requests_total.clone(),
        );
        for (name, help, family) in [
            (
                "outbound_http_route_retry_requests",
                "Requests sent again by a route's retry policy",
                &m.routes.outbound_http_route_retry_requests_total,
            ),
            (
                "outbound_http_route_retry_overflow",
                "Retries not made because the retry budget was spent",
                &m.routes.outbound_http_route_retry_overflow_total,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        registry.register("tap_sessions_open", "Tap sessions open now", m.tap_sessions_open.clone());
        for (name, help, counter) in [
            ("tap_events_sent", "Tap events sent to tap clients", &m.tap_events_sent_total),
            (
                "tap_events_dropped",
                "Tap events dropped because a tap client read too slowly",
                &m.tap_events_dropped_total,
            ),
            ("tap_denied", "Tap calls refused: the client's identity may not tap", &m.tap_denied_total),
            (
                "inbound_tcp_authz_revoked",
                "Opaque connections closed because a policy update revoked their authorization",
                &m.authz.inbound_tcp_authz_revoked_total,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        registry.register(
            "connection_protocol",
            "Connections by the protocol they were served as and what decided it",
            m.connection_protocol_total.clone(),
        );
        registry.register_collector(Box::new(m.trace.clone()));
        // Egress
        registry.register(
            "outbound_egress_connections",
            "Egress connections by EgressNetwork, destination hostname (TLS SNI, else the IP) and protocol",
            m.egress.outbound_egress_connections_total.clone(),
        );
        registry.register(
            "outbound_egress_requests",
            "Egress HTTP requests by EgressNetwork and destination hostname (Host/authority)",
            m.egress.outbound_egress_requests_total.clone(),
        );
        registry.register(
            "outbound_egress_denied",
            "Egress connections and requests refused by an EgressNetwork's policy",
            m.egress.outbound_egress_denied_total.clone(),
        );
        Self { registry, ..m }
    }
}

/// One proxied TCP connection, counted in `tcp_open_connections` until its last holder is gone:
/// an upgraded (WebSocket, CONNECT) tunnel outlives the HTTP connection that carried it.
pub struct OpenConnection {
    metrics: std::sync::Arc<Metrics>,
    labels: TcpLabels,
}

impl OpenConnection {
    pub fn open(metrics: std::sync::Arc<Metrics>, labels: TcpLabels) -> std::sync::Arc<Self> {
        metrics.tcp_open_total.get_or_create(&labels).inc();
        metrics.tcp_open_connections.get_or_create(&labels).inc();
        std::sync::Arc::new(Self { metrics, labels })
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.metrics.tcp_open_connections.get_or_create(&self.labels).dec();
        self.metrics.tcp_close_total.get_or_create(&self.labels).inc();
    }
}

impl Metrics {
    /// The label value for an authority, bounded in length and in number of distinct values.
    pub fn authority_label(&self, direction: Direction, authority: &str) -> String {
        let a: String = authority.chars().take(MAX_AUTHORITY_LEN).collect();
        self.authorities[direction as usize].label(&a, MAX_AUTHORITIES)
    }

    /// The label value for a target address, bounded in number of distinct values.
    pub fn target_label(&self, direction: Direction, target: std::net::SocketAddr) -> String {
        self.conn.target_label(direction, target)
    }

    /// A connection refused by policy ([`ConnMetrics::tcp_refused`]).
    pub fn tcp_refused(&self, direction: Direction, target: std::net::SocketAddr) {
        self.conn.tcp_refused(direction, target)
    }

    /// A connection closed before it was served.
    pub fn accept_error(&self, direction: Direction, error: AcceptError) {
        self.conn.accept_error(direction, error)
    }

    /// What discovery and its balancers count into.
    pub fn discovery(&self) -> DiscoveryMetrics {
        DiscoveryMetrics {
            endpoints: self.outbound_endpoints.clone(),
            accrual: self.balancer_accrual.clone(),
            connect_retries: self.outbound_connect_retries.clone(),
            streams: self.control_streams.clone(),
        }
    }

    /// The certificate metrics the identity's refresh loop keeps ([`crate::transport::identity`]).
    pub fn identity(&self) -> IdentityMetrics {
        IdentityMetrics {
            expiration: self.identity_cert_expiration_timestamp_seconds.clone(),
            refresh: self.identity_cert_refresh_total.clone(),
            anchors_refused: self.identity_trust_anchors_refused_total.clone(),
        }
    }

    /// The tap registry's metrics ([`crate::http::tap`]).
    pub fn tap(&self) -> TapMetrics {
        TapMetrics {
            sessions_open: self.tap_sessions_open.clone(),
            events_dropped: self.tap_events_dropped_total.clone(),
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linkerd_names_and_bounded_authorities() {
        let m = Metrics::default();
        let labels = TcpLabels {
            direction: Direction::inbound,
            target_addr: "10.0.0.1:80".into(),
            dst_kind: DstKind::Mesh,
            target_cluster: TargetCluster::default(),
            tls: TlsLabel::plaintext(),
        };
        m.tcp_open_total.get_or_create(&labels).inc();
        let req = RequestLabels {
            direction: Direction::outbound,
            target_addr: "10.0.0.2:80".into(),
            dst_kind: DstKind::Mesh,
            target_cluster: TargetCluster::default(),
            authority: "web".into(),
            tls: TlsLabel { tls: true, client_id: None, server_id: Some("web.shop".into()) },
        };
        m.request_total.get_or_create(&req).inc();
        m.response_latency_ms.get_or_create(&req).observe(3.0);
        let text = m.encode();
        assert!(
            text.contains("tcp_open_total{direction=\"inbound\",target_addr=\"10.0.0.1:80\",tls=\"false\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("request_total{direction=\"outbound\",target_addr=\"10.0.0.2:80\",authority=\"web\",tls=\"true\",server_id=\"web.shop\"} 1"),
            "{text}"
        );
        assert!(text.contains("response_latency_ms_bucket{"), "{text}");
        for i in 0..MAX_AUTHORITIES {
            m.authority_label(Direction::inbound, &format!("host-{i}"));
        }
        assert_eq!(m.authority_label(Direction::inbound, "one-too-many"), "other");
        assert_eq!(m.authority_label(Direction::inbound, "host-1"), "host-1");
        assert_eq!(m.authority_label(Direction::inbound, &"x".repeat(500)), "other", "new values beyond the cap");
        assert_eq!(m.authority_label(Direction::outbound, "web"), "web", "caps are per direction");
        assert_eq!(m.target_label(Direction::outbound, "10.0.0.1:80".parse().unwrap()), "10.0.0.1:80");
        m.accept_error(Direction::inbound, AcceptError::source_limit);
        m.accept_error(Direction::outbound, AcceptError::detect_timeout);
        let text = m.encode();
        assert!(text.contains("inbound_tcp_accept_errors_total{error=\"source_limit\"} 1"), "{text}");
        assert!(text.contains("outbound_tcp_accept_errors_total{error=\"detect_timeout\"} 1"), "{text}");
    }

    #[test]
    fn a_connection_error_is_counted_by_reason_and_in_the_family_that_long_named_it() {
        use crate::transport::conn_error::ConnError;
        use crate::transport::detect::DetectError;
        let m = Metrics::default();
        let addr: std::net::SocketAddr = "10.0.0.2:80".parse().unwrap();
        let peer: std::net::SocketAddr = "10.0.0.9:4000".parse().unwrap();
        let timeout = std::time::Duration::from_secs(1);
        let cases: Vec<(Direction, ConnError, &str, Option<&str>)> = vec![
            (
                Direction::inbound,
                ConnError::LoopbackDestination { peer, addr: "127.0.0.1:80".parse().unwrap() },
                "loopback_destination",
                Some("inbound_tcp_accept_errors_total{error=\"loopback_destination\"} 1"),
            ),
            (
                Direction::inbound,
                ConnError::NotOurAddress { addr },
                "not_our_address",
                Some("tcp_refused_total{direction=\"inbound\",target_addr=\"10.0.0.2:80\",tls=\"false\"} 1"),
            ),
            (
                Direction::inbound,
                ConnError::PolicyWatchLimit("full".into()),
                "policy_watch_limit",
                Some("inbound_tcp_accept_errors_total{error=\"policy_watch_limit\"} 1"),
            ),
            (
                Direction::inbound,
                ConnError::TlsUndecided { wait: timeout, read: 0 },
                "tls_undecided",
                Some("inbound_tcp_accept_errors_total{error=\"tls_detect_timeout\"} 1"),
            ),
            (
                Direction::outbound,
                ConnError::Detect(DetectError::TimedOut { timeout, read: 0 }),
                "detect_timeout",
                Some("outbound_tcp_accept_errors_total{error=\"detect_timeout\"} 1"),
            ),
            (
                Direction::outbound,
                ConnError::NoTarget { addr, why: "no certificate yet" },
                "no_target",
                Some("tcp_refused_total{direction=\"outbound\",target_addr=\"10.0.0.2:80\",tls=\"false\"} 1"),
            ),
            (Direction::inbound, ConnError::PolicyDenied { addr }, "policy_denied", None),
            (Direction::inbound, ConnError::Revoked { addr }, "revoked", None),
        ];
        for (direction, error, reason, family) in &cases {
            m.conn.conn_error(*direction, error);
            let text = m.encode();
            let by_reason = format!(
                "tcp_connection_errors_total{{direction=\"{}\",reason=\"{reason}\"}} 1",
                if *direction == Direction::inbound { "inbound" } else { "outbound" }
            );
            assert!(text.contains(&by_reason), "{error}: {text}");
            if let Some(family) = family {
                assert!(text.contains(family), "{error}: {text}");
            }
        }
        let text = m.encode();
        let refused = text.lines().filter(|l| l.starts_with("tcp_refused_total{")).count();
        assert_eq!(refused, 2, "only refusals of the destination or its TLS are in tcp_refused_total: {text}");
    }

    #[test]
    fn egress_traffic_alone_carries_dst_kind() {
        let m = Metrics::default();
        let egress = TcpLabels {
            direction: Direction::outbound,
            target_addr: "203.0.113.10:80".into(),
            dst_kind: DstKind::egress(true),
            target_cluster: TargetCluster::default(),
            tls: TlsLabel::plaintext(),
        };
        m.tcp_open_total.get_or_create(&egress).inc();
        let mesh = TcpLabels { target_addr: "10.0.0.2:80".into(), dst_kind: DstKind::egress(false), ..egress };
        m.tcp_open_total.get_or_create(&mesh).inc();
        let text = m.encode();
        let egress = "tcp_open_total{direction=\"outbound\",target_addr=\"203.0.113.10:80\",dst_kind=\"egress\",tls=\"false\"} 1";
        assert!(text.contains(egress), "{text}");
        assert!(
            text.contains("tcp_open_total{direction=\"outbound\",target_addr=\"10.0.0.2:80\",tls=\"false\"} 1"),
            "{text}"
        );
    }
}
