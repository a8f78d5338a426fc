//! What `up` writes to local mode's API server, as a cluster's controllers and kubelet would:
//! objects applied server-side by their kind (discovery names the resource), a Pod's status, and
//! ServiceAccount tokens from the token request subresource. `up` is blocking code; each call
//! blocks on the runtime it runs in.

use std::path::Path;

use anyhow::Context;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use serde_json::Value;
use tokio::runtime::Handle;

/// The field manager of everything `up` writes.
const MANAGER: &str = "cnimesh-local";

/// A client of local mode's API server, as its administrator.
pub struct Objects {
    client: kube::Client,
    runtime: Handle,
}

impl Objects {
    /// The client of the kubeconfig at `path` (run on a runtime's worker, in `block_in_place`).
    pub fn connect(path: &Path) -> anyhow::Result<Self> {
        let runtime = Handle::current();
        let client = runtime.block_on(async {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
            anyhow::Ok(kube::Client::try_from(config)?)
        })?;
        Ok(Self { client, runtime })
    }

    /// The dynamic API of `object`'s kind (discovery names its resource), in its namespace.
    async fn api_of(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> anyhow::Result<Api<DynamicObject>> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) = kube::discovery::pinned_kind(&self.client, &gvk).await?;
        Ok(match (capabilities.scope, namespace) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, &resource),
            _ => Api::all_with(self.client.clone(), &resource),
        })
    }

    /// Applies `object` (server-side apply, forced: `up` owns what it writes); returns it as stored.
    pub fn apply(&self, object: &Value) -> anyhow::Result<Value> {
        let (api_version, kind, namespace, name) = identify(object);
        self.runtime
            .block_on(async {
                let api = self.api_of(api_version, kind, namespace).await?;
                let applied = api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(object)).await?;
                anyhow::Ok(serde_json::to_value(applied)?)
            })
            .with_context(|| format!("applying {} to local mode's API server", describe(object)))
    }

    /// Sets the status of `object` (as stored: kind, namespace and name are read from it), as its
    /// kubelet or controller would.
    pub fn set_status(&self, object: &Value, status: &Value) -> anyhow::Result<()> {
        let (api_version, kind, namespace, name) = identify(object);
        let patch = serde_json::json!({ "status": status });
        self.runtime
            .block_on(async {
                let api = self.api_of(api_version, kind, namespace).await?;
                api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                anyhow::Ok(())
            })
            .with_context(|| format!("setting the status of {}", describe(object)))
    }

    /// The object `namespace/name` of `kind`, if it exists.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> anyhow::Result<Option<Value>> {
        self.runtime.block_on(async {
            let api = self.api_of(api_version, kind, Some(namespace)).await?;
            let found = api.get_opt(name).await?;
            found.map(serde_json::to_value).transpose().map_err(anyhow::Error::from)
        })
    }

    /// A token of ServiceAccount `namespace/name` for `audiences` (none: the API's own).
    pub fn token(&self, namespace: &str, name: &str, audiences: &[&str]) -> anyhow::Result<String> {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: audiences.iter().map(|a| a.to_string()).collect(),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = self
            .runtime
            .block_on(accounts.create_token_request(name, &PostParams::default(), &request))
            .with_context(|| format!("a token for the ServiceAccount {namespace}/{name}"))?;
        answer.status.map(|s| s.token).filter(|t| !t.is_empty()).context("the TokenRequest answered no token")
    }
}

/// apiVersion, kind, namespace and name of `object`.
fn identify(object: &Value) -> (&str, &str, Option<&str>, &str) {
    (
        object["apiVersion"].as_str().unwrap_or(""),
        object["kind"].as_str().unwrap_or(""),
        object["metadata"]["namespace"].as_str(),
        object["metadata"]["name"].as_str().unwrap_or(""),
    )
}

/// `Kind namespace/name`, for errors.
fn describe(object: &Value) -> String {
    let (_, kind, namespace, name) = identify(object);
    format!("{kind} {}{name}", namespace.map(|n| format!("{n}/")).unwrap_or_default())
}
