//! `cnimesh uninstall`: what `kubectl delete -f -` needs to remove the mesh, in the order that
//! keeps the cluster working while it goes: the webhook configuration first (pod creation must
//! not wait on a webhook that is going away), then the control plane, the node agents last.
//!
//! It refuses, unless `--force`, while meshed pods remain (their proxies would lose their control
//! plane) and while the node agents would leave the plugin chained on exit: a chained plugin
//! with no agent fails every new pod closed. `CNIMESH_UNINSTALL_ON_EXIT=true` on the DaemonSet
//! makes exiting agents unchain it (daemonset/README.md, "Upgrades").
//!
//! The node agents' ValidatingAdmissionPolicy and its Binding are listed only where the server
//! serves their kind (1.30 and later, [`super::install::guard`]): `kubectl delete` fails on a kind
//! the server does not know, even with `--ignore-not-found`.
//!
//! Layer: runtime (operator CLI).

use anyhow::Context;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::install::guard::{self, ADMISSION_POLICY, POLICY_KINDS};
use super::install::{ISSUER_SECRET, TRUST_ANCHORS_CONFIG_MAP, VALUES_CONFIG_MAP, WEBHOOK_SECRET};
use super::{ClusterArgs, manifests, yaml};
use cnimesh_common::names::{
    AGENT_NAME as AGENT_DAEMONSET, AGENT_NAMESPACE, CONTROL_NAMESPACE as DEFAULT_CONTROL_NAMESPACE, PROXY_CONTAINER,
};
use cnimesh_model::inject::ServerVersion;

const UNINSTALL_ON_EXIT: &str = "CNIMESH_UNINSTALL_ON_EXIT";
/// How many meshed pods a refusal names.
const NAMED: usize = 10;

#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// Print the deletions even while meshed pods remain or agents would leave the plugin chained.
    #[arg(long)]
    pub force: bool,
    /// The cluster's Kubernetes version (MAJOR.MINOR) instead of its API server's: below 1.30 the
    /// node agents' ValidatingAdmissionPolicy kinds are not listed (the server does not know them).
    #[arg(long, value_name = "MAJOR.MINOR", value_parser = guard::parse_version)]
    pub kubernetes_version: Option<ServerVersion>,
}

pub async fn main(cluster: &ClusterArgs, args: UninstallArgs) -> anyhow::Result<String> {
    let client = if args.force && args.kubernetes_version.is_some() { None } else { Some(cluster.client().await?) };
    uninstall(client.as_ref(), &args).await
}

/// The deletions for the cluster behind `client` (none: `--force` with `--kubernetes-version`).
pub async fn uninstall(client: Option<&kube::Client>, args: &UninstallArgs) -> anyhow::Result<String> {
    if let Some(client) = client
        && !args.force
    {
        refuse_while_meshed(client).await?;
        refuse_while_agents_keep_the_plugin(client).await?;
    }
    let version = match (args.kubernetes_version, client) {
        (Some(version), _) => version,
        (None, Some(client)) => guard::server_version(client)
            .await
            .context("reading the API server's version (or pass --kubernetes-version)")?,
        (None, None) => anyhow::bail!("no cluster to read the version from: pass --kubernetes-version"),
    };
    Ok(format!(
        "# cnimesh {}: `cnimesh uninstall` — remove with `kubectl delete --ignore-not-found -f -`.\n{}",
        env!("CARGO_PKG_VERSION"),
        yaml::render(&deletions(version >= ADMISSION_POLICY))
    ))
}

/// Every object `install` creates, reduced to what identifies it, in deletion order; the
/// policy kinds only when the server serves them (`policy`).
pub fn deletions(policy: bool) -> Vec<Value> {
    let mut docs: Vec<Value> = manifests::documents()
        .iter()
        .filter(|d| policy || !POLICY_KINDS.iter().any(|kind| d["kind"] == *kind))
        .map(identity)
        .collect();
    let secret = |name: &str| json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": DEFAULT_CONTROL_NAMESPACE}});
    let control_namespace = docs
        .iter()
        .position(|d| d["kind"] == "Namespace" && d["metadata"]["name"] == DEFAULT_CONTROL_NAMESPACE)
        .map_or(docs.len(), |i| i + 1);
    let generated = [
        secret(ISSUER_SECRET),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": TRUST_ANCHORS_CONFIG_MAP, "namespace": DEFAULT_CONTROL_NAMESPACE}}),
        secret(WEBHOOK_SECRET),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": VALUES_CONFIG_MAP, "namespace": DEFAULT_CONTROL_NAMESPACE}}),
    ];
    docs.splice(control_namespace..control_namespace, generated);
    docs.reverse();
    docs
}

fn identity(doc: &Value) -> Value {
    let mut metadata = serde_json::Map::new();
    for key in ["name", "namespace"] {
        if let Some(v) = doc.pointer(&format!("/metadata/{key}")) {
            metadata.insert(key.into(), v.clone());
        }
    }
    json!({"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": metadata})
}

async fn refuse_while_meshed(client: &kube::Client) -> anyhow::Result<()> {
    let pods: kube::Api<Pod> = kube::Api::all(client.clone());
    let pods = pods.list(&Default::default()).await.context("listing pods to find meshed ones")?;
    let meshed: Vec<String> = pods
        .items
        .iter()
        .filter(|p| {
            let spec = p.spec.as_ref();
            let containers =
                spec.into_iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()));
            containers.into_iter().any(|c| c.name == PROXY_CONTAINER)
        })
        .map(|p| {
            format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or("?"), p.metadata.name.as_deref().unwrap_or("?"))
        })
        .collect();
    if meshed.is_empty() {
        return Ok(());
    }
    let more = meshed.len().saturating_sub(NAMED);
    anyhow::bail!(
        "{} meshed pods remain ({}{}): unlabel their namespaces (kubectl label namespace NS cnimesh.io/inject-) \
         or `cnimesh uninject` their workloads, restart them, then uninstall; --force removes the control plane anyway",
        meshed.len(),
        meshed[..meshed.len().min(NAMED)].join(", "),
        if more > 0 { format!(" and {more} more") } else { String::new() }
    )
}

async fn refuse_while_agents_keep_the_plugin(client: &kube::Client) -> anyhow::Result<()> {
    let api: kube::Api<DaemonSet> = kube::Api::namespaced(client.clone(), AGENT_NAMESPACE);
    let Some(daemonset) = api.get_opt(AGENT_DAEMONSET).await.context("reading the node agents' DaemonSet")? else {
        return Ok(());
    };
    let set = daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.iter().find(|c| c.name == AGENT_DAEMONSET))
        .and_then(|c| c.env.as_ref())
        .is_some_and(|env| env.iter().any(|e| e.name == UNINSTALL_ON_EXIT && e.value.as_deref() == Some("true")));
    let status = daemonset.status.unwrap_or_default();
    let rolled_out = daemonset.metadata.generation.is_some_and(|g| status.observed_generation == Some(g))
        && status.updated_number_scheduled.unwrap_or(0) == status.desired_number_scheduled;
    if set && rolled_out {
        return Ok(());
    }
    anyhow::bail!(
        "the node agents would leave cnimesh-cni chained when deleted, and every new pod would then fail to start. First run:\n  \
         kubectl -n {AGENT_NAMESPACE} set env daemonset/{AGENT_DAEMONSET} {UNINSTALL_ON_EXIT}=true\n  \
         kubectl -n {AGENT_NAMESPACE} rollout status daemonset/{AGENT_DAEMONSET}\n\
         then uninstall again (or pass --force)"
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A kube client over an API server that answers GETs from `objects` (path → JSON).
    fn api(objects: Vec<(&'static str, Value)>) -> kube::Client {
        let objects = Arc::new(objects);
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let objects = objects.clone();
            async move {
                let path = req.uri().path().to_string();
                let (status, body) = match objects.iter().find(|(p, _)| *p == path) {
                    Some((_, body)) => (200, body.clone()),
                    None => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
                    ),
                };
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(status)
                        .body(kube::client::Body::from(body.to_string().into_bytes()))
                        .unwrap(),
                )
            }
        });
        kube::Client::new(service, "default")
    }

    fn pods(pods: Vec<Value>) -> (&'static str, Value) {
        ("/api/v1/pods", json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods}))
    }

    fn pod(name: &str, container: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "shop"}, "spec": {"containers": [{"name": container}]}})
    }

    fn daemonset(uninstall_on_exit: bool, rolled_out: bool) -> (&'static str, Value) {
        let env = if uninstall_on_exit { json!([{"name": UNINSTALL_ON_EXIT, "value": "true"}]) } else { json!([]) };
        let updated = if rolled_out { 3 } else { 1 };
        (
            "/apis/apps/v1/namespaces/cnimesh-system/daemonsets/cnimesh-node",
            json!({
                "apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": AGENT_DAEMONSET, "namespace": AGENT_NAMESPACE, "generation": 2},
                "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": AGENT_DAEMONSET, "env": env}]}}},
                "status": {"observedGeneration": 2, "desiredNumberScheduled": 3, "updatedNumberScheduled": updated,
                           "currentNumberScheduled": 3, "numberMisscheduled": 0, "numberReady": 3}
            }),
        )
    }

    #[test]
    fn the_webhook_goes_first_and_everything_install_creates_is_listed() {
        let docs = deletions(true);
        assert_eq!(docs[0]["kind"], "MutatingWebhookConfiguration");
        assert_eq!(docs.last().unwrap()["kind"], "Namespace");
        assert_eq!(docs.last().unwrap()["metadata"]["name"], AGENT_NAMESPACE, "the agents go last");
        let anchor =
            cnimesh_identity::ca::new_trust_anchor("cluster.local", std::time::Duration::from_secs(60)).unwrap();
        let issuer =
            cnimesh_identity::ca::new_issuer(&anchor, "cluster.local", std::time::Duration::from_secs(60)).unwrap();
        let certs = super::super::install::Certificates {
            anchors: anchor.cert_pem.clone(),
            issuer_cert: issuer.cert_pem,
            issuer_key: issuer.key_pem,
            webhook_ca: anchor.cert_pem.clone(),
            webhook_cert: anchor.cert_pem.clone(),
            webhook_key: anchor.key_pem,
        };
        let installed = super::super::install::documents(&certs, &Default::default()).unwrap();
        let mut expected: Vec<Value> = installed.iter().map(identity).collect();
        expected.reverse();
        assert_eq!(docs, expected);
    }

    #[tokio::test]
    async fn meshed_pods_and_agents_that_keep_the_plugin_are_refused() {
        let meshed = api(vec![pods(vec![pod("web-1", PROXY_CONTAINER), pod("legacy", "app")]), daemonset(true, true)]);
        let error = refuse_while_meshed(&meshed).await.unwrap_err().to_string();
        assert!(error.starts_with("1 meshed pods remain (shop/web-1)"), "{error}");

        let clean = api(vec![pods(vec![pod("legacy", "app")]), daemonset(true, true)]);
        refuse_while_meshed(&clean).await.unwrap();
        refuse_while_agents_keep_the_plugin(&clean).await.unwrap();
        for (set, rolled_out) in [(false, true), (true, false)] {
            let client = api(vec![daemonset(set, rolled_out)]);
            let error = refuse_while_agents_keep_the_plugin(&client).await.unwrap_err().to_string();
            assert!(error.contains("set env daemonset/cnimesh-node CNIMESH_UNINSTALL_ON_EXIT=true"), "{error}");
        }
        // No agents left: nothing to wait for.
        refuse_while_agents_keep_the_plugin(&api(vec![])).await.unwrap();
    }

    fn version(minor: u32) -> (&'static str, Value) {
        (
            "/version",
            json!({"major": "1", "minor": minor.to_string(), "gitVersion": format!("v1.{minor}.0"),
                            "gitCommit": "", "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "", "platform": ""}),
        )
    }

    #[tokio::test]
    async fn uninstall_lists_the_policy_kinds_only_where_the_server_serves_them() {
        let kinds = |text: &str| -> usize {
            let docs = yaml::documents(text, "uninstall").unwrap();
            docs.iter().filter(|d| POLICY_KINDS.iter().any(|k| d["kind"] == *k)).count()
        };
        let args = UninstallArgs { force: false, kubernetes_version: None };
        for (minor, expected) in [(24, 0), (29, 0), (30, 2)] {
            let cluster = api(vec![pods(vec![]), daemonset(true, true), version(minor)]);
            let text = uninstall(Some(&cluster), &args).await.unwrap();
            assert_eq!(kinds(&text), expected, "1.{minor}");
            assert!(text.contains("kind: MutatingWebhookConfiguration"), "the rest is there");
        }
        let offline = UninstallArgs { force: true, kubernetes_version: Some(guard::parse_version("1.24").unwrap()) };
        assert_eq!(kinds(&uninstall(None, &offline).await.unwrap()), 0);
        let error = uninstall(None, &UninstallArgs { force: true, kubernetes_version: None }).await.unwrap_err();
        assert!(error.to_string().contains("--kubernetes-version"), "{error}");
    }
}
