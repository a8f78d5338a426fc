//! Where mirrors are written in this cluster, never half: the API server, by server-side apply
//! (field manager [`FIELD_MANAGER`]: the slices first, then the Service; on delete the Service
//! first, then the slices; the API server gives a mirror its ClusterIP). Only objects labelled
//! [`MIRRORED_SERVICE_LABEL`] are ever touched: a Service of the same name that is not a mirror
//! is left alone and the write refused. The Link status goes to its status subresource, by
//! server-side apply too.
//!
//! Layer: runtime (kube).

use std::collections::{BTreeMap, BTreeSet};

use cnimesh_common::names::MIRRORED_SERVICE_LABEL;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};

use super::crd::{API_VERSION, KIND, Link, LinkStatus};
use super::plan::{Mirror, SERVICE_NAME_LABEL, is_mirror};
use cnimesh_model::meta::NsName;

/// The server-side apply field manager of every mirror write.
pub const FIELD_MANAGER: &str = "cnimesh-mirror";

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("Service {0} exists and is not a mirror (no {MIRRORED_SERVICE_LABEL} label): not touched")]
    NotAMirror(NsName),
}

/// Mirrors through the API server.
pub struct KubeWriter {
    client: kube::Client,
    /// The Links' namespace.
    namespace: String,
}

impl KubeWriter {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self { client, namespace: namespace.to_string() }
    }

    fn selector() -> String {
        format!("{MIRRORED_SERVICE_LABEL}=true")
    }

    /// Every mirror there is (objects labelled [`MIRRORED_SERVICE_LABEL`]).
    pub async fn list(&self) -> Result<Vec<Mirror>, WriteError> {
        let params = ListParams::default().labels(&Self::selector());
        let services = Api::<Service>::all(self.client.clone()).list(&params).await?;
        let slices = Api::<EndpointSlice>::all(self.client.clone()).list(&params).await?;
        let mut by_service: BTreeMap<NsName, Vec<EndpointSlice>> = BTreeMap::new();
        for slice in slices {
            let owner =
                slice.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)).cloned().unwrap_or_default();
            by_service.entry(NsName::new(NsName::of(&slice.metadata).namespace, owner)).or_default().push(slice);
        }
        Ok(services
            .into_iter()
            .map(|service| {
                let slices = by_service.remove(&NsName::of(&service.metadata)).unwrap_or_default();
                Mirror { service, slices }
            })
            .collect())
    }

    /// Creates or replaces the mirror: its Service and exactly its slices.
    pub async fn apply(&self, mirror: &Mirror) -> Result<(), WriteError> {
        let key = mirror.key();
        let services = Api::<Service>::namespaced(self.client.clone(), &key.namespace);
        if let Some(existing) = services.get_opt(&key.name).await?
            && !is_mirror(&existing)
        {
            return Err(WriteError::NotAMirror(key));
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let slices = Api::<EndpointSlice>::namespaced(self.client.clone(), &key.namespace);
        let mut wanted = BTreeSet::new();
        for slice in &mirror.slices {
            let name = slice.metadata.name.clone().unwrap_or_default();
            slices.patch(&name, &params, &Patch::Apply(slice)).await?;
            wanted.insert(name);
        }
        services.patch(&key.name, &params, &Patch::Apply(&mirror.service)).await?;
        self.delete_slices(&key, &wanted).await
    }

    /// The mirror's slices not in `keep`.
    async fn delete_slices(&self, key: &NsName, keep: &BTreeSet<String>) -> Result<(), WriteError> {
        let slices = Api::<EndpointSlice>::namespaced(self.client.clone(), &key.namespace);
        let selector = format!("{},{SERVICE_NAME_LABEL}={}", Self::selector(), key.name);
        for slice in slices.list(&ListParams::default().labels(&selector)).await? {
            let name = slice.metadata.name.unwrap_or_default();
            if !keep.contains(&name) {
                ignore_not_found(slices.delete(&name, &DeleteParams::default()).await.map(drop))?;
            }
        }
        Ok(())
    }

    /// Removes the mirror's Service and slices.
    pub async fn delete(&self, key: &NsName) -> Result<(), WriteError> {
        let services = Api::<Service>::namespaced(self.client.clone(), &key.namespace);
        match services.get_opt(&key.name).await? {
            Some(existing) if !is_mirror(&existing) => return Err(WriteError::NotAMirror(key.clone())),
            Some(_) => ignore_not_found(services.delete(&key.name, &DeleteParams::default()).await.map(drop))?,
            None => {}
        }
        self.delete_slices(key, &BTreeSet::new()).await
    }

    /// The whole status, by server-side apply: a field this writer set before and leaves out now
    /// (the reason of a link that was lost and is back, a gateway's last error) goes. A merge
    /// patch would keep it, so a link back up still read "connecting" or its old loss.
    pub async fn status(&self, link: &str, status: &LinkStatus) -> Result<(), WriteError> {
        let links = Api::<Link>::namespaced(self.client.clone(), &self.namespace);
        let patch = serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": { "name": link, "namespace": self.namespace },
            "status": status,
        });
        links.patch_status(link, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
        Ok(())
    }
}

fn ignore_not_found(result: Result<(), kube::Error>) -> Result<(), WriteError> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => Ok(other?),
    }
}
