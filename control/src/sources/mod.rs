//! Sources layer: where cluster state comes from, above the pure model and index
//! (`cnimesh_model::destination`) and below the gRPC services and the runtime. A source keeps an
//! [`Index`] in step with the Kubernetes API ([`KubeSource`]; tests and local mode run it against
//! the in-process API server, cnimesh-apiserver). docs/architecture.md, "Design decisions":
//! Kubernetes stays at the edge, behind this one trait. The source also feeds every other index
//! it is given (`with_index`; `with_policy`): each declares the kinds it consumes
//! (`cnimesh_model::index_list`), and each kind is watched once for all of them.
//!
//! Destination, wired (what [`crate::serve`] does):
//! ```no_run
//! use cnimesh_model::destination::{Config, Index};
//! use cnimesh_control::grpc::destination::DestinationService;
//! use cnimesh_control::sources::{KubeSource, Source};
//!
//! async fn serve(client: kube::Client, addr: std::net::SocketAddr) -> anyhow::Result<()> {
//!     let index = Index::new();
//!     tokio::spawn(KubeSource::new(client).run(index.clone()));
//!     let destination = DestinationService::new(index, Config::default()).into_server();
//!     tonic::transport::Server::builder().add_service(destination).serve(addr).await?;
//!     Ok(())
//! }
//! ```
//!
//! Inbound and outbound policy beside it:
//! ```no_run
//! use cnimesh_control::grpc::inbound::InboundService;
//! use cnimesh_control::grpc::outbound::OutboundService;
//! use cnimesh_control::sources::{KubeSource, Source};
//! use cnimesh_model::{destination, egress, outbound, policy};
//!
//! async fn serve(client: kube::Client, addr: std::net::SocketAddr) -> anyhow::Result<()> {
//!     let (index, policy) = (destination::Index::new(), policy::Index::new(policy::Config::default()));
//!     let outbound = outbound::Index::new(egress::Index::new(egress::Config::new(Vec::new())));
//!     let source = KubeSource::new(client).with_policy(policy.clone()).with_index(outbound.clone());
//!     tokio::spawn(source.run(index.clone()));
//!     let outbound = OutboundService::new(index, destination::Config::default()).with_outbound(outbound);
//!     tonic::transport::Server::builder()
//!         .add_service(InboundService::new(policy.clone()).into_server())
//!         .add_service(outbound.into_server())
//!         .serve(addr)
//!         .await?;
//!     Ok(())
//! }
//! ```

mod kube;

use std::future::Future;

pub use kube::KubeSource;

use cnimesh_model::destination::Index;

/// Where cluster state comes from. `run` keeps the index in step with the source for as long as
/// the program runs; it returns only when the source cannot go on.
pub trait Source: Send + 'static {
    fn run(self, index: Index) -> impl Future<Output = Result<(), SourceError>> + Send;
}

/// Why a source could not go on. The Kubernetes source retries every failure with backoff, so
/// it has no reason to stop: no variant yet.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {}
