//! `cnimesh-control`: the control plane. Identity (certificates for workloads), Destination
//! (service discovery) and inbound/outbound policy over gRPC speaking `linkerd2-proxy-api`, and
//! the injection webhook.
//!
//! Layers, as in Linkerd's policy controller, each built on those before it (never after):
//! 1. model/index (pure): [`destination`] (model, index, path, resolve), [`policy`] (CRDs,
//!    model, index; the index also holds [`routes`]: Gateway API HTTPRoute/GRPCRoute), [`identity`]'s issuer model, [`inject`]'s mutation, [`metrics`];
//! 2. sources: [`sources`] (Kubernetes watchers, YAML files), the identity token sources and
//!    the issuer directory;
//! 3. gRPC: [`grpc`] (Destination, Identity, inbound and outbound policy over TLS) and the webhook's HTTPS endpoint;
//! 4. runtime: [`cli`], [`serve`], [`admin`] (with the tap relay, [`tap`]), [`ca_init`], [`leader`] (Lease elections for the
//!    writers), [`webhook_certs`] (the webhook's Secret and caBundle) and the operator's CLI, [`operator`].
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
pub mod leader;
pub mod metrics;
pub mod policy;
pub mod resource;
pub mod routes;
pub mod serve;
pub mod sources;
pub mod tap;
pub mod webhook_certs;

pub use serve::{ClusterSource, Config, Listeners, TokenSource, run};
