//! `cnimesh stat` and `cnimesh edges`: golden metrics per workload and who talks to whom, from
//! the proxies' own `/metrics` (no Prometheus needed), like `linkerd viz stat` / `edges`.
//!
//! Where things are read from:
//! - the pods and Services: the cluster (kubeconfig; `--local DIR` is local mode's, whose API
//!   server `cnimesh-local up --dir DIR` runs);
//! - the metrics: each meshed pod's proxy admin port, through the API server's pod proxy
//!   subresource; or, with `--prometheus URL`, the same series from Prometheus (labelled
//!   `namespace` and `pod` by the scrape config in `daemonset/observability/`).
//!
//! Rates come from two readings a window apart; `-w` keeps reading, each window starting where
//! the last ended. [`mesh`] and [`compute`] are pure, [`render`] prints.
//!
//! Layer: runtime (operator CLI).

pub mod compute;
pub mod fetch;
pub mod mesh;
pub mod render;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cnimesh_common::names::PROXY_ADMIN_PORT;
use cnimesh_common::prom_text::{Sample, samples};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::ListParams;

use self::compute::{Query, Scrapes, pod_key};
use self::mesh::{Kind, Mesh, PodView, Resource};
use self::render::Output;
use super::ClusterArgs;
use super::pod_proxy::{CONCURRENCY, POD_PROXY_TIMEOUT, pod_proxy_get};
use super::query_error::QueryError;

/// Which namespaces, and where the pods and metrics come from.
#[derive(Debug, Clone, clap::Args)]
pub struct Scope {
    /// The namespace [default: the kubeconfig context's namespace, else `default`; with --local,
    /// local mode's workloads' namespace].
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
    /// Local mode's directory (`cnimesh-local up --dir DIR`): its cluster, a shorthand for
    /// `--kubeconfig DIR/kubeconfig`.
    #[arg(long, value_name = "DIR")]
    pub local: Option<PathBuf>,
    /// Read the proxies' series from this Prometheus (`http://host:9090`) instead of the proxies.
    #[arg(long, value_name = "URL")]
    pub prometheus: Option<String>,
    /// A PEM CA bundle to verify an `https://` Prometheus with, besides the system's roots.
    #[arg(long, value_name = "FILE", requires = "prometheus")]
    pub prometheus_ca: Option<PathBuf>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

impl Scope {
    /// The namespace shown (`None`: all); `default` is the cluster client's namespace (kubectl's:
    /// the kubeconfig context's, else `default`).
    pub fn namespace(&self, default: &str) -> Option<String> {
        match (&self.namespace, self.all_namespaces) {
            (Some(ns), _) => Some(ns.clone()),
            (None, true) => None,
            (None, false) => Some(default.to_string()),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct StatArgs {
    /// `<kind>[/<name>]`: namespace, deployment, statefulset, daemonset, replicaset, job, cronjob
    /// or pod (kubectl's short names too: ns, deploy, sts, ds, rs, cj, po); or `egress[/<hostname>]`:
    /// what the namespace's meshed pods sent to EgressNetworks' destinations, by hostname.
    pub resource: Resource,
    #[command(flatten)]
    pub scope: Scope,
    /// Count only what this resource (`kind[/name]`) sent to the selected ones.
    #[arg(long, value_name = "RESOURCE", conflicts_with = "to")]
    pub from: Option<Resource>,
    /// The namespace of --from [default: the one shown].
    #[arg(long, value_name = "NS")]
    pub from_namespace: Option<String>,
    /// Count only what the selected resources sent to this one (`kind[/name]`).
    #[arg(long, value_name = "RESOURCE")]
    pub to: Option<Resource>,
    /// The namespace of --to [default: the one shown].
    #[arg(long, value_name = "NS")]
    pub to_namespace: Option<String>,
    /// How long a window the rates are computed over (two readings this far apart).
    #[arg(short = 't', long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub window: Duration,
    /// Keep printing, one window after another.
    #[arg(short = 'w', long)]
    pub watch: bool,
}

#[derive(Debug, clap::Args)]
pub struct EdgesArgs {
    /// `<kind>[/<name>]`: the sources whose edges are shown.
    pub resource: Resource,
    #[command(flatten)]
    pub scope: Scope,
}

/// One reading of the proxies' metrics by pod (`namespace/name`), or why a pod could not be read.
pub type Readings = BTreeMap<String, Result<Vec<Sample>, String>>;

/// Where the metrics are read from.
enum Metrics {
    Cluster(kube::Client),
    Prometheus { base: fetch::BaseUrl, tls: Option<Arc<rustls::ClientConfig>> },
}

/// Where pods and metrics are read from: shared with the dashboard's sampler, so that the page
/// reads exactly what `stat` reads.
pub struct Sources {
    client: kube::Client,
    metrics: Metrics,
}

impl Sources {
    pub async fn new(cluster: &ClusterArgs, scope: &Scope) -> anyhow::Result<Self> {
        let client = cluster.or_local(scope.local.as_deref()).client().await?;
        Ok(Self::with_client(client, scope)?)
    }

    /// `client` for the cluster (local mode's with `--local`).
    pub fn with_client(client: kube::Client, scope: &Scope) -> Result<Self, QueryError> {
        let metrics = match &scope.prometheus {
            Some(url) => {
                let base =
                    fetch::BaseUrl::parse(url).map_err(|e| QueryError::bad_query(format!("--prometheus {e}")))?;
                let tls = match base.https {
                    true => Some(fetch::tls_config(scope.prometheus_ca.as_deref()).map_err(QueryError::BadQuery)?),
                    false => None,
                };
                Metrics::Prometheus { base, tls }
            }
            None => Metrics::Cluster(client.clone()),
        };
        Ok(Self { client, metrics })
    }

    /// Metrics come from Prometheus (`--prometheus`), not the proxies.
    pub fn is_prometheus(&self) -> bool {
        matches!(self.metrics, Metrics::Prometheus { .. })
    }

    /// The namespace `-n` defaults to: the cluster client's (the kubeconfig context's).
    pub fn default_namespace(&self) -> &str {
        self.client.default_namespace()
    }

    /// The pods and Services of `namespaces` (`None`: all).
    pub async fn mesh(&self, namespaces: Option<&[String]>) -> Result<Mesh, QueryError> {
        let keep = |ns: Option<&String>| namespaces.is_none_or(|list| ns.is_some_and(|ns| list.contains(ns)));
        let pods: kube::Api<Pod> = kube::Api::all(self.client.clone());
        let services: kube::Api<Service> = kube::Api::all(self.client.clone());
        let params = ListParams::default();
        let pods = pods.list(&params).await.map_err(|e| QueryError::from_kube("listing pods", &e))?.items;
        let services = services.list(&params).await.map_err(|e| QueryError::from_kube("listing services", &e))?.items;
        let pods: Vec<Pod> = pods.into_iter().filter(|p| keep(p.metadata.namespace.as_ref())).collect();
        let services: Vec<Service> = services.into_iter().filter(|s| keep(s.metadata.namespace.as_ref())).collect();
        Ok(Mesh::new(&pods, &services))
    }

    /// One reading of every meshed pod's metrics (at `at` for Prometheus).
    pub async fn read(&self, pods: &[&PodView], at: SystemTime) -> Readings {
        if let Metrics::Prometheus { base, tls } = &self.metrics {
            return match prometheus_query(base, tls.as_ref(), at).await {
                Ok(by_pod) => pods
                    .iter()
                    .map(|p| (pod_key(p), Ok(by_pod.get(&pod_key(p)).cloned().unwrap_or_default())))
                    .collect(),
                Err(e) => pods.iter().map(|p| (pod_key(p), Err(e.clone()))).collect(),
            };
        }
        futures::stream::iter(pods.iter().map(|p| async move {
            let text = match &self.metrics {
                Metrics::Cluster(client) => {
                    pod_proxy_get(client, &p.namespace, &p.name, PROXY_ADMIN_PORT, "metrics").await
                }
                Metrics::Prometheus { .. } => unreachable!("Prometheus is read above"),
            };
            (pod_key(p), text.map(|t| samples(&t)))
        }))
        .buffered(CONCURRENCY)
        .collect()
        .await
    }
}

/// Every namespace a query touches (`None`: all of them).
fn namespaces(shown: Option<String>, extra: &[Option<String>]) -> Option<Vec<String>> {
    let mut list = vec![shown?];
    list.extend(extra.iter().flatten().cloned());
    list.sort();
    list.dedup();
    Some(list)
}

/// The pods whose proxies are read.
pub fn meshed(mesh: &Mesh) -> Vec<&PodView> {
    mesh.pods.iter().filter(|p| p.meshed).collect()
}

/// Two readings as the scrapes a window's rates come from.
pub fn join(before: Readings, after: &Readings) -> Scrapes {
    after
        .iter()
        .map(|(key, now)| {
            let then = before.get(key).cloned().unwrap_or_else(|| Ok(Vec::new()));
            (key.clone(), then.and_then(|then| now.clone().map(|now| (then, now))))
        })
        .collect()
}

pub async fn stat_main(cluster: &ClusterArgs, args: StatArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let sources = Sources::new(cluster, &args.scope).await?;
    stat(&sources, &args, out).await
}

async fn stat(sources: &Sources, args: &StatArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let scope = &args.scope;
    let shown = scope.namespace(sources.default_namespace());
    let from_ns = args
        .from_namespace
        .clone()
        .or_else(|| shown.clone())
        .unwrap_or_else(|| sources.default_namespace().to_string());
    let to_ns =
        args.to_namespace.clone().or_else(|| shown.clone()).unwrap_or_else(|| sources.default_namespace().to_string());
    let query = Query {
        resource: args.resource.clone(),
        namespace: shown.clone(),
        from: args.from.clone().map(|r| (r, from_ns.clone())),
        to: args.to.clone().map(|r| (r, to_ns.clone())),
        window: args.window,
    };
    // Egress is a destination, counted by its clients' proxies (`stat egress`).
    if args.to.as_ref().is_some_and(|to| to.kind == Kind::Egress) {
        anyhow::bail!("--to egress: egress is counted by hostname with `cnimesh stat egress[/HOSTNAME]` (--from R)");
    }
    if args.from.as_ref().is_some_and(|from| from.kind == Kind::Egress) {
        anyhow::bail!("--from egress: egress sends nothing into the mesh; see `cnimesh stat egress`");
    }
    let extra = [args.from.as_ref().map(|_| from_ns), args.to.as_ref().map(|_| to_ns)];
    let wanted = namespaces(shown.clone(), &extra);
    let mut mesh = sources.mesh(wanted.as_deref()).await?;
    let prometheus = matches!(sources.metrics, Metrics::Prometheus { .. });
    let mut before = if prometheus { BTreeMap::new() } else { sources.read(&meshed(&mesh), SystemTime::now()).await };
    loop {
        let now = if prometheus {
            before = sources.read(&meshed(&mesh), SystemTime::now() - args.window).await;
            SystemTime::now()
        } else {
            tokio::time::sleep(args.window).await;
            SystemTime::now()
        };
        let after = sources.read(&meshed(&mesh), now).await;
        let scrapes = join(std::mem::take(&mut before), &after);
        if args.watch && args.scope.output != Output::Json {
            writeln!(out, "{}", humantime::format_rfc3339_seconds(now))?;
        }
        let text = match query.resource.kind {
            Kind::Egress => {
                render::egress_stat(&compute::egress_stat(&mesh, &scrapes, &query), scope.output, shown.is_none())
            }
            _ => render::stat(&compute::stat(&mesh, &scrapes, &query), scope.output, shown.is_none()),
        };
        out.write_all(text.as_bytes())?;
        out.flush()?;
        if !args.watch {
            return Ok(());
        }
        writeln!(out)?;
        if prometheus {
            tokio::time::sleep(args.window).await;
        }
        // Pods come and go between windows.
        mesh = sources.mesh(wanted.as_deref()).await?;
        before = after;
    }
}

pub async fn edges_main(cluster: &ClusterArgs, args: EdgesArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let sources = Sources::new(cluster, &args.scope).await?;
    edges(&sources, &args, out).await
}

async fn edges(sources: &Sources, args: &EdgesArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let scope = &args.scope;
    anyhow::ensure!(
        args.resource.kind != Kind::Egress,
        "egress is a destination: its edges are the rows `egress/<hostname>` of its clients' (e.g. `cnimesh edges deploy`)"
    );
    let query = Query {
        resource: args.resource.clone(),
        namespace: scope.namespace(sources.default_namespace()),
        from: None,
        to: None,
        window: Duration::ZERO,
    };
    // Destinations may live in any namespace.
    let mesh = sources.mesh(None).await?;
    let after = sources.read(&meshed(&mesh), SystemTime::now()).await;
    let scrapes = join(BTreeMap::new(), &after);
    out.write_all(render::edges(&compute::edges(&mesh, &scrapes, &query), scope.output).as_bytes())?;
    Ok(())
}

/// The series `stat` reads, as one PromQL selector.
const SERIES: &str = r#"{__name__=~"response_total|response_latency_ms_bucket|request_total|tcp_open_total|tcp_open_connections|outbound_egress_requests_total|outbound_egress_connections_total|outbound_egress_denied_total"}"#;

/// Percent-encoding for a URL query value (RFC 3986 unreserved characters kept).
fn encode_query(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The proxies' series in Prometheus at `at`, by pod (`namespace/pod` labels, as the scrape
/// config in `daemonset/observability/` sets them).
async fn prometheus_query(
    base: &fetch::BaseUrl,
    tls: Option<&Arc<rustls::ClientConfig>>,
    at: SystemTime,
) -> Result<BTreeMap<String, Vec<Sample>>, String> {
    let time = at.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let path = format!("{}/api/v1/query?query={}&time={time:.3}", base.prefix, encode_query(SERIES));
    let body = fetch::url_get(base, tls, &path, POD_PROXY_TIMEOUT).await?;
    parse_prometheus(&body)
}

/// A Prometheus `/api/v1/query` answer (an instant vector) as samples by pod.
fn parse_prometheus(body: &str) -> Result<BTreeMap<String, Vec<Sample>>, String> {
    let answer: serde_json::Value = serde_json::from_str(body).map_err(|e| format!("not a Prometheus answer: {e}"))?;
    if answer["status"] != "success" {
        return Err(format!("Prometheus: {}", answer["error"].as_str().unwrap_or("query failed")));
    }
    let mut by_pod: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    for series in answer["data"]["result"].as_array().into_iter().flatten() {
        let Some(metric) = series["metric"].as_object() else { continue };
        let mut labels: BTreeMap<String, String> =
            metric.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect();
        let (Some(name), Some(namespace), Some(pod)) =
            (labels.remove("__name__"), labels.remove("namespace"), labels.remove("pod"))
        else {
            continue;
        };
        let Some(value) = series["value"][1].as_str().and_then(|v| v.parse().ok()) else { continue };
        by_pod.entry(format!("{namespace}/{pod}")).or_default().push(Sample { name, labels, value });
    }
    Ok(by_pod)
}

#[cfg(test)]
pub(crate) mod tests;
