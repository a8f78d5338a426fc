//! Traffic from a client pod, as its app (root, not the proxy UID, so it is captured), and the
//! summary of what happened: per service success, rate, latency, which replicas answered, and
//! whether each edge was mTLS according to the proxies' own `/metrics`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use http::Request;
use http::header::{CONNECTION, HOST};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio::time::timeout;

use cnimesh_node::debug::{Format, table};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A runtime for the calling thread alone: the sockets it opens are made in that thread's netns
/// (setns is per thread, docs/architecture.md, "Capture rules"), which a multi-threaded runtime could not promise.
fn thread_runtime() -> anyhow::Result<Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?)
}

/// One HTTP/1.1 GET with hyper over a fresh connection: (status, body). The connection is made
/// when the future is first polled, so on a [`thread_runtime`] it is in that thread's netns.
async fn get(addr: SocketAddr, host: &str, path: &str) -> anyhow::Result<(u16, String)> {
    get_with(addr, host, path, &[]).await
}

/// [`get`] with extra request headers (the demo's traced request carries a `traceparent`).
async fn get_with(
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, String)],
) -> anyhow::Result<(u16, String)> {
    let stream = timeout(REQUEST_TIMEOUT, TcpStream::connect(addr)).await.context("connect timed out")??;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut request = Request::get(path).header(HOST, host).header(CONNECTION, "close");
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    let request = request.body(Empty::<Bytes>::new())?;
    timeout(REQUEST_TIMEOUT, async {
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    })
    .await
    .context("no complete response in time")?
}

/// One GET from the calling thread's netns: (status, body).
pub fn http_get(addr: SocketAddr, host: &str, path: &str) -> anyhow::Result<(u16, String)> {
    thread_runtime()?.block_on(get(addr, host, path))
}

/// [`http_get`] from inside the netns at `netns`.
pub fn http_get_in(netns: &Path, addr: SocketAddr, host: &str, path: &str) -> anyhow::Result<(u16, String)> {
    cnimesh_cni::netns::run_in(netns, move || http_get(addr, host, path))?
}

/// One GET with `headers` from inside the netns at `netns`: (status, body).
pub fn http_get_in_with(
    netns: &Path,
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, String)],
) -> anyhow::Result<(u16, String)> {
    let headers: Vec<(String, String)> = headers.iter().map(|(n, v)| (n.to_string(), v.clone())).collect();
    let (host, path) = (host.to_string(), path.to_string());
    cnimesh_cni::netns::run_in(netns, move || {
        let headers: Vec<(&str, String)> = headers.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
        thread_runtime()?.block_on(get_with(addr, &host, &path, &headers))
    })?
}

/// What the load of one client against one service produced.
#[derive(Debug, Default)]
pub struct Load {
    pub latencies: Vec<Duration>,
    pub failures: Vec<String>,
    /// Responses per body (the replica's name).
    pub answered_by: BTreeMap<String, u64>,
    /// Responses per HTTP status (a policy's 403s beside the 200s).
    pub statuses: BTreeMap<u16, u64>,
    pub elapsed: Duration,
}

/// `concurrency` connections-per-request loops against `addr` from `netns` for `duration`.
pub fn load(netns: &Path, addr: SocketAddr, host: &str, concurrency: usize, duration: Duration) -> Load {
    let start = Instant::now();
    let results: Vec<Load> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                scope.spawn(move || {
                    let mut out = Load::default();
                    let run = cnimesh_cni::netns::run_in(netns, || -> anyhow::Result<()> {
                        // One runtime per worker thread, in the pod's netns, for all its requests.
                        let runtime = thread_runtime()?;
                        while start.elapsed() < duration {
                            let t = Instant::now();
                            let answer = runtime.block_on(get(addr, host, "/"));
                            if let Ok((status, _)) = &answer {
                                *out.statuses.entry(*status).or_default() += 1;
                            }
                            match answer {
                                Ok((200, body)) => {
                                    out.latencies.push(t.elapsed());
                                    *out.answered_by.entry(body.trim().to_string()).or_default() += 1;
                                }
                                Ok((status, body)) => out.failures.push(format!("HTTP {status}: {}", body.trim())),
                                Err(e) => out.failures.push(format!("{e:#}")),
                            }
                        }
                        Ok(())
                    });
                    match run {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => out.failures.push(format!("{e:#}")),
                        Err(e) => out.failures.push(e.to_string()),
                    }
                    out
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_default()).collect()
    });
    let mut total = Load { elapsed: start.elapsed(), ..Load::default() };
    for r in results {
        total.latencies.extend(r.latencies);
        total.failures.extend(r.failures);
        for (k, v) in r.answered_by {
            *total.answered_by.entry(k).or_default() += v;
        }
        for (k, v) in r.statuses {
            *total.statuses.entry(k).or_default() += v;
        }
    }
    total.latencies.sort();
    total
}

/// The proxies' `/metrics` are read with the one parser every reader of them shares.
pub use cnimesh_common::prom_text::{Sample, samples};

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

/// One client → service edge.
#[derive(Debug, Clone, Serialize)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub meshed: bool,
    pub requests: u64,
    pub successes: u64,
    pub success_rate: f64,
    pub rps: f64,
    pub latency_ms: Latency,
    /// Successful responses per replica; every replica is listed, including those with none.
    pub replicas: BTreeMap<String, u64>,
    /// Successful responses per backend service: the service itself, or each service of its
    /// split (canary), including those with none.
    pub backends: BTreeMap<String, u64>,
    /// Responses per HTTP status.
    pub statuses: BTreeMap<u16, u64>,
    /// Whether every request the client's proxy sent to the service's endpoints was TLS.
    pub tls: bool,
    /// The server identities the client's proxy verified.
    pub server_ids: Vec<String>,
    /// Per replica with a proxy: the client identities its inbound proxy saw.
    pub client_ids: BTreeMap<String, Vec<String>>,
    /// Up to five distinct failure messages.
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub root: String,
    pub edges: Vec<Edge>,
    /// How to look further: `/metrics` of each proxy, and the node CLI on these pods.
    pub commands: BTreeMap<String, String>,
    pub up_seconds: f64,
    /// The demo's traced request, as the collector stand-in received its spans.
    pub trace: Option<crate::demo_trace::DemoTrace>,
    /// `--clusters 2`: the cross-cluster part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multicluster: Option<Multicluster>,
    /// The workloads file's `ingress:`: where to send requests from the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<IngressSummary>,
}

/// The ingress controller `up` started, as a user reaches it from the host.
#[derive(Debug, Clone, Serialize)]
pub struct IngressSummary {
    /// nginx's `ip:port` on the bridge (the ingress pod's address).
    pub address: String,
    /// The `Host` each Service answers for, by host.
    pub routes: BTreeMap<String, String>,
    /// A request through it, from the host.
    pub example: String,
}

/// What `up --clusters 2` did across the clusters and what each side saw.
#[derive(Debug, Clone, Serialize)]
pub struct Multicluster {
    pub west_root: String,
    /// The gateway pod's `ip:port`.
    pub gateway: String,
    /// What `cnimesh multicluster link` printed (applied to east), kept root-only.
    pub link_file: String,
    /// East's client to each mirror: the mirror, what happened.
    pub edges: Vec<Edge>,
    /// Notes instead of edges (no meshed client, a mirror that did not appear in time).
    pub notes: Vec<String>,
    /// Client identities west's gateway and west's servers saw on inbound mTLS, by pod.
    pub identities_seen: BTreeMap<String, Vec<String>>,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    (sorted[i].as_secs_f64() * 1e5).round() / 100.0
}

impl Edge {
    pub fn new(from: &str, to: &str, meshed: bool, load: &Load, replicas: &[String]) -> Self {
        let successes = load.latencies.len() as u64;
        let requests = successes + load.failures.len() as u64;
        let mut errors: Vec<String> = load.failures.clone();
        errors.sort();
        errors.dedup();
        errors.truncate(5);
        let mut answered: BTreeMap<String, u64> = replicas.iter().map(|r| (r.clone(), 0)).collect();
        answered.extend(load.answered_by.clone());
        Edge {
            from: from.into(),
            to: to.into(),
            meshed,
            requests,
            successes,
            success_rate: if requests == 0 { 0.0 } else { successes as f64 / requests as f64 },
            rps: (requests as f64 / load.elapsed.as_secs_f64().max(1e-3) * 10.0).round() / 10.0,
            latency_ms: Latency {
                p50: percentile(&load.latencies, 0.50),
                p95: percentile(&load.latencies, 0.95),
                p99: percentile(&load.latencies, 0.99),
            },
            replicas: answered,
            backends: BTreeMap::new(),
            statuses: load.statuses.clone(),
            tls: false,
            server_ids: Vec::new(),
            client_ids: BTreeMap::new(),
            errors,
        }
    }

    /// Sums the responses per replica into responses per backend service, given each replica's
    /// service.
    pub fn count_backends(&mut self, service_of: &[(&str, &str)]) {
        self.backends = service_of.iter().map(|(_, service)| (service.to_string(), 0)).collect();
        for (replica, service) in service_of {
            *self.backends.entry(service.to_string()).or_default() += self.replicas.get(*replica).copied().unwrap_or(0);
        }
    }

    /// Fills the TLS columns from the client proxy's outbound requests to `endpoints` (the
    /// service's ClusterIP and pod IPs) and each replica proxy's inbound requests.
    pub fn read_tls(
        &mut self,
        client_metrics: &[Sample],
        endpoints: &[String],
        replica_metrics: &[(String, Vec<Sample>)],
    ) {
        let to_service: Vec<&Sample> = client_metrics
            .iter()
            .filter(|s| s.name == "request_total" && s.labels.get("direction").is_some_and(|d| d == "outbound"))
            .filter(|s| {
                let target = s.labels.get("target_addr").map(String::as_str).unwrap_or_default();
                endpoints.iter().any(|ip| target.rsplit_once(':').is_some_and(|(host, _)| host == ip))
            })
            .filter(|s| s.value > 0.0)
            .collect();
        self.tls =
            !to_service.is_empty() && to_service.iter().all(|s| s.labels.get("tls").is_some_and(|t| t == "true"));
        let mut ids: Vec<String> = to_service.iter().filter_map(|s| s.labels.get("server_id").cloned()).collect();
        ids.sort();
        ids.dedup();
        self.server_ids = ids;
        for (replica, metrics) in replica_metrics {
            let mut ids: Vec<String> = metrics
                .iter()
                .filter(|s| s.name == "request_total" && s.labels.get("direction").is_some_and(|d| d == "inbound"))
                .filter_map(|s| s.labels.get("client_id").cloned())
                .collect();
            ids.sort();
            ids.dedup();
            self.client_ids.insert(replica.clone(), ids);
        }
    }
}

pub fn render(summary: &Summary, format: Format) -> String {
    if format == Format::Json {
        return serde_json::to_string_pretty(summary).expect("serialisable") + "\n";
    }
    let rows: Vec<Vec<String>> = summary
        .edges
        .iter()
        .map(|e| {
            let tls = if e.tls {
                format!("mTLS ({})", e.server_ids.iter().map(|id| short_id(id)).collect::<Vec<_>>().join(", "))
            } else {
                "plaintext".into()
            };
            let spread: Vec<String> = e.replicas.iter().map(|(r, n)| format!("{r}={n}")).collect();
            let statuses: Vec<String> = e.statuses.iter().map(|(s, n)| format!("{s}={n}")).collect();
            vec![
                format!("{} -> {}", e.from, e.to),
                format!("{:.1}%", e.success_rate * 100.0),
                format!("{:.1}", e.rps),
                format!("{:.1}/{:.1}/{:.1}", e.latency_ms.p50, e.latency_ms.p95, e.latency_ms.p99),
                statuses.join(" "),
                tls,
                spread.join(" "),
            ]
        })
        .collect();
    let mut out = format!("\ncnimesh local mode is up ({:.1} s) in {}\n\n", summary.up_seconds, summary.root);
    out.push_str(&table(
        &["EDGE", "SUCCESS", "RPS", "P50/P95/P99 MS", "STATUSES", "TLS", "REPLICAS (responses)"],
        &rows,
    ));
    for e in &summary.edges {
        for (replica, ids) in e.client_ids.iter().filter(|(_, ids)| !ids.is_empty()) {
            out.push_str(&format!("  {replica}'s proxy saw client identity {}\n", ids.join(", ")));
        }
        if e.backends.len() > 1 {
            let total = e.backends.values().sum::<u64>().max(1) as f64;
            let shares: Vec<String> =
                e.backends.iter().map(|(b, n)| format!("{b}={n} ({:.1}%)", *n as f64 * 100.0 / total)).collect();
            out.push_str(&format!("  {} -> {} split over backends: {}\n", e.from, e.to, shares.join(" ")));
        }
        for err in &e.errors {
            out.push_str(&format!("  {} -> {} error: {err}\n", e.from, e.to));
        }
    }
    if let Some(trace) = &summary.trace {
        out.push('\n');
        out.push_str(&crate::demo_trace::render(trace));
    }
    if let Some(mc) = &summary.multicluster {
        out.push_str(&render_multicluster(mc));
    }
    if let Some(ingress) = &summary.ingress {
        out.push_str(&format!("\ningress controller (nginx, its proxy in ingress mode) on {}:\n", ingress.address));
        for (host, service) in &ingress.routes {
            out.push_str(&format!("  Host {host} -> service {service}\n"));
        }
        out.push_str(&format!("  try: {}\n", ingress.example));
    }
    out.push('\n');
    for (what, cmd) in &summary.commands {
        out.push_str(&format!("{what}:\n  {cmd}\n"));
    }
    out
}

/// The second cluster's part of the summary: the Link, each edge to a mirror, what west saw.
fn render_multicluster(mc: &Multicluster) -> String {
    let mut out = format!(
        "\nwest (second cluster) in {}: gateway {}, Link written to {}\n",
        mc.west_root, mc.gateway, mc.link_file
    );
    for e in &mc.edges {
        let tls = if e.tls { format!("mTLS ({})", e.server_ids.join(", ")) } else { "plaintext".into() };
        out.push_str(&format!(
            "  {} -> {}: {:.1}% of {} requests, {tls}\n",
            e.from,
            e.to,
            e.success_rate * 100.0,
            e.requests
        ));
        for err in &e.errors {
            out.push_str(&format!("    error: {err}\n"));
        }
    }
    for note in &mc.notes {
        out.push_str(&format!("  {note}\n"));
    }
    for (pod, ids) in &mc.identities_seen {
        out.push_str(&format!("  west's {pod} saw client identities: {}\n", ids.join(", ")));
    }
    out
}

/// `web.demo` for `web.demo.serviceaccount.identity.cnimesh.cluster.local`.
fn short_id(id: &str) -> &str {
    id.split_once(".serviceaccount.").map_or(id, |(short, _)| short)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_counted_per_backend_service() {
        let load = Load {
            latencies: vec![Duration::from_millis(1); 10],
            answered_by: [("web-0".to_string(), 5), ("web-1".to_string(), 4), ("web-canary".to_string(), 1)].into(),
            ..Load::default()
        };
        let replicas = ["web-0", "web-1", "web-canary"].map(String::from);
        let mut edge = Edge::new("client", "web", true, &load, &replicas);
        edge.count_backends(&[("web-0", "web"), ("web-1", "web"), ("web-canary", "web-canary")]);
        assert_eq!(edge.backends, [("web".to_string(), 9), ("web-canary".to_string(), 1)].into());
        let summary = Summary {
            root: "/r".into(),
            edges: vec![edge],
            commands: BTreeMap::new(),
            up_seconds: 1.0,
            trace: None,
            multicluster: None,
            ingress: Some(IngressSummary {
                address: "10.247.0.9:8080".into(),
                routes: [("web.demo".to_string(), "web".to_string())].into(),
                example: "curl -H 'Host: web.demo' http://10.247.0.9:8080/".into(),
            }),
        };
        let text = render(&summary, Format::Human);
        assert!(text.contains("client -> web split over backends: web=9 (90.0%) web-canary=1 (10.0%)"), "{text}");
        assert!(text.contains("ingress mode) on 10.247.0.9:8080:\n  Host web.demo -> service web\n"), "{text}");
    }

    #[test]
    fn percentiles_pick_ranks() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&d, 0.5), 50.0);
        assert_eq!(percentile(&d, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
