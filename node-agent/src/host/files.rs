//! The files host mode trusts, checked before anything is installed: the proxy binary (whoever
//! can replace it runs code as the one UID capture lets out), the proxy's environment file (its
//! control plane addresses and where its join token is), and the proxy's state directory (its
//! key and certificate).

use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum HostFileError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {path} is owned by uid {owner}, not root: another user could change it")]
    NotRootOwned { what: &'static str, path: PathBuf, owner: u32 },
    #[error("{what} {path} has mode {mode:04o}: {why}")]
    Mode { what: &'static str, path: PathBuf, mode: u32, why: &'static str },
    #[error("{path} line {line}: {why}")]
    EnvLine { path: PathBuf, line: usize, why: String },
    #[error(
        "--proxy-uid {uid}: user {user} has a login shell {shell}; the proxy's UID is never captured \
         and owns the mesh key, so it must be a system account nobody logs in as \
         (useradd --system --shell /usr/sbin/nologin cnimesh-proxy)"
    )]
    LoginUser { uid: u32, user: String, shell: String },
}

/// Shells that let nobody log in.
const NO_LOGIN_SHELLS: &[&str] = &["nologin", "false"];

/// Refuses a proxy UID that belongs to a login user in `passwd` (`/etc/passwd`): a person with
/// that UID would bypass capture and could read the proxy's key. A UID with no entry, or whose
/// shell is `nologin`/`false`, is accepted.
pub fn check_proxy_uid(uid: u32, passwd: &Path) -> Result<(), HostFileError> {
    let text = std::fs::read_to_string(passwd).map_err(|source| HostFileError::Io {
        what: "user database",
        path: passwd.into(),
        source,
    })?;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        let [user, _, entry_uid, _, _, _, shell] = fields.as_slice() else { continue };
        if entry_uid.parse() != Ok(uid) {
            continue;
        }
        let shell = if shell.is_empty() { "/bin/sh" } else { shell };
        let program = shell.rsplit('/').next().unwrap_or(shell);
        if !NO_LOGIN_SHELLS.contains(&program) {
            return Err(HostFileError::LoginUser { uid, user: (*user).into(), shell: shell.into() });
        }
    }
    Ok(())
}

fn metadata(what: &'static str, path: &Path) -> Result<std::fs::Metadata, HostFileError> {
    std::fs::metadata(path).map_err(|source| HostFileError::Io { what, path: path.into(), source })
}

/// `path` must be root's and have none of the `forbidden` mode bits.
fn check_owner_and_mode(
    what: &'static str,
    path: &Path,
    forbidden: u32,
    why: &'static str,
) -> Result<(), HostFileError> {
    let meta = metadata(what, path)?;
    if meta.uid() != 0 {
        return Err(HostFileError::NotRootOwned { what, path: path.into(), owner: meta.uid() });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & forbidden != 0 {
        return Err(HostFileError::Mode { what, path: path.into(), mode, why });
    }
    Ok(())
}

/// The proxy binary and its directory: root's, writable by root only.
pub fn check_proxy_binary(path: &Path) -> Result<(), HostFileError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let why = "writable by other users, who could run their code as the proxy's UID, whose traffic is not captured";
    check_owner_and_mode("proxy binary", path, 0o022, why)?;
    check_owner_and_mode("proxy binary's directory", dir, 0o022, why)
}

/// A secret-bearing file (the proxy's environment): root's, readable by root only (0600/0400).
pub fn check_private(what: &'static str, path: &Path) -> Result<(), HostFileError> {
    check_owner_and_mode(what, path, 0o077, "readable or writable by other users; make it 0600 (chmod 600)")
}

/// Reads `KEY=VALUE` lines (blank lines and `#` comments skipped; no quoting: the value is the
/// rest of the line) after [`check_private`]. A bad line is named and nothing is used.
pub fn read_env_file(path: &Path) -> Result<Vec<(OsString, OsString)>, HostFileError> {
    check_private("proxy environment file", path)?;
    let text = std::fs::read_to_string(path).map_err(|source| HostFileError::Io {
        what: "proxy environment file",
        path: path.into(),
        source,
    })?;
    parse_env(&text).map_err(|(line, why)| HostFileError::EnvLine { path: path.into(), line, why })
}

/// `KEY=VALUE` lines; on error, the 1-based line number and why.
pub fn parse_env(text: &str) -> Result<Vec<(OsString, OsString)>, (usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err((i + 1, format!("expected KEY=VALUE, found {line:?}")));
        };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err((i + 1, format!("{key:?} is not an environment variable name")));
        }
        out.push((key.into(), value.trim().into()));
    }
    Ok(out)
}

/// The proxy's state directory (its key and certificate, its join token): created if missing,
/// then owned by the proxy's UID and GID and 0700, whatever it was before, at every start. Its
/// parent (the agent's state directory) is made 0711: the proxy may pass through it to its own
/// directory, but list or read nothing else there.
pub fn prepare_state_dir(dir: &Path, uid: u32, gid: u32) -> Result<(), HostFileError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| HostFileError::Io { what: "proxy state directory", path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o711)).map_err(io(parent))?;
    }
    std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
    Ok(())
}

/// The join token's name in the proxy's state directory.
pub const JOIN_TOKEN: &str = "join-token";

/// Hands the operator's join token (root's, 0600, checked) to the proxy: a copy in its state
/// directory, the proxy's own, 0600. Nothing to do when the operator's file is absent (the
/// host joined already: the proxy renews with its certificate). Returns the copy's path.
pub fn install_join_token(source: &Path, proxy_dir: &Path, uid: u32, gid: u32) -> Result<PathBuf, HostFileError> {
    let copy = proxy_dir.join(JOIN_TOKEN);
    if !source.exists() {
        return Ok(copy);
    }
    check_private("join token file", source)?;
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| HostFileError::Io { what, path, source }
    };
    let token = std::fs::read(source).map_err(io("join token file", source))?;
    cnimesh_common::fs::write_atomic(&copy, &token, Some(0o600)).map_err(io("proxy's join token", &copy))?;
    std::os::unix::fs::chown(&copy, Some(uid), Some(gid)).map_err(io("proxy's join token", &copy))?;
    Ok(copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_lines_are_parsed_and_a_bad_one_is_named() {
        let env = parse_env("# control plane\nCNIMESH_PROXY_DESTINATION_ADDR=10.0.0.1:4190\n\n A_B = c=d \n").unwrap();
        assert_eq!(
            env,
            vec![("CNIMESH_PROXY_DESTINATION_ADDR".into(), "10.0.0.1:4190".into()), ("A_B".into(), "c=d".into())]
        );
        assert_eq!(parse_env("OK=1\nnot a pair\n").unwrap_err().0, 2);
        assert!(parse_env("BAD-NAME=1").unwrap_err().1.contains("BAD-NAME"));
    }

    #[test]
    fn a_login_users_uid_is_refused_and_a_system_accounts_or_unknown_one_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let passwd = dir.path().join("passwd");
        std::fs::write(
            &passwd,
            "root:x:0:0:root:/root:/bin/bash\nalice:x:2102:2102::/home/alice:\n\
             cnimesh-proxy:x:998:998::/:/usr/sbin/nologin\nd:x:997:997::/:/bin/false\n",
        )
        .unwrap();
        let err = check_proxy_uid(2102, &passwd).unwrap_err().to_string();
        assert!(err.contains("--proxy-uid 2102: user alice has a login shell /bin/sh"), "{err}");
        assert!(check_proxy_uid(998, &passwd).is_ok());
        assert!(check_proxy_uid(997, &passwd).is_ok());
        assert!(check_proxy_uid(4242, &passwd).is_ok(), "no entry: no login user");
    }
}
