//! `cnimesh-control`: the control plane. Identity (certificates for workloads), Destination
//! (service discovery) and inbound/outbound policy over gRPC speaking `linkerd2-proxy-api`, and
//! the injection webhook.
//!
//! Layers, as in Linkerd's policy controller, each built on those before it (never after):
//! 1. model/index (pure): [`meta`] (objects' keys), [`resource`] (what an operator names),
//!    [`workload`] (a pod's owner), [`metrics`]; then the Gateway API routes ([`routes`]), which
//!    [`destination`] (model, index, path, resolve) reads for service defaults, beside [`egress`]
//!    (EgressNetworks and the routes attached to them), and [`policy`]
//!    (CRDs, model, index; the index also holds the routes) beside [`identity`] (issuer, token
//!    checks);
//! 2. sources: [`sources`] (Kubernetes watchers), and the TLS accept loop the servers
//!    share ([`tls_accept`]);
//! 3. servers: [`grpc`] (Destination, Identity, inbound and outbound policy over TLS), the
//!    webhook ([`inject`]), [`leader`] (Lease elections for the writers) and the tap relay
//!    ([`tap`]), none importing another;
//! 4. runtime: [`admin`], [`ca_init`], [`webhook_certs`] (the webhook's Secret and caBundle),
//!    [`trust_bundle`] (the endorsed anchors in every namespace), then [`serve`], which wires
//!    them, and [`cli`], its flags.
//!
//! The operator's command line (`cnimesh`) is a crate of its own, cnimesh-cli, built on this one.
//! So is the multicluster mirror (cnimesh-mirror), its own process and ServiceAccount: the
//! process that holds the issuer's key holds no linked cluster's credentials and cannot write
//! Services or EndpointSlices; Destination reads the mirrors from the API server like any Service.
//!
//! Layers: metrics | resource | meta | workload → routes → destination | egress → policy | identity → sources | tls_accept → grpc | inject | leader | tap → admin | ca_init | webhook_certs | trust_bundle → serve → cli
//!
//! In-process use (tests, benchmarks): bind the listeners yourself and call [`serve::run`] with a
//! [`serve::Config`]; it returns once the config's shutdown future resolves and calls have
//! drained.

pub mod admin;
pub mod ca_init;
pub mod cli;
pub mod destination;
pub mod egress;
pub mod grpc;
pub mod identity;
pub mod inject;
pub mod leader;
pub mod meta;
pub mod metrics;
pub mod policy;
pub mod resource;
pub mod routes;
pub mod serve;
pub mod sources;
pub mod tap;
pub mod tls_accept;
pub mod trust_bundle;
pub mod webhook_certs;
pub mod workload;

pub use serve::{ClusterConfig, Config, Listener, Listeners, WebhookConfig, run};
