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
