//! Sources layer: where cluster state comes from, above the pure model and index
//! ([`crate::destination`]) and below the gRPC services and the runtime. Each source keeps an
//! [`Index`] in step with one place: the Kubernetes API ([`KubeSource`]) or a directory of YAML
//! files ([`FileSource`], local mode and tests). docs/architecture.md, "Design decisions": Kubernetes stays at the edge,
//! behind this one trait with two implementations. Both also feed the policy index
//! ([`crate::policy::Index`]) when given one (`with_policy`): Pods once for both indexes, plus
//! Namespaces, the `policy.cnimesh.io` resources and the Gateway API routes and grants.

mod files;
mod kube;

use std::future::Future;
use std::path::PathBuf;

#[doc(hidden)]
pub use files::parse_for_fuzzing as parse_files_for_fuzzing;
pub use files::{ClusterObjects, DEFAULT_DEBOUNCE, FileSource, ReadError, cluster_objects_in, pods_and_services_in};
pub use kube::KubeSource;

use crate::destination::Index;

/// Where cluster state comes from. `run` keeps the index in step with the source for as long as
/// the program runs; it returns only when the source cannot go on.
pub trait Source: Send + 'static {
    fn run(self, index: Index) -> impl Future<Output = Result<(), SourceError>> + Send;
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot watch {dir}: {source}")]
    Watch { dir: PathBuf, source: notify::Error },
    #[error("file watcher for {dir} stopped: {reason}")]
    Stopped { dir: PathBuf, reason: String },
}
