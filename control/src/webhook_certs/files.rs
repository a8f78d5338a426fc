//! The webhook's certificate from a directory (`serve --webhook-certs files --webhook-tls-dir D`,
//! e.g. the Secret `cnimesh-webhook-tls` mounted as a volume), reloaded when the files change.
//!
//! Without this, a new certificate in the Secret (a re-run `install`, a rotated webhook CA) was
//! served only after a restart, while the caBundle already named the new CA: every pod creation
//! failed with `x509: certificate signed by unknown authority`. Now the kubelet's
//! in-place update of the volume (a `..data` symlink swap) is picked up within a second: the
//! directory is watched, and also re-read every [`POLL`] in case an event was missed.
//!
//! A reload is all-or-nothing: `tls.crt` and `tls.key` must parse and belong together, else the
//! last good certificate stays (logged).
//!
//! Layer: runtime: files in, the webhook listener's [`CurrentCert`] out.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use cnimesh_identity::tls::CurrentCert;
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use cnimesh_model::inject::{WEBHOOK_CERT_FILE, WEBHOOK_KEY_FILE, WebhookCertError};

/// Events come in bursts (the kubelet swaps a symlink, `cnimesh ca webhook` writes three files).
const DEBOUNCE: Duration = Duration::from_millis(200);
/// Re-read even without events (inotify overflow, the directory itself replaced).
const POLL: Duration = Duration::from_secs(10);

/// The certificate and key files as read, to tell a real change from a spurious event.
type Files = (Vec<u8>, Vec<u8>);

fn read(dir: &Path) -> Result<Files, WebhookCertError> {
    let read = |file: &str| {
        let path = dir.join(file);
        std::fs::read(&path).map_err(|source| WebhookCertError::Io { what: "reading", path, source })
    };
    Ok((read(WEBHOOK_CERT_FILE)?, read(WEBHOOK_KEY_FILE)?))
}

fn certified(dir: &Path, (cert, key): &Files) -> Result<Arc<rustls::sign::CertifiedKey>, WebhookCertError> {
    let invalid = |file: &str, why: String| WebhookCertError::Invalid { path: dir.join(file), why };
    let chain = cnimesh_identity::pem::certs(cert, "webhook certificate")
        .map_err(|e| invalid(WEBHOOK_CERT_FILE, e.to_string()))?;
    let key = cnimesh_identity::pem::key(key, "webhook key").map_err(|e| invalid(WEBHOOK_KEY_FILE, e.to_string()))?;
    cnimesh_identity::tls::certified_key(chain, key).map_err(|e| invalid(WEBHOOK_KEY_FILE, e.to_string()))
}

/// Loads the certificate in `dir` into a new [`CurrentCert`] now (an error here is the caller's:
/// the webhook does not start without a certificate), then keeps it current from the directory
/// for as long as anything else holds the returned `Arc` (the webhook's TLS config does).
pub fn watch_dir(dir: PathBuf) -> Result<Arc<CurrentCert>, WebhookCertError> {
    let files = read(&dir)?;
    let current = Arc::new(CurrentCert::default());
    current.set(certified(&dir, &files)?);
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Our own reads show up as access events; reacting to them would loop.
        if !matches!(&event, Ok(e) if matches!(e.kind, EventKind::Access(_))) {
            let _ = events_tx.send(());
        }
    })
    .and_then(|mut watcher| watcher.watch(&dir, RecursiveMode::NonRecursive).map(|()| watcher));
    let watcher = match watcher {
        Ok(watcher) => Some(watcher),
        Err(error) => {
            // Polling still reloads; only slower.
            tracing::warn!(dir = %dir.display(), %error, "cannot watch the webhook certificate directory; polling it");
            None
        }
    };
    let weak = Arc::downgrade(&current);
    tokio::spawn(async move {
        let watching = watcher.is_some();
        let _watcher = watcher; // dropping it stops the events
        let mut last = files;
        loop {
            tokio::select! {
                event = events.recv(), if watching => {
                    if event.is_none() {
                        return;
                    }
                    while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, events.recv()).await {}
                }
                _ = tokio::time::sleep(POLL) => {}
            }
            if !reload(&dir, &weak, &mut last) {
                return;
            }
        }
    });
    Ok(current)
}

/// Re-reads `dir` into `current`; false once nobody serves `current` any more.
fn reload(dir: &Path, current: &Weak<CurrentCert>, last: &mut Files) -> bool {
    let Some(current) = current.upgrade() else { return false };
    let files = match read(dir) {
        Ok(files) if files == *last => return true,
        Ok(files) => files,
        Err(error) => {
            tracing::warn!(%error, "webhook certificate not reloaded; keeping the last one");
            return true;
        }
    };
    match certified(dir, &files) {
        Ok(key) => {
            let not_after = key.cert.first().and_then(|c| cnimesh_identity::tls::not_after(c).ok());
            tracing::info!(dir = %dir.display(), not_after = ?not_after.map(humantime::format_rfc3339_seconds), "serving the reloaded webhook certificate");
            current.set(key);
            *last = files;
        }
        Err(error) => tracing::warn!(%error, "webhook certificate not reloaded; keeping the last one"),
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnimesh_model::inject::{generate_webhook_cert, webhook_dns_names, webhook_tls_from};
    use rustls_pki_types::ServerName;
    use tokio::io::AsyncWriteExt;

    /// The certificate a fresh TLS handshake with `addr` is given, trusting `ca_pem`.
    async fn served(addr: std::net::SocketAddr, ca_pem: &[u8]) -> Result<Vec<u8>, String> {
        let anchors = cnimesh_identity::pem::certs(ca_pem, "ca").unwrap();
        let roots = cnimesh_identity::tls::roots(&anchors).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(cnimesh_identity::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("cnimesh-webhook.cnimesh.svc").unwrap();
        let mut tls =
            tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.map_err(|e| e.to_string())?;
        let cert = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
        let _ = tls.shutdown().await;
        Ok(cert)
    }

    #[tokio::test]
    async fn a_rewritten_certificate_is_served_to_the_next_handshake_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let names = webhook_dns_names("cnimesh", "cluster.local");
        generate_webhook_cert(dir.path(), &names, Duration::from_secs(3600), false).unwrap();
        let first_ca = std::fs::read(dir.path().join("ca.crt")).unwrap();
        let current = watch_dir(dir.path().to_path_buf()).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(webhook_tls_from(current).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        let before = served(addr, &first_ca).await.expect("the first certificate verifies");

        // `cnimesh ca webhook --force`: a new CA and serving certificate, as a re-run install makes.
        generate_webhook_cert(dir.path(), &names, Duration::from_secs(3600), true).unwrap();
        let new_ca = std::fs::read(dir.path().join("ca.crt")).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let after = loop {
            match served(addr, &new_ca).await {
                Ok(cert) => break cert,
                Err(_) if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => panic!("the new certificate was never served: {e}"),
            }
        };
        assert_ne!(before, after);
        assert!(served(addr, &first_ca).await.is_err(), "the old CA no longer verifies what is served");

        // A broken key keeps the last good certificate.
        std::fs::write(dir.path().join("tls.key"), "not a key").unwrap();
        tokio::time::sleep(DEBOUNCE * 3).await;
        assert_eq!(served(addr, &new_ca).await.unwrap(), after);
    }
}
