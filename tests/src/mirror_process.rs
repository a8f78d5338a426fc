//! The multicluster mirror as a cluster runs it: the real `cnimesh-mirror serve` in a pod's
//! network namespace, with a kubeconfig for its own ServiceAccount on its cluster's API server
//! ([`crate::cluster::Cluster::kubeconfig_for`]`("cnimesh", "cnimesh-mirror")`). It reaches each
//! linked cluster only through its Link's kubeconfig. Killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::pod::Pod;
use crate::sidecar::http_in;

pub struct MirrorProcess {
    child: Child,
    netns: PathBuf,
    /// Its admin listener (`/metrics`), in its pod.
    admin: String,
}

impl MirrorProcess {
    /// `bin` (`CARGO_BIN_EXE_cnimesh-mirror-e2e`) in `pod`, as this cluster's trust domain's
    /// mirror, with a short writer Lease so a test's second replica takes over quickly.
    pub fn start(bin: &Path, pod: &Pod<'_>, kubeconfig: &Path, trust_domain: &str) -> anyhow::Result<Self> {
        let admin = format!("{}:9990", pod.ipv4());
        let child = Command::new("ip")
            .args(["netns", "exec", pod.netns.name()])
            .arg(bin)
            .arg("serve")
            .env("KUBECONFIG", kubeconfig)
            .env("CNIMESH_MIRROR_TRUST_DOMAIN", trust_domain)
            .env("CNIMESH_MIRROR_ADMIN_ADDR", &admin)
            .env("CNIMESH_MIRROR_LEASE_DURATION", "3s")
            .env("CNIMESH_MIRROR_LEASE_RENEW_INTERVAL", "500ms")
            .env("CNIMESH_MIRROR_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        Ok(Self { child, netns: pod.netns.path(), admin })
    }

    /// Its Prometheus metrics (empty when it does not answer).
    pub fn metrics(&self) -> String {
        http_in(&self.netns, &self.admin, "GET", "/metrics", "").map(|(_, b)| b).unwrap_or_default()
    }
}

impl Drop for MirrorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
