//! Policy: which clients may reach which ports of meshed pods (inbound), and how proxies treat
//! the destinations they call (outbound), served as linkerd2-proxy-api's
//! `io.linkerd.proxy.inbound.InboundServerPolicies` and `io.linkerd.proxy.outbound.OutboundPolicies`
//! so a stock linkerd2-proxy can run against cnimesh-control.
//!
//! Cluster state flows one way, as for Destination: a `cnimesh_control::sources::Source` given
//! the policy index (`KubeSource::with_policy`) turns Pods and
//! Services (the same watches Destination uses; of a Service, only the `appProtocol` it declares
//! for the pods it selects is kept), Namespaces and the `policy.cnimesh.io/v1alpha1`
//! resources into
//! [`Change`]s on an [`Index`]; `cnimesh_control::grpc::inbound::InboundService` streams
//! its answers. Outbound policy needs Services and their opaque ports, which the Destination
//! index already holds, and the Gateway API routes attached to them, which the outbound index
//! (`crate::outbound`, keyed by parent) holds: `cnimesh_control::grpc::outbound::OutboundService`
//! reads both. This index is the inbound one only.
//!
//! The wiring, with the servers, is in `cnimesh_control::sources`' documentation.
//!
//! Layer: model/index (pure): [`crd`] (the custom resources), [`model`] (validated records),
//! [`index`] (answers per pod port and per service port, streamed through `tokio::sync::watch`).
//! The sources feeding the index are `cnimesh_control::sources`; the gRPC services
//! `cnimesh_control::grpc::inbound` and `cnimesh_control::grpc::outbound`.

pub mod crd;
pub mod index;
pub mod model;

pub use index::{Change, Config, Index, Kind, Object};
pub use model::{DefaultPolicy, PodRecord};
