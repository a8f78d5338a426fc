//! The control plane's own serving certificate. It is issued by the control plane to itself from
//! the loaded issuer (no token, no CSR: the key never leaves this process), so that proxies can
//! verify the Identity endpoint with the same anchors they verify each other with. Re-issued
//! when the issuer changes and before it expires.
//!
//! Layer: gRPC support: keeps the certificate the gRPC listener presents current, following the
//! issuer (a source); it issues in memory and does no I/O of its own.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cnimesh_identity::Name;
use cnimesh_identity::tls::{self, CurrentCert};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::sync::watch;

use super::Policy;
use super::issuer::{Issuer, IssuerRx};

/// Never retry faster than this, even if the issuer is about to expire (or a signing fails).
const MIN_RENEW_DELAY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum OwnCertError {
    #[error("generating a key: {0}")]
    Key(#[from] rcgen::Error),
    #[error("signing: {0}")]
    Sign(#[from] cnimesh_identity::ca::CaError),
    #[error("{0}")]
    Tls(#[from] tls::TlsError),
}

/// Issues a certificate for `name` from `issuer` into `current`; returns its expiry.
pub fn issue(name: &Name, issuer: &Issuer, policy: &Policy, current: &CurrentCert) -> Result<SystemTime, OwnCertError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let now = SystemTime::now();
    let leaf = issuer.signer.sign(name, &key, now - policy.clock_skew, now + policy.lifetime)?;
    let not_after = tls::not_after(&leaf)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    current.set(tls::certified_key(issuer.chain_for(leaf), key)?);
    Ok(not_after)
}

/// A mesh certificate for `name`, issued in memory from the issuer in `dir` as the control plane
/// issues its own: what a client of the gRPC port must present for anything but Certify. For
/// tests, benchmarks and tools that run beside the control plane with its issuer at hand.
pub fn issue_from_dir(dir: &std::path::Path, name: &Name, lifetime: Duration) -> anyhow::Result<Arc<CurrentCert>> {
    let issuer = Issuer::load(dir).map_err(|e| anyhow::anyhow!("issuer in {}: {e}", dir.display()))?;
    let policy = Policy { trust_domain: String::new(), lifetime, clock_skew: Duration::from_secs(60) };
    let current = Arc::new(CurrentCert::default());
    issue(name, &issuer, &policy, &current)?;
    Ok(current)
}

/// When to renew a certificate valid until `not_after`: two thirds into its remaining life, so
/// that a failed renewal still leaves time for retries.
fn renew_at(now: SystemTime, not_after: SystemTime) -> Duration {
    let remaining = not_after.duration_since(now).unwrap_or_default();
    (remaining * 2 / 3).max(MIN_RENEW_DELAY)
}

/// Keeps `current` holding a valid certificate for `name` until `shutdown` changes.
pub async fn keep_current(
    name: Name,
    mut issuer: IssuerRx,
    policy: Policy,
    current: Arc<CurrentCert>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let loaded = issuer.borrow_and_update().clone();
        let renew_in = match loaded {
            None => None, // nothing to sign with yet: wait for the issuer
            Some(loaded) => match issue(&name, &loaded, &policy, &current) {
                Ok(not_after) => {
                    tracing::info!(identity = %name, expires_unix = super::issuer::epoch_secs(not_after), "own certificate issued");
                    Some(renew_at(SystemTime::now(), not_after))
                }
                Err(error) => {
                    tracing::error!(identity = %name, %error, "issuing own certificate failed; retrying");
                    Some(MIN_RENEW_DELAY * 5)
                }
            },
        };
        let renewal = async {
            match renew_in {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.changed() => return,
            changed = issuer.changed() => if changed.is_err() { return },
            _ = renewal => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renews_two_thirds_into_the_remaining_life() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(renew_at(now, now + Duration::from_secs(30)), Duration::from_secs(20));
        assert_eq!(renew_at(now, now + Duration::from_secs(86400)), Duration::from_secs(57600));
        assert_eq!(renew_at(now, now - Duration::from_secs(5)), MIN_RENEW_DELAY);
    }
}
