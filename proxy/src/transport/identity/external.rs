//! A proxy running as an ExternalWorkload (a VM, a bare-metal host): it has no service-account
//! token. Its first certificate comes with a one-time join token (`cnimesh external-workload
//! join`, read from `--identity-join-token-file`); from then on it renews with no token,
//! presenting its current certificate as TLS client certificate to Identity. The key and the
//! certificate are kept in `--identity-state-dir` (files 0600, directory 0700), so a restart
//! renews with the stored certificate instead of needing a new join token; a stored certificate
//! that has expired needs a new join, and the error says so.
//!
//! The Identity channel pins the trust anchors the operator gave the host and the control
//! plane's identity ([`super::certify::channel`]), as for every proxy.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Context;
use cnimesh_identity::Name;
use cnimesh_identity::ca::KeyPair;
use cnimesh_identity::tls::Trust;
use rustls_pki_types::CertificateDer;

/// The key's file in the state directory.
pub const KEY_FILE: &str = "identity.key";
/// The certificate chain's file (leaf first).
pub const CERT_FILE: &str = "identity.crt";

/// Which ExternalWorkload the proxy runs as, and where its join token and state are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalIdentity {
    pub namespace: String,
    pub name: String,
    /// The join token's file, for the first certificate (or after the stored one expired).
    pub join_token_file: Option<PathBuf>,
    /// Where the key and certificate are kept across restarts.
    pub state_dir: PathBuf,
}

impl ExternalIdentity {
    /// The workload as the policy API names it (Linkerd's JSON form for an ExternalWorkload).
    pub fn policy_workload(&self) -> String {
        serde_json::json!({"ns": self.namespace, "kind": "external_workload", "name": self.name}).to_string()
    }

    /// The join token, when its file is set and holds one.
    pub fn join_token(&self) -> anyhow::Result<Option<Vec<u8>>> {
        let Some(path) = &self.join_token_file else { return Ok(None) };
        match std::fs::read(path) {
            Ok(token) if !token.trim_ascii().is_empty() => Ok(Some(token.trim_ascii().to_vec())),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading the join token {}", path.display())),
        }
    }

    /// What to do when there is no certificate to renew with and no join token: the operator's
    /// next step, named.
    pub fn needs_join(&self, stored_expired: Option<SystemTime>) -> anyhow::Error {
        let join = format!(
            "run `cnimesh external-workload join {} -n {}` and write the token to {}",
            self.name,
            self.namespace,
            self.join_token_file.as_deref().map_or("--identity-join-token-file".into(), |p| p.display().to_string())
        );
        match stored_expired {
            Some(at) => anyhow::anyhow!(
                "the certificate stored in {} expired (at Unix time {}): it cannot be renewed; {join}",
                self.state_dir.display(),
                at.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
            ),
            None => anyhow::anyhow!("no certificate yet and no join token: {join}"),
        }
    }
}

/// A key and the certificate issued for it, as stored.
pub struct Stored {
    pub key: KeyPair,
    pub chain: Vec<CertificateDer<'static>>,
    pub not_after: SystemTime,
}

/// The stored key and certificate, if any. A certificate that does not name `name` or does not
/// chain to `roots` is an error (never presented); an expired one is returned for the caller to
/// say so.
pub fn load(dir: &Path, name: &Name, roots: impl Into<Trust>) -> anyhow::Result<Option<Stored>> {
    let (key_path, cert_path) = (dir.join(KEY_FILE), dir.join(CERT_FILE));
    if !key_path.exists() && !cert_path.exists() {
        return Ok(None);
    }
    let key_pem = std::fs::read_to_string(&key_path).with_context(|| format!("reading {}", key_path.display()))?;
    let key = KeyPair::from_pem(&key_pem).with_context(|| format!("{}: not a private key", key_path.display()))?;
    let cert_pem = std::fs::read(&cert_path).with_context(|| format!("reading {}", cert_path.display()))?;
    let chain = cnimesh_identity::pem::certs(&cert_pem, &cert_path.display().to_string())?;
    let leaf = chain.first().with_context(|| format!("{}: no certificate", cert_path.display()))?;
    anyhow::ensure!(
        cnimesh_identity::tls::identity_of(leaf).as_ref() == Some(name),
        "{}: the stored certificate is not {name}'s",
        cert_path.display()
    );
    let not_after = cnimesh_identity::tls::not_after(leaf)?;
    if not_after > SystemTime::now() {
        cnimesh_identity::tls::verify(roots, &chain, name)
            .with_context(|| format!("{}: the stored certificate does not verify", cert_path.display()))?;
    }
    Ok(Some(Stored { key, chain, not_after }))
}

/// Keeps `key` and `chain` for the next start: the directory 0700, the files 0600, each written
/// whole (never half a key).
pub fn save(dir: &Path, key: &KeyPair, chain: &[CertificateDer<'static>]) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let pem = cnimesh_identity::pem::encode_certs(chain);
    cnimesh_common::fs::write_atomic(&dir.join(KEY_FILE), key.serialize_pem().as_bytes(), Some(0o600))
        .with_context(|| format!("writing {}", dir.join(KEY_FILE).display()))?;
    cnimesh_common::fs::write_atomic(&dir.join(CERT_FILE), pem.as_bytes(), Some(0o600))
        .with_context(|| format!("writing {}", dir.join(CERT_FILE).display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_saved_key_and_certificate_load_back_0600_and_anothers_certificate_is_refused() {
        let anchor = cnimesh_identity::ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap();
        let issuer = cnimesh_identity::ca::new_issuer(&anchor, "cluster.local", Duration::from_secs(3600)).unwrap();
        let signer = cnimesh_identity::ca::Signer::new(&issuer).unwrap();
        let name: Name = "db.shop.serviceaccount.identity.cnimesh.cluster.local".parse().unwrap();
        let (key, _) = cnimesh_identity::ca::new_csr(&name).unwrap();
        let now = SystemTime::now();
        let leaf = signer.sign(&name, &key, now, now + Duration::from_secs(600)).unwrap();
        let chain = vec![leaf, signer.issuer_der.clone()];
        let roots =
            cnimesh_identity::tls::roots(&cnimesh_identity::pem::certs(anchor.cert_pem.as_bytes(), "a").unwrap())
                .unwrap();

        let state = std::env::temp_dir().join(format!("cnimesh-proxy-ew-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        assert!(load(&state, &name, roots.clone()).unwrap().is_none(), "nothing stored yet");
        save(&state, &key, &chain).unwrap();
        assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);
        for file in [KEY_FILE, CERT_FILE] {
            assert_eq!(std::fs::metadata(state.join(file)).unwrap().permissions().mode() & 0o777, 0o600, "{file}");
        }
        let stored = load(&state, &name, roots.clone()).unwrap().expect("stored");
        assert_eq!(stored.key.public_key_pem(), key.public_key_pem());
        assert_eq!(stored.chain, chain);

        let other: Name = "web.shop.serviceaccount.identity.cnimesh.cluster.local".parse().unwrap();
        let e = load(&state, &other, roots).err().expect("not web's certificate");
        assert!(format!("{e:#}").contains("not web.shop"), "{e:#}");
        let _ = std::fs::remove_dir_all(&state);
    }

    #[test]
    fn without_a_certificate_or_a_token_the_error_names_the_join_command() {
        let external = ExternalIdentity {
            namespace: "shop".into(),
            name: "db-vm".into(),
            join_token_file: Some("/etc/cnimesh/join-token".into()),
            state_dir: "/var/lib/cnimesh".into(),
        };
        assert_eq!(external.join_token().unwrap(), None, "a missing file is no token");
        let e = external.needs_join(Some(SystemTime::UNIX_EPOCH)).to_string();
        assert!(e.contains("expired (at Unix time 0)"), "{e}");
        assert!(
            e.contains("cnimesh external-workload join db-vm -n shop") && e.contains("/etc/cnimesh/join-token"),
            "{e}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&external.policy_workload()).unwrap();
        assert_eq!(parsed, serde_json::json!({"ns": "shop", "kind": "external_workload", "name": "db-vm"}));
    }
}
