//! An in-process OTLP/gRPC collector: a tonic `TraceService` server that keeps every span it
//! receives as a plain [`ReceivedSpan`] (ids as lowercase hex, attributes as strings), and
//! optionally appends each as one JSON line to a file. The e2e tests assert on it, and local
//! mode uses it as its collector stand-in. It is a real gRPC server on a real socket: the
//! proxies under test export to it exactly as they would to an OpenTelemetry Collector.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::{Notify, oneshot};

use crate::context::hex;

/// One received span, flattened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// `None` for a root span.
    pub parent_span_id: Option<String>,
    pub name: String,
    /// `server`, `client`, `internal`, `producer`, `consumer` or `unspecified`.
    pub kind: String,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// Attributes, every value as a string (`true`, `503`, …).
    pub attributes: BTreeMap<String, String>,
    /// Event names in order.
    pub events: Vec<String>,
    /// `unset`, `ok` or `error: message`.
    pub status: String,
    pub trace_state: String,
    /// The resource attributes of the batch (`service.name`, `k8s.pod.name`, …).
    pub resource: BTreeMap<String, String>,
}

impl ReceivedSpan {
    /// An attribute's value.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// A bad receiver file sink or address.
#[derive(Debug, thiserror::Error)]
pub enum ReceiverError {
    #[error("binding the trace receiver to {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("opening the span file {}: {source}", path.display())]
    File { path: PathBuf, source: std::io::Error },
}

/// `wait_for` gave up.
#[derive(Debug, thiserror::Error)]
#[error("waited {waited:?} for {wanted} spans; received {got}")]
pub struct WaitTimeout {
    pub wanted: usize,
    pub got: usize,
    pub waited: Duration,
}

struct Shared {
    spans: Mutex<Vec<ReceivedSpan>>,
    exports: Mutex<u64>,
    /// Spans received, kept or not.
    received: AtomicU64,
    /// Off: spans are counted only (a benchmark's hundreds of thousands would fill memory).
    keep: AtomicBool,
    file: Option<Mutex<std::fs::File>>,
    notify: Notify,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            spans: Mutex::default(),
            exports: Mutex::default(),
            received: AtomicU64::new(0),
            keep: AtomicBool::new(true),
            file: None,
            notify: Notify::new(),
        }
    }
}

/// The running receiver; stops serving when dropped.
pub struct Receiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _stop: oneshot::Sender<()>,
}

impl Receiver {
    /// Serves on `addr` (port 0: any) on the current tokio runtime.
    pub async fn bind(addr: SocketAddr) -> Result<Receiver, ReceiverError> {
        Self::start(addr, None).await
    }

    /// The same, appending every span as one JSON line to `path` (created if missing).
    pub async fn bind_with_file(addr: SocketAddr, path: &Path) -> Result<Receiver, ReceiverError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| ReceiverError::File { path: path.to_path_buf(), source })?;
        Self::start(addr, Some(file)).await
    }

    /// Serves on a listener bound elsewhere (e.g. inside a pod's network namespace, where a
    /// socket stays when the thread that made it leaves), optionally with a JSON-lines file.
    /// Needs a tokio runtime's context.
    pub fn from_listener(listener: std::net::TcpListener, file: Option<&Path>) -> Result<Receiver, ReceiverError> {
        let unknown = SocketAddr::from(([0, 0, 0, 0], 0));
        let addr = listener.local_addr().map_err(|source| ReceiverError::Bind { addr: unknown, source })?;
        let file = match file {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|source| ReceiverError::File { path: path.to_path_buf(), source })?,
            ),
            None => None,
        };
        listener.set_nonblocking(true).map_err(|source| ReceiverError::Bind { addr, source })?;
        let listener =
            tokio::net::TcpListener::from_std(listener).map_err(|source| ReceiverError::Bind { addr, source })?;
        Ok(Self::serve(listener, addr, file))
    }

    async fn start(addr: SocketAddr, file: Option<std::fs::File>) -> Result<Receiver, ReceiverError> {
        let listener =
            tokio::net::TcpListener::bind(addr).await.map_err(|source| ReceiverError::Bind { addr, source })?;
        let local = listener.local_addr().map_err(|source| ReceiverError::Bind { addr, source })?;
        Ok(Self::serve(listener, local, file))
    }

    fn serve(listener: tokio::net::TcpListener, local: SocketAddr, file: Option<std::fs::File>) -> Receiver {
        let shared = Arc::new(Shared { file: file.map(Mutex::new), ..Shared::default() });
        let (stop, stopped) = oneshot::channel::<()>();
        let service = TraceServiceServer::new(Service(shared.clone()));
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(error) = result {
                tracing::warn!(%error, "trace receiver stopped");
            }
        });
        Receiver { addr: local, shared, _stop: stop }
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The collector address for an exporter: `http://ip:port`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.shared.spans.lock().clone()
    }

    /// Whether spans are kept for [`Receiver::spans`] (default) or only counted.
    pub fn keep_spans(&self, keep: bool) {
        self.shared.keep.store(keep, Ordering::Relaxed);
    }

    /// How many spans arrived, kept or not.
    pub fn received(&self) -> u64 {
        self.shared.received.load(Ordering::Relaxed)
    }

    /// How many Export calls arrived (empty ones included).
    pub fn exports(&self) -> u64 {
        *self.shared.exports.lock()
    }

    /// Waits until at least `n` spans have arrived, at most `timeout`; returns them all.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Result<Vec<ReceivedSpan>, WaitTimeout> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.notify.notified();
            {
                let spans = self.shared.spans.lock();
                if spans.len() >= n {
                    return Ok(spans.clone());
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(WaitTimeout { wanted: n, got: self.shared.spans.lock().len(), waited: timeout });
            }
        }
    }
}

struct Service(Arc<Shared>);

#[tonic::async_trait]
impl TraceService for Service {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans.resource.map(|r| strings(&r.attributes)).unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    received.push(ReceivedSpan {
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: (!span.parent_span_id.is_empty()).then(|| hex(&span.parent_span_id)),
                        name: span.name,
                        kind: match SpanKind::try_from(span.kind).unwrap_or(SpanKind::Unspecified) {
                            SpanKind::Unspecified => "unspecified",
                            SpanKind::Internal => "internal",
                            SpanKind::Server => "server",
                            SpanKind::Client => "client",
                            SpanKind::Producer => "producer",
                            SpanKind::Consumer => "consumer",
                        }
                        .into(),
                        start_unix_nano: span.start_time_unix_nano,
                        end_unix_nano: span.end_time_unix_nano,
                        attributes: strings(&span.attributes),
                        events: span.events.into_iter().map(|e| e.name).collect(),
                        status: match span.status {
                            None => "unset".into(),
                            Some(s) if s.code == 1 => "ok".into(),
                            Some(s) if s.code == 2 => format!("error: {}", s.message),
                            Some(_) => "unset".into(),
                        },
                        trace_state: span.trace_state,
                        resource: resource.clone(),
                    });
                }
            }
        }
        if let Some(file) = &self.0.file {
            let mut file = file.lock();
            for span in &received {
                let line = serde_json::to_string(span).expect("plain strings and numbers serialize");
                if let Err(error) = writeln!(file, "{line}") {
                    tracing::warn!(%error, "writing a received span");
                }
            }
        }
        *self.0.exports.lock() += 1;
        self.0.received.fetch_add(received.len() as u64, Ordering::Relaxed);
        if self.0.keep.load(Ordering::Relaxed) {
            self.0.spans.lock().extend(received);
        }
        self.0.notify.notify_waiters();
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn strings(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    attributes.iter().map(|kv| (kv.key.clone(), kv.value.as_ref().map(string).unwrap_or_default())).collect()
}

fn string(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BytesValue(b)) => hex(b),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{Exporter, ExporterConfig};
    use crate::span::{Parent, Span, SpanKind as Kind};

    const WAIT: Duration = Duration::from_secs(10);

    /// The whole path in one process: spans recorded on an exporter arrive at a receiver over
    /// real OTLP/gRPC, with their links, attributes, events and resource, and in the file sink.
    #[tokio::test]
    async fn spans_recorded_on_an_exporter_arrive_at_the_receiver_and_in_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("spans.jsonl");
        let receiver = Receiver::bind_with_file("127.0.0.1:0".parse().unwrap(), &file).await.unwrap();
        let config = ExporterConfig::new(&receiver.endpoint(), "cnimesh-proxy")
            .unwrap()
            .with_resource("k8s.pod.name", "web-0")
            .with_resource("k8s.namespace.name", "")
            .with_batch(2, Duration::from_millis(50));
        let exporter = Exporter::spawn(config).unwrap();
        let mut server = Span::start("GET /", Kind::Server, Parent::Root);
        server.set("http.response.status_code", 200u16);
        let mut client = server.child("GET", Kind::Client);
        client.event("retry", Vec::new());
        client.end();
        server.end();
        exporter.record(client.clone());
        exporter.record(server.clone());
        let spans = receiver.wait_for(2, WAIT).await.unwrap();
        let by_name = |n: &str| spans.iter().find(|s| s.name == n).unwrap().clone();
        let (s, c) = (by_name("GET /"), by_name("GET"));
        assert_eq!(s.parent_span_id, None);
        assert_eq!(c.parent_span_id.as_deref(), Some(s.span_id.as_str()));
        assert_eq!((s.kind.as_str(), c.kind.as_str()), ("server", "client"));
        assert_eq!(s.attr("http.response.status_code"), Some("200"));
        assert_eq!(c.events, ["retry"]);
        assert_eq!(s.resource.get("service.name").map(String::as_str), Some("cnimesh-proxy"));
        assert_eq!(s.resource.get("k8s.pod.name").map(String::as_str), Some("web-0"));
        assert!(!s.resource.contains_key("k8s.namespace.name"), "empty values are left out");
        assert_eq!(s.trace_id, server.trace_id.to_hex());
        let lines = std::fs::read_to_string(&file).unwrap();
        assert_eq!(lines.lines().count(), 2);
        let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
        assert_eq!(first["trace_id"], server.trace_id.to_hex());
        let deadline = tokio::time::Instant::now() + WAIT;
        while exporter.counts().exported < 2 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(exporter.counts().exported, 2);
        assert_eq!(exporter.counts().dropped, 0);
    }

    /// A collector that is not there never blocks `record`: the batch is retried, then dropped
    /// and counted, and spans beyond the queue are dropped and counted at once.
    #[tokio::test]
    async fn a_collector_that_is_down_costs_dropped_spans_not_blocked_callers() {
        // A port that was just free: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config = ExporterConfig::new(&format!("127.0.0.1:{port}"), "test")
            .unwrap()
            .with_queue_capacity(4)
            .with_batch(1, Duration::from_millis(1));
        let exporter = Exporter::spawn(config).unwrap();
        for _ in 0..100 {
            exporter.record(Span::start("x", Kind::Internal, Parent::Root));
        }
        assert!(exporter.counts().dropped >= 90, "{:?}", exporter.counts());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while exporter.counts().failed_batches < u64::from(crate::export::MAX_ATTEMPTS)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let counts = exporter.counts();
        assert!(counts.failed_batches >= u64::from(crate::export::MAX_ATTEMPTS), "{counts:?}");
        assert_eq!(counts.exported, 0);
    }

    #[tokio::test]
    async fn waiting_for_more_spans_than_arrive_times_out_and_says_how_many_came() {
        let receiver = Receiver::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let error = receiver.wait_for(1, Duration::from_millis(50)).await.unwrap_err();
        assert_eq!((error.wanted, error.got), (1, 0));
        assert_eq!((receiver.exports(), receiver.received()), (0, 0));
    }
}
