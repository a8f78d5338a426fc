//! Who is asking: a token is exchanged for the service account it was issued to. The service
//! then compares that account with the identity requested, in one place for every backend.
//!
//! Layer: model ([`Authenticator`]) and sources (files: [`FileTokens`]).

use parking_lot::Mutex;
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use futures::future::BoxFuture;

/// Longer than any service-account token Kubernetes issues (about 1 KiB), short enough that a
/// client cannot make us forward megabytes to the API server.
pub const MAX_TOKEN_LEN: usize = 16 * 1024;

/// A Kubernetes service account.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceAccount {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The caller could not prove anything: no token, an unknown or expired one.
    #[error("{0}")]
    Unauthenticated(String),
    /// The token is fine but does not carry what we need (wrong audience, not a service account).
    #[error("{0}")]
    Denied(String),
    /// We could not find out (API server unreachable, tokens directory unreadable).
    #[error("{0}")]
    Unavailable(String),
}

/// Exchanges a token for the service account it proves. Boxed futures so that the backend can
/// be chosen at run time (`--kube` or `--tokens-dir`).
pub trait Authenticator: Send + Sync + 'static {
    fn authenticate<'a>(&'a self, token: &'a [u8]) -> BoxFuture<'a, Result<ServiceAccount, TokenError>>;
}

/// Local mode: `<dir>/<namespace>/<serviceaccount>` holds that account's token. Read on every
/// request so that adding or rotating a token needs no restart (local mode serves a handful of
/// workloads; the cost is a few small reads).
#[derive(Debug)]
pub struct FileTokens {
    dir: PathBuf,
    /// Group-readable files already warned about, so the log says it once, not per request.
    warned: Mutex<HashSet<PathBuf>>,
}

impl FileTokens {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), warned: Mutex::default() }
    }

    fn find(&self, token: &[u8]) -> Result<ServiceAccount, TokenError> {
        let token = token.trim_ascii();
        if token.is_empty() {
            return Err(TokenError::Unauthenticated("the token is empty".into()));
        }
        let unavailable = |path: &Path, e: std::io::Error| TokenError::Unavailable(format!("{}: {e}", path.display()));
        let mut found = None;
        for ns in visible_entries(&self.dir).map_err(|e| unavailable(&self.dir, e))? {
            let ns_path = self.dir.join(&ns);
            if !ns_path.is_dir() {
                continue;
            }
            for sa in visible_entries(&ns_path).map_err(|e| unavailable(&ns_path, e))? {
                let path = ns_path.join(&sa);
                if !path.is_file() || !self.permissions_allow_use(&path) {
                    continue;
                }
                let content = std::fs::read(&path).map_err(|e| unavailable(&path, e))?;
                // Every file is compared, match or not, so timing does not tell which one held it.
                if cnimesh_identity::secret::constant_time_eq(content.trim_ascii(), token) && found.is_none() {
                    found = Some(ServiceAccount { namespace: ns.clone(), name: sa });
                }
            }
        }
        found.ok_or_else(|| TokenError::Unauthenticated("the token matches no service account".into()))
    }

    /// World-readable or -writable token files are skipped: any local user could impersonate the
    /// workload, or plant a token for it (docs/architecture.md, lesson 3). Group-readable ones are used with a warning, since a shared group is
    /// sometimes how the workload gets to read its own file.
    fn permissions_allow_use(&self, path: &Path) -> bool {
        let mode = match std::fs::metadata(path) {
            Ok(meta) => meta.permissions().mode(),
            Err(_) => return false,
        };
        if mode & 0o006 != 0 {
            if self.warned.lock().insert(path.to_path_buf()) {
                tracing::error!(path = %path.display(), mode = format!("{mode:o}"), "world-readable or -writable token file ignored");
            }
            return false;
        }
        if mode & 0o040 != 0 && self.warned.lock().insert(path.to_path_buf()) {
            tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "group-readable token file");
        }
        true
    }
}

impl Authenticator for FileTokens {
    fn authenticate<'a>(&'a self, token: &'a [u8]) -> BoxFuture<'a, Result<ServiceAccount, TokenError>> {
        Box::pin(async move { self.find(token) })
    }
}

/// Entries of `dir` that are not hidden: a mounted Secret also holds `..data` and friends.
fn visible_entries(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        if let Ok(name) = entry?.file_name().into_string()
            && !name.starts_with('.')
        {
            names.push(name);
        }
    }
    Ok(names)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes `<dir>/<ns>/<sa>` with `token` and mode 0600.
    pub(crate) fn write_token(dir: &Path, ns: &str, sa: &str, token: &str) {
        std::fs::create_dir_all(dir.join(ns)).unwrap();
        let path = dir.join(ns).join(sa);
        std::fs::write(&path, token).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    #[tokio::test]
    async fn maps_a_token_to_the_account_whose_file_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        write_token(dir.path(), "shop", "web", "token-web\n");
        write_token(dir.path(), "shop", "db", "token-db");
        std::fs::create_dir_all(dir.path().join("..data")).unwrap();
        let tokens = FileTokens::new(dir.path());
        let sa = tokens.authenticate(b"  token-web ").await.unwrap();
        assert_eq!(sa, ServiceAccount { namespace: "shop".into(), name: "web".into() });
        assert_eq!(tokens.authenticate(b"token-db").await.unwrap().name, "db");
        assert!(matches!(tokens.authenticate(b"token-we").await, Err(TokenError::Unauthenticated(_))));
        assert!(matches!(tokens.authenticate(b" \n").await, Err(TokenError::Unauthenticated(_))));
    }

    #[tokio::test]
    async fn ignores_world_readable_token_files() {
        let dir = tempfile::tempdir().unwrap();
        write_token(dir.path(), "shop", "web", "token-web");
        let path = dir.path().join("shop/web");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let tokens = FileTokens::new(dir.path());
        assert!(matches!(tokens.authenticate(b"token-web").await, Err(TokenError::Unauthenticated(_))));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(tokens.authenticate(b"token-web").await.unwrap().name, "web");
    }

    #[tokio::test]
    async fn a_missing_directory_is_unavailable_not_a_denial() {
        let tokens = FileTokens::new("/nonexistent/cnimesh-tokens");
        assert!(matches!(tokens.authenticate(b"x").await, Err(TokenError::Unavailable(_))));
    }
}
