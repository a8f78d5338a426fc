//! `cnimesh prune`: the objects an earlier version of the mesh created that this version no
//! longer ships, for `kubectl delete -f -` (printed, like `uninstall`: nothing is deleted here).
//!
//! It lists, kind by kind, the cluster's objects labelled `app.kubernetes.io/part-of=cnimesh` and
//! `app.kubernetes.io/managed-by=cnimesh` (only what `install`/`upgrade` rendered carries the
//! second label: the control plane's Leases and the like are never candidates) and keeps those
//! whose kind/namespace/name this version, rendered with the cluster's stored values, does not
//! have. Kinds listed: those this version renders and those earlier versions could have.

use std::collections::BTreeSet;

use anyhow::Context;
use kube::api::{DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use super::install::{self, Certificates, Options, cluster, labels};
use super::{ClusterArgs, yaml};

/// Kinds a mesh install may have shipped, beyond what this version renders.
const KNOWN_KINDS: &[(&str, &str)] = &[
    ("v1", "Namespace"),
    ("v1", "ServiceAccount"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "DaemonSet"),
    ("policy/v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
];

#[derive(Debug, Default, clap::Args)]
pub struct PruneArgs {}

pub async fn main(cluster: &ClusterArgs, _args: PruneArgs) -> anyhow::Result<String> {
    let client = cluster.client().await?;
    let stale = stale(&client).await?;
    let header = format!(
        "# cnimesh {}: `cnimesh prune` — {} object(s) this version no longer ships; remove with \
         `kubectl delete --ignore-not-found -f -`.\n",
        env!("CARGO_PKG_VERSION"),
        stale.len()
    );
    Ok(format!("{header}{}", yaml::render(&stale)))
}

/// The rendered set of this version, with the cluster's stored options.
fn current(installed: &cluster::Installed) -> anyhow::Result<BTreeSet<String>> {
    let options = Options::new(installed.overrides()?)?;
    // Identities do not depend on the certificates: placeholders render the same set.
    Ok(install::documents(&placeholder(), &options)?.iter().map(yaml::describe).collect())
}

/// Certificates for rendering identities only (they do not depend on the PEM).
fn placeholder() -> Certificates {
    Certificates {
        anchors: String::new(),
        issuer_cert: String::new(),
        issuer_key: String::new(),
        webhook_ca: String::new(),
        webhook_cert: String::new(),
        webhook_key: String::new(),
    }
}

/// The cluster's mesh objects that are not in this version's rendered set, as deletions.
pub async fn stale(client: &kube::Client) -> anyhow::Result<Vec<Value>> {
    let installed = cluster::read(client).await.context("reading the installed mesh from the cluster")?;
    let current = current(&installed)?;
    let rendered_kinds: BTreeSet<(String, String)> = install::documents(&placeholder(), &Options::default())?
        .iter()
        .map(|d| {
            (
                d["apiVersion"].as_str().unwrap_or_default().to_string(),
                d["kind"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let mut kinds: BTreeSet<(String, String)> =
        KNOWN_KINDS.iter().map(|(v, k)| (v.to_string(), k.to_string())).collect();
    kinds.extend(rendered_kinds);
    let mut out = Vec::new();
    for (api_version, kind) in kinds {
        let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
        let api: kube::Api<DynamicObject> = kube::Api::all_with(client.clone(), &resource);
        let list = match api.list(&ListParams::default().labels(labels::SELECTOR)).await {
            Ok(list) => list,
            // An API the cluster does not serve holds nothing to prune.
            Err(kube::Error::Api(status)) if status.code == 404 => continue,
            Err(e) => return Err(e).with_context(|| format!("listing {kind} objects labelled {}", labels::SELECTOR)),
        };
        for object in list.items {
            let mut metadata = serde_json::Map::new();
            metadata.insert("name".into(), json!(object.metadata.name));
            if let Some(ns) = &object.metadata.namespace {
                metadata.insert("namespace".into(), json!(ns));
            }
            let identity = json!({"apiVersion": api_version, "kind": kind, "metadata": metadata});
            if !current.contains(&yaml::describe(&identity)) {
                out.push(identity);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install::mock_api::ObjectsApi;

    fn install(set: &[&str]) -> String {
        crate::install::mock_api::rendered_install(set)
    }

    #[tokio::test]
    async fn prune_lists_what_this_version_no_longer_ships_and_nothing_else() {
        let cluster = ObjectsApi::default();
        cluster.apply(&install(&[]));
        assert_eq!(
            stale(&cluster.client()).await.unwrap(),
            Vec::<Value>::new(),
            "a fresh install has nothing to prune"
        );

        // What an older version shipped and this one does not, labelled as install labels.
        let mut old = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cnimesh-old-settings", "namespace": "cnimesh", "labels": {}}});
        let mut docs = vec![old.clone()];
        labels::apply(&mut docs);
        old = docs.remove(0);
        cluster.insert(old);
        // Something the control plane made at run time: part of the mesh, not rendered, kept.
        cluster.insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "runtime-state", "namespace": "cnimesh", "labels": {"app.kubernetes.io/part-of": "cnimesh"}}}));
        let stale = stale(&cluster.client()).await.unwrap();
        assert_eq!(
            stale,
            vec![
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cnimesh-old-settings", "namespace": "cnimesh"}})
            ]
        );
    }

    #[tokio::test]
    async fn prune_follows_the_stored_options() {
        // Installed with one replica there is no budget, so prune does not offer to keep one.
        let cluster = ObjectsApi::default();
        cluster.apply(&install(&[]));
        let one = install(&["controlPlane.replicas=1"]);
        // The upgrade to one replica was applied (kubectl apply leaves the old budget behind).
        cluster.apply(&one);
        let stale = stale(&cluster.client()).await.unwrap();
        let names: Vec<String> = stale.iter().map(yaml::describe).collect();
        assert_eq!(names, ["PodDisruptionBudget/cnimesh/cnimesh-control"]);
    }
}
