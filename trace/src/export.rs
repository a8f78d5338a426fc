//! The exporter: spans go from the request path into a bounded queue ([`Exporter::record`],
//! never blocking: a full queue drops the span and counts it), and one tokio task drains it in
//! batches (at most [`ExporterConfig::batch_size`] spans, or whatever arrived within
//! [`ExporterConfig::batch_interval`] of the batch's first span), sending each as one OTLP/gRPC
//! `TraceService/Export` call. A failed call is retried with jittered exponential backoff
//! (cnimesh-common's) up to [`MAX_ATTEMPTS`] times when the failure is transient (the OTLP
//! spec's retryable codes, and a collector that cannot be reached); then the batch is dropped and
//! counted. The task keeps its backoff across batches, so a collector that stays down is
//! tried at most once per backoff step, not once per batch.
//!
//! The collector is `http://host:port`, `https://host:port`, or bare `host:port` (= http).
//! https verifies the collector's certificate against the PEM roots of a CA file when given, the
//! system's roots otherwise (aws-lc-rs, as everywhere in cnimesh), with the host as the name.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use rustls_pki_types::ServerName;
use rustls_pki_types::pem::PemObject;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

use crate::span::{Span, Value, key_values};

/// Attempts per batch (the first one and its retries) before it is dropped.
pub const MAX_ATTEMPTS: u32 = 5;

/// A bad collector address, sampling ratio or CA file: each names the value it could not use.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "trace collector {0:?}: expected http://host:port, https://host:port or host:port (a host and a port, no path)"
    )]
    Collector(String),
    /// A sampling ratio that is not one: names the variable it was read from and the value.
    #[error("{var}={value:?}: {SAMPLING_EXPECTED}")]
    Sampling { var: String, value: String },
    #[error("trace collector CA file {}: {reason}", path.display())]
    CaFile { path: PathBuf, reason: String },
    #[error("trace collector {0}: no system CA roots could be loaded")]
    NoSystemRoots(String),
}

/// What a sampling ratio may be, for every message that refuses one.
pub const SAMPLING_EXPECTED: &str = "expected a ratio from 0 to 1 (the share of requests without trace context that \
     start a trace), such as 0.05";

/// Parses a sampling ratio (`0`, `0.25`, `1.0`): finite and within 0..=1. `var` is where the
/// text was read from (an environment variable), for the error.
pub fn parse_sampling(var: &str, text: &str) -> Result<f64, ConfigError> {
    match text.trim().parse::<f64>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(ConfigError::Sampling { var: var.to_string(), value: text.to_string() }),
    }
}

/// Where spans go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collector {
    /// `true` for https.
    pub tls: bool,
    /// The host (a name or an IP; IPv6 without brackets): the TLS server name.
    pub host: String,
    pub port: u16,
}

impl Collector {
    /// `host:port`, as connected to (IPv6 in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Collector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", if self.tls { "https" } else { "http" }, self.authority())
    }
}

impl FromStr for Collector {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, ConfigError> {
        let bad = || ConfigError::Collector(text.to_string());
        let trimmed = text.trim();
        let (tls, rest) = if let Some(rest) = trimmed.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = trimmed.strip_prefix("http://") {
            (false, rest)
        } else {
            (false, trimmed)
        };
        // A trailing slash is harmless; any other path is not what OTLP/gRPC takes.
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '@', '?', '#', ' ']) {
            return Err(bad());
        }
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().ok().filter(|p| *p != 0).ok_or_else(bad)?;
        let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) if v6.parse::<std::net::Ipv6Addr>().is_ok() => v6.to_string(),
            Some(_) => return Err(bad()),
            None if host.is_empty() || host.contains([':', '[', ']']) => return Err(bad()),
            None => host.to_string(),
        };
        Ok(Collector { tls, host, port })
    }
}

/// How the exporter sends. Defaults: queue 2048 spans, batches of 512 or 1 s, 30 s backoff cap,
/// 10 s per Export call.
#[derive(Clone, Debug)]
pub struct ExporterConfig {
    pub collector: Collector,
    /// PEM roots for https (default: the system's).
    pub ca_file: Option<PathBuf>,
    /// Resource attributes (`service.name` first).
    pub resource: Vec<(String, String)>,
    pub queue_capacity: usize,
    pub batch_size: usize,
    pub batch_interval: Duration,
    pub max_backoff: Duration,
    pub timeout: Duration,
}

impl ExporterConfig {
    /// A config for `collector` (see [`Collector`]) with `service.name` = `service_name`.
    pub fn new(collector: &str, service_name: &str) -> Result<Self, ConfigError> {
        Ok(ExporterConfig {
            collector: collector.parse()?,
            ca_file: None,
            resource: vec![("service.name".into(), service_name.into())],
            queue_capacity: 2048,
            batch_size: 512,
            batch_interval: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
        })
    }

    /// Verifies an https collector against this file's PEM certificates only.
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Adds a resource attribute (skipped when `value` is empty: an unset env var).
    pub fn with_resource(mut self, key: &str, value: &str) -> Self {
        if !value.is_empty() {
            self.resource.push((key.into(), value.into()));
        }
        self
    }

    /// Sets the batch size and the longest wait for a batch to fill.
    pub fn with_batch(mut self, size: usize, interval: Duration) -> Self {
        self.batch_size = size.max(1);
        self.batch_interval = interval;
        self
    }

    /// Sets the queue capacity (spans waiting for export; beyond it they are dropped).
    pub fn with_queue_capacity(mut self, capacity: usize) -> Self {
        self.queue_capacity = capacity.max(1);
        self
    }
}

/// What the exporter did, for metrics. All counts are of spans except `failed_batches`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Spans the collector accepted.
    pub exported: u64,
    /// Spans lost: the queue was full, or their batch failed for good.
    pub dropped: u64,
    /// Export calls that failed (each retry counts).
    pub failed_batches: u64,
}

#[derive(Debug, Default)]
struct Counters {
    exported: AtomicU64,
    dropped: AtomicU64,
    failed_batches: AtomicU64,
}

/// A cheap, cloneable handle to the export task. The task ends when every handle is dropped,
/// after sending what it holds.
#[derive(Clone, Debug)]
pub struct Exporter {
    tx: mpsc::Sender<Span>,
    counters: Arc<Counters>,
}

/// The export task could not be set up (the CA file or the system roots).
pub type SpawnError = ConfigError;

impl Exporter {
    /// Starts the export task on the current tokio runtime. Reads the CA file (or the system
    /// roots) now, so a bad file is an error at start-up; the collector itself is connected
    /// lazily, so one that is down is not.
    pub fn spawn(config: ExporterConfig) -> Result<Exporter, SpawnError> {
        let channel = channel(&config)?;
        let (tx, rx) = mpsc::channel(config.queue_capacity);
        let counters = Arc::new(Counters::default());
        tokio::spawn(run(rx, TraceServiceClient::new(channel), config, counters.clone()));
        Ok(Exporter { tx, counters })
    }

    /// Queues `span` for export; never waits. A full queue (or a stopped task) drops it.
    pub fn record(&self, span: Span) {
        if self.tx.try_send(span).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        Counts {
            exported: self.counters.exported.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
            failed_batches: self.counters.failed_batches.load(Ordering::Relaxed),
        }
    }
}

async fn run(
    mut rx: mpsc::Receiver<Span>,
    mut client: TraceServiceClient<Channel>,
    config: ExporterConfig,
    counters: Arc<Counters>,
) {
    let resource = Resource {
        attributes: key_values(
            &config.resource.iter().map(|(k, v)| (k.clone().into(), Value::from(v.clone()))).collect::<Vec<_>>(),
        ),
        dropped_attributes_count: 0,
        entity_refs: Vec::new(),
    };
    let mut backoff = Duration::ZERO;
    let mut batch = Vec::with_capacity(config.batch_size);
    loop {
        let Some(first) = rx.recv().await else { return };
        batch.push(first);
        let deadline = tokio::time::Instant::now() + config.batch_interval;
        while batch.len() < config.batch_size {
            tokio::select! {
                next = rx.recv() => match next {
                    Some(span) => batch.push(span),
                    None => break,
                },
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "cnimesh".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        attributes: Vec::new(),
                        dropped_attributes_count: 0,
                    }),
                    spans: batch.drain(..).map(|s| s.to_proto()).collect(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        let count = request.resource_spans[0].scope_spans[0].spans.len() as u64;
        match send(&mut client, request, &config, &counters, &mut backoff).await {
            Ok(rejected) => {
                counters.exported.fetch_add(count.saturating_sub(rejected), Ordering::Relaxed);
                counters.dropped.fetch_add(rejected.min(count), Ordering::Relaxed);
            }
            Err(status) => {
                counters.dropped.fetch_add(count, Ordering::Relaxed);
                tracing::warn!(collector = %config.collector, spans = count, error = %status, "trace batch dropped");
            }
        }
    }
}

/// One batch, retried while the failure is transient. Returns the spans the collector rejected.
async fn send(
    client: &mut TraceServiceClient<Channel>,
    request: ExportTraceServiceRequest,
    config: &ExporterConfig,
    counters: &Counters,
    backoff: &mut Duration,
) -> Result<u64, tonic::Status> {
    let mut attempt = 1;
    loop {
        let mut call = tonic::Request::new(request.clone());
        call.set_timeout(config.timeout);
        match client.export(call).await {
            Ok(response) => {
                *backoff = Duration::ZERO;
                let rejected = response.into_inner().partial_success.map_or(0, |p| p.rejected_spans.max(0));
                return Ok(u64::try_from(rejected).unwrap_or(0));
            }
            Err(status) => {
                counters.failed_batches.fetch_add(1, Ordering::Relaxed);
                if attempt >= MAX_ATTEMPTS || !retryable(status.code()) {
                    return Err(status);
                }
                let (next, wait) =
                    cnimesh_common::backoff::backoff(*backoff, config.max_backoff, rand::random_range(0.5..=1.0));
                *backoff = next;
                tracing::debug!(collector = %config.collector, attempt, error = %status, ?wait, "trace export failed; retrying");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
        }
    }
}

/// OTLP/gRPC's retryable codes, plus Unknown: tonic's code for a collector it could not reach.
fn retryable(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        Cancelled | DeadlineExceeded | ResourceExhausted | Aborted | OutOfRange | Unavailable | DataLoss | Unknown
    )
}

fn channel(config: &ExporterConfig) -> Result<Channel, ConfigError> {
    let collector = &config.collector;
    let endpoint = Endpoint::from_shared(collector.to_string())
        .map_err(|_| ConfigError::Collector(collector.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    let authority = collector.authority();
    if !collector.tls {
        return Ok(endpoint.connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
            let authority = authority.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(&authority)
                    .await
                    .map_err(|e| io::Error::new(e.kind(), format!("connecting to {authority}: {e}")))?;
                tcp.set_nodelay(true)?;
                Ok::<_, io::Error>(TokioIo::new(tcp))
            }
        })));
    }
    let roots = match &config.ca_file {
        Some(path) => roots_from_file(path)?,
        None => system_roots(collector)?,
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("aws-lc-rs supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let tls = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let name =
        ServerName::try_from(collector.host.clone()).map_err(|_| ConfigError::Collector(collector.to_string()))?;
    Ok(endpoint.connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
        let (tls, authority, name) = (tls.clone(), authority.clone(), name.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(&authority)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("connecting to {authority}: {e}")))?;
            tcp.set_nodelay(true)?;
            let tls = tls
                .connect(name, tcp)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake with {authority}: {e}")))?;
            Ok::<_, io::Error>(TokioIo::new(tls))
        }
    })))
}

fn roots_from_file(path: &Path) -> Result<rustls::RootCertStore, ConfigError> {
    let err = |reason: String| ConfigError::CaFile { path: path.to_path_buf(), reason };
    let mut roots = rustls::RootCertStore::empty();
    let certs = rustls_pki_types::CertificateDer::pem_file_iter(path).map_err(|e| err(e.to_string()))?;
    for cert in certs {
        roots.add(cert.map_err(|e| err(e.to_string()))?).map_err(|e| err(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(err("no PEM certificates in it".into()));
    }
    Ok(roots)
}

fn system_roots(collector: &Collector) -> Result<rustls::RootCertStore, ConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if added == 0 {
        return Err(ConfigError::NoSystemRoots(collector.to_string()));
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collector_addresses_parse_with_or_without_a_scheme() {
        let c: Collector = "otel-collector.tracing:4317".parse().unwrap();
        assert_eq!((c.tls, c.host.as_str(), c.port), (false, "otel-collector.tracing", 4317));
        assert_eq!(c.to_string(), "http://otel-collector.tracing:4317");
        let c: Collector = "https://collector:4317/".parse().unwrap();
        assert!(c.tls);
        let c: Collector = "http://[fd00::1]:4317".parse().unwrap();
        assert_eq!((c.host.as_str(), c.authority().as_str()), ("fd00::1", "[fd00::1]:4317"));
    }

    #[test]
    fn bad_collector_addresses_are_errors_that_name_the_value() {
        for bad in [
            "",
            "collector",
            "http://collector",
            "collector:0",
            "collector:99999",
            "grpc://c:1",
            "http://c:1/v1/traces",
            "[::1:4317",
            "fd00::1:4317",
            ":4317",
        ] {
            let error = bad.parse::<Collector>().unwrap_err().to_string();
            assert!(error.contains(&format!("{bad:?}")), "{bad}: {error}");
        }
    }

    #[test]
    fn sampling_is_a_ratio_from_zero_to_one() {
        const VAR: &str = "CNIMESH_CONTROL_TRACE_SAMPLING";
        assert_eq!(parse_sampling(VAR, "0").unwrap(), 0.0);
        assert_eq!(parse_sampling(VAR, "0.25").unwrap(), 0.25);
        assert_eq!(parse_sampling(VAR, "1.0").unwrap(), 1.0);
        for bad in ["", "1.5", "-0.1", "NaN", "50%", "inf"] {
            assert!(parse_sampling(VAR, bad).unwrap_err().to_string().contains(&format!("{bad:?}")), "{bad}");
        }
    }

    #[test]
    fn a_bad_sampling_ratio_is_refused_naming_the_variable_the_value_and_what_is_accepted() {
        let error = parse_sampling("CNIMESH_CONTROL_TRACE_SAMPLING", "10%").unwrap_err().to_string();
        assert_eq!(
            error,
            "CNIMESH_CONTROL_TRACE_SAMPLING=\"10%\": expected a ratio from 0 to 1 (the share of requests without \
             trace context that start a trace), such as 0.05"
        );
    }

    #[tokio::test]
    async fn a_ca_file_without_certificates_is_an_error_at_spawn_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate").unwrap();
        let config = ExporterConfig::new("https://collector:4317", "test").unwrap().with_ca_file(&path);
        let error = Exporter::spawn(config).unwrap_err().to_string();
        assert!(error.contains(&path.display().to_string()), "{error}");
        let missing =
            ExporterConfig::new("https://collector:4317", "test").unwrap().with_ca_file(dir.path().join("nope"));
        assert!(Exporter::spawn(missing).unwrap_err().to_string().contains("nope"));
    }
}
