//! The node agents: one ready `cnimesh-node` pod per node, and what each reports on its status
//! endpoint (read through the API server's pod proxy, so no port on the node needs to be open to
//! the operator): the CNI plugin installed and chained into the config the runtime reads, a
//! shared root mount, and — the point of a CNI-based mesh — the live capture rules of every
//! captured pod compared with the rules it should have.
//!
//! Layer: runtime (operator CLI).

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;
use serde::Deserialize;

use super::report::{Category, Check, plural};
use super::{AGENT_NAME, AGENT_NAMESPACE, CONCURRENCY, kube_error, pod_proxy_get, pod_ready, read_hint};

const CATEGORY: &Category = &Category::NodeAgents;
pub use cnimesh_common::names::AGENT_HEALTH_PORT as AGENT_STATUS_PORT;
/// How many drift lines of one pod are shown: the first ones say what is wrong.
const DRIFT_LINES: usize = 3;

/// The agent's `/status` document (the node agent's contract; unknown fields are ignored and
/// missing ones default, so agents of a neighbouring version still read).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct AgentStatus {
    pub node: String,
    pub ready: bool,
    pub pending: Vec<serde_json::Value>,
    pub status: PluginStatus,
    pub healthy: bool,
    pub mount_propagation: String,
    pub verify: Vec<Verified>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct PluginStatus {
    pub plugin_binary: String,
    pub plugin_installed: bool,
    pub plugin_versions: Vec<String>,
    pub primary_config: Option<String>,
    pub chained_in: Option<String>,
    pub agent_socket: String,
    pub agent_socket_present: bool,
    pub captured_pods: u64,
}

/// One captured pod's live rules compared with its desired rules.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Verified {
    pub pod: String,
    pub container_id: String,
    pub ok: bool,
    pub drift: Vec<String>,
}

const NAMES: [&str; 5] = [
    "a ready agent runs on every node",
    "agents answer on their status endpoint",
    "the CNI plugin is installed and chained on every node",
    "the host root mount is shared on every node",
    "live capture rules match the desired rules",
];

pub async fn check(client: &kube::Client, checks: &mut Vec<Check>) {
    let exists = "the cnimesh-node DaemonSet exists";
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), AGENT_NAMESPACE);
    match daemonsets.get_opt(AGENT_NAME).await {
        Ok(Some(_)) => checks.push(Check::ok(CATEGORY, exists, format!("{AGENT_NAMESPACE}/{AGENT_NAME}"))),
        Ok(None) => {
            checks.push(Check::fail(
                CATEGORY,
                exists,
                format!("no DaemonSet {AGENT_NAME} in namespace {AGENT_NAMESPACE}: nothing captures pods"),
                "install the mesh: cnimesh install | kubectl apply -f -",
            ));
            return skip_from(checks, 0, "no node agent DaemonSet");
        }
        Err(e) => {
            checks.push(Check::fail(
                CATEGORY,
                exists,
                format!("reading DaemonSet {AGENT_NAMESPACE}/{AGENT_NAME}: {}", kube_error(&e)),
                read_hint(&e, "allow reading daemonsets in the agent's namespace"),
            ));
            return skip_from(checks, 0, "the DaemonSet could not be read");
        }
    }

    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), AGENT_NAMESPACE);
    let selector = format!("app.kubernetes.io/name={AGENT_NAME}");
    let (nodes, pods) =
        match (nodes.list(&ListParams::default()).await, pods.list(&ListParams::default().labels(&selector)).await) {
            (Ok(n), Ok(p)) => (n.items, p.items),
            (Err(e), _) | (_, Err(e)) => {
                checks.push(Check::fail(
                    CATEGORY,
                    NAMES[0],
                    format!("listing nodes and agent pods: {}", kube_error(&e)),
                    read_hint(&e, "allow listing nodes and pods"),
                ));
                return skip_from(checks, 1, "nodes or agent pods could not be listed");
            }
        };

    // The ready agent of each node; a node may briefly have two during a rollout.
    let mut agents: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for pod in &pods {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            agents.entry(node).or_default().push(pod);
        }
    }
    let mut missing = Vec::new();
    let mut ready: Vec<(String, String)> = Vec::new(); // (node, pod)
    for node in nodes.iter().filter_map(|n| n.metadata.name.clone()) {
        let on_node = agents.get(&node).map(Vec::as_slice).unwrap_or_default();
        match on_node.iter().find(|p| pod_ready(p)) {
            Some(pod) => ready.push((node, pod.metadata.name.clone().unwrap_or_default())),
            None if on_node.is_empty() => missing.push(format!("{node}: no agent pod")),
            None => missing.push(format!(
                "{node}: agent {} is not ready",
                on_node.iter().filter_map(|p| p.metadata.name.clone()).collect::<Vec<_>>().join(", ")
            )),
        }
    }
    checks.push(if missing.is_empty() {
        Check::ok(CATEGORY, NAMES[0], format!("{} of {} nodes", ready.len(), nodes.len()))
    } else {
        Check::fail(
            CATEGORY,
            NAMES[0],
            format!("{} of {} nodes have no ready agent: pods there cannot start", missing.len(), nodes.len()),
            format!(
                "kubectl -n {AGENT_NAMESPACE} get pods -l {selector} -o wide; a node without one may be excluded by a taint the DaemonSet does not tolerate"
            ),
        )
        .details(missing)
    });
    if ready.is_empty() {
        return skip_from(checks, 1, "no ready agent");
    }

    let answers: Vec<(String, String, Result<AgentStatus, String>)> = futures::stream::iter(ready)
        .map(|(node, pod)| async move {
            let status =
                pod_proxy_get(client, AGENT_NAMESPACE, &pod, AGENT_STATUS_PORT, "status").await.and_then(|text| {
                    serde_json::from_str::<AgentStatus>(&text).map_err(|e| format!("invalid status JSON: {e}"))
                });
            (node, pod, status)
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let silent: Vec<String> =
        answers.iter().filter_map(|(n, p, s)| s.as_ref().err().map(|e| format!("{n} ({p}): {e}"))).collect();
    let statuses: Vec<(&str, &str, &AgentStatus)> =
        answers.iter().filter_map(|(n, p, s)| Some((n.as_str(), p.as_str(), s.as_ref().ok()?))).collect();
    checks.push(if silent.is_empty() {
        Check::ok(CATEGORY, NAMES[1], plural(statuses.len(), "agent") + " answered")
    } else {
        Check::fail(
            CATEGORY,
            NAMES[1],
            format!("{} of {} agents did not answer; their nodes are not checked below", silent.len(), answers.len()),
            format!("kubectl -n {AGENT_NAMESPACE} logs <pod>; the status endpoint is :{AGENT_STATUS_PORT}/status"),
        )
        .details(silent)
    });
    if statuses.is_empty() {
        return skip_from(checks, 2, "no agent answered");
    }
    checks.push(plugin(&statuses));
    checks.push(mounts(&statuses));
    checks.push(capture(&statuses));
}

fn skip_from(checks: &mut Vec<Check>, first: usize, why: &str) {
    for name in &NAMES[first..] {
        checks.push(Check::skip(CATEGORY, name, format!("skipped: {why}")));
    }
}

/// Where the runtime reads CNI configs on this node, as the agent sees it.
fn conf_dir(status: &PluginStatus) -> String {
    let file = status.primary_config.as_deref().or(status.chained_in.as_deref());
    file.and_then(|f| f.rsplit_once('/')).map(|(dir, _)| dir.to_string()).unwrap_or_else(|| "the CNI conf dir".into())
}

fn plugin(statuses: &[(&str, &str, &AgentStatus)]) -> Check {
    let mut broken = Vec::new();
    for (node, _, agent) in statuses {
        let s = &agent.status;
        let problem = if !s.plugin_installed {
            Some(format!("plugin {} is not installed", s.plugin_binary))
        } else if s.chained_in.is_none() {
            Some(format!("not chained into any config in {}", conf_dir(s)))
        } else if s.primary_config.is_some() && s.primary_config != s.chained_in {
            Some(format!(
                "chained into {} but the runtime reads {} (in {})",
                s.chained_in.as_deref().unwrap_or_default(),
                s.primary_config.as_deref().unwrap_or_default(),
                conf_dir(s)
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            broken.push(format!("{node}: {problem}"));
        }
    }
    if broken.is_empty() {
        Check::ok(CATEGORY, NAMES[2], format!("{} of {} nodes", statuses.len(), statuses.len()))
    } else {
        Check::fail(
            CATEGORY,
            NAMES[2],
            format!("{} of {} nodes would start pods uncaptured", broken.len(), statuses.len()),
            format!(
                "the agent installs and chains the plugin: kubectl -n {AGENT_NAMESPACE} logs the node's {AGENT_NAME} pod; another CNI may be rewriting the conf dir"
            ),
        )
        .details(broken)
    }
}

fn mounts(statuses: &[(&str, &str, &AgentStatus)]) -> Check {
    let private: Vec<String> = statuses
        .iter()
        .filter(|(_, _, a)| a.mount_propagation.eq_ignore_ascii_case("private"))
        .map(|(node, _, _)| format!("{node}: mount propagation private"))
        .collect();
    if private.is_empty() {
        Check::ok(CATEGORY, NAMES[3], format!("{} of {} nodes", statuses.len(), statuses.len()))
    } else {
        Check::fail(
            CATEGORY,
            NAMES[3],
            format!(
                "{} of {} nodes have a private root mount: the agent cannot see pods' network namespaces",
                private.len(),
                statuses.len()
            ),
            format!(
                "run `mount --make-rshared /` on the host (systemd's default), then restart the node's {AGENT_NAME} pod"
            ),
        )
        .details(private)
    }
}

fn capture(statuses: &[(&str, &str, &AgentStatus)]) -> Check {
    let mut verified = 0;
    let (mut pods, mut details) = (Vec::new(), Vec::new());
    for (node, _, agent) in statuses {
        for v in &agent.verify {
            verified += 1;
            if v.ok {
                continue;
            }
            pods.push(v.pod.clone());
            let short: String = v.container_id.chars().take(12).collect();
            details.push(format!("{node} {} (container {short}) drifted:", v.pod));
            if v.drift.is_empty() {
                details.push("  rules differ (the agent gave no detail)".to_string());
            }
            details.extend(v.drift.iter().take(DRIFT_LINES).map(|line| format!("  {line}")));
            if v.drift.len() > DRIFT_LINES {
                details.push(format!("  … {} more", v.drift.len() - DRIFT_LINES));
            }
        }
    }
    let nodes = statuses.len();
    if pods.is_empty() {
        return Check::ok(
            CATEGORY,
            NAMES[4],
            format!(
                "{} on {} verified against their desired rules",
                plural(verified, "captured pod"),
                plural(nodes, "node")
            ),
        );
    }
    let restart = match pods.as_slice() {
        [one] => match one.split_once('/') {
            Some((ns, pod)) => format!("kubectl -n {ns} delete pod {pod}"),
            None => format!("kubectl delete pod {one}"),
        },
        _ => "kubectl -n <ns> delete pod <pod>".to_string(),
    };
    Check::fail(
        CATEGORY,
        NAMES[4],
        format!(
            "{} of {verified} captured pods have drifted from their desired rules: their traffic may bypass the proxy",
            pods.len()
        ),
        format!("{AGENT_NAME} repairs drift on its own; if it stays, restart the pod to re-run capture: {restart}"),
    )
    .details(details)
}
