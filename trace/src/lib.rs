//! Distributed tracing for cnimesh: trace context propagation, a span model, a
//! batching OTLP/gRPC exporter, and an in-process OTLP/gRPC receiver.
//!
//! Layers: context → span → export → receiver
//!
//! - [`context`]: W3C `traceparent`/`tracestate` and B3 (single `b3`, multi `X-B3-*`) read
//!   from and written to HTTP headers. Malformed values are treated as absent, never an error.
//! - [`span`]: [`Span`] (ids, parent, name, kind, times, attributes, events, status) → OTLP,
//!   and the [`Sampler`]: a parent's sampled flag is obeyed; a ratio applies only to requests
//!   without any context. [`Sampler::server_span`] gives a SERVER span from a request's headers
//!   (a tonic server passes `request.metadata().as_ref()`).
//! - [`export`]: [`Exporter`], a tokio task fed by a bounded queue; [`Exporter::record`] never
//!   blocks (a full queue drops and counts); batches go out as OTLP/gRPC `TraceService/Export`
//!   calls, retried with backoff; [`Exporter::counts`] feeds metrics.
//! - [`receiver`]: [`Receiver`], a real OTLP/gRPC collector in process for tests and local mode.
//!
//! # Configuration (the contract with the injector, the control plane and local mode)
//!
//! | env | meaning |
//! | --- | --- |
//! | `CNIMESH_PROXY_TRACE_COLLECTOR` | OTLP/gRPC collector: `http://host:port`, `https://host:port`, or bare `host:port` (= http). No path. Unset or empty: tracing off (no spans, no exporter task, trace headers forwarded untouched). |
//! | `CNIMESH_PROXY_TRACE_SAMPLING` | ratio 0.0–1.0 of requests *without* trace context that start a trace; default 0. Requests with context follow their parent's sampled flag. |
//! | `CNIMESH_PROXY_TRACE_COLLECTOR_CA_FILE` | PEM roots to verify an https collector (default: the system's roots). |
//! | `CNIMESH_CONTROL_TRACE_COLLECTOR`, `CNIMESH_CONTROL_TRACE_SAMPLING` | the same for the control plane. |
//!
//! Values are parsed by [`export::Collector`]'s `FromStr` and [`export::parse_sampling`]; errors
//! name the bad value. Resource attributes: `service.name` (`cnimesh-proxy` for the proxy), plus
//! `k8s.pod.name`, `k8s.namespace.name` and `cnimesh.identity` from `CNIMESH_POD_NAME`,
//! `CNIMESH_POD_NAMESPACE` and the proxy's identity name.
//!
//! Exporter defaults: queue 2048 spans, batches of up to 512 spans or 1 s after the first span,
//! up to [`export::MAX_ATTEMPTS`] attempts per batch (retrying OTLP's transient codes and an
//! unreachable collector) with jittered exponential backoff from 200 ms capped at 30 s, 10 s per
//! call. Spans lost to a full queue or a batch that failed for good count as `dropped`.
//!
//! # What the proxy does with it (cnimesh-proxy's `app::spans`)
//!
//! - Tracing off: no spans, no exporter task, no header parsed; trace headers pass untouched.
//! - A request with a sampled parent (W3C, else B3) is continued: inbound, one SERVER span whose
//!   parent is the caller's span; outbound, one CLIENT span under the app's span. An unsampled
//!   parent (`-00`, `b3: …-0`, `b3: 0`) gets no spans and its headers go on untouched. A request
//!   without context is traced only when `CNIMESH_PROXY_TRACE_SAMPLING` picks it (then it is a
//!   new trace, root span in the proxy). `b3: 1`/`d` alone asks for a new trace.
//! - Malformed trace headers are treated as absent: no spans from them, and they are forwarded as
//!   received (the proxy rewrites trace headers only on requests it traces).
//! - Forwarded downstream: the same trace id with the proxy's span as parent, `traceparent`
//!   always, `tracestate` as received; a request that came with B3 also gets B3 in the form it
//!   came in (single or multi; `X-B3-ParentSpanId` dropped, a 64-bit B3 trace id widened to 128
//!   bits) with the same ids as `traceparent`.
//! - Retries (a route's retry policy): each try is a CLIENT child of the request's span and the
//!   next hop's parent; the request span gets a `retry` event per retry; route and per-try
//!   timeouts add a `timeout` event. A route split records the chosen backend
//!   (`cnimesh.target.service`) and the route (`http.route`, span name `METHOD route`).
//! - A span ends with its response body (gRPC trailers included); a request abandoned first
//!   (a peer's timeout reset it) is exported as `cancelled`.
//! - Metrics: `trace_spans_exported_total`, `trace_spans_dropped_total` on the admin port.
//!
//! # Using it
//!
//! ```no_run
//! # async fn demo(headers: http::HeaderMap) -> Result<(), Box<dyn std::error::Error>> {
//! use cnimesh_trace::{Exporter, ExporterConfig, Sampler};
//! let config = ExporterConfig::new("http://otel-collector.tracing:4317", "cnimesh-control")?
//!     .with_resource("k8s.namespace.name", "cnimesh");
//! let exporter = Exporter::spawn(config)?; // on a tokio runtime
//! let sampler = Sampler::new(cnimesh_trace::export::parse_sampling("CNIMESH_CONTROL_TRACE_SAMPLING", "0")?);
//! if let Some(mut span) = sampler.server_span(&headers, "/io.linkerd.proxy.destination.Destination/Get") {
//!     span.set("rpc.system", "grpc");
//!     span.end();
//!     exporter.record(span);
//! }
//! # Ok(()) }
//! ```
//!
//! # Dependencies: what opentelemetry-proto brings in
//!
//! `opentelemetry-proto` 0.33.1 (prost 0.14 and tonic 0.14, ours) with default features off and
//! only `gen-tonic` + `trace`: the trace and collector messages and the TraceService client and
//! server. Its `trace` feature also links `opentelemetry` and `opentelemetry_sdk` (trace only,
//! no default features) for its conversions from SDK types, which we do not use; they add
//! `futures-executor`, `rand_chacha` and `ppv-lite86` to the build and turn on rand's std
//! generator. No runtime cost (no SDK pipeline, no background thread: nothing of theirs is
//! called), some compile time; the alternative, hand-written prost messages, would duplicate a
//! wire format the collector defines. Everything else (tonic, hyper, rustls on aws-lc-rs) was
//! already in the proxy.

pub mod context;
pub mod export;
pub mod receiver;
pub mod span;

pub use context::{B3Form, Incoming, SpanContext, SpanId, TraceId};
pub use export::{Collector, ConfigError, Counts, Exporter, ExporterConfig};
pub use receiver::{ReceivedSpan, Receiver};
pub use span::{Caller, Decision, Parent, Sampler, Span, SpanKind, Status, Value};
