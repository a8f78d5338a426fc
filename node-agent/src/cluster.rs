//! The agent's view of the cluster, behind one small trait so that the node agent runs against the
//! Kubernetes API in a cluster and against a directory of pod files in local mode and tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;

/// Everything the agent reads and changes in the cluster.
pub trait Cluster: Send + Sync + 'static {
    /// A pod by namespace and name; `None` when it does not exist.
    fn pod<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, anyhow::Result<Option<Pod>>>;
    /// The pods scheduled to this node.
    fn node_pods(&self) -> BoxFuture<'_, anyhow::Result<Vec<Pod>>>;
    /// Deletes a pod so its controller recreates it (through the plugin).
    fn delete_pod<'a>(&'a self, pod: &'a Pod, reason: &'a str) -> BoxFuture<'a, anyhow::Result<()>>;
    /// Marks a pod with a label instead of deleting it.
    fn label_pod<'a>(&'a self, pod: &'a Pod, key: &'a str, value: &'a str) -> BoxFuture<'a, anyhow::Result<()>>;
    /// Removes a `NoSchedule` taint from this node if present; returns whether it was there.
    fn remove_node_taint<'a>(&'a self, key: &'a str) -> BoxFuture<'a, anyhow::Result<bool>>;
    /// Whether the cluster state has been fully loaded (watch caches synced).
    fn ready(&self) -> bool;
}

pub type SharedCluster = Arc<dyn Cluster>;

/// `namespace/name` for messages.
pub fn pod_key(pod: &Pod) -> String {
    format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or("default"), pod.metadata.name.as_deref().unwrap_or(""))
}

/// Pods as YAML or JSON files in a directory (one pod per file): local mode's "API server".
pub struct FileCluster {
    dir: PathBuf,
    node: Option<String>,
}

impl FileCluster {
    /// Pods of `dir`; with `node`, only those whose `spec.nodeName` is that node (or unset).
    pub fn new(dir: &Path, node: Option<String>) -> Self {
        Self { dir: dir.to_path_buf(), node }
    }

    fn load(&self) -> anyhow::Result<Vec<(PathBuf, Pod)>> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(anyhow::anyhow!("{}: {e}", self.dir.display())),
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
            let body = match ext {
                "json" | "yaml" | "yml" => match std::fs::read_to_string(&path) {
                    Ok(body) => body,
                    // Deleted since the listing (repair, or `local down`, removing another
                    // pod): it is gone, which is not a reason to fail every other pod's read.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(anyhow::anyhow!("{}: {e}", path.display())),
                },
                _ => continue,
            };
            let pod: Pod = if ext == "json" {
                serde_json::from_str(&body)?
            } else {
                serde_saphyr::from_str(&body).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
            };
            let on_node = match (&self.node, pod.spec.as_ref().and_then(|s| s.node_name.as_ref())) {
                (Some(node), Some(pod_node)) => node == pod_node,
                _ => true,
            };
            if on_node {
                out.push((path, pod));
            }
        }
        Ok(out)
    }

    fn path_of(&self, pod: &Pod) -> anyhow::Result<PathBuf> {
        let key = pod_key(pod);
        self.load()?
            .into_iter()
            .find(|(_, p)| pod_key(p) == key)
            .map(|(path, _)| path)
            .ok_or_else(|| anyhow::anyhow!("pod {key} not found"))
    }
}

impl Cluster for FileCluster {
    fn pod<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, anyhow::Result<Option<Pod>>> {
        Box::pin(async move {
            let key = format!("{namespace}/{name}");
            Ok(self.load()?.into_iter().map(|(_, p)| p).find(|p| pod_key(p) == key))
        })
    }

    fn node_pods(&self) -> BoxFuture<'_, anyhow::Result<Vec<Pod>>> {
        Box::pin(async move { Ok(self.load()?.into_iter().map(|(_, p)| p).collect()) })
    }

    fn delete_pod<'a>(&'a self, pod: &'a Pod, reason: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            tracing::warn!(pod = pod_key(pod), reason, "deleting pod file");
            std::fs::remove_file(self.path_of(pod)?)?;
            Ok(())
        })
    }

    fn label_pod<'a>(&'a self, pod: &'a Pod, key: &'a str, value: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let path = self.path_of(pod)?;
            let mut labelled = pod.clone();
            labelled.metadata.labels.get_or_insert_default().insert(key.into(), value.into());
            let body = serde_json::to_vec_pretty(&labelled)?;
            cnimesh_common::fs::write_atomic(&path.with_extension("json"), &body, None)?;
            if path.extension().is_some_and(|e| e != "json") {
                std::fs::remove_file(&path)?;
            }
            Ok(())
        })
    }

    fn remove_node_taint<'a>(&'a self, _key: &'a str) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async { Ok(false) })
    }

    fn ready(&self) -> bool {
        true
    }
}
