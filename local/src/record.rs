//! What `up` records about itself in `<root>/local.json`, read back by `down` (whose prefix it
//! overrides) and by people. Its own module so that `up` and `down` both depend on it and not on
//! each other.

use std::net::SocketAddr;
use std::path::Path;

use cnimesh_common::fs::write_atomic;
use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

/// The file under the root dir; its presence means local mode is (or was) up there.
pub const FILE: &str = "local.json";

/// What `up` recorded about itself, for `down` and for people (`<root>/local.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub prefix: String,
    pub subnet: Ipv4Net,
    pub bridge: String,
    pub control: Option<SocketAddr>,
    /// The cluster's trust domain (absent: cluster.local); `cnimesh multicluster link --local`
    /// reads it, with the gateway below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_domain: Option<String>,
    /// The multicluster gateway pod's `ip:4143` (west of `--clusters 2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<SocketAddr>,
    /// The nftables table accepting forwarded traffic between the clusters' pod networks (east
    /// of `--clusters 2`), which `down` deletes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_table: Option<String>,
    /// The nftables table masquerading the pods' egress out of the host's uplink, which `down`
    /// deletes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_table: Option<String>,
}

impl State {
    pub fn read(root: &Path) -> Option<Self> {
        serde_json::from_slice(&std::fs::read(root.join(FILE)).ok()?).ok()
    }

    pub fn write(&self, root: &Path) -> anyhow::Result<()> {
        write_atomic(&root.join(FILE), &serde_json::to_vec_pretty(self)?, None)?;
        Ok(())
    }
}
