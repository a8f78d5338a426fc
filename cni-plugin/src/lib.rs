//! `cnimesh-cni`: the chained CNI plugin that programs cnimesh's traffic capture, and the library
//! the node agent and debug CLI share with it (rule model, backends, state records).
//!
//! Dependencies stay small on purpose (docs/architecture.md, "Design decisions"): the binary is exec'd for every pod.

pub mod agent;
pub mod backend;
pub mod cli;
pub mod config;
pub mod env;
pub mod error;
pub mod iptables;
pub mod logging;
pub mod netns;
pub mod nft;
pub mod plugin;
pub mod result;
pub mod rules;
pub mod spec;
pub mod state;
pub mod version;
