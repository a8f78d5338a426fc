//! The agent's view of the cluster, behind one small trait: the Kubernetes API
//! ([`crate::kube_cluster::KubeCluster`]), in a cluster as in local mode and the tests (against the
//! in-process API server).

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
