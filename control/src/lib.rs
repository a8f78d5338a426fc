//! `cnimesh-control`: the control plane's servers. Identity (certificates for workloads),
//! Destination (service discovery) and inbound/outbound policy over gRPC speaking
//! `linkerd2-proxy-api`, the injection webhook and the tap relay.
//!
//! Its pure layer (the models and indexes those servers answer from: objects' keys, routes,
//! Destination, EgressNetworks, policy, the identity issuer, the webhook's mutation) is the crate
//! below it, `cnimesh-model`, and its process plumbing (the Lease elector, the admin accept loop)
//! is `cnimesh-runtime`: the multicluster mirror and the operator's command line build on those two
//! and never link these servers.
//!
//! Layers, as in Linkerd's policy controller, each built on those before it (never after):
//! 1. sources: [`sources`] (Kubernetes watchers feeding the model's indexes: one watch per kind
//!    the indexes declare, each change fanned out to every index that declared its kind), and
//!    the TLS accept loop the servers share ([`tls_accept`]);
//! 2. servers: [`grpc`] (Destination, Identity, inbound policy from the policy index and outbound
//!    policy from the Destination and outbound indexes, over TLS), the
//!    webhook ([`inject`]) and the tap relay ([`tap`]), none importing another;
//! 3. runtime: [`admin`], [`webhook_certs`] (the webhook's Secret and caBundle),
//!    [`trust_bundle`] (the endorsed anchors in every namespace), then [`serve`], which wires
//!    them, and [`cli`], its flags.
//!
//! The operator's command line (`cnimesh`) is a crate of its own, cnimesh-cli. So is the
//! multicluster mirror (cnimesh-mirror), its own process and ServiceAccount, a peer of this crate:
//! the process that holds the issuer's key holds no linked cluster's credentials and cannot write
//! Services or EndpointSlices; Destination reads the mirrors from the API server like any Service.
//!
//! Layers: sources | tls_accept → grpc | inject | tap → admin | webhook_certs | trust_bundle → serve → cli
//!
//! In-process use (tests, benchmarks): bind the listeners yourself and call [`serve::run`] with a
//! [`serve::Config`]; it returns once the config's shutdown future resolves and calls have
//! drained.

pub mod admin;
pub mod cli;
pub mod grpc;
pub mod inject;
pub mod serve;
pub mod sources;
pub mod tap;
pub mod tls_accept;
pub mod trust_bundle;
pub mod webhook_certs;

pub use serve::{ClusterConfig, Config, Listener, Listeners, WebhookConfig, run};
