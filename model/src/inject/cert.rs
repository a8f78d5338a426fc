//! The webhook's serving certificate. The API server calls webhooks over TLS only, checking the
//! certificate against the `caBundle` of the MutatingWebhookConfiguration, so this CA is private
//! to that one connection: it is not the mesh's trust anchor, and its key is not kept (to
//! rotate, generate both again and update the Secret and the `caBundle` together).
//!
//! `cnimesh ca webhook --dir D --namespace cnimesh` (wired by the CLI) writes:
//! - `D/ca.crt`: the CA certificate, for the `caBundle` (base64 of the PEM file);
//! - `D/tls.crt`: the serving certificate, DNS SANs `cnimesh-webhook.<ns>.svc[.<cluster-domain>]`;
//! - `D/tls.key`: its key, mode 0600.
//!
//! which is the layout of a `kubernetes.io/tls` Secret (`kubectl create secret generic
//! cnimesh-webhook-tls --type kubernetes.io/tls --from-file=D/tls.crt --from-file=D/tls.key
//! --from-file=D/ca.crt`) mounted at `--webhook-tls-dir`.
//!
//! Layer: runtime: the webhook certificate's files (written by `ca webhook`, read by `serve`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cnimesh_identity::ca;
use cnimesh_identity::tls::{CurrentCert, provider};

/// The Secret that holds the webhook's serving certificate in a cluster (these three files);
/// `cnimesh install` writes it, `serve --webhook-certs secret|managed` reads it.
pub const WEBHOOK_SECRET: &str = "cnimesh-webhook-tls";
pub const WEBHOOK_CA_FILE: &str = "ca.crt";
pub const WEBHOOK_CERT_FILE: &str = "tls.crt";
pub const WEBHOOK_KEY_FILE: &str = "tls.key";
/// The CA that signs the serving certificate, in the same Secret when the control plane manages
/// it (`serve --webhook-certs managed`; `cnimesh install` writes the first).
pub const WEBHOOK_ISSUER_CERT: &str = "issuer.crt";
pub const WEBHOOK_ISSUER_KEY: &str = "issuer.key";
/// The webhook's Service (`daemonset/control-plane.yaml`).
pub const WEBHOOK_SERVICE: &str = "cnimesh-webhook";

#[derive(Debug, thiserror::Error)]
pub enum WebhookCertError {
    #[error("{} exists; pass --force to overwrite", .0.display())]
    Exists(PathBuf),
    #[error("{what} {}: {source}", path.display())]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("certificate generation: {0}")]
    Ca(#[from] ca::CaError),
    #[error("no DNS names for the certificate")]
    NoNames,
    #[error("{}: {why}", path.display())]
    Invalid { path: PathBuf, why: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The names the API server may use for the webhook's Service: it dials
/// `<service>.<namespace>.svc`; the FQDN is there for clients that qualify it.
pub fn webhook_dns_names(namespace: &str, cluster_domain: &str) -> Vec<String> {
    let svc = format!("{WEBHOOK_SERVICE}.{namespace}.svc");
    vec![format!("{svc}.{cluster_domain}"), svc]
}

/// The webhook's CA certificate (the `caBundle`) and its serving certificate and key, as PEM.
#[derive(Debug, Clone)]
pub struct WebhookCertPem {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

/// Generates a CA and a serving certificate for `dns_names`, both valid for `lifetime`, and
/// writes `ca.crt`, `tls.crt`, `tls.key` to `dir` (see the module doc). Without `force`, nothing
/// is written if any of them exists. Returns the paths written.
pub fn generate_webhook_cert(
    dir: &Path,
    dns_names: &[String],
    lifetime: Duration,
    force: bool,
) -> Result<Vec<PathBuf>, WebhookCertError> {
    let [ca_path, cert_path, key_path] = [WEBHOOK_CA_FILE, WEBHOOK_CERT_FILE, WEBHOOK_KEY_FILE].map(|f| dir.join(f));
    if !force
        && let Some(existing) = [&ca_path, &cert_path, &key_path].into_iter().find(|p| p.symlink_metadata().is_ok())
    {
        return Err(WebhookCertError::Exists(existing.clone()));
    }
    let pem = new_webhook_cert(dns_names, lifetime)?;
    std::fs::create_dir_all(dir).map_err(|source| WebhookCertError::Io {
        what: "creating",
        path: dir.to_path_buf(),
        source,
    })?;
    // The key first: a server reloading the directory never sees a new certificate with an old key.
    // Atomic, each with its mode from creation (a key is never readable by others, not even
    // briefly): a reader sees the old file or the new one.
    for (path, body, mode) in [(&key_path, &pem.key, 0o600), (&cert_path, &pem.cert, 0o644), (&ca_path, &pem.ca, 0o644)]
    {
        cnimesh_common::fs::write_atomic(path, body.as_bytes(), Some(mode)).map_err(|source| WebhookCertError::Io {
            what: "writing",
            path: path.clone(),
            source,
        })?;
    }
    Ok(vec![ca_path, cert_path, key_path])
}

/// A CA and a serving certificate for `dns_names`, both valid for `lifetime`, in memory.
pub fn new_webhook_cert(dns_names: &[String], lifetime: Duration) -> Result<WebhookCertPem, WebhookCertError> {
    if dns_names.is_empty() {
        return Err(WebhookCertError::NoNames);
    }
    let ca = ca::new_private_ca("cnimesh webhook CA", lifetime)?;
    let serving = ca::Signer::new(&ca)?.new_server_cert(dns_names, lifetime)?;
    Ok(WebhookCertPem { ca: ca.cert_pem, cert: serving.cert_pem, key: serving.key_pem })
}

/// A TLS server config for the webhook from `dir/tls.crt` and `dir/tls.key`. TLS 1.2 and 1.3 and
/// ALPN h2 + http/1.1: whatever the API server (or a proxy in front of it) speaks. Loaded once
/// (a check of the files); `serve` itself reloads them (`cnimesh_control::webhook_certs::files`, through
/// [`webhook_tls_from`]).
pub fn load_webhook_tls(dir: &Path) -> Result<Arc<rustls::ServerConfig>, WebhookCertError> {
    let read = |file: &str| {
        let path = dir.join(file);
        std::fs::read(&path).map_err(|source| WebhookCertError::Io { what: "reading", path, source })
    };
    let invalid = |file: &str, why: String| WebhookCertError::Invalid { path: dir.join(file), why };
    let chain = cnimesh_identity::pem::certs(&read(WEBHOOK_CERT_FILE)?, "webhook certificate")
        .map_err(|e| invalid(WEBHOOK_CERT_FILE, e.to_string()))?;
    let key = cnimesh_identity::pem::key(&read(WEBHOOK_KEY_FILE)?, "webhook key")
        .map_err(|e| invalid(WEBHOOK_KEY_FILE, e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = webhook_alpn();
    Ok(Arc::new(config))
}

/// A TLS server config for the webhook presenting whatever `current` holds at each handshake:
/// the certificate from the watched Secret (`cnimesh_control::webhook_certs`), swapped without a restart.
/// Until a certificate is loaded, handshakes fail (the API server retries).
pub fn webhook_tls_from(current: Arc<CurrentCert>) -> Result<Arc<rustls::ServerConfig>, WebhookCertError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(current);
    config.alpn_protocols = webhook_alpn();
    Ok(Arc::new(config))
}

fn webhook_alpn() -> Vec<Vec<u8>> {
    vec![b"h2".to_vec(), b"http/1.1".to_vec()]
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn writes_a_loadable_certificate_with_a_private_key_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let names = webhook_dns_names("cnimesh", "cluster.local");
        assert_eq!(names, ["cnimesh-webhook.cnimesh.svc.cluster.local", "cnimesh-webhook.cnimesh.svc"]);
        let written = generate_webhook_cert(dir.path(), &names, Duration::from_secs(3600), false).unwrap();
        assert_eq!(written.len(), 3);
        let mode = std::fs::metadata(dir.path().join(WEBHOOK_KEY_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        load_webhook_tls(dir.path()).unwrap();

        let before = std::fs::read(dir.path().join(WEBHOOK_CERT_FILE)).unwrap();
        let again = generate_webhook_cert(dir.path(), &names, Duration::from_secs(3600), false);
        assert!(matches!(again, Err(WebhookCertError::Exists(_))));
        assert_eq!(std::fs::read(dir.path().join(WEBHOOK_CERT_FILE)).unwrap(), before);
        generate_webhook_cert(dir.path(), &names, Duration::from_secs(3600), true).unwrap();
        assert_ne!(std::fs::read(dir.path().join(WEBHOOK_CERT_FILE)).unwrap(), before);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers.len(), 3, "no temporary files left: {leftovers:?}");
    }

    #[test]
    fn missing_files_are_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = load_webhook_tls(dir.path()).unwrap_err().to_string();
        assert!(e.contains("tls.crt"), "{e}");
        assert!(generate_webhook_cert(dir.path(), &[], Duration::from_secs(60), false).is_err());
    }
}
