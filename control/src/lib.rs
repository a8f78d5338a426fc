//! `cnimesh-control`: the control plane. Identity (certificates for workloads), Destination
//! (service discovery) over gRPC speaking `linkerd2-proxy-api`, and the injection webhook.
//!
//! In-process use (tests, benchmarks): bind the listeners yourself and call [`serve::run`] with a
//! [`serve::Config`]; it returns once the shutdown future resolves and calls have drained.

pub mod admin;
pub mod ca_init;
pub mod cli;
pub mod destination;
pub mod grpc;
pub mod identity;
pub mod inject;
pub mod metrics;
pub mod operator;
pub mod serve;
pub mod sources;

pub use serve::{ClusterSource, Config, Listeners, TokenSource, run};
