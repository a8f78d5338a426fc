//! The control plane's own spans: one SERVER span per gRPC call on the port
//! (Identity, Destination, inbound and outbound policy), continuing the caller's trace when the
//! call carries a sampled `traceparent` (or B3), else started at the configured ratio. Exported by
//! cnimesh-trace's [`Exporter`], the one exporter of the workspace: bounded queue, drops counted,
//! never blocking a call. Without `CNIMESH_CONTROL_TRACE_COLLECTOR` nothing here exists.
//!
//! A span ends when its response body does: for Destination's and policy's watch streams that is
//! when the stream closes, so the span's duration is how long the proxy followed that resource.
//! Attributes follow OpenTelemetry's RPC conventions: `rpc.system`, `rpc.service`, `rpc.method`,
//! `rpc.grpc.status_code`, `network.peer.address`/`.port`, plus `cnimesh.client.identity` (the
//! caller's mesh identity, when it presented one).
//!
//! Layer: gRPC (used by [`super::serve_tls`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use cnimesh_identity::Name;
use cnimesh_trace::export::parse_sampling;
use cnimesh_trace::{ConfigError, Exporter, ExporterConfig, Sampler, Span, Status};

/// `service.name` of the control plane's spans.
pub const SERVICE_NAME: &str = "cnimesh-control";

/// Where and how the control plane traces (`serve --trace-collector`, `--trace-sampling`).
#[derive(Debug, Clone)]
pub struct TraceConfig {
    /// `host:port`, `http://host:port` or `https://host:port`.
    pub collector: String,
    /// Ratio of calls without trace context that start a trace (`0` to `1`).
    pub sampling: String,
    /// PEM roots for an https collector.
    pub ca_file: Option<PathBuf>,
    /// Resource attributes: the control plane's pod, namespace and identity.
    pub pod: String,
    pub namespace: String,
    pub identity: String,
}

/// The spans' exporter and sampler; cheap to clone.
#[derive(Debug, Clone)]
pub struct GrpcTracing {
    exporter: Exporter,
    sampler: Sampler,
}

impl GrpcTracing {
    /// Checks the configuration and starts the exporter (on the current tokio runtime).
    pub fn spawn(config: &TraceConfig) -> Result<Self, ConfigError> {
        let sampler = Sampler::new(parse_sampling("CNIMESH_CONTROL_TRACE_SAMPLING", &config.sampling)?);
        let mut exporter = ExporterConfig::new(&config.collector, SERVICE_NAME)?
            .with_resource("k8s.pod.name", &config.pod)
            .with_resource("k8s.namespace.name", &config.namespace)
            .with_resource("cnimesh.identity", &config.identity);
        if let Some(ca) = &config.ca_file {
            exporter = exporter.with_ca_file(ca);
        }
        Ok(Self { exporter: Exporter::spawn(exporter)?, sampler })
    }

    /// The exporter's counts (exported, dropped), for tests and logs.
    pub fn exporter(&self) -> &Exporter {
        &self.exporter
    }

    /// A span for this call, if it is traced: the caller's context decides, else the ratio.
    pub fn start<B>(&self, request: &http::Request<B>, peer: SocketAddr, identity: Option<&Name>) -> Option<InFlight> {
        let path = request.uri().path();
        let name = path.trim_start_matches('/').to_string();
        let mut span = self.sampler.server_span(request.headers(), name)?;
        let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or((path, ""));
        span.set("rpc.system", "grpc");
        span.set("rpc.service", service.to_string());
        span.set("rpc.method", method.to_string());
        span.set("network.peer.address", peer.ip().to_string());
        span.set("network.peer.port", i64::from(peer.port()));
        if let Some(identity) = identity {
            span.set("cnimesh.client.identity", identity.to_string());
        }
        Some(InFlight { span: Some(span), exporter: self.exporter.clone(), status: None })
    }
}

/// A call's span until its response ends; dropped, it is ended and handed to the exporter.
#[derive(Debug)]
pub struct InFlight {
    span: Option<Span>,
    exporter: Exporter,
    status: Option<i64>,
}

impl InFlight {
    /// Reads `grpc-status` from response headers (a trailers-only answer) or trailers.
    pub fn observe(&mut self, headers: &http::HeaderMap) {
        if let Some(code) = headers.get("grpc-status").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()) {
            self.status = Some(code);
        }
    }

    /// Ends the span with a refusal of the port itself (no service was called).
    pub fn refused(mut self, status: &tonic::Status) {
        self.status = Some(status.code() as i64);
        if let Some(span) = &mut self.span {
            span.set("cnimesh.refused", status.message().to_string());
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(mut span) = self.span.take() else { return };
        // A stream the client reset has no trailers: its status is CANCELLED (1).
        let code = self.status.unwrap_or(1);
        span.set("rpc.grpc.status_code", code);
        if code != 0 {
            span.status = Status::Error(format!("gRPC status {code}"));
        }
        span.end();
        self.exporter.record(span);
    }
}
