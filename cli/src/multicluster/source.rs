//! Cluster A's side of its links, read from its API server (the Link CRs with their status, the
//! credentials Secrets, the trust anchors ConfigMap); local mode's cluster is read the same way.
//!
//! Each linked cluster's API is reached through the Link's kubeconfig, read by the control
//! plane's own reader (inline data only; nothing in it is ever run or read); a `file://` server
//! is refused, as the control plane refuses it.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use super::super::install::{TRUST_ANCHORS_CONFIG_MAP, TRUST_ANCHORS_KEY};
use cnimesh_common::names::{CONTROL_NAMESPACE, LINK_CREDENTIALS_KEY, LINK_CREDENTIALS_SECRET_TYPE};
use cnimesh_mirror::crd::{Link, LinkStatus};
use cnimesh_mirror::kubeconfig::{self, KubeconfigError, LinkKubeconfig};

/// How long a remote API gets to answer.
pub const REMOTE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where A's links live: its API server.
#[derive(Clone)]
pub enum Source {
    Cluster(kube::Client),
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
        let mut found: Vec<Found> = match self {
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
        }
    }

    /// The link's status (None when the controller has not written one yet).
    pub fn status(&self, found: &Link) -> Result<Option<LinkStatus>, String> {
        match self {
            Source::Cluster(_) => Ok(found.status.clone()),
        }
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

/// A linked cluster's API, as the Link's kubeconfig reaches it.
pub enum Remote {
    Cluster(kube::Client),
}

impl Remote {
    /// From the kubeconfig text, read as data only (the control plane's reader: a command or a
    /// file path in it is refused by name, never run or read); a `file://` server is refused.
    pub async fn connect(kubeconfig: &str) -> Result<Self, String> {
        let refused = |e: KubeconfigError| format!("the kubeconfig is refused: {e}");
        match kubeconfig::parse(kubeconfig).map_err(refused)? {
            LinkKubeconfig::Files(dir) => {
                Err(format!("server file://{}: not an API server; the control plane refuses it", dir.display()))
            }
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
        }
    }

    /// The linked cluster's trust anchors (PEM).
    pub async fn anchors(&self) -> Result<String, String> {
        match self {
            Remote::Cluster(client) => match tokio::time::timeout(REMOTE_TIMEOUT, configmap_anchors(client)).await {
                Err(_) => Err(format!("no answer within {} s", REMOTE_TIMEOUT.as_secs())),
                Ok(r) => r.map_err(|e| format!("{e:#}")),
            },
        }
    }
}
