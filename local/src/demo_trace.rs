//! Local mode's tracing: the collector stand-in, and the demo's one trace.
//!
//! The stand-in is cnimesh-trace's in-process OTLP/gRPC receiver, run detached as
//! `cnimesh-local collector` on the bridge's gateway (where every pod can reach the host, as it
//! reaches the control plane's pod), appending each span it receives as one JSON line to
//! `DIR/traces.jsonl`. Every demo proxy exports to it; their sampling stays 0, the proxies'
//! default, so the load's requests (which carry no context) are not traced and the latencies in
//! the summary are those of a mesh that is not tracing. After the load the client sends one
//! request to `web` with a W3C `traceparent` of its own, as an instrumented app would: its trace is
//! the one the summary shows.
//!
//! Layer: app (a process of local mode's own) and the summary's trace.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// Where the stand-in listens on the gateway: OTLP/gRPC's port.
pub const COLLECTOR_PORT: u16 = 4317;
/// The spans file under local mode's dir.
pub const TRACES_FILE: &str = "traces.jsonl";
/// The exporters send a batch at most a second after its first span; a few of those, plus a
/// retry, and the spans are in.
pub const SPANS_WAIT: Duration = Duration::from_secs(15);

/// `cnimesh-local collector`: serves until the process is stopped (`down`).
pub async fn collect(listen: SocketAddr, out: &Path) -> anyhow::Result<()> {
    let receiver = cnimesh_trace::Receiver::bind_with_file(listen, out).await?;
    tracing::info!(addr = %receiver.local_addr(), file = %out.display(), "collector stand-in serving");
    std::future::pending::<()>().await;
    drop(receiver);
    Ok(())
}

/// One span of the spans file, as the summary shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceSpan {
    pub span_id: String,
    pub parent_span_id: Option<String>,
    pub name: String,
    /// `client`, `server`, …
    pub kind: String,
    /// The pod whose proxy emitted it (resource `k8s.pod.name`).
    pub pod: String,
    /// Resource `service.name` (`cnimesh-proxy`).
    pub service: String,
    /// The emitting proxy's identity (resource `cnimesh.identity`).
    pub identity: String,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    pub attributes: BTreeMap<String, String>,
}

/// The demo's trace: its id, the span the client's "app" sent as parent, and the spans the
/// proxies exported, parents before children.
#[derive(Debug, Clone, Serialize)]
pub struct DemoTrace {
    pub trace_id: String,
    /// The span id of the demo client's `traceparent`: the parent of the client proxy's span.
    pub app_span_id: String,
    pub spans: Vec<TraceSpan>,
    /// Whether the chain client app → client proxy CLIENT → web proxy SERVER is complete.
    pub linked: bool,
    /// What is missing when it is not.
    pub missing: Vec<String>,
    pub file: String,
}

/// The line format of cnimesh-trace's receiver file (`ReceivedSpan`), the fields read here.
#[derive(Debug, Deserialize)]
struct Line {
    trace_id: String,
    span_id: String,
    parent_span_id: Option<String>,
    name: String,
    kind: String,
    start_unix_nano: u64,
    end_unix_nano: u64,
    #[serde(default)]
    attributes: BTreeMap<String, String>,
    #[serde(default)]
    resource: BTreeMap<String, String>,
}

/// A new W3C `traceparent` (sampled) and its trace and span ids.
pub fn new_traceparent(random_hex: &str) -> (String, String, String) {
    let (trace_id, span_id) = (random_hex[..32].to_string(), random_hex[32..48].to_string());
    (format!("00-{trace_id}-{span_id}-01"), trace_id, span_id)
}

/// The spans of `trace_id` in `file` so far.
fn spans_of(file: &Path, trace_id: &str) -> Vec<TraceSpan> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Line>(line).ok())
        .filter(|l| l.trace_id == trace_id)
        .map(|l| {
            let resource = |key: &str| l.resource.get(key).cloned().unwrap_or_default();
            TraceSpan {
                pod: resource("k8s.pod.name"),
                service: resource("service.name"),
                identity: resource("cnimesh.identity"),
                span_id: l.span_id,
                parent_span_id: l.parent_span_id.filter(|p| !p.is_empty()),
                name: l.name,
                kind: l.kind,
                start_unix_nano: l.start_unix_nano,
                end_unix_nano: l.end_unix_nano,
                attributes: l.attributes,
            }
        })
        .collect()
}

/// What the chain app → `client` proxy CLIENT → a `servers` proxy SERVER lacks (empty: linked).
/// The server's parent is the client proxy's request span, or one of its tries (a CLIENT child
/// of it, when a route retries).
fn missing(spans: &[TraceSpan], app_span_id: &str, client: &str, servers: &[String]) -> Vec<String> {
    let outbound = spans
        .iter()
        .find(|s| s.kind == "client" && s.pod == client && s.parent_span_id.as_deref() == Some(app_span_id));
    let Some(outbound) = outbound else {
        return vec![format!("a CLIENT span from {client}'s proxy whose parent is the app's span {app_span_id}")];
    };
    let tries: Vec<&str> = spans
        .iter()
        .filter(|s| {
            s.kind == "client" && s.pod == client && s.parent_span_id.as_deref() == Some(outbound.span_id.as_str())
        })
        .map(|s| s.span_id.as_str())
        .chain([outbound.span_id.as_str()])
        .collect();
    let inbound = spans.iter().any(|s| {
        s.kind == "server"
            && servers.contains(&s.pod)
            && s.parent_span_id.as_deref().is_some_and(|p| tries.contains(&p))
    });
    if inbound {
        Vec::new()
    } else {
        vec![format!("a SERVER span from a proxy of {} whose parent is {}'s CLIENT span", servers.join(", "), client)]
    }
}

/// Parents before children, then by start time.
fn ordered(mut spans: Vec<TraceSpan>) -> Vec<TraceSpan> {
    spans.sort_by_key(|s| s.start_unix_nano);
    let mut out: Vec<TraceSpan> = Vec::new();
    while !spans.is_empty() {
        let ready = spans
            .iter()
            .position(|s| {
                s.parent_span_id
                    .as_ref()
                    .is_none_or(|p| out.iter().any(|o| &o.span_id == p) || !spans.iter().any(|x| &x.span_id == p))
            })
            .unwrap_or(0);
        out.push(spans.remove(ready));
    }
    out
}

/// Waits (bounded) for the trace's spans in `file`: the client's proxy's and a server's.
pub fn wait_for_trace(
    file: &Path,
    trace_id: &str,
    app_span_id: &str,
    client: &str,
    servers: &[String],
    wait: Duration,
) -> DemoTrace {
    let deadline = Instant::now() + wait;
    loop {
        let spans = spans_of(file, trace_id);
        let gaps = missing(&spans, app_span_id, client, servers);
        if gaps.is_empty() || Instant::now() > deadline {
            return DemoTrace {
                trace_id: trace_id.into(),
                app_span_id: app_span_id.into(),
                linked: gaps.is_empty(),
                missing: gaps,
                spans: ordered(spans),
                file: file.display().to_string(),
            };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The trace for the human summary: one line per span, indented under its parent.
pub fn render(trace: &DemoTrace) -> String {
    let mut out = format!("trace {} (spans in {}):\n", trace.trace_id, trace.file);
    out.push_str(&format!("  {} the client app's span (its traceparent)\n", trace.app_span_id));
    let depth_of = |span: &TraceSpan| {
        let mut depth = 1;
        let mut parent = span.parent_span_id.clone();
        while let Some(p) = parent {
            match trace.spans.iter().find(|s| s.span_id == p) {
                Some(s) => {
                    depth += 1;
                    parent = s.parent_span_id.clone();
                }
                None => break,
            }
            if depth > 16 {
                break;
            }
        }
        depth
    };
    for span in &trace.spans {
        let micros = span.end_unix_nano.saturating_sub(span.start_unix_nano) / 1000;
        out.push_str(&format!(
            "  {}{} {} {} {:?} in {} ({}), {micros} µs\n",
            "  ".repeat(depth_of(span)),
            span.span_id,
            span.service,
            span.kind.to_uppercase(),
            span.name,
            span.pod,
            span.identity,
        ));
    }
    for gap in &trace.missing {
        out.push_str(&format!("  missing: {gap}\n"));
    }
    out
}

/// The span file's path under `root`.
pub fn traces_file(root: &Path) -> std::path::PathBuf {
    root.join(TRACES_FILE)
}

/// Checks the stand-in answers on `addr` (a TCP connect), for `up`'s readiness wait.
pub fn listening(addr: SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Creates the (empty) spans file, readable by whoever inspects the demo.
pub fn create_file(file: &Path) -> anyhow::Result<()> {
    std::fs::write(file, b"").with_context(|| format!("creating {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(span: &str, parent: Option<&str>, kind: &str, pod: &str) -> String {
        serde_json::json!({
            "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": span, "parent_span_id": parent,
            "name": "GET", "kind": kind, "start_unix_nano": 1, "end_unix_nano": 2001, "attributes": {},
            "events": [], "status": "unset", "trace_state": "",
            "resource": {"service.name": "cnimesh-proxy", "k8s.pod.name": pod, "cnimesh.identity": format!("{pod}.demo")},
        })
        .to_string()
    }

    #[test]
    fn the_trace_is_linked_only_with_both_proxies_spans_under_the_apps() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(TRACES_FILE);
        let servers = vec!["web-0".to_string(), "web-canary-0".to_string()];
        let other_trace = line("1111111111111111", None, "server", "web-0").replace("4bf9", "0000");
        std::fs::write(
            &file,
            format!("{other_trace}\n{}\n", line("00000000000000c1", Some("00000000000000a1"), "client", "client")),
        )
        .unwrap();
        let trace = wait_for_trace(
            &file,
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "00000000000000a1",
            "client",
            &[],
            Duration::ZERO,
        );
        assert!(!trace.linked && trace.missing[0].contains("SERVER"), "{trace:?}");
        let server =
            line("00000000000000s1".replace('s', "5").as_str(), Some("00000000000000c1"), "server", "web-canary-0");
        std::fs::write(
            &file,
            format!("{server}\n{}\n", line("00000000000000c1", Some("00000000000000a1"), "client", "client")),
        )
        .unwrap();
        let trace = wait_for_trace(
            &file,
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "00000000000000a1",
            "client",
            &servers,
            SPANS_WAIT,
        );
        assert!(trace.linked, "{trace:?}");
        assert_eq!(
            trace.spans.iter().map(|s| s.kind.as_str()).collect::<Vec<_>>(),
            ["client", "server"],
            "parents first"
        );
        assert_eq!(trace.spans[1].identity, "web-canary-0.demo");
        // Through a route that retries: the server's parent is a try, a CLIENT child of the request's span.
        let tried = line("00000000000000c2", Some("00000000000000c1"), "client", "client");
        let server = line("0000000000000052", Some("00000000000000c2"), "server", "web-0");
        let request = line("00000000000000c1", Some("00000000000000a1"), "client", "client");
        std::fs::write(&file, format!("{server}\n{tried}\n{request}\n")).unwrap();
        let retried = wait_for_trace(
            &file,
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "00000000000000a1",
            "client",
            &servers,
            SPANS_WAIT,
        );
        assert!(retried.linked, "{retried:?}");
        let order: Vec<&str> = retried.spans.iter().map(|s| s.span_id.as_str()).collect();
        assert_eq!(order, ["00000000000000c1", "00000000000000c2", "0000000000000052"], "parents first");
        let text = render(&trace);
        assert!(text.contains("CLIENT \"GET\" in client") && text.contains("SERVER \"GET\" in web-canary-0"), "{text}");
    }

    #[test]
    fn a_traceparent_is_version_trace_span_and_sampled() {
        let hex = "4bf92f3577b34da6a3ce929d0e0e473600f067aa0ba902b7aaaaaaaaaaaaaaaa";
        let (header, trace, span) = new_traceparent(hex);
        assert_eq!(header, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!((trace.as_str(), span.as_str()), ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"));
    }
}
