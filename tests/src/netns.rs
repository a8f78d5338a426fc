//! A named network namespace (`ip netns add`), deleted on drop.

use std::path::PathBuf;

use crate::host::{run, unique_name};

pub struct Netns {
    name: String,
    deleted: bool,
}

impl Netns {
    pub fn new() -> anyhow::Result<Self> {
        let name = unique_name("cnm");
        run("ip", &["netns", "add", &name])?;
        // Skip IPv6 duplicate address detection so addresses are usable at once.
        for key in ["all", "default"] {
            let _ = run("ip", &["netns", "exec", &name, "sysctl", "-qw", &format!("net.ipv6.conf.{key}.accept_dad=0")]);
        }
        Ok(Self { name, deleted: false })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.name)
    }

    /// Runs a command inside the namespace.
    pub fn exec(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let mut full = vec!["netns", "exec", &self.name, program];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// `nft list table inet cnimesh` here; `None` only when the table does not exist.
    pub fn nft_table(&self) -> Option<String> {
        match self.exec("nft", &["list", "table", "inet", "cnimesh"]) {
            Ok(listing) => Some(listing),
            Err(e) if e.to_string().contains("No such file or directory") => None,
            Err(e) => panic!("nft failed in {}: {e}", self.name),
        }
    }

    /// Deletes the namespace now (e.g. to test DEL after the pod's netns is gone).
    pub fn delete(&mut self) -> anyhow::Result<()> {
        if !self.deleted {
            run("ip", &["netns", "del", &self.name])?;
            self.deleted = true;
        }
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.delete();
    }
}

/// Runs `work` on a new thread inside the netns at `path` (for long-lived in-netns servers).
pub fn spawn_in(
    path: &std::path::Path,
    work: impl FnOnce() + Send + 'static,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let file = std::fs::File::open(path)?;
    Ok(std::thread::spawn(move || {
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns into the pod netns");
        work()
    }))
}

/// Runs `work` to completion inside the netns at `path`, on a thread with its own tokio runtime.
pub fn block_on_in<T: Send>(path: &std::path::Path, work: impl std::future::Future<Output = T> + Send) -> T {
    cnimesh_cni::netns::run_in(path, || {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(work)
    })
    .expect("enter netns")
}
