//! Multicluster (issue 28): Links to other clusters, the mirror controller that copies their
//! exported Services here, and the union of federated Services. The model is Linkerd's:
//! docs/tasks/multicluster.md describes it for operators.
//!
//! Layer: runtime (a controller over a remote cluster and the local one); [`crd`] is pure.

pub mod crd;
