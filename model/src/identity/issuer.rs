//! The issuer (intermediate CA) and trust anchors, read from a directory laid out like a
//! `kubernetes.io/tls` Secret (`ca.crt`, `tls.crt`, `tls.key`) and reloaded when it changes.
//!
//! A reload is all-or-nothing: the three files are re-read together and the result must sign a
//! leaf that verifies against the anchors before it replaces the current issuer. Anything less
//! (half-written files, a key from another certificate, an issuer from another root) is logged
//! and the last good issuer keeps signing.
//!
//! Layer: sources (files): the issuer comes from a watched directory; what it signs is the model.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cnimesh_identity::ca::{CaPem, Signer};
use cnimesh_identity::{Name, pem, tls, trust_domain};
use notify::{EventKind, RecursiveMode, Watcher};
use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use tokio::sync::{mpsc, watch};

use crate::metrics::Metrics;

pub const ANCHORS_FILE: &str = "ca.crt";
pub const ISSUER_CERT_FILE: &str = "tls.crt";
pub const ISSUER_KEY_FILE: &str = "tls.key";

/// Events come in bursts (Kubernetes swaps a `..data` symlink, editors write twice): wait this
/// long after the last one before reading.
const DEBOUNCE: Duration = Duration::from_millis(200);
/// Re-read even without events, in case a change was missed (inotify queue overflow, the
/// directory itself replaced). Cheap: unchanged files are not re-validated.
const POLL: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    #[error("reading {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Pem(#[from] pem::PemError),
    #[error("issuer certificate or key: {0}")]
    Ca(#[from] cnimesh_identity::ca::CaError),
    #[error("trust anchors: {0}")]
    Anchors(tls::TlsError),
    #[error("the issuer does not produce certificates that verify against the trust anchors: {0}")]
    Chain(tls::TlsError),
    #[error("watching {}: {source}", path.display())]
    Watch { path: PathBuf, source: notify::Error },
}

/// The raw files, kept to tell a real change from a spurious event.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Files {
    anchors: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl Files {
    fn read(dir: &Path) -> Result<Self, IssuerError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|source| IssuerError::Read { path, source })
        };
        Ok(Self { anchors: read(ANCHORS_FILE)?, cert: read(ISSUER_CERT_FILE)?, key: read(ISSUER_KEY_FILE)? })
    }
}

/// A validated issuer: signs leaves that chain to `roots`.
#[derive(Debug)]
pub struct Issuer {
    pub signer: Signer,
    /// Everything in `tls.crt`, issuer first: what follows a leaf in a chain.
    pub chain: Vec<CertificateDer<'static>>,
    pub roots: Arc<RootCertStore>,
    files: Files,
}

impl Issuer {
    /// Reads and validates the issuer in `dir`.
    pub fn load(dir: &Path) -> Result<Self, IssuerError> {
        Self::from_files(Files::read(dir)?)
    }

    /// Validates an issuer given as PEM (anchors, issuer certificate chain, issuer key), as
    /// `cnimesh install` does before it prints anything.
    pub fn from_pem(anchors: &[u8], cert: &[u8], key: &[u8]) -> Result<Self, IssuerError> {
        Self::from_files(Files { anchors: anchors.to_vec(), cert: cert.to_vec(), key: key.to_vec() })
    }

    fn from_files(files: Files) -> Result<Self, IssuerError> {
        let anchors = pem::certs(&files.anchors, ANCHORS_FILE)?;
        let roots = tls::roots(&anchors).map_err(IssuerError::Anchors)?;
        let chain = pem::certs(&files.cert, ISSUER_CERT_FILE)?;
        pem::key(&files.key, ISSUER_KEY_FILE)?; // a clearer error than rcgen's for a missing key
        let ca = CaPem {
            cert_pem: String::from_utf8_lossy(&files.cert).into_owned(),
            key_pem: String::from_utf8_lossy(&files.key).into_owned(),
        };
        let signer = Signer::new(&ca)?;
        let issuer = Self { signer, chain, roots, files };
        issuer.check()?;
        Ok(issuer)
    }

    /// Signs a throwaway leaf and verifies it as a peer would: proves the key belongs to the
    /// certificate, the issuer chains to the anchors and nothing in the chain has expired. The
    /// leaf's name is one the issuer may issue (inside its name constraints, when it has some).
    fn check(&self) -> Result<(), IssuerError> {
        let permitted = trust_domain::permitted_dns_of(&self.signer.issuer_der);
        let name = match permitted.first() {
            Some(subtree) => Name::parse(&format!("issuer-check.{subtree}"))
                .map_err(|e| IssuerError::Ca(cnimesh_identity::ca::CaError::IssuerCert(e.to_string())))?,
            None => Name::parse("issuer-check.cnimesh.invalid").expect("a valid name"),
        };
        let key =
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| IssuerError::Ca(e.into()))?;
        let now = SystemTime::now();
        let leaf = self.signer.sign(&name, &key, now - Duration::from_secs(60), now + Duration::from_secs(60))?;
        tls::verify(self.roots.clone(), &self.chain_for(leaf), &name).map_err(IssuerError::Chain)
    }

    /// The trust anchors as loaded (PEM): what the injector hands to proxies.
    pub fn anchors_pem(&self) -> &str {
        // `from_files` parsed them as PEM certificates, which are ASCII.
        std::str::from_utf8(&self.files.anchors).unwrap_or_default()
    }

    /// `leaf` followed by the issuer chain.
    pub fn chain_for(&self, leaf: CertificateDer<'static>) -> Vec<CertificateDer<'static>> {
        std::iter::once(leaf).chain(self.chain.iter().cloned()).collect()
    }
}

/// The current issuer, `None` until one has loaded. Consumers `borrow()` it per request or wait
/// for `changed()` (the control plane's own certificate).
pub type IssuerRx = watch::Receiver<Option<Arc<Issuer>>>;

/// Loads the issuer in `dir` now (an error is logged; the process keeps waiting for valid
/// files) and keeps reloading it when the directory changes, until `shutdown` resolves.
pub fn watch_dir(
    dir: PathBuf,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<IssuerRx, IssuerError> {
    let (tx, rx) = watch::channel(None);
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Our own reads show up as access events; reacting to them would loop.
        if !matches!(&event, Ok(e) if matches!(e.kind, EventKind::Access(_))) {
            let _ = events_tx.send(());
        }
    })
    .map_err(|source| IssuerError::Watch { path: dir.clone(), source })?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|source| IssuerError::Watch { path: dir.clone(), source })?;
    reload(&dir, &tx, &metrics);
    tokio::spawn(async move {
        let _watcher = watcher; // dropping it stops the events
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                event = events.recv() => {
                    if event.is_none() {
                        return;
                    }
                    // Debounce: wait until the directory has been quiet for a while.
                    while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, events.recv()).await {}
                }
                _ = tokio::time::sleep(POLL) => {}
            }
            reload(&dir, &tx, &metrics);
        }
    });
    Ok(rx)
}

fn reload(dir: &Path, tx: &watch::Sender<Option<Arc<Issuer>>>, metrics: &Metrics) {
    let files = match Files::read(dir) {
        Ok(files) => files,
        Err(e) => return rejected(dir, tx, metrics, e),
    };
    if tx.borrow().as_ref().is_some_and(|current| current.files == files) {
        return;
    }
    match Issuer::from_files(files) {
        Ok(issuer) => {
            tracing::info!(
                dir = %dir.display(),
                expires_unix = epoch_secs(issuer.signer.issuer_not_after),
                "issuer loaded"
            );
            metrics.issuer_loaded(issuer.signer.issuer_not_after);
            tx.send_replace(Some(Arc::new(issuer)));
        }
        Err(e) => rejected(dir, tx, metrics, e),
    }
}

fn rejected(dir: &Path, tx: &watch::Sender<Option<Arc<Issuer>>>, metrics: &Metrics, error: IssuerError) {
    metrics.issuer_rejected();
    if tx.borrow().is_some() {
        tracing::error!(dir = %dir.display(), %error, "issuer reload rejected; the previous issuer stays in use");
    } else {
        tracing::error!(dir = %dir.display(), %error, "no valid issuer yet; Certify is unavailable");
    }
}

/// Seconds since the epoch, for logs: exact and unambiguous without a date library.
pub fn epoch_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Helpers for this crate's tests and, behind `test-util`, the servers' tests.
#[cfg(any(test, feature = "test-util"))]
pub mod tests {
    use super::*;
    use cnimesh_identity::ca;

    /// A fresh anchor and issuer written to `dir` the way `ca init` does; returns the anchor.
    pub fn write_pki(dir: &Path, issuer_lifetime: Duration) -> CaPem {
        let anchor = ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap();
        write_issuer(dir, &anchor, issuer_lifetime);
        anchor
    }

    pub fn write_issuer(dir: &Path, anchor: &CaPem, lifetime: Duration) -> CaPem {
        let issuer = ca::new_issuer(anchor, "cluster.local", lifetime).unwrap();
        std::fs::write(dir.join(ANCHORS_FILE), &anchor.cert_pem).unwrap();
        std::fs::write(dir.join(ISSUER_CERT_FILE), &issuer.cert_pem).unwrap();
        std::fs::write(dir.join(ISSUER_KEY_FILE), &issuer.key_pem).unwrap();
        issuer
    }

    #[test]
    fn loads_a_valid_issuer_and_refuses_broken_ones() {
        let dir = tempfile::tempdir().unwrap();
        let anchor = write_pki(dir.path(), Duration::from_secs(3600));
        Issuer::load(dir.path()).unwrap();

        // A key that is not the certificate's.
        let other = ca::new_issuer(&anchor, "cluster.local", Duration::from_secs(3600)).unwrap();
        std::fs::write(dir.path().join(ISSUER_KEY_FILE), &other.key_pem).unwrap();
        assert!(matches!(Issuer::load(dir.path()), Err(IssuerError::Chain(_))));

        // An issuer of another root.
        let stranger = ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap();
        let foreign = ca::new_issuer(&stranger, "cluster.local", Duration::from_secs(3600)).unwrap();
        std::fs::write(dir.path().join(ISSUER_CERT_FILE), &foreign.cert_pem).unwrap();
        std::fs::write(dir.path().join(ISSUER_KEY_FILE), &foreign.key_pem).unwrap();
        assert!(matches!(Issuer::load(dir.path()), Err(IssuerError::Chain(_))));

        std::fs::write(dir.path().join(ISSUER_KEY_FILE), "not a key").unwrap();
        assert!(matches!(Issuer::load(dir.path()), Err(IssuerError::Pem(_))));
        std::fs::remove_file(dir.path().join(ANCHORS_FILE)).unwrap();
        assert!(matches!(Issuer::load(dir.path()), Err(IssuerError::Read { .. })));
    }

    #[cfg(test)]
    async fn wait_for(rx: &mut IssuerRx, what: &str, pred: impl Fn(&Option<Arc<Issuer>>) -> bool) {
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|i| pred(i)))
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .unwrap();
    }

    #[tokio::test]
    async fn reloads_on_change_and_keeps_the_last_good_issuer() {
        let dir = tempfile::tempdir().unwrap();
        let anchor = write_pki(dir.path(), Duration::from_secs(3600));
        let metrics = Arc::new(Metrics::default());
        let (_stop, shutdown) = watch::channel(false);
        let mut rx = watch_dir(dir.path().to_path_buf(), metrics.clone(), shutdown).unwrap();
        let first = rx.borrow().clone().expect("loaded at once");

        let second_pem = write_issuer(dir.path(), &anchor, Duration::from_secs(7200));
        let second_der = pem::certs(second_pem.cert_pem.as_bytes(), "second").unwrap().remove(0);
        wait_for(&mut rx, "the new issuer", |i| i.as_ref().is_some_and(|i| i.signer.issuer_der == second_der)).await;
        assert_ne!(first.signer.issuer_der, second_der);

        std::fs::write(
            dir.path().join(ISSUER_KEY_FILE),
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while metrics.issuer_rejections() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "the broken key was never read");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(rx.borrow().as_ref().unwrap().signer.issuer_der, second_der, "the last good issuer stays");
    }

    #[tokio::test]
    async fn waits_for_an_issuer_that_is_not_there_yet() {
        let dir = tempfile::tempdir().unwrap();
        let (_stop, shutdown) = watch::channel(false);
        let mut rx = watch_dir(dir.path().to_path_buf(), Arc::new(Metrics::default()), shutdown).unwrap();
        assert!(rx.borrow().is_none());
        write_pki(dir.path(), Duration::from_secs(3600));
        wait_for(&mut rx, "the issuer", |i| i.is_some()).await;
    }
}
