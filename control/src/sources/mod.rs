//! Sources layer: where cluster state comes from, above the pure model and index
//! ([`crate::destination`]) and below the gRPC services and the runtime. A source keeps an
//! [`Index`] in step with the Kubernetes API ([`KubeSource`]; tests and local mode run it against
//! the in-process API server, cnimesh-apiserver). docs/architecture.md, "Design decisions":
//! Kubernetes stays at the edge, behind this one trait. The source also feeds the policy index
//! ([`crate::policy::Index`]) when given one (`with_policy`): Pods once for both indexes, plus
//! Namespaces, the `policy.cnimesh.io` resources and the Gateway API routes and grants.

mod kube;

use std::future::Future;

pub use kube::KubeSource;

use crate::destination::Index;

/// Where cluster state comes from. `run` keeps the index in step with the source for as long as
/// the program runs; it returns only when the source cannot go on.
pub trait Source: Send + 'static {
    fn run(self, index: Index) -> impl Future<Output = Result<(), SourceError>> + Send;
}

/// Why a source could not go on. The Kubernetes source retries every failure with backoff, so
/// it has no reason to stop: no variant yet.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {}
