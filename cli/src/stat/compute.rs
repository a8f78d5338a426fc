//! Golden metrics from two scrapes of the proxies' `/metrics` a window apart: success rate, RPS,
//! latency percentiles (from the histogram's buckets, interpolated within a bucket as
//! Prometheus's `histogram_quantile` does), open TCP connections and the mTLS share; and the
//! edges between workloads with the identities on each side.
//!
//! What a row counts, as `linkerd viz stat` does: without `--from`/`--to`, what the workload's
//! pods received (their inbound proxies); with `--to T`, what they sent to T's pods (their
//! outbound proxies); with `--from F`, what F's pods sent to them.
//!
//! Layer: model (pure).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cnimesh_common::prom_text::Sample;
use serde::Serialize;

use super::mesh::{Kind, Mesh, PodView, Resource, target_ip};

/// Both scrapes of one pod's proxy, or why it could not be read.
pub type Scrape = Result<(Vec<Sample>, Vec<Sample>), String>;

/// Scrapes by pod (`namespace/name`).
pub type Scrapes = BTreeMap<String, Scrape>;

pub fn pod_key(pod: &PodView) -> String {
    format!("{}/{}", pod.namespace, pod.name)
}

/// What the rows are about and what traffic they count.
#[derive(Debug, Clone)]
pub struct Query {
    pub resource: Resource,
    /// `None`: every namespace.
    pub namespace: Option<String>,
    pub from: Option<(Resource, String)>,
    pub to: Option<(Resource, String)>,
    pub window: Duration,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

impl Latency {
    /// The percentiles of a cumulative histogram (`None` when it counted nothing).
    fn of(buckets: &BTreeMap<u64, (f64, f64)>) -> Option<Self> {
        Some(Latency { p50: quantile(buckets, 0.50)?, p95: quantile(buckets, 0.95)?, p99: quantile(buckets, 0.99)? })
    }
}

/// One workload's golden metrics over the window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StatRow {
    pub namespace: String,
    pub kind: &'static str,
    pub name: String,
    pub meshed_pods: usize,
    pub pods: usize,
    /// Responses in the window.
    pub requests: f64,
    /// `None` when there was no request to judge by.
    pub success_rate: Option<f64>,
    pub rps: f64,
    pub latency_ms: Option<Latency>,
    /// Open now (at the second scrape).
    pub tcp_connections: f64,
    /// Share of the window's requests (or, without requests, of its connections) that were mTLS.
    pub mtls_share: Option<f64>,
    /// Meshed pods whose metrics could not be read, with the reason.
    pub unreadable: Vec<String>,
}

/// The delta of every series between two scrapes; a series that went down (a restarted proxy)
/// counts from zero.
pub fn deltas<'a>(before: &'a [Sample], after: &'a [Sample]) -> impl Iterator<Item = (&'a Sample, f64)> + 'a {
    let earlier: BTreeMap<(&str, &BTreeMap<String, String>), f64> =
        before.iter().map(|s| ((s.name.as_str(), &s.labels), s.value)).collect();
    after.iter().map(move |s| {
        let was = earlier.get(&(s.name.as_str(), &s.labels)).copied().unwrap_or(0.0);
        (s, if s.value >= was { s.value - was } else { s.value })
    })
}

/// The quantile `q` of a cumulative histogram given as (upper bound, count) pairs.
pub fn quantile(buckets: &BTreeMap<u64, (f64, f64)>, q: f64) -> Option<f64> {
    let total = buckets.values().map(|(_, c)| *c).fold(0.0, f64::max);
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (bound, count) in buckets.values() {
        if *count >= rank {
            if bound.is_infinite() {
                return Some(lower);
            }
            let within = count - below;
            let fraction = if within > 0.0 { (rank - below) / within } else { 1.0 };
            return Some(lower + (bound - lower) * fraction);
        }
        (lower, below) = (*bound, *count);
    }
    Some(lower)
}

/// Totals of the samples one set of pods' proxies recorded about some traffic.
#[derive(Debug, Default)]
struct Totals {
    responses: f64,
    successes: f64,
    tls_responses: f64,
    /// Cumulative latency buckets, keyed by the bound's bits for ordering.
    buckets: BTreeMap<u64, (f64, f64)>,
    open_connections: f64,
    tls_open_connections: f64,
    opened: f64,
    tls_opened: f64,
}

impl Totals {
    fn add(&mut self, sample: &Sample, delta: f64) {
        let tls = sample.label("tls") == "true";
        match sample.name.as_str() {
            "response_total" => {
                self.responses += delta;
                if sample.label("classification") == "success" {
                    self.successes += delta;
                }
                if tls {
                    self.tls_responses += delta;
                }
            }
            "response_latency_ms_bucket" => {
                let bound: f64 = match sample.label("le") {
                    "+Inf" => f64::INFINITY,
                    le => match le.parse() {
                        Ok(b) => b,
                        Err(_) => return,
                    },
                };
                // Positive floats order like their bit patterns.
                self.buckets.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += delta;
            }
            "tcp_open_total" => {
                self.opened += delta;
                if tls {
                    self.tls_opened += delta;
                }
            }
            "tcp_open_connections" => {
                self.open_connections += sample.value;
                if tls {
                    self.tls_open_connections += sample.value;
                }
            }
            _ => {}
        }
    }

    fn mtls_share(&self) -> Option<f64> {
        [
            (self.tls_responses, self.responses),
            (self.tls_opened, self.opened),
            (self.tls_open_connections, self.open_connections),
        ]
        .into_iter()
        .find(|(_, all)| *all > 0.0)
        .map(|(tls, all)| tls / all)
    }
}

/// The traffic a row counts: whose proxies, which direction, to which addresses.
struct Traffic<'a> {
    sources: Vec<&'a PodView>,
    direction: &'static str,
    /// Outbound: only traffic to these pods (by pod IP or a ClusterIP selecting them).
    targets: Option<Vec<&'a PodView>>,
}

fn totals(mesh: &Mesh, scrapes: &Scrapes, traffic: &Traffic<'_>) -> Totals {
    let mut totals = Totals::default();
    let reaches = |target_addr: &str| match &traffic.targets {
        None => true,
        Some(targets) => target_ip(target_addr).is_some_and(|ip| {
            mesh.pods_at(ip).iter().any(|p| targets.iter().any(|t| t.namespace == p.namespace && t.name == p.name))
        }),
    };
    for pod in &traffic.sources {
        let Some(Ok((before, after))) = scrapes.get(&pod_key(pod)) else { continue };
        for (sample, delta) in deltas(before, after) {
            if sample.label("direction") == traffic.direction && reaches(sample.label("target_addr")) {
                totals.add(sample, delta);
            }
        }
    }
    totals
}

/// Every resource of the query's kind (or the one named), with its pods.
fn selected<'a>(mesh: &'a Mesh, query: &Query) -> BTreeMap<(String, String), Vec<&'a PodView>> {
    let kind = query.resource.kind;
    let mut out: BTreeMap<(String, String), Vec<&PodView>> = BTreeMap::new();
    for pod in &mesh.pods {
        if query.namespace.as_ref().is_some_and(|ns| *ns != pod.namespace) {
            continue;
        }
        let Some(name) = pod.resource_name(kind) else { continue };
        if query.resource.name.as_ref().is_some_and(|n| *n != name) {
            continue;
        }
        let namespace = if kind == Kind::Namespace { String::new() } else { pod.namespace.clone() };
        out.entry((namespace, name)).or_default().push(pod);
    }
    out
}

/// The pods of `--from`/`--to` (a resource without a name: every one of its kind).
fn pods_of<'a>(mesh: &'a Mesh, (resource, namespace): &(Resource, String)) -> Vec<&'a PodView> {
    mesh.pods
        .iter()
        .filter(|p| resource.kind == Kind::Namespace || p.namespace == *namespace)
        .filter(|p| match (p.resource_name(resource.kind), &resource.name) {
            (Some(have), Some(want)) => have == *want,
            (Some(_), None) => true,
            (None, _) => false,
        })
        .collect()
}

/// One row per selected resource.
pub fn stat(mesh: &Mesh, scrapes: &Scrapes, query: &Query) -> Vec<StatRow> {
    let seconds = query.window.as_secs_f64().max(1e-3);
    selected(mesh, query)
        .into_iter()
        .map(|((namespace, name), pods)| {
            let traffic = match (&query.from, &query.to) {
                (Some(from), _) => {
                    Traffic { sources: pods_of(mesh, from), direction: "outbound", targets: Some(pods.clone()) }
                }
                (None, Some(to)) => {
                    Traffic { sources: pods.clone(), direction: "outbound", targets: Some(pods_of(mesh, to)) }
                }
                (None, None) => Traffic { sources: pods.clone(), direction: "inbound", targets: None },
            };
            let t = totals(mesh, scrapes, &traffic);
            let unreadable = traffic
                .sources
                .iter()
                .filter(|p| p.meshed)
                .filter_map(|p| match scrapes.get(&pod_key(p)) {
                    Some(Ok(_)) => None,
                    Some(Err(e)) => Some(format!("{}: {e}", pod_key(p))),
                    None => Some(format!("{}: not scraped", pod_key(p))),
                })
                .collect();
            StatRow {
                namespace,
                kind: query.resource.kind.name(),
                name,
                meshed_pods: pods.iter().filter(|p| p.meshed).count(),
                pods: pods.len(),
                requests: t.responses,
                success_rate: (t.responses > 0.0).then(|| t.successes / t.responses),
                rps: t.responses / seconds,
                latency_ms: Latency::of(&t.buckets),
                tcp_connections: t.open_connections,
                mtls_share: t.mtls_share(),
                unreadable,
            }
        })
        .collect()
}

/// Traffic from one workload to another, as the source's proxies saw it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EdgeRow {
    pub src_namespace: String,
    pub src: String,
    pub dst_namespace: String,
    /// `kind/name`: the destination's resource of the same kind, else its pod, else its address.
    pub dst: String,
    /// `sa.ns` of the source pods' proxies.
    pub client_ids: Vec<String>,
    /// The identities the destination proved (`server_id`), short form.
    pub server_ids: Vec<String>,
    /// Every request and connection of the edge was mTLS.
    pub mtls: bool,
    /// Requests and connections the source sent to addresses that reach the destination. The
    /// proxies label outbound traffic by its original destination: traffic to a ClusterIP counts
    /// for every workload (or pod) behind it, so per-pod edges of a Service repeat its totals.
    pub requests: f64,
    pub connections: f64,
    /// Traffic to an EgressNetwork's destinations, by hostname (`dst` is
    /// `egress/<hostname>`): the EgressNetwork and what its policy refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressEdge>,
}

/// What an egress edge adds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EgressEdge {
    /// `<namespace>/<name>` of the EgressNetwork.
    pub network: String,
    /// Connections and requests its policy refused.
    pub denied: f64,
}

fn short(id: &str) -> String {
    id.split_once(".serviceaccount.").map_or(id, |(short, _)| short).to_string()
}

/// Edges from the selected resources to whatever their proxies sent to, from one scrape
/// (counters since each proxy started).
pub fn edges(mesh: &Mesh, scrapes: &Scrapes, query: &Query) -> Vec<EdgeRow> {
    let kind = query.resource.kind;
    let mut out: BTreeMap<(String, String, String, String), EdgeRow> = BTreeMap::new();
    for ((src_namespace, src), pods) in selected(mesh, query) {
        for pod in pods {
            let Some(Ok((_, after))) = scrapes.get(&pod_key(pod)) else { continue };
            // Egress the proxy saw by hostname (`dst_kind="egress"`) is one row per
            // hostname ([`egress_edges`]), not also one per IP.
            let outbound = after
                .iter()
                .filter(|s| s.label("direction") == "outbound" && s.value > 0.0 && s.label("dst_kind") != "egress");
            for sample in outbound.filter(|s| s.name == "request_total" || s.name == "tcp_open_total") {
                for (dst_namespace, dst) in destinations(mesh, kind, sample.label("target_addr")) {
                    let key = (src_namespace.clone(), src.clone(), dst_namespace.clone(), dst.clone());
                    let edge = out.entry(key).or_insert_with(|| EdgeRow {
                        src_namespace: src_namespace.clone(),
                        src: format!("{}/{src}", kind.name()),
                        dst_namespace,
                        dst,
                        client_ids: Vec::new(),
                        server_ids: Vec::new(),
                        mtls: true,
                        requests: 0.0,
                        connections: 0.0,
                        egress: None,
                    });
                    if pod.meshed && !edge.client_ids.contains(&pod.short_identity()) {
                        edge.client_ids.push(pod.short_identity());
                    }
                    let server = sample.label("server_id");
                    if !server.is_empty() && !edge.server_ids.contains(&short(server)) {
                        edge.server_ids.push(short(server));
                    }
                    edge.mtls &= sample.label("tls") == "true";
                    if sample.name == "request_total" {
                        edge.requests += sample.value;
                    } else {
                        edge.connections += sample.value;
                    }
                }
            }
        }
    }
    egress_edges(mesh, scrapes, query, &mut out);
    out.into_values()
        .map(|mut e| {
            e.client_ids.sort();
            e.server_ids.sort();
            e
        })
        .collect()
}

/// The `(namespace, kind/name)` an outbound `target_addr` reaches: the resources of `kind` (else
/// the pods) behind its IP, or the address itself (namespace `""`) when no pod is there.
fn destinations(mesh: &Mesh, kind: Kind, target: &str) -> BTreeSet<(String, String)> {
    let dsts = target_ip(target).map(|ip| mesh.pods_at(ip)).unwrap_or_default();
    if dsts.is_empty() {
        return BTreeSet::from([(String::new(), target.to_string())]);
    }
    dsts.iter()
        .map(|d| {
            let name = match d.resource_name(kind) {
                Some(n) => format!("{}/{n}", kind.name()),
                None => format!("pod/{}", d.name),
            };
            (d.namespace.clone(), name)
        })
        .collect()
}

/// `(src_namespace, src, dst_namespace, dst)` of an edge, as [`EdgeRow`] names them.
pub type EdgeKey = (String, String, String, String);

/// What the source's proxies got back on one edge over the window: responses by outcome.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct EdgeTraffic {
    pub responses: f64,
    pub rps: f64,
    /// `None` without responses.
    pub success_rate: Option<f64>,
    /// 403s: refused by the destination's policy.
    pub denied: f64,
    /// 429s: refused by the destination's rate limit.
    pub rate_limited: f64,
}

/// Each edge's responses over the window (deltas of the source's outbound `response_total`),
/// keyed as [`edges`] names the edge.
pub fn edge_traffic(mesh: &Mesh, scrapes: &Scrapes, query: &Query) -> BTreeMap<EdgeKey, EdgeTraffic> {
    let kind = query.resource.kind;
    let seconds = query.window.as_secs_f64().max(1e-3);
    let mut out: BTreeMap<EdgeKey, (EdgeTraffic, f64)> = BTreeMap::new();
    let responses = source_deltas(mesh, scrapes, query).filter(|(_, _, s, d)| {
        *d > 0.0 && s.name == "response_total" && s.label("direction") == "outbound" && s.label("dst_kind") != "egress"
    });
    for (src_namespace, src, sample, delta) in responses {
        for (dst_namespace, dst) in destinations(mesh, kind, sample.label("target_addr")) {
            let (traffic, successes) = out.entry((src_namespace.clone(), src.clone(), dst_namespace, dst)).or_default();
            traffic.responses += delta;
            match sample.label("status_code") {
                "403" => traffic.denied += delta,
                "429" => traffic.rate_limited += delta,
                _ => {}
            }
            if sample.label("classification") == "success" {
                *successes += delta;
            }
        }
    }
    out.into_iter()
        .map(|(key, (mut traffic, successes))| {
            traffic.rps = traffic.responses / seconds;
            traffic.success_rate = (traffic.responses > 0.0).then(|| successes / traffic.responses);
            (key, traffic)
        })
        .collect()
}

/// Every sample's delta over the window from the selected resources' pods, with the resource
/// (`namespace`, `kind/name`) whose pod's proxy counted it.
fn source_deltas<'a>(
    mesh: &'a Mesh,
    scrapes: &'a Scrapes,
    query: &Query,
) -> impl Iterator<Item = (String, String, &'a Sample, f64)> + 'a {
    let kind = query.resource.kind;
    selected(mesh, query).into_iter().flat_map(move |((namespace, name), pods)| {
        let src = format!("{}/{name}", kind.name());
        pods.into_iter()
            .filter_map(|pod| match scrapes.get(&pod_key(pod)) {
                Some(Ok((before, after))) => Some(deltas(before, after)),
                _ => None,
            })
            .flatten()
            .map(move |(sample, delta)| (namespace.clone(), src.clone(), sample, delta))
    })
}

/// `namespace/name` of a route metric's `<prefix>_*` labels (`parent`, `backend`).
fn route_resource(sample: &Sample, prefix: &str) -> String {
    let ns = sample.label(&format!("{prefix}_namespace"));
    let name = sample.label(&format!("{prefix}_name"));
    if ns.is_empty() { name.to_string() } else { format!("{ns}/{name}") }
}

/// A route metric's route (`default` when the proxy names none).
fn route_name(sample: &Sample) -> String {
    match sample.label("route_name") {
        "" => "default".to_string(),
        name => name.to_string(),
    }
}

/// Requests a route sent to one of its backends over the window
/// (`outbound_http_route_backend_requests_total`): a traffic split's share per backend.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RouteBackendRow {
    pub src_namespace: String,
    /// `kind/name` of the sending resource.
    pub src: String,
    /// `namespace/name` of the route's parent (the Service the client called).
    pub parent: String,
    pub route: String,
    /// `namespace/name` of the backend Service.
    pub backend: String,
    pub requests: f64,
    pub rps: f64,
}

/// Every (source, parent, route, backend)'s requests over the window.
pub fn route_backends(mesh: &Mesh, scrapes: &Scrapes, query: &Query) -> Vec<RouteBackendRow> {
    let seconds = query.window.as_secs_f64().max(1e-3);
    let mut out: BTreeMap<(String, String, String, String, String), f64> = BTreeMap::new();
    for (src_namespace, src, sample, delta) in source_deltas(mesh, scrapes, query) {
        if sample.name == "outbound_http_route_backend_requests_total" {
            let key = (
                src_namespace,
                src,
                route_resource(sample, "parent"),
                route_name(sample),
                route_resource(sample, "backend"),
            );
            *out.entry(key).or_default() += delta;
        }
    }
    out.into_iter()
        .map(|((src_namespace, src, parent, route, backend), requests)| RouteBackendRow {
            src_namespace,
            src,
            parent,
            route,
            backend,
            requests,
            rps: requests / seconds,
        })
        .collect()
}

/// One route's traffic from the selected resource over the window, as its proxies measured it
/// (`outbound_http_route_request_duration_seconds`, and `outbound_http_route_request_statuses_total`
/// for the outcome where the proxy writes it).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RouteRow {
    pub src_namespace: String,
    pub src: String,
    /// `namespace/name` of the route's parent (the Service called).
    pub parent: String,
    pub route: String,
    pub requests: f64,
    pub rps: f64,
    /// Of the responses with a status in the window; `None` without any.
    pub success_rate: Option<f64>,
    /// To the response's headers.
    pub latency_ms: Option<Latency>,
}

/// Every (source, parent, route) of the selected resources over the window.
pub fn routes(mesh: &Mesh, scrapes: &Scrapes, query: &Query) -> Vec<RouteRow> {
    #[derive(Default)]
    struct Acc {
        requests: f64,
        answered: f64,
        successes: f64,
        buckets: BTreeMap<u64, (f64, f64)>,
    }
    let seconds = query.window.as_secs_f64().max(1e-3);
    let mut out: BTreeMap<(String, String, String, String), Acc> = BTreeMap::new();
    for (src_namespace, src, sample, delta) in source_deltas(mesh, scrapes, query) {
        let family = sample.name.as_str();
        if !family.starts_with("outbound_http_route_request_") {
            continue;
        }
        let key = (src_namespace, src, route_resource(sample, "parent"), route_name(sample));
        let acc = out.entry(key).or_default();
        match family {
            "outbound_http_route_request_duration_seconds_count" => acc.requests += delta,
            "outbound_http_route_request_duration_seconds_bucket" => {
                let bound = match sample.label("le") {
                    "+Inf" => f64::INFINITY,
                    le => match le.parse::<f64>() {
                        Ok(b) => b * 1000.0,
                        Err(_) => continue,
                    },
                };
                acc.buckets.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += delta;
            }
            "outbound_http_route_request_statuses_total" => {
                acc.answered += delta;
                let status: u16 = sample.label("http_status").parse().unwrap_or(0);
                let refused = status == 403 || status == 429;
                if sample.label("error").is_empty() && (1..500).contains(&status) && !refused {
                    acc.successes += delta;
                }
            }
            _ => {}
        }
    }
    out.into_iter()
        .map(|((src_namespace, src, parent, route), acc)| RouteRow {
            src_namespace,
            src,
            parent,
            route,
            requests: acc.requests,
            rps: acc.requests / seconds,
            success_rate: (acc.answered > 0.0).then(|| acc.successes / acc.answered),
            latency_ms: Latency::of(&acc.buckets),
        })
        .collect()
}

/// What one `outbound_egress_*` sample counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EgressCount {
    Requests,
    Connections,
    Denied,
}

/// An `outbound_egress_*` sample as (EgressNetwork `<ns>/<name>`, hostname, what it
/// counts); `None` for any other series. The one reading of these families that `edges`,
/// `stat egress` and the dashboard share.
fn egress_sample(sample: &Sample) -> Option<(&str, &str, EgressCount)> {
    let count = match sample.name.as_str() {
        "outbound_egress_requests_total" => EgressCount::Requests,
        "outbound_egress_connections_total" => EgressCount::Connections,
        "outbound_egress_denied_total" => EgressCount::Denied,
        _ => return None,
    };
    Some((sample.label("egress_network"), sample.label("dst_hostname"), count))
}

/// Requests, connections and refusals of one (EgressNetwork, hostname).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EgressCounts {
    pub requests: f64,
    pub connections: f64,
    pub denied: f64,
}

impl EgressCounts {
    fn add(&mut self, count: EgressCount, value: f64) {
        match count {
            EgressCount::Requests => self.requests += value,
            EgressCount::Connections => self.connections += value,
            EgressCount::Denied => self.denied += value,
        }
    }
}

/// `dst` of an egress row: `egress/<hostname>`.
pub fn egress_dst(hostname: &str) -> String {
    format!("egress/{hostname}")
}

/// The selected resources' egress, by destination hostname (TLS SNI, HTTP Host, else
/// the IP), from the proxies' `outbound_egress_*` families: one edge per (EgressNetwork,
/// hostname), `dst` `egress/<hostname>` in the EgressNetwork's namespace.
fn egress_edges(
    mesh: &Mesh,
    scrapes: &Scrapes,
    query: &Query,
    out: &mut BTreeMap<(String, String, String, String), EdgeRow>,
) {
    let kind = query.resource.kind;
    for ((src_namespace, src), pods) in selected(mesh, query) {
        for pod in pods {
            let Some(Ok((_, after))) = scrapes.get(&pod_key(pod)) else { continue };
            for sample in after.iter().filter(|s| s.value > 0.0) {
                let Some((network, hostname, count)) = egress_sample(sample) else { continue };
                let dst_namespace = network.split_once('/').map_or("", |(ns, _)| ns).to_string();
                let dst = egress_dst(hostname);
                let key = (src_namespace.clone(), src.clone(), dst_namespace.clone(), dst.clone());
                let edge = out.entry(key).or_insert_with(|| EdgeRow {
                    src_namespace: src_namespace.clone(),
                    src: format!("{}/{src}", kind.name()),
                    dst_namespace,
                    dst,
                    client_ids: Vec::new(),
                    server_ids: Vec::new(),
                    mtls: false,
                    requests: 0.0,
                    connections: 0.0,
                    egress: Some(EgressEdge { network: network.to_string(), denied: 0.0 }),
                });
                if pod.meshed && !edge.client_ids.contains(&pod.short_identity()) {
                    edge.client_ids.push(pod.short_identity());
                }
                let mut counts = EgressCounts::default();
                counts.add(count, sample.value);
                edge.requests += counts.requests;
                edge.connections += counts.connections;
                if let Some(egress) = edge.egress.as_mut() {
                    egress.denied += counts.denied;
                }
            }
        }
    }
}

/// One (EgressNetwork, hostname)'s traffic from the meshed pods of a namespace over
/// the window: `cnimesh stat egress`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EgressStatRow {
    /// The namespace of the clients whose traffic this is.
    pub namespace: String,
    pub kind: &'static str,
    /// The hostname (TLS SNI, HTTP Host, else the IP; `other` beyond the proxies' cap).
    pub name: String,
    /// `<namespace>/<name>` of the EgressNetwork.
    pub network: String,
    /// HTTP requests in the window (refused ones included).
    pub requests: f64,
    pub rps: f64,
    /// Of the HTTP responses to this hostname (`response_total{dst_kind="egress"}` by its
    /// authority's host; a refusal's 403 is a response, as Linkerd classifies 4xx); `None`
    /// without responses.
    pub success_rate: Option<f64>,
    /// Connections opened in the window (TLS, HTTP, opaque).
    pub connections: f64,
    /// Connections and requests its policy refused in the window.
    pub denied: f64,
    /// Meshed pods whose metrics could not be read, with the reason.
    pub unreadable: Vec<String>,
}

/// The host of an `authority` label (`host[:port]`), lower case.
fn authority_host(authority: &str) -> String {
    authority
        .parse::<http::uri::Authority>()
        .map_or_else(|_| authority.to_string(), |a| a.host().to_string())
        .to_ascii_lowercase()
}

/// `stat egress[/HOSTNAME]`: the egress of the meshed pods of the query's namespace (or
/// of `--from`'s pods), one row per (client namespace, EgressNetwork, hostname), over the window.
pub fn egress_stat(mesh: &Mesh, scrapes: &Scrapes, query: &Query) -> Vec<EgressStatRow> {
    let seconds = query.window.as_secs_f64().max(1e-3);
    let pods: Vec<&PodView> = match &query.from {
        Some(from) => pods_of(mesh, from),
        None => mesh.pods.iter().filter(|p| query.namespace.as_ref().is_none_or(|ns| *ns == p.namespace)).collect(),
    };
    let wanted = query.resource.name.as_ref().map(|n| n.to_ascii_lowercase());
    // (client namespace, network, hostname) → counts, responses, successes
    let mut rows: BTreeMap<(String, String, String), (EgressCounts, f64, f64)> = BTreeMap::new();
    let mut unreadable: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| p.meshed) {
        let (before, after) = match scrapes.get(&pod_key(pod)) {
            Some(Ok(both)) => both,
            Some(Err(e)) => {
                unreadable.entry(pod.namespace.clone()).or_default().push(format!("{}: {e}", pod_key(pod)));
                continue;
            }
            None => {
                unreadable.entry(pod.namespace.clone()).or_default().push(format!("{}: not scraped", pod_key(pod)));
                continue;
            }
        };
        let mut responses: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        let mut seen: Vec<(String, String)> = Vec::new();
        for (sample, delta) in deltas(before, after) {
            if let Some((network, hostname, count)) = egress_sample(sample) {
                if wanted.as_ref().is_some_and(|w| w != hostname) {
                    continue;
                }
                let key = (pod.namespace.clone(), network.to_string(), hostname.to_string());
                rows.entry(key).or_default().0.add(count, delta);
                if !seen.iter().any(|(n, h)| n == network && h == hostname) {
                    seen.push((network.to_string(), hostname.to_string()));
                }
            } else if sample.name == "response_total"
                && sample.label("direction") == "outbound"
                && sample.label("dst_kind") == "egress"
            {
                let entry = responses.entry(authority_host(sample.label("authority"))).or_default();
                entry.0 += delta;
                if sample.label("classification") == "success" {
                    entry.1 += delta;
                }
            }
        }
        for (network, hostname) in seen {
            let Some((all, ok)) = responses.get(&hostname) else { continue };
            let row = rows.entry((pod.namespace.clone(), network, hostname)).or_default();
            row.1 += all;
            row.2 += ok;
        }
    }
    rows.into_iter()
        .map(|((namespace, network, name), (counts, responses, successes))| EgressStatRow {
            unreadable: unreadable.get(&namespace).cloned().unwrap_or_default(),
            namespace,
            kind: Kind::Egress.name(),
            name,
            network,
            requests: counts.requests,
            rps: counts.requests / seconds,
            success_rate: (responses > 0.0).then(|| successes / responses),
            connections: counts.connections,
            denied: counts.denied,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buckets(pairs: &[(f64, f64)]) -> BTreeMap<u64, (f64, f64)> {
        pairs.iter().map(|&(b, c)| (b.to_bits(), (b, c))).collect()
    }

    #[test]
    fn quantiles_interpolate_within_buckets_like_prometheus() {
        let b = buckets(&[(1.0, 0.0), (2.0, 50.0), (5.0, 90.0), (10.0, 100.0), (f64::INFINITY, 100.0)]);
        assert_eq!(quantile(&b, 0.5), Some(2.0));
        assert_eq!(quantile(&b, 0.25), Some(1.5));
        assert!((quantile(&b, 0.95).unwrap() - 7.5).abs() < 1e-9);
        let overflow = buckets(&[(10.0, 1.0), (f64::INFINITY, 10.0)]);
        assert_eq!(quantile(&overflow, 0.99), Some(10.0), "the +Inf bucket answers its lower bound");
        assert_eq!(quantile(&buckets(&[(1.0, 0.0)]), 0.5), None);
    }

    #[test]
    fn a_counter_that_went_down_counts_from_zero() {
        let s = |v: f64| Sample { name: "response_total".into(), labels: BTreeMap::new(), value: v };
        let (before, after) = (vec![s(10.0)], vec![s(3.0)]);
        assert_eq!(deltas(&before, &after).map(|(_, d)| d).collect::<Vec<_>>(), vec![3.0]);
        let (before, after) = (vec![s(10.0)], vec![s(14.0)]);
        assert_eq!(deltas(&before, &after).map(|(_, d)| d).collect::<Vec<_>>(), vec![4.0]);
    }
}
