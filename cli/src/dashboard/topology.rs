//! The topology page's graph in one answer: every workload of the namespace (or all) as a node
//! with its golden metrics over the chosen time range, every edge `cnimesh edges` finds with what
//! its source got back over that range (responses, success, 403 denials, 429 rate limits), the
//! backends a route split traffic to, and destinations outside the mesh as what they are: an
//! address (no workload to ask about) or an egress hostname. One answer instead of one `stat`
//! call per edge, so a namespace of 200 services costs one request per refresh.
//!
//! Layer: model (pure): built from the sampler's readings by the CLI's own functions
//! ([`compute::edges`], [`compute::edge_traffic`], [`compute::route_backends`], [`compute::stat`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

use crate::stat::compute::{self, EdgeTraffic, EgressEdge, Query, Scrapes};
use crate::stat::mesh::{Kind, Mesh, Resource};

/// What a node stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    /// A deployment (or another workload kind) with a page of its own.
    Workload,
    /// A pod that belongs to no workload of the kind shown.
    Pod,
    /// An address no pod of the mesh has (a call outside the mesh): nothing to ask about.
    Address,
    /// A hostname reached through an EgressNetwork.
    Egress,
    /// A Service a route split to whose pods are not known.
    Service,
}

#[derive(Debug, Clone, Serialize)]
pub struct Node {
    /// Unique in the answer: `namespace/kind/name`, `address:IP:PORT`, `egress:NS/HOST`, `service:NS/NAME`.
    pub id: String,
    pub kind: NodeKind,
    pub namespace: String,
    /// `kind/name` for workloads and pods, the address or hostname otherwise.
    pub name: String,
    /// What the page writes in the node.
    pub label: String,
    pub meshed: bool,
    /// What the workload received over the range (its inbound proxies), when it is one.
    pub rps: Option<f64>,
    pub success_rate: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// How an edge is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeKind {
    Mtls,
    Plaintext,
    Egress,
    /// A route's backend other than the Service called (a canary's share).
    Split,
}

/// The route and share of a split edge.
#[derive(Debug, Clone, Serialize)]
pub struct Split {
    /// `namespace/name` of the Service the client called.
    pub parent: String,
    pub route: String,
    /// `namespace/name` of the backend Service.
    pub backend: String,
    /// Of the route's requests from this source over the range.
    pub share: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Edge {
    pub id: String,
    pub source: String,
    pub target: String,
    pub kind: EdgeKind,
    pub mtls: bool,
    pub client_ids: Vec<String>,
    pub server_ids: Vec<String>,
    /// Requests since the proxies started (what `cnimesh edges` prints).
    pub requests_total: f64,
    /// Over the range.
    pub traffic: EdgeTraffic,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressEdge>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    /// Every namespace with pods (what the page's filter offers).
    pub namespaces: Vec<String>,
    /// The range the rates span (shorter than asked while the dashboard has run for less).
    pub window_seconds: f64,
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
}

/// The graph of `namespace` (`None`: every namespace): nodes are its workloads and whatever they
/// call or are called by. `latest` is the last reading alone (edges since the proxies started),
/// `range` the scrapes over the time range, `window` its length.
pub fn build(mesh: &Mesh, latest: &Scrapes, range: &Scrapes, window: Duration, namespace: Option<&str>) -> Topology {
    let kind = Kind::Deployment;
    let query = Query { resource: Resource { kind, name: None }, namespace: None, from: None, to: None, window };
    let touches = |a: &str, b: &str| namespace.is_none_or(|ns| ns == a || ns == b);
    let rows: Vec<_> = compute::edges(mesh, latest, &query)
        .into_iter()
        .filter(|e| touches(&e.src_namespace, &e.dst_namespace))
        .collect();
    let traffic = compute::edge_traffic(mesh, range, &query);
    let stats: BTreeMap<(String, String), compute::StatRow> = compute::stat(mesh, range, &query)
        .into_iter()
        .map(|r| ((r.namespace.clone(), format!("{}/{}", r.kind, r.name)), r))
        .collect();

    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    let workload = |nodes: &mut BTreeMap<String, Node>, ns: &str, name: &str| -> String {
        let id = format!("{ns}/{name}");
        nodes.entry(id.clone()).or_insert_with(|| {
            let stat = stats.get(&(ns.to_string(), name.to_string()));
            let is_pod = name.starts_with("pod/");
            Node {
                id: id.clone(),
                kind: if is_pod { NodeKind::Pod } else { NodeKind::Workload },
                namespace: ns.to_string(),
                name: name.to_string(),
                label: name.split_once('/').map_or(name, |(_, n)| n).to_string(),
                meshed: stat.map_or_else(
                    || mesh.pods.iter().any(|p| p.namespace == ns && name == format!("pod/{}", p.name) && p.meshed),
                    |s| s.meshed_pods > 0,
                ),
                rps: stat.map(|s| s.rps),
                success_rate: stat.and_then(|s| s.success_rate),
                p99_ms: stat.and_then(|s| s.latency_ms.as_ref().map(|l| l.p99)),
            }
        });
        id
    };
    // Every workload of the namespace, called or not.
    for (ns, name) in stats.keys() {
        if namespace.is_none_or(|want| want == ns) {
            workload(&mut nodes, ns, name);
        }
    }

    let mut edges = Vec::new();
    for row in rows {
        let source = workload(&mut nodes, &row.src_namespace, &row.src);
        let (target, kind) = match (&row.egress, row.dst_namespace.is_empty()) {
            (Some(_), _) => {
                let host = row.dst.strip_prefix("egress/").unwrap_or(&row.dst).to_string();
                let id = format!("egress:{}/{host}", row.dst_namespace);
                nodes.entry(id.clone()).or_insert_with(|| outside(&id, NodeKind::Egress, &row.dst_namespace, &host));
                (id, EdgeKind::Egress)
            }
            (None, true) => {
                let id = format!("address:{}", row.dst);
                nodes.entry(id.clone()).or_insert_with(|| outside(&id, NodeKind::Address, "", &row.dst));
                (id, if row.mtls { EdgeKind::Mtls } else { EdgeKind::Plaintext })
            }
            (None, false) => {
                let id = workload(&mut nodes, &row.dst_namespace, &row.dst);
                (id, if row.mtls { EdgeKind::Mtls } else { EdgeKind::Plaintext })
            }
        };
        let key = (row.src_namespace.clone(), row.src.clone(), row.dst_namespace.clone(), row.dst.clone());
        edges.push(Edge {
            id: format!("{source}>{target}"),
            source,
            target,
            kind,
            mtls: row.mtls,
            client_ids: row.client_ids,
            server_ids: row.server_ids,
            requests_total: row.requests,
            traffic: traffic.get(&key).cloned().unwrap_or_default(),
            egress: row.egress,
            split: None,
        });
    }

    // A route's backends other than the Service called: the canary's share gets its own edge.
    let backends = compute::route_backends(mesh, range, &query);
    let mut route_totals: BTreeMap<(String, String, String, String), f64> = BTreeMap::new();
    for b in &backends {
        *route_totals
            .entry((b.src_namespace.clone(), b.src.clone(), b.parent.clone(), b.route.clone()))
            .or_default() += b.requests;
    }
    let mut drawn: BTreeSet<String> = edges.iter().map(|e| e.id.clone()).collect();
    for b in backends.iter().filter(|b| {
        b.backend != b.parent && touches(&b.src_namespace, b.backend.split_once('/').map_or("", |(ns, _)| ns))
    }) {
        let source = workload(&mut nodes, &b.src_namespace, &b.src);
        let targets = match backend_workloads(mesh, &b.backend, kind) {
            list if list.is_empty() => {
                let id = format!("service:{}", b.backend);
                let (ns, name) = b.backend.split_once('/').unwrap_or(("", &b.backend));
                nodes.entry(id.clone()).or_insert_with(|| outside(&id, NodeKind::Service, ns, &format!("svc/{name}")));
                vec![id]
            }
            list => list.into_iter().map(|(ns, name)| workload(&mut nodes, &ns, &name)).collect(),
        };
        let total = route_totals
            .get(&(b.src_namespace.clone(), b.src.clone(), b.parent.clone(), b.route.clone()))
            .copied()
            .unwrap_or_default();
        for target in targets {
            let id = format!("{source}>{target}|split");
            if !drawn.insert(id.clone()) {
                continue;
            }
            edges.push(Edge {
                id,
                source: source.clone(),
                target,
                kind: EdgeKind::Split,
                mtls: false,
                client_ids: Vec::new(),
                server_ids: Vec::new(),
                requests_total: 0.0,
                traffic: EdgeTraffic { responses: b.requests, rps: b.rps, ..EdgeTraffic::default() },
                egress: None,
                split: Some(Split {
                    parent: b.parent.clone(),
                    route: b.route.clone(),
                    backend: b.backend.clone(),
                    share: (total > 0.0).then(|| b.requests / total),
                }),
            });
        }
    }

    let mut namespaces: Vec<String> = mesh.pods.iter().map(|p| p.namespace.clone()).collect();
    namespaces.sort();
    namespaces.dedup();
    Topology { namespaces, window_seconds: window.as_secs_f64(), nodes: nodes.into_values().collect(), edges }
}

/// A node outside the mesh's workloads.
fn outside(id: &str, kind: NodeKind, namespace: &str, name: &str) -> Node {
    Node {
        id: id.to_string(),
        kind,
        namespace: namespace.to_string(),
        name: name.to_string(),
        label: name.to_string(),
        meshed: false,
        rps: None,
        success_rate: None,
        p99_ms: None,
    }
}

/// The workloads (of `kind`, else pods) a Service `namespace/name` selects, through its ClusterIP.
fn backend_workloads(mesh: &Mesh, service: &str, kind: Kind) -> Vec<(String, String)> {
    let Some((ns, name)) = service.split_once('/') else { return Vec::new() };
    let Some(ip) =
        mesh.services.iter().find(|s| s.namespace == ns && s.name == name).and_then(|s| s.cluster_ips.first())
    else {
        return Vec::new();
    };
    let set: BTreeSet<(String, String)> = mesh
        .pods_at(*ip)
        .into_iter()
        .map(|p| match p.resource_name(kind) {
            Some(n) => (p.namespace.clone(), format!("{}/{n}", kind.name())),
            None => (p.namespace.clone(), format!("pod/{}", p.name)),
        })
        .collect();
    set.into_iter().collect()
}
