//! `cnimesh-node`: the node agent (installer, pod decisions, repair), its host mode for machines
//! outside Kubernetes, and the node-level debug CLI.

pub mod chain;
pub mod cli;
pub mod cluster;
pub mod debug;
pub mod decide;
pub mod health;
pub mod host;
pub mod install;
pub mod kube_cluster;
pub mod metrics;
pub mod mounts;
pub mod rechain;
pub mod repair;
pub mod run;
pub mod server;
