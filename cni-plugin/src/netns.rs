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
    #[error("cannot start a thread to enter network namespace {path}: {source}")]
    Thread { path: String, source: io::Error },
}

impl NetnsError {
    /// Whether the namespace no longer exists: its path is gone, or is no longer a namespace
    /// (a runtime unmounted it but left the file).
    pub fn is_gone(&self) -> bool {
        matches!(self, NetnsError::Missing { .. } | NetnsError::Enter { source: nix::Error::EINVAL, .. })
    }
}

/// The identity of a network namespace file (device and inode of the nsfs entry): a path can be
/// reused for another namespace, this cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

impl NetnsId {
    pub fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).ok().map(|m| Self { dev: m.dev(), ino: m.ino() })
    }
}

/// Runs `work` with the thread inside the netns at `path`.
pub fn run_in<T: Send>(path: &Path, work: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    let shown = path.display().to_string();
    let file = File::open(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => NetnsError::Missing { path: shown.clone() },
        _ => NetnsError::Open { path: shown.clone(), source },
    })?;
    let thread_path = shown.clone();
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("netns".into())
            .spawn_scoped(scope, move || {
                setns(&file, CloneFlags::CLONE_NEWNET)
                    .map_err(|source| NetnsError::Enter { path: thread_path, source })?;
                Ok(work())
            })
            .map_err(|source| NetnsError::Thread { path: shown, source })?
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}
