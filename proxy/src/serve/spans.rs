//! The proxy's part in distributed tracing, on cnimesh-trace: which requests get spans,
//! what the spans say, and the context the proxy forwards.
//!
//! - Off (no collector configured): [`Shared::tracer`](crate::serve::shared::Shared) is `None`;
//!   the request path checks that `Option` and nothing else: no header is parsed.
//! - On: each request's headers are read once ([`cnimesh_trace::context::extract`]) and the
//!   sampler decides ([`cnimesh_trace::Sampler`]): a sampled parent (W3C or B3) is continued, an
//!   unsampled one gets no spans and its headers go on untouched, a request without context is
//!   traced only if the sampling ratio picks it (0 by default). A malformed header counts as
//!   absent and is forwarded as received (the proxy rewrites trace headers only for a request it
//!   traces; then the ones it writes replace them).
//! - Whose decision: an inbound client's trace context is followed only when the client proved a
//!   mesh identity (mTLS). Anyone else's trace headers are all removed, whatever their format,
//!   count or validity, and the ratio decides as for a request without them: picked, the app gets
//!   a new trace of the proxy's; not, no trace header at all ([`cnimesh_trace::Caller`]), so the
//!   app's tracer cannot continue the trace as sampled either. Outbound, the decision is this
//!   pod's own app's.
//! - A budget: at most `CNIMESH_PROXY_TRACE_SPAN_BUDGET` requests a second are traced per proxy
//!   (a token bucket, the rate limiter's GCRA), so no client, meshed or not, can make the proxy
//!   export more than that; a request over it is not traced (its headers go on untouched).
//! - Inbound: one SERVER span per request; the app receives `traceparent` naming that span.
//!   A multicluster gateway: one SERVER span per forwarded request (`cnimesh.direction` =
//!   `gateway`), child of the calling cluster's CLIENT span and parent of the target's SERVER span.
//!   Outbound: one CLIENT span per request; when a route retries, each try (the first one too)
//!   is a CLIENT child of it, the request span gets a `retry` event per retry, and the next hop's
//!   parent is the try's span. Route and per-try timeouts add a `timeout` event.
//! - Forwarded context: same trace id, the proxy's span as parent, `tracestate` as received,
//!   `traceparent` always written; a request that came with B3 also gets B3 in the same form
//!   (single or multi) with the same ids (see [`cnimesh_trace::context::inject`]).
//! - A request's span ends when its response body ends (so a gRPC status from the trailers is
//!   in it), or, if the request is abandoned first (its client reset it: a peer's timeout), then,
//!   as `cancelled`; a try's span ends when the try's response head arrives.
//!
//! Attributes (OpenTelemetry HTTP semantic conventions where one exists): `http.request.method`,
//! `url.path`, `network.protocol.version` (as received), `server.address`/`server.port` (the request's authority), `network.peer.address`/
//! `network.peer.port` (the client inbound, the endpoint outbound), `http.route` (the route's name
//! when a route took the request), `http.response.status_code`, `rpc.grpc.status_code`,
//! `http.request.resend_count` (tries after the first), `error.type`; and cnimesh's:
//! `cnimesh.direction`, `cnimesh.tls`, `cnimesh.client.identity`, `cnimesh.server.identity`,
//! `cnimesh.target.service` (the Service the request went to, a route's backend included),
//! `k8s.pod.name`, `k8s.namespace.name`.

use std::net::SocketAddr;
use std::sync::Arc;

use cnimesh_trace::{Caller, Decision, Exporter, ExporterConfig, Sampler, Span, SpanKind};
use http::Request;

use crate::http::trace::Traced;
use crate::inbound::policy::metrics::Resource;
use crate::inbound::policy::ratelimit::{Limiter, RateLimit};
use crate::serve::metrics::{Direction, TlsLabel};
use std::path::PathBuf;

/// Where the proxy's spans go and which untraced requests start a trace (cnimesh-trace's crate
/// docs have the contract).
#[derive(Debug, Clone)]
pub struct TraceConfig {
    /// `CNIMESH_PROXY_TRACE_COLLECTOR`: the OTLP/gRPC collector.
    pub collector: cnimesh_trace::Collector,
    /// `CNIMESH_PROXY_TRACE_SAMPLING`: the share of requests *without* trace context that start a
    /// trace (0 by default: only requests that arrive traced are).
    pub sampling: f64,
    /// `CNIMESH_PROXY_TRACE_COLLECTOR_CA_FILE`: PEM roots for an https collector (default: the
    /// system's).
    pub ca_file: Option<PathBuf>,
    /// `CNIMESH_PROXY_TRACE_SPAN_BUDGET`: requests this proxy records spans for per second,
    /// whatever its clients ask for (a token bucket with a burst of one second's worth).
    pub span_budget: u32,
    /// `CNIMESH_POD_NAME`, `CNIMESH_POD_NAMESPACE` (set by the injector): span and resource attributes.
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
}

/// The resource's `service.name` for every proxy.
pub const SERVICE_NAME: &str = "cnimesh-proxy";

/// The exporter and the sampling rule, shared by every connection.
pub struct Tracer {
    exporter: Arc<Exporter>,
    sampler: Sampler,
    /// The span budget: one bucket for every request of this proxy.
    budget: Arc<Limiter>,
    pod: Option<String>,
    namespace: Option<String>,
    /// This proxy's own identity (the server's inbound, the client's outbound).
    identity: Option<String>,
}

impl Tracer {
    /// Starts the exporter task (on the current runtime). Fails only on a CA file that cannot be
    /// used; a collector that is down costs dropped spans, not a start-up failure.
    pub fn spawn(config: &TraceConfig, identity: Option<String>) -> Result<Arc<Tracer>, cnimesh_trace::ConfigError> {
        let mut exporter = ExporterConfig::new(&config.collector.to_string(), SERVICE_NAME)?
            .with_resource("k8s.pod.name", config.pod_name.as_deref().unwrap_or_default())
            .with_resource("k8s.namespace.name", config.pod_namespace.as_deref().unwrap_or_default())
            .with_resource("cnimesh.identity", identity.as_deref().unwrap_or_default());
        if let Some(ca) = &config.ca_file {
            exporter = exporter.with_ca_file(ca);
        }
        Ok(Arc::new(Tracer {
            exporter: Arc::new(Exporter::spawn(exporter)?),
            sampler: Sampler::new(config.sampling),
            budget: Arc::new(span_budget(config.span_budget)),
            pod: config.pod_name.clone(),
            namespace: config.pod_namespace.clone(),
            identity,
        }))
    }

    /// The exporter (its counts are the `trace_spans_*` metrics).
    pub fn exporter(&self) -> &Exporter {
        &self.exporter
    }

    /// The span budget (`trace_span_budget_full` reads it at each scrape).
    pub fn budget(&self) -> Arc<Limiter> {
        self.budget.clone()
    }
}

/// The bucket of `per_second` traced requests (the Server rate limit's, one `total` scope).
fn span_budget(per_second: u32) -> Limiter {
    Limiter::new(&RateLimit {
        meta: Resource::new("", "trace", "span-budget"),
        total: Some(per_second),
        identity: None,
        overrides: Vec::new(),
    })
}

/// What a connection knows that a request's span reports.
pub struct ConnInfo<'a> {
    pub direction: Direction,
    /// The client (inbound: the peer; outbound: the app).
    pub peer: SocketAddr,
    /// The connection's TLS (inbound: the client's; outbound, a gateway's too: the target's).
    pub tls: &'a TlsLabel,
    /// Outbound: the Service the connection's target balances over.
    pub service: Option<&'a str>,
    /// A gateway's connection (outbound to this cluster's Service): the calling proxy's verified
    /// identity. Its span is the hop's SERVER span, so a cross-cluster trace runs client →
    /// gateway → target without a gap.
    pub gateway_client: Option<&'a str>,
}

/// The span of a request with `req`'s headers, or `None` when it is not sampled (an untrusted
/// client's request that asked for a trace is then marked not sampled).
pub fn start<B>(
    tracer: &Arc<Tracer>,
    req: &mut Request<B>,
    authority: fn(&Request<B>) -> &str,
    conn: &ConnInfo<'_>,
) -> Option<Box<Traced>> {
    // Inbound, only a client that proved a mesh identity decides; outbound, the app does.
    let caller = match conn.direction {
        Direction::inbound if conn.tls.client_id.is_none() => Caller::Untrusted,
        _ => Caller::Trusted,
    };
    let (parent, b3) = match tracer.sampler.decide_for(req.headers_mut(), caller) {
        Decision::Record { parent, b3 } => (parent, b3),
        Decision::Skip => return None,
    };
    if tracer.budget.check(None).is_err() {
        return None;
    }
    let req: &Request<B> = req;
    let authority = authority(req);
    let kind = match conn.direction {
        Direction::inbound => SpanKind::Server,
        Direction::outbound if conn.gateway_client.is_some() => SpanKind::Server,
        Direction::outbound => SpanKind::Client,
    };
    let method = req.method().as_str().to_string();
    let mut span = Span::start(method.clone(), kind, parent);
    span.set("http.request.method", method);
    span.set("url.path", req.uri().path().to_string());
    // As received: an inbound `2` under an app that saw HTTP/1.1 is the `l5d-orig-proto` hop.
    span.set(
        "network.protocol.version",
        match req.version() {
            http::Version::HTTP_2 => "2",
            http::Version::HTTP_10 => "1.0",
            _ => "1.1",
        },
    );
    let (host, port) = split_authority(authority);
    if !host.is_empty() {
        span.set("server.address", host.to_string());
    }
    if let Some(port) = port {
        span.set("server.port", i64::from(port));
    }
    let direction = match conn.direction {
        Direction::inbound => "inbound",
        Direction::outbound if conn.gateway_client.is_some() => "gateway",
        Direction::outbound => "outbound",
    };
    span.set("cnimesh.direction", direction);
    span.set("cnimesh.tls", conn.tls.tls);
    // The serving side (inbound, or a gateway, whose client is another cluster's proxy with its
    // verified identity) names its peer and itself as the server; the calling side names itself
    // as the client and the target's identity as the server.
    let (client, server) = match (conn.direction, conn.gateway_client) {
        (Direction::inbound, _) | (Direction::outbound, Some(_)) => {
            span.set("network.peer.address", conn.peer.ip().to_string());
            span.set("network.peer.port", i64::from(conn.peer.port()));
            (conn.gateway_client.or(conn.tls.client_id.as_deref()), tracer.identity.as_deref())
        }
        (Direction::outbound, None) => (tracer.identity.as_deref(), conn.tls.server_id.as_deref()),
    };
    if let Some(id) = client {
        span.set("cnimesh.client.identity", id.to_string());
    }
    if let Some(id) = server {
        span.set("cnimesh.server.identity", id.to_string());
    }
    // Outbound (a gateway too): the Service the request goes to.
    if conn.direction == Direction::outbound
        && let Some(service) = conn.service
    {
        span.set("cnimesh.target.service", service.to_string());
    }
    if let Some(pod) = &tracer.pod {
        span.set("k8s.pod.name", pod.clone());
    }
    if let Some(ns) = &tracer.namespace {
        span.set("k8s.namespace.name", ns.clone());
    }
    Some(Traced::new(span, b3, tracer.exporter.clone()))
}

/// `host` and `port` of an authority (`[v6]:port`, `host:port`, `host`).
fn split_authority(authority: &str) -> (&str, Option<u16>) {
    if let Some(rest) = authority.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((host, port)) => (host, port.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (authority, None),
        };
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => (host, port.parse().ok()),
        _ => (authority, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_into_host_and_port() {
        assert_eq!(split_authority("web.shop.svc.cluster.local:8080"), ("web.shop.svc.cluster.local", Some(8080)));
        assert_eq!(split_authority("web"), ("web", None));
        assert_eq!(split_authority("[fd00::1]:80"), ("fd00::1", Some(80)));
        assert_eq!(split_authority("fd00::1"), ("fd00::1", None));
        assert_eq!(split_authority(""), ("", None));
    }

    /// A tracer whose collector is down (spans are dropped): only what `start` decides is read.
    fn tracer(identity: &str) -> Arc<Tracer> {
        let config = TraceConfig {
            collector: "http://127.0.0.1:9".parse().unwrap(),
            sampling: 0.0,
            ca_file: None,
            span_budget: 100,
            pod_name: None,
            pod_namespace: None,
        };
        Tracer::spawn(&config, Some(identity.to_string())).unwrap()
    }

    fn attribute<'s>(span: &'s Span, key: &str) -> Option<&'s cnimesh_trace::Value> {
        span.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    #[tokio::test]
    async fn a_gateways_span_is_the_hops_server_span_child_of_the_calling_clusters_and_naming_its_identity() {
        const GATEWAY: &str = "cnimesh-gateway.cnimesh-multicluster.serviceaccount.identity.cnimesh.west.local";
        const CALLER: &str = "web.shop.serviceaccount.identity.cnimesh.east.local";
        let tracer = tracer(GATEWAY);
        let mut req = Request::get("/")
            .header("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .body(())
            .unwrap();
        // As the gateway holds them: the TLS of its connection to the target, the caller apart.
        let tls = TlsLabel {
            tls: true,
            client_id: None,
            server_id: Some("api.shop.serviceaccount.identity.cnimesh.west.local".into()),
        };
        let conn = ConnInfo {
            direction: Direction::outbound,
            peer: "10.2.0.9:40000".parse().unwrap(),
            tls: &tls,
            service: Some("api.shop.svc.west.local"),
            gateway_client: Some(CALLER),
        };
        let traced = start(&tracer, &mut req, |_| "api.shop.svc.west.local:80", &conn).expect("the caller sampled it");
        let span = &traced.span;
        assert_eq!(span.kind, SpanKind::Server);
        assert_eq!(span.trace_id.to_string(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(span.parent.map(|p| p.to_string()).as_deref(), Some("b7ad6b7169203331"));
        let text = |key| match attribute(span, key) {
            Some(cnimesh_trace::Value::Str(s)) => s.to_string(),
            other => panic!("{key}: {other:?}"),
        };
        assert_eq!(text("cnimesh.direction"), "gateway");
        assert_eq!(text("cnimesh.client.identity"), CALLER);
        assert_eq!(text("cnimesh.server.identity"), GATEWAY);
        assert_eq!(text("cnimesh.target.service"), "api.shop.svc.west.local");
        assert_eq!(text("network.peer.address"), "10.2.0.9");
    }
}
