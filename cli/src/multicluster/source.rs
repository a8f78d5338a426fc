//! Cluster A's side of its links, read from a cluster (the Link CRs with their status, the
//! credentials Secrets, the trust anchors ConfigMap) or from local mode's directory (the same
//! objects as files under `DIR/cluster`, the status under `DIR/cluster/.status/link-<name>.json`,
//! the anchors in `DIR/ca/ca.crt`). `check` and `gateways` see one shape either way.
//!
//! Each linked cluster's API is reached through the Link's kubeconfig, read by the control
//! plane's own reader (inline data only; nothing in it is ever run or read): a `file://` server
//! (local mode) is read as a directory; on a real cluster it is refused, as the control plane
//! refuses it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::Value;

use super::super::install::{TRUST_ANCHORS_CONFIG_MAP, TRUST_ANCHORS_KEY};
use super::super::yaml;
use cnimesh_common::names::{CONTROL_NAMESPACE, LINK_CREDENTIALS_KEY, LINK_CREDENTIALS_SECRET_TYPE};
use cnimesh_mirror::crd::{KIND, Link, LinkStatus};
use cnimesh_mirror::kubeconfig::{self, KubeconfigError, LinkKubeconfig};

/// How long a remote API gets to answer.
pub const REMOTE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where A's links live.
#[derive(Clone)]
pub enum Source {
    Cluster(kube::Client),
    /// Local mode's root dir.
    Local(PathBuf),
}

/// A Link as found, or why it could not be read.
#[derive(Debug, Clone)]
pub struct Found {
    pub name: String,
    pub link: Result<Link, String>,
}

impl Source {
    /// Every Link in the control plane's namespace, by name.
    pub async fn links(&self) -> anyhow::Result<Vec<Found>> {
        let mut found = match self {
            Source::Cluster(client) => {
                let api: kube::Api<Link> = kube::Api::namespaced(client.clone(), CONTROL_NAMESPACE);
                let list = api
                    .list(&Default::default())
                    .await
                    .context("listing Links (is `cnimesh multicluster install` applied?)")?;
                list.items
                    .into_iter()
                    .map(|l| Found { name: l.metadata.name.clone().unwrap_or_default(), link: Ok(l) })
                    .collect()
            }
            Source::Local(dir) => local_links(&dir.join("cluster"))?,
        };
        found.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(found)
    }

    /// The kubeconfig in a Link's Secret, or why there is none.
    pub async fn credentials(&self, secret: &str) -> Result<String, String> {
        let object: Secret = match self {
            Source::Cluster(client) => {
                let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), CONTROL_NAMESPACE);
                match api.get_opt(secret).await {
                    Ok(Some(s)) => s,
                    Ok(None) => return Err(format!("Secret {CONTROL_NAMESPACE}/{secret} does not exist")),
                    Err(e) => return Err(format!("reading Secret {CONTROL_NAMESPACE}/{secret}: {e}")),
                }
            }
            Source::Local(dir) => {
                let docs = documents_of(&dir.join("cluster"));
                let doc = docs
                    .into_iter()
                    .find(|d| {
                        d["kind"] == "Secret"
                            && d["metadata"]["name"] == secret
                            && d["metadata"]["namespace"] == CONTROL_NAMESPACE
                    })
                    .ok_or_else(|| {
                        format!("Secret {CONTROL_NAMESPACE}/{secret} is not in {}", dir.join("cluster").display())
                    })?;
                serde_json::from_value(doc).map_err(|e| format!("Secret {secret}: {e}"))?
            }
        };
        if object.type_.as_deref() != Some(LINK_CREDENTIALS_SECRET_TYPE) {
            return Err(format!(
                "Secret {secret} has type {:?}, not {LINK_CREDENTIALS_SECRET_TYPE}",
                object.type_.unwrap_or_default()
            ));
        }
        let data = object.data.unwrap_or_default();
        let text = data.get(LINK_CREDENTIALS_KEY).map(|b| String::from_utf8_lossy(&b.0).into_owned());
        text.filter(|t| !t.trim().is_empty()).ok_or_else(|| format!("Secret {secret} has no {LINK_CREDENTIALS_KEY}"))
    }

    /// This cluster's trust anchors (PEM).
    pub async fn anchors(&self) -> anyhow::Result<String> {
        match self {
            Source::Cluster(client) => configmap_anchors(client).await,
            Source::Local(dir) => {
                let path = dir.join("ca").join("ca.crt");
                std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
            }
        }
    }

    /// The link's status: the Link's own on a cluster; the status file in local mode (None when
    /// the controller has not written one yet).
    pub fn status(&self, found: &Link) -> Result<Option<LinkStatus>, String> {
        match self {
            Source::Cluster(_) => Ok(found.status.clone()),
            Source::Local(dir) => {
                let name = found.metadata.name.clone().unwrap_or_default();
                let path = dir.join("cluster").join(".status").join(format!("link-{name}.json"));
                match std::fs::read(&path) {
                    Ok(bytes) => {
                        serde_json::from_slice(&bytes).map(Some).map_err(|e| format!("{}: {e}", path.display()))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(format!("{}: {e}", path.display())),
                }
            }
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self, Source::Local(_))
    }
}

async fn configmap_anchors(client: &kube::Client) -> anyhow::Result<String> {
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), CONTROL_NAMESPACE);
    let map = api
        .get(TRUST_ANCHORS_CONFIG_MAP)
        .await
        .with_context(|| format!("reading ConfigMap {CONTROL_NAMESPACE}/{TRUST_ANCHORS_CONFIG_MAP}"))?;
    map.data
        .and_then(|d| d.get(TRUST_ANCHORS_KEY).cloned())
        .with_context(|| format!("ConfigMap {CONTROL_NAMESPACE}/{TRUST_ANCHORS_CONFIG_MAP} has no {TRUST_ANCHORS_KEY}"))
}

/// Every document of every YAML file directly in a cluster dir (unreadable files are skipped:
/// the control plane skips them the same way).
fn documents_of(cluster_dir: &Path) -> Vec<Value> {
    let mut paths: Vec<PathBuf> =
        std::fs::read_dir(cluster_dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    paths.retain(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"));
    paths.sort();
    paths
        .iter()
        .filter_map(|p| yaml::documents(&std::fs::read_to_string(p).ok()?, &p.display().to_string()).ok())
        .flatten()
        .collect()
}

fn local_links(cluster_dir: &Path) -> anyhow::Result<Vec<Found>> {
    anyhow::ensure!(cluster_dir.is_dir(), "{} is not a directory: is local mode up there?", cluster_dir.display());
    Ok(documents_of(cluster_dir)
        .into_iter()
        .filter(|d| d["kind"] == KIND && d["metadata"]["namespace"] == CONTROL_NAMESPACE)
        .map(|d| {
            let name = d["metadata"]["name"].as_str().unwrap_or_default().to_string();
            Found { name, link: serde_json::from_value(d).map_err(|e| format!("not a valid Link: {e}")) }
        })
        .collect())
}

/// A linked cluster's API, as the Link's kubeconfig reaches it.
pub enum Remote {
    Cluster(kube::Client),
    /// Local mode: the target's cluster dir (`file://` server).
    Files(PathBuf),
}

impl Remote {
    /// From the kubeconfig text, read as data only (the control plane's reader: a command or a
    /// file path in it is refused by name, never run or read); a `file://` server only when
    /// `allow_files` (local mode).
    pub async fn connect(kubeconfig: &str, allow_files: bool) -> Result<Self, String> {
        let refused = |e: KubeconfigError| format!("the kubeconfig is refused: {e}");
        match kubeconfig::parse(kubeconfig).map_err(refused)? {
            LinkKubeconfig::Files(dir) if allow_files => Ok(Remote::Files(dir)),
            LinkKubeconfig::Files(dir) => Err(format!(
                "server file://{}: a file:// server is local mode's files backend only; a cluster's control plane refuses it",
                dir.display()
            )),
            LinkKubeconfig::Api(api) => {
                let config = api.client_config().map_err(refused)?;
                let client =
                    kube::Client::try_from(config).map_err(|e| format!("building a client for {}: {e}", api.server))?;
                Ok(Remote::Cluster(client))
            }
        }
    }

    /// Whether the remote API answers with these credentials, and what it said.
    pub async fn answers(&self) -> Result<String, String> {
        match self {
            Remote::Cluster(client) => {
                let api: kube::Api<k8s_openapi::api::core::v1::Service> = kube::Api::all(client.clone());
                let params = kube::api::ListParams::default().limit(1);
                match tokio::time::timeout(REMOTE_TIMEOUT, api.list(&params)).await {
                    Err(_) => Err(format!("no answer within {} s", REMOTE_TIMEOUT.as_secs())),
                    Ok(Err(kube::Error::Api(s))) if s.code == 401 => {
                        Err(format!("the credentials were refused (401 {})", s.message))
                    }
                    Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
                        Err(format!("the credentials may not list Services (403 {})", s.message))
                    }
                    Ok(Err(e)) => Err(format!("unreachable: {e}")),
                    Ok(Ok(_)) => Ok("lists Services".into()),
                }
            }
            Remote::Files(dir) => match std::fs::read_dir(dir) {
                Ok(entries) => Ok(format!("{} readable ({} entries)", dir.display(), entries.count())),
                Err(e) => Err(format!("{}: {e}", dir.display())),
            },
        }
    }

    /// The linked cluster's trust anchors (PEM).
    pub async fn anchors(&self) -> Result<String, String> {
        match self {
            Remote::Cluster(client) => match tokio::time::timeout(REMOTE_TIMEOUT, configmap_anchors(client)).await {
                Err(_) => Err(format!("no answer within {} s", REMOTE_TIMEOUT.as_secs())),
                Ok(r) => r.map_err(|e| format!("{e:#}")),
            },
            Remote::Files(cluster_dir) => {
                let path = cluster_dir.parent().unwrap_or(cluster_dir).join("ca").join("ca.crt");
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))
            }
        }
    }
}
