//! The end-to-end harness: pods as network namespaces, a CNI runtime that executes a conflist the
//! way libcni does, and traffic probes with real sockets.
//!
//! Everything a test creates is owned by an RAII value (namespaces, listeners, pods, temp dirs), so
//! it is torn down even when an assertion fails, and names are unique per process so tests can run
//! in parallel.

pub mod agent;
pub mod apps;
pub mod bench;
pub mod cluster;
pub mod cni;
pub mod control;
pub mod cost;
pub mod dns;
pub mod flood;
pub mod haproxy;
pub mod host;
pub mod host_agent;
pub mod kube_api;
pub mod local_mode;
pub mod manifest_check;
pub mod mesh;
pub mod mirror_process;
pub mod multicluster;
pub mod netns;
pub mod nginx;
pub mod objects;
pub mod outside;
pub mod pod;
pub mod probe;
pub mod sidecar;
pub mod sniff;
pub mod tap_client;
pub mod wait;
pub mod webdriver;

pub use cni::{Bins, Call, CniFailure, Network, PluginDir};
pub use host::require_root;
pub use netns::Netns;
pub use pod::Pod;
pub use probe::{Listener, Report};
