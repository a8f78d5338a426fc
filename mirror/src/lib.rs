//! The multicluster mirror, its own process (`cnimesh-mirror`) with its own ServiceAccount: it
//! follows the Links in the control plane's namespace, connects to each linked cluster with the
//! Link's credentials, and mirrors that cluster's exported Services here as Services and
//! EndpointSlices (and the union of federated Services). The model is Linkerd's:
//! docs/tasks/multicluster.md describes it for operators.
//!
//! Why a process of its own: the control plane holds the identity issuer's key; the mirror holds
//! every linked cluster's credentials and cluster-wide write on Services and EndpointSlices. Apart,
//! a compromise of either gets only its own (docs/threat-model.md); the control plane reads the
//! mirrors from its API server like any Service.
//!
//! - [`crd`]: the Link resource; [`link`]: a Link checked into what can be carried out;
//!   [`kubeconfig`]: a Link's credentials, read as data only (shared with the CLI's `check`);
//!   [`overlap`]: Links whose cluster names would let their mirrors share names (refused);
//! - [`plan`]: pure: linked clusters' state in, the mirrors this cluster should hold out;
//! - [`remote`]: a cluster as the mirror reads it (its API server); [`write`]: where mirrors and
//!   Link status go (this cluster's API server);
//! - [`controller`]: per Link, follow the target, probe its gateway, write mirrors and status;
//! - [`metrics`], [`admin`] (`/metrics`, `/ready`, `/live`) and [`cli`]: the process.
//!
//! Layers: crd → kubeconfig | overlap → link → plan → remote | write | metrics → controller | admin → cli

pub mod admin;
pub mod cli;
pub mod controller;
pub mod crd;
pub mod kubeconfig;
pub mod link;
pub mod metrics;
pub mod overlap;
pub mod plan;
pub mod remote;
pub mod write;
