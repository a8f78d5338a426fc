//! Where mirrors are written in this cluster, never half: behind [`MirrorWriter`], the API server
//! (server-side apply, field manager [`FIELD_MANAGER`]: the slices first, then the Service; on
//! delete the Service first, then the slices) or the cluster directory (local mode: a mirror is
//! ONE multi-document file `mirror-<ns>-<name>.yaml`, replaced in one rename, with a ClusterIP
//! from `--mirror-service-cidr` that stays the same across updates). Either way only objects
//! labelled [`MIRRORED_SERVICE_LABEL`] are ever touched: a Service of the same name that is not a
//! mirror is left alone and the write refused. The Link status goes beside them (kube: the
//! status subresource, by server-side apply too).
//!
//! Layer: runtime (kube, files).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use cnimesh_common::names::MIRRORED_SERVICE_LABEL;
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::Value;

use super::crd::{API_VERSION, KIND, Link, LinkStatus};
use super::plan::{Mirror, SERVICE_NAME_LABEL, is_mirror};
use crate::meta::NsName;

/// The server-side apply field manager of every mirror write.
pub const FIELD_MANAGER: &str = "cnimesh-mirror";
/// The directory, under the cluster directory, of the Link status files.
pub const STATUS_DIR: &str = ".status";

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("Service {0} exists and is not a mirror (no {MIRRORED_SERVICE_LABEL} label): not touched")]
    NotAMirror(NsName),
    #[error("no ClusterIP for {0}: the control plane has no --mirror-service-cidr")]
    NoCidr(NsName),
    #[error("no ClusterIP for {0}: every address of {1} is taken")]
    CidrFull(NsName, ipnet::IpNet),
    #[error("{}: {error}", path.display())]
    Parse { path: PathBuf, error: String },
}

/// Where mirrors and Link status are written.
pub trait MirrorWriter: Send + Sync {
    /// Every mirror there is (objects labelled [`MIRRORED_SERVICE_LABEL`]).
    fn list(&self) -> BoxFuture<'_, Result<Vec<Mirror>, WriteError>>;
    /// Creates or replaces the mirror: its Service and exactly its slices.
    fn apply<'a>(&'a self, mirror: &'a Mirror) -> BoxFuture<'a, Result<(), WriteError>>;
    /// Removes the mirror's Service and slices.
    fn delete<'a>(&'a self, mirror: &'a NsName) -> BoxFuture<'a, Result<(), WriteError>>;
    /// Records a Link's status (`link` is the Link's name).
    fn status<'a>(&'a self, link: &'a str, status: &'a LinkStatus) -> BoxFuture<'a, Result<(), WriteError>>;
}

/// Mirrors as files in the cluster directory the files source serves.
pub struct FilesWriter {
    dir: PathBuf,
    cidr: Option<ipnet::IpNet>,
}

impl FilesWriter {
    pub fn new(dir: impl Into<PathBuf>, cidr: Option<ipnet::IpNet>) -> Self {
        Self { dir: dir.into(), cidr }
    }

    /// `mirror-<ns>-<name>.yaml`.
    pub fn path_of(&self, key: &NsName) -> PathBuf {
        self.dir.join(format!("mirror-{}-{}.yaml", key.namespace, key.name))
    }

    /// The Link's status file.
    pub fn status_path(dir: &Path, link: &str) -> PathBuf {
        dir.join(STATUS_DIR).join(format!("link-{link}.json"))
    }

    fn mirror_files(&self) -> Result<Vec<PathBuf>, WriteError> {
        let io = |source| WriteError::Io { path: self.dir.clone(), source };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.starts_with("mirror-") && name.ends_with(".yaml") {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }

    fn read_mirror(path: &Path) -> Result<Option<Mirror>, WriteError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(WriteError::Io { path: path.to_path_buf(), source }),
        };
        let parse = |error: String| WriteError::Parse { path: path.to_path_buf(), error };
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| parse(e.to_string()))?;
        let mut service = None;
        let mut slices = Vec::new();
        for doc in docs {
            match doc.get("kind").and_then(Value::as_str) {
                Some("Service") => {
                    service = Some(serde_json::from_value::<Service>(doc).map_err(|e| parse(e.to_string()))?)
                }
                Some("EndpointSlice") => slices.push(serde_json::from_value(doc).map_err(|e| parse(e.to_string()))?),
                _ => {}
            }
        }
        Ok(service.filter(is_mirror).map(|service| Mirror { service, slices }))
    }

    fn list_now(&self) -> Result<Vec<Mirror>, WriteError> {
        let mut mirrors = Vec::new();
        for path in self.mirror_files()? {
            match Self::read_mirror(&path) {
                Ok(Some(mirror)) => mirrors.push(mirror),
                Ok(None) => {}
                // Not ours to fix: logged, and left alone (it is not deleted either).
                Err(error) => tracing::warn!(%error, "a mirror file that cannot be read"),
            }
        }
        Ok(mirrors)
    }

    fn apply_now(&self, mirror: &Mirror) -> Result<(), WriteError> {
        let key = mirror.key();
        let path = self.path_of(&key);
        let cluster = crate::sources::cluster_objects_in(&self.dir, &[])
            .map_err(|e| WriteError::Parse { path: self.dir.clone(), error: e.to_string() })?;
        if cluster.services.iter().any(|s| NsName::of(&s.metadata) == key && !is_mirror(s)) {
            return Err(WriteError::NotAMirror(key));
        }
        let kept = Self::read_mirror(&path)?.and_then(|m| m.service.spec.and_then(|s| s.cluster_ip));
        let ip = match kept {
            Some(ip) => ip,
            None => {
                let used: HashSet<IpAddr> = cluster
                    .services
                    .iter()
                    .filter_map(|s| s.spec.as_ref())
                    .flat_map(|s| s.cluster_ip.iter().chain(s.cluster_ips.iter().flatten()))
                    .filter_map(|ip| ip.parse().ok())
                    .collect();
                allocate(self.cidr, &used)
                    .map_err(|full| match full {
                        None => WriteError::NoCidr(key.clone()),
                        Some(cidr) => WriteError::CidrFull(key.clone(), cidr),
                    })?
                    .to_string()
            }
        };
        let mut service = mirror.service.clone();
        if let Some(spec) = service.spec.as_mut() {
            spec.cluster_ip = Some(ip.clone());
            spec.cluster_ips = Some(vec![ip]);
        }
        let mut body = yaml(&service);
        for slice in &mirror.slices {
            body.push_str("---\n");
            body.push_str(&yaml(slice));
        }
        cnimesh_common::fs::write_atomic(&path, body.as_bytes(), Some(0o644))
            .map_err(|source| WriteError::Io { path, source })
    }

    fn delete_now(&self, key: &NsName) -> Result<(), WriteError> {
        let path = self.path_of(key);
        // Only a file that holds a mirror.
        if Self::read_mirror(&path)?.is_none() {
            return Ok(());
        }
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(WriteError::Io { path, source: e }),
            _ => Ok(()),
        }
    }

    fn status_now(&self, link: &str, status: &LinkStatus) -> Result<(), WriteError> {
        let path = Self::status_path(&self.dir, link);
        let dir = self.dir.join(STATUS_DIR);
        std::fs::create_dir_all(&dir).map_err(|source| WriteError::Io { path: dir, source })?;
        let body = serde_json::to_vec_pretty(status).expect("a LinkStatus serialises");
        cnimesh_common::fs::write_atomic_with(&path, &body, Some(0o644), cnimesh_common::fs::Durability::Unsynced)
            .map_err(|source| WriteError::Io { path, source })
    }
}

impl MirrorWriter for FilesWriter {
    fn list(&self) -> BoxFuture<'_, Result<Vec<Mirror>, WriteError>> {
        std::future::ready(self.list_now()).boxed()
    }

    fn apply<'a>(&'a self, mirror: &'a Mirror) -> BoxFuture<'a, Result<(), WriteError>> {
        std::future::ready(self.apply_now(mirror)).boxed()
    }

    fn delete<'a>(&'a self, mirror: &'a NsName) -> BoxFuture<'a, Result<(), WriteError>> {
        std::future::ready(self.delete_now(mirror)).boxed()
    }

    fn status<'a>(&'a self, link: &'a str, status: &'a LinkStatus) -> BoxFuture<'a, Result<(), WriteError>> {
        std::future::ready(self.status_now(link, status)).boxed()
    }
}

/// The highest address of `cidr` no Service uses (`Err(None)`: no range; `Err(Some)`: full).
fn allocate(cidr: Option<ipnet::IpNet>, used: &HashSet<IpAddr>) -> Result<IpAddr, Option<ipnet::IpNet>> {
    let cidr = cidr.ok_or(None)?;
    let free = match cidr {
        ipnet::IpNet::V4(net) => net.hosts().rev().map(IpAddr::V4).find(|ip| !used.contains(ip)),
        ipnet::IpNet::V6(net) => net.hosts().rev().take(1 << 16).map(IpAddr::V6).find(|ip| !used.contains(ip)),
    };
    free.ok_or(Some(cidr))
}

fn yaml<T: serde::Serialize>(object: &T) -> String {
    let value = serde_json::to_value(object).expect("a Kubernetes object serialises");
    serde_saphyr::to_string(&value).expect("JSON values serialise as YAML")
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

    async fn list_now(&self) -> Result<Vec<Mirror>, WriteError> {
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

    async fn apply_now(&self, mirror: &Mirror) -> Result<(), WriteError> {
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

    async fn delete_now(&self, key: &NsName) -> Result<(), WriteError> {
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
    async fn status_now(&self, link: &str, status: &LinkStatus) -> Result<(), WriteError> {
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

impl MirrorWriter for KubeWriter {
    fn list(&self) -> BoxFuture<'_, Result<Vec<Mirror>, WriteError>> {
        self.list_now().boxed()
    }

    fn apply<'a>(&'a self, mirror: &'a Mirror) -> BoxFuture<'a, Result<(), WriteError>> {
        self.apply_now(mirror).boxed()
    }

    fn delete<'a>(&'a self, mirror: &'a NsName) -> BoxFuture<'a, Result<(), WriteError>> {
        self.delete_now(mirror).boxed()
    }

    fn status<'a>(&'a self, link: &'a str, status: &'a LinkStatus) -> BoxFuture<'a, Result<(), WriteError>> {
        self.status_now(link, status).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::multicluster::link::{ValidLink, tests::link};
    use crate::multicluster::plan::{self, LinkInput, Local, Snapshot, View};

    fn mirror(ports: &[i32]) -> Mirror {
        let ports: Vec<_> = ports.iter().map(|p| serde_json::json!({"name": format!("p{p}"), "port": p})).collect();
        let service: Service =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "web", "namespace": "shop",
            "labels": {cnimesh_common::names::MIRROR_EXPORTED_LABEL: "true"}}, "spec": {"ports": ports}}))
            .unwrap();
        let west = ValidLink::from_link(&link("west")).unwrap();
        let snapshot = Snapshot { services: vec![service], ..Default::default() };
        let input =
            LinkInput { link: &west, gateway_ip: Some("192.0.2.10".parse().unwrap()), view: View::Up(&snapshot) };
        let local = Local { snapshot: None, trust_domain: "east.local", cluster_domain: "cluster.local" };
        plan::plan(&[input], &local, &[]).upserts.remove(0)
    }

    fn cluster_ip(writer: &FilesWriter) -> String {
        let listed = writer.list_now().unwrap();
        listed[0].service.spec.as_ref().unwrap().cluster_ip.clone().unwrap()
    }

    #[test]
    fn a_mirror_is_one_file_with_a_cluster_ip_from_the_top_of_the_range_kept_across_updates() {
        let dir = tempfile::tempdir().unwrap();
        // A Service of the cluster already holds the range's highest address.
        std::fs::write(
            dir.path().join("other.yaml"),
            "apiVersion: v1\nkind: Service\nmetadata: {name: other, namespace: shop}\nspec: {clusterIP: 10.96.255.254}\n",
        )
        .unwrap();
        let writer = FilesWriter::new(dir.path(), Some("10.96.0.0/16".parse().unwrap()));
        writer.apply_now(&mirror(&[80])).unwrap();
        let file = dir.path().join("mirror-shop-web-west.yaml");
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(text.matches("\n---\n").count() + usize::from(text.starts_with("---")), 1, "{text}");
        assert_eq!(cluster_ip(&writer), "10.96.255.253");
        // The files source reads it: the Service and its slice, one file.
        let objects = crate::sources::cluster_objects_in(dir.path(), &[]).unwrap();
        assert_eq!((objects.services.len(), objects.slices.len()), (2, 1));
        writer.apply_now(&mirror(&[80, 81])).unwrap();
        assert_eq!(cluster_ip(&writer), "10.96.255.253");
        let listed = writer.list_now().unwrap();
        assert_eq!(listed[0].normalized(), mirror(&[80, 81]).normalized());
        // Nothing else is left behind (no temporary files), and deleting removes the one file.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        writer.delete_now(&NsName::new("shop", "web-west")).unwrap();
        assert!(!file.exists());
    }

    #[test]
    fn a_service_that_is_not_a_mirror_is_never_overwritten_and_a_missing_range_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let theirs = "apiVersion: v1\nkind: Service\nmetadata: {name: web-west, namespace: shop}\nspec: {clusterIP: 10.96.0.1}\n";
        std::fs::write(dir.path().join("mine.yaml"), theirs).unwrap();
        let writer = FilesWriter::new(dir.path(), Some("10.96.0.0/16".parse().unwrap()));
        let error = writer.apply_now(&mirror(&[80])).unwrap_err();
        assert!(matches!(error, WriteError::NotAMirror(_)), "{error}");
        assert_eq!(std::fs::read_to_string(dir.path().join("mine.yaml")).unwrap(), theirs);
        let dir = tempfile::tempdir().unwrap();
        let error = FilesWriter::new(dir.path(), None).apply_now(&mirror(&[80])).unwrap_err();
        assert!(error.to_string().contains("--mirror-service-cidr"), "{error}");
    }
}
