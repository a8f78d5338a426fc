//! The last step of `local up`: the demo's traffic from each client, what the proxies saw of it,
//! and the commands to look further.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use cnimesh_common::names::PROXY_ADMIN_PORT;

use super::{Inputs, Running, loopback, replicas};
use crate::demo_trace::{DemoTrace, SPANS_WAIT, new_traceparent, wait_for_trace};
use crate::runtime::random_id;
use crate::traffic::{self, Edge, http_get_in, http_get_in_with, samples};
use crate::workloads::Role;

/// The samples of `pod`'s proxy `/metrics` (none when it cannot be read).
fn metrics_of(i: &Inputs<'_>, pod: &str) -> Vec<traffic::Sample> {
    http_get_in(&i.netns(pod), loopback(PROXY_ADMIN_PORT), "proxy", "/metrics")
        .map(|(_, body)| samples(&body))
        .unwrap_or_default()
}

/// Each client's load against each service it calls, and for meshed clients whether the proxies
/// saw it as mTLS.
pub(super) fn send_traffic(i: &Inputs<'_>, pods: &[Running]) -> Vec<Edge> {
    i.progress("sending traffic");
    let (w, ns) = (i.workloads, i.workloads.namespace.as_str());
    let mut edges = Vec::new();
    for client in &w.clients {
        let netns = i.netns(&client.name);
        for target in &client.calls {
            let s = w.service(target).expect("validated: calls name services");
            // A split service is answered by the replicas of every service it splits to.
            let backends: Vec<&str> = match &s.split {
                Some(split) => split.iter().map(|b| b.service.as_str()).collect(),
                None => vec![s.name.as_str()],
            };
            let replicas: Vec<&Running> = backends.iter().flat_map(|b| replicas(pods, b)).collect();
            let host = format!("{}.{ns}.svc.cluster.local", s.name);
            let duration = Duration::from_secs_f64(i.args.traffic_seconds);
            let load =
                traffic::load(&netns, SocketAddr::from((s.cluster_ip, s.port)), &host, i.args.concurrency, duration);
            let names: Vec<String> = replicas.iter().map(|p| p.spec.name.clone()).collect();
            let mut edge = Edge::new(&client.name, &s.name, s.meshed, &load, &names);
            let service_of: Vec<(&str, &str)> = replicas
                .iter()
                .filter_map(|p| match &p.spec.role {
                    Role::Server { service } => Some((p.spec.name.as_str(), service.as_str())),
                    Role::Client | Role::Ingress => None,
                })
                .collect();
            edge.count_backends(&service_of);
            if client.meshed {
                // The proxy labels by the address the app dialled (the ClusterIP) or the endpoint's.
                let ips: Vec<String> =
                    replicas.iter().map(|p| p.ip.to_string()).chain([s.cluster_ip.to_string()]).collect();
                let replica_metrics: Vec<(String, Vec<traffic::Sample>)> = replicas
                    .iter()
                    .filter(|p| p.spec.meshed)
                    .map(|p| (p.spec.name.clone(), metrics_of(i, &p.spec.name)))
                    .collect();
                edge.read_tls(&metrics_of(i, &client.name), &ips, &replica_metrics);
            }
            edges.push(edge);
        }
    }
    edges
}

/// After the load: one request from the first meshed client to the first meshed service it
/// calls, with a sampled W3C `traceparent` as an instrumented app would send, and its trace as the
/// collector stand-in received it (bounded wait). `None` when the demo has no such pair.
pub(super) fn send_traced_request(i: &Inputs<'_>, pods: &[Running]) -> anyhow::Result<Option<DemoTrace>> {
    let (w, ns) = (i.workloads, i.workloads.namespace.as_str());
    let pair = w.clients.iter().filter(|c| c.meshed).find_map(|client| {
        let service = client.calls.iter().filter_map(|t| w.service(t)).find(|s| s.meshed)?;
        Some((client, service))
    });
    let Some((client, s)) = pair else { return Ok(None) };
    i.progress(&format!("sending one traced request {} -> {}", client.name, s.name));
    let (traceparent, trace_id, app_span) = new_traceparent(&random_id()?);
    let host = format!("{}.{ns}.svc.cluster.local", s.name);
    let answer = http_get_in_with(
        &i.netns(&client.name),
        SocketAddr::from((s.cluster_ip, s.port)),
        &host,
        "/",
        &[("traceparent", traceparent)],
    );
    if let Err(error) = &answer {
        tracing::warn!(%error, "the traced request failed; its spans may still show where");
    }
    let backends: Vec<&str> = match &s.split {
        Some(split) => split.iter().map(|b| b.service.as_str()).collect(),
        None => vec![s.name.as_str()],
    };
    let servers: Vec<String> = backends.iter().flat_map(|b| replicas(pods, b)).map(|p| p.spec.name.clone()).collect();
    let file = crate::demo_trace::traces_file(i.root);
    Ok(Some(wait_for_trace(&file, &trace_id, &app_span, &client.name, &servers, SPANS_WAIT)))
}

/// The summary's "look further" commands.
pub(super) fn next_commands(i: &Inputs<'_>) -> BTreeMap<String, String> {
    let (node, root, prefix, ns) = (&i.bins.node, i.root, i.prefix, i.workloads.namespace.as_str());
    let state_dir = root.join("state");
    let mut commands = BTreeMap::new();
    if let Some(client) = i.workloads.clients.iter().find(|c| c.meshed) {
        commands.insert(
            "a proxy's metrics".into(),
            format!("ip netns exec {prefix}-{} curl -s localhost:{PROXY_ADMIN_PORT}/metrics", client.name),
        );
        commands.insert(
            "the capture rules of a pod".into(),
            format!("{} --state-dir {} rules {ns}/{}", node.display(), state_dir.display(), client.name),
        );
    }
    commands.insert(
        "meshed pods on this node".into(),
        format!("{} --state-dir {} pods", node.display(), state_dir.display()),
    );
    commands.insert("logs".into(), format!("ls {}", root.join("logs").display()));
    commands.insert(
        "the cluster, as kubectl sees it (local mode's API server)".into(),
        format!("kubectl --kubeconfig {} get pods -A", root.join("kubeconfig").display()),
    );
    commands.insert(
        "the spans the proxies exported (the collector stand-in's file)".into(),
        format!("cat {}", crate::demo_trace::traces_file(root).display()),
    );
    // The operator's command (a binary of cnimesh-control, built beside this one) reads these
    // pods and their proxies as it reads a cluster's.
    let cnimesh = i.bins.local.with_file_name("cnimesh");
    commands.insert(
        "golden metrics and edges per workload".into(),
        format!(
            "{0} stat deploy --local {1} -n {ns} -w; {0} edges deploy --local {1} -n {ns}",
            cnimesh.display(),
            root.display()
        ),
    );
    commands.insert(
        "live requests (tap) and their table (top)".into(),
        format!(
            "{0} tap deploy --local {1} -n {ns}; {0} top deploy --local {1} -n {ns}",
            cnimesh.display(),
            root.display()
        ),
    );
    commands.insert(
        "tear it down".into(),
        format!("{} down --dir {} --prefix {prefix}", i.bins.local.display(), root.display()),
    );
    commands
}
