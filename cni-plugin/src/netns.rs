//! Running work inside a pod's network namespace.
//!
//! `setns(CLONE_NEWNET)` changes only the calling thread, so the work runs on a dedicated OS thread
//! that enters the netns and then ends: the caller's thread (and any async runtime that embeds this
//! library) never leaves its own namespace.

use std::fs::File;
use std::io;
use std::path::Path;

use nix::sched::{CloneFlags, setns};

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace {path} does not exist")]
    Missing { path: String },
    #[error("cannot open network namespace {path}: {source}")]
    Open { path: String, source: io::Error },
    #[error("cannot enter network namespace {path}: {source}")]
    Enter { path: String, source: nix::Error },
}

impl NetnsError {
    /// Whether the namespace no longer exists: its path is gone, or is no longer a namespace
    /// (a runtime unmounted it but left the file).
    pub fn is_gone(&self) -> bool {
        matches!(self, NetnsError::Missing { .. } | NetnsError::Enter { source: nix::Error::EINVAL, .. })
    }
}

/// Runs `work` with the thread inside the netns at `path`.
pub fn run_in<T: Send>(path: &Path, work: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    let shown = path.display().to_string();
    let file = File::open(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => NetnsError::Missing { path: shown.clone() },
        _ => NetnsError::Open { path: shown.clone(), source },
    })?;
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter { path: shown, source })?;
                Ok(work())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}
