//! Installing the plugin binary into the host's CNI bin dir.
//!
//! A runtime may exec the plugin at any moment, so the binary is never written in place: it is
//! copied to a temp name in the same directory, fsync'd, made executable, and renamed over the
//! target, so an exec sees either the old or the new binary, never half of one.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use cnimesh_common::fs::write_atomic;

use crate::chain::PLUGIN_TYPE;

pub fn target(bin_dir: &Path) -> PathBuf {
    bin_dir.join(PLUGIN_TYPE)
}

/// Installs `source` as `<bin_dir>/cnimesh-cni`; returns whether anything changed.
pub fn install_binary(source: &Path, bin_dir: &Path) -> io::Result<bool> {
    let body = fs::read(source)?;
    let target = target(bin_dir);
    if fs::read(&target).is_ok_and(|current| current == body) {
        return Ok(false);
    }
    fs::create_dir_all(bin_dir)?;
    // The rename publishes a complete, executable file: never a half-written or 0644 one.
    write_atomic(&target, &body, Some(0o755))?;
    Ok(true)
}

/// Removes the installed binary; a missing one is fine.
pub fn remove_binary(bin_dir: &Path) -> io::Result<()> {
    match fs::remove_file(target(bin_dir)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn installs_atomically_and_executable_once() {
        let src_dir = tempfile::tempdir().unwrap();
        let bin_dir = tempfile::tempdir().unwrap();
        let source = src_dir.path().join("cnimesh-cni");
        fs::write(&source, b"#!/bin/sh\necho v1\n").unwrap();
        assert!(install_binary(&source, bin_dir.path()).unwrap());
        assert!(!install_binary(&source, bin_dir.path()).unwrap(), "same content: no write");
        let installed = target(bin_dir.path());
        assert_eq!(fs::metadata(&installed).unwrap().permissions().mode() & 0o777, 0o755);
        fs::write(&source, b"#!/bin/sh\necho v2\n").unwrap();
        assert!(install_binary(&source, bin_dir.path()).unwrap());
        assert_eq!(fs::read(&installed).unwrap(), b"#!/bin/sh\necho v2\n");
        assert_eq!(fs::metadata(&installed).unwrap().permissions().mode() & 0o777, 0o755);
        assert_eq!(fs::read_dir(bin_dir.path()).unwrap().count(), 1, "no temp file left");
        remove_binary(bin_dir.path()).unwrap();
        remove_binary(bin_dir.path()).unwrap();
        assert!(!installed.exists());
    }
}
