//! Multicluster: Links to other clusters, the mirror controller that copies their
//! exported Services here, and the union of federated Services. The model is Linkerd's:
//! docs/tasks/multicluster.md describes it for operators.
//!
//! - [`crd`]: the Link resource; [`link`]: a Link checked into what can be carried out;
//!   [`kubeconfig`]: a Link's credentials, read as data only (shared with the CLI's `check`);
//!   [`overlap`]: Links whose cluster names would let their mirrors share names (refused);
//! - [`plan`]: pure: linked clusters' state in, the mirrors this cluster should hold out;
//! - [`remote`]: a cluster as the mirror reads it (API server or directory); [`write`]: where
//!   mirrors and Link status go (API server or directory);
//! - [`controller`]: per Link, follow the target, probe its gateway, write mirrors and status.
//!
//! Layer: runtime (a controller over a remote cluster and the local one); [`crd`], [`link`],
//! [`kubeconfig`], [`overlap`] and [`plan`] are pure.

pub mod controller;
pub mod crd;
pub mod kubeconfig;
pub mod link;
pub mod overlap;
pub mod plan;
pub mod remote;
pub mod write;
