//! `cnimesh ca init`: a trust anchor and an issuer for local use and tests, written in
//! the layout `serve --issuer-dir` reads, so that nobody needs openssl or step to get started.
//! The root key is written next to the issuer for convenience; in a cluster it belongs offline.
//!
//! The files are the control plane's (what `serve --issuer-dir` reads), so the function lives
//! here; the command that calls it is the operator's (cnimesh-cli), and tests and benchmarks
//! call it directly.
//!
//! Layer: runtime (writes files).

use std::path::PathBuf;
use std::time::Duration;

use cnimesh_identity::ca;

use crate::identity::issuer::{ANCHORS_FILE, ISSUER_CERT_FILE, ISSUER_KEY_FILE};

pub const ANCHOR_KEY_FILE: &str = "ca.key";

#[derive(Debug, thiserror::Error)]
pub enum CaInitError {
    #[error("{} exists; pass --force to overwrite", .0.display())]
    Exists(PathBuf),
    #[error("writing {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Ca(#[from] ca::CaError),
}

#[derive(Debug, Clone)]
pub struct CaInit {
    pub dir: PathBuf,
    pub trust_domain: String,
    pub anchor_lifetime: Duration,
    pub issuer_lifetime: Duration,
    pub force: bool,
}

impl CaInit {
    /// `cnimesh ca init --dir DIR`'s defaults: the default trust domain, an anchor for ten years
    /// and an issuer for one.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            trust_domain: cnimesh_identity::DEFAULT_TRUST_DOMAIN.to_string(),
            anchor_lifetime: Duration::from_secs(3650 * 86400),
            issuer_lifetime: Duration::from_secs(365 * 86400),
            force: false,
        }
    }
}

/// Generates and writes the four files. Without `force`, nothing is written if any exists.
pub fn run(opts: &CaInit) -> Result<Vec<PathBuf>, CaInitError> {
    let files = [ANCHORS_FILE, ANCHOR_KEY_FILE, ISSUER_CERT_FILE, ISSUER_KEY_FILE].map(|f| opts.dir.join(f));
    if !opts.force
        && let Some(existing) = files.iter().find(|p| p.symlink_metadata().is_ok())
    {
        return Err(CaInitError::Exists(existing.clone()));
    }
    std::fs::create_dir_all(&opts.dir).map_err(|source| CaInitError::Write { path: opts.dir.clone(), source })?;
    let anchor = ca::new_trust_anchor(&opts.trust_domain, opts.anchor_lifetime)?;
    let issuer = ca::new_issuer(&anchor, &opts.trust_domain, opts.issuer_lifetime)?;
    // Keys first and the issuer certificate last, so that a watching control plane never sees
    // a new certificate next to an old key for long (it would reject that and keep the old).
    let contents = [(&files[1], &anchor.key_pem, 0o600), (&files[3], &issuer.key_pem, 0o600)];
    let contents =
        contents.into_iter().chain([(&files[0], &anchor.cert_pem, 0o644), (&files[2], &issuer.cert_pem, 0o644)]);
    // Atomic and with its mode from creation: a key is never readable by others, not even
    // briefly, and --force does not keep an existing file's looser mode.
    for (path, pem, mode) in contents {
        cnimesh_common::fs::write_atomic(path, pem.as_bytes(), Some(mode))
            .map_err(|source| CaInitError::Write { path: path.clone(), source })?;
    }
    Ok(files.to_vec())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::*;
    use crate::identity::Issuer;

    fn opts(dir: &Path) -> CaInit {
        CaInit {
            dir: dir.join("pki"),
            trust_domain: "cluster.local".into(),
            anchor_lifetime: Duration::from_secs(3600),
            issuer_lifetime: Duration::from_secs(1800),
            force: false,
        }
    }

    #[test]
    fn writes_a_loadable_issuer_with_private_keys() {
        let dir = tempfile::tempdir().unwrap();
        let opts = opts(dir.path());
        run(&opts).unwrap();
        let issuer = Issuer::load(&opts.dir).unwrap();
        let expires = issuer.signer.issuer_not_after.duration_since(std::time::SystemTime::now()).unwrap();
        assert!(expires <= Duration::from_secs(1800) && expires > Duration::from_secs(1700), "{expires:?}");
        for key in [ANCHOR_KEY_FILE, ISSUER_KEY_FILE] {
            let mode = std::fs::metadata(opts.dir.join(key)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{key}");
        }
    }

    #[test]
    fn refuses_to_overwrite_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = opts(dir.path());
        run(&opts).unwrap();
        let before = std::fs::read(opts.dir.join(ISSUER_CERT_FILE)).unwrap();
        assert!(matches!(run(&opts), Err(CaInitError::Exists(_))));
        assert_eq!(std::fs::read(opts.dir.join(ISSUER_CERT_FILE)).unwrap(), before);
        opts.force = true;
        run(&opts).unwrap();
        assert_ne!(std::fs::read(opts.dir.join(ISSUER_CERT_FILE)).unwrap(), before);
    }
}
