//! Policy: which clients may reach which ports of meshed pods (inbound), and how proxies treat
//! the destinations they call (outbound), served as linkerd2-proxy-api's
//! `io.linkerd.proxy.inbound.InboundServerPolicies` and `io.linkerd.proxy.outbound.OutboundPolicies`
//! so a stock linkerd2-proxy can run against cnimesh-control (issue 19).
//!
//! Layer: model/index (pure): [`crd`] (the custom resources), [`model`] (validated records),
//! [`index`] (answers per pod port and per service port, streamed through `tokio::sync::watch`).
//! The sources feeding the index are [`crate::sources`]; the gRPC services
//! [`crate::grpc::inbound`] and [`crate::grpc::outbound`].

pub mod crd;
pub mod index;
pub mod model;

pub use index::{Change, Config, Index, Kind, Object};
pub use model::DefaultPolicy;
