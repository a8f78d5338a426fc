//! Atomic file writes: a temporary file in the same directory, complete, synced and with its
//! final mode from its creation, then renamed over the target. A reader (libcni scanning a
//! config dir, a server reloading a certificate) sees the old file or the new one, never half,
//! and a key is never readable by others, not even briefly.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether a write must survive a crash of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// File and directory synced before returning: configuration, certificates, keys.
    Synced,
    /// Atomic for readers, not synced: state that dies with the machine anyway (the plugin's
    /// records of live network namespaces), where a sync would stall every pod's ADD.
    Unsynced,
}

/// Writes `body` to `path` atomically and durably with `mode`, or, when `None`, the existing
/// file's mode (0644 for a new file). The temporary name starts with a dot and does not end in
/// `.conf`, `.conflist` or `.json`, so libcni (and anything listing by extension) never reads it.
pub fn write_atomic(path: &Path, body: &[u8], mode: Option<u32>) -> io::Result<()> {
    write_atomic_with(path, body, mode, Durability::Synced)
}

/// [`write_atomic`] with a choice of [`Durability`].
pub fn write_atomic_with(path: &Path, body: &[u8], mode: Option<u32>, durability: Durability) -> io::Result<()> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let mode = mode.unwrap_or_else(|| fs::metadata(path).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0o644));
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    // Created exclusively: two writers (even with equal pids in different pid namespaces) never
    // share a temporary file.
    let tmp = dir.join(format!(
        ".{name}.cnimesh-tmp.{}.{}.{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        // The umask may have taken bits away from the creation mode.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(body)?;
        if durability == Durability::Synced {
            file.sync_all()?;
        }
        fs::rename(&tmp, path)?;
        match durability {
            // Make the rename itself durable.
            Durability::Synced => fs::File::open(dir)?.sync_all(),
            Durability::Unsynced => Ok(()),
        }
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_with_the_given_mode_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tls.key");
        write_atomic(&path, b"one", Some(0o600)).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"one");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        write_atomic(&path, b"two", None).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600, "the mode is kept");
        let new = dir.path().join("new.conflist");
        write_atomic(&new, b"{}", None).unwrap();
        assert_eq!(fs::metadata(&new).unwrap().permissions().mode() & 0o777, 0o644);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2, "no temporary file left");
        write_atomic_with(&new, b"[]", None, Durability::Unsynced).unwrap();
        assert_eq!(fs::read(&new).unwrap(), b"[]");
        let error = write_atomic(&dir.path().join("missing/dir/file"), b"x", None).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
    }
}
