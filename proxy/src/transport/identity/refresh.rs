//! Keeping a certificate: refresh at 70% of its life; on failure retry with jittered exponential
//! backoff ([`crate::transport::backoff`]) while the old certificate stays in use until it expires.
//! A trust-anchors file is followed meanwhile ([`super::anchors_file`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use super::Identity;
use super::certify::{self, Issued};
use super::config::{IdentityConfig, TrustAnchors};
use crate::transport::backoff::backoff;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// Fraction of a certificate's remaining life after which it is renewed.
const REFRESH_AT: f64 = 0.7;

/// When to refresh a certificate received `now` that expires at `not_after`.
pub fn refresh_after(now: SystemTime, not_after: SystemTime) -> Duration {
    not_after.duration_since(now).unwrap_or_default().mul_f64(REFRESH_AT)
}

/// `identity_cert_refresh_total`'s `result`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefreshLabels {
    pub result: String,
}

/// The certificate's metrics, handles into the app's registry: `identity_cert_expiration_timestamp_seconds`
/// and `identity_cert_refresh_total`.
#[derive(Clone)]
pub struct IdentityMetrics {
    pub expiration: Gauge,
    pub refresh: Family<RefreshLabels, Counter>,
    /// `identity_trust_anchors_refused_total`: followed bundles not taken.
    pub anchors_refused: Counter,
}

/// Runs forever: obtains and renews the certificate.
pub async fn run(identity: Arc<Identity>, config: IdentityConfig, metrics: IdentityMetrics) {
    match &config.trust_anchors {
        TrustAnchors::File(path) => {
            let refused = metrics.anchors_refused.clone();
            tokio::spawn(super::anchors_file::follow(path.clone(), identity.roots.clone(), None, None, refused));
        }
        TrustAnchors::Endorsed { file, signer, since, .. } => {
            let (signer, refused) = (Some(signer.clone()), metrics.anchors_refused.clone());
            tokio::spawn(super::anchors_file::follow(file.clone(), identity.roots.clone(), signer, *since, refused));
        }
        TrustAnchors::Pem(_) => {}
    }
    // An ExternalWorkload keeps its key and certificate across restarts; a pod's key is new.
    let external = config.external.clone();
    let stored = match &external {
        Some(ext) => match super::external::load(&ext.state_dir, &identity.name, identity.roots.clone()) {
            Ok(stored) => stored,
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "the stored certificate is unusable; joining anew");
                None
            }
        },
        None => None,
    };
    let now = SystemTime::now();
    let (key, held, stored_expired) = match stored {
        Some(super::external::Stored { key, chain, not_after }) if not_after > now => {
            (key, Some((chain, not_after)), None)
        }
        Some(super::external::Stored { key, not_after, .. }) => (key, None, Some(not_after)),
        None => match cnimesh_identity::ca::new_key() {
            Ok(key) => (key, None, None),
            Err(e) => {
                tracing::error!(error = %e, "cannot generate a key; the proxy stays not ready");
                return;
            }
        },
    };
    let csr = match cnimesh_identity::ca::csr_for(&key, &identity.name) {
        Ok(csr) => csr,
        Err(e) => {
            tracing::error!(error = %e, "cannot make a certificate request; the proxy stays not ready");
            return;
        }
    };
    let channel = match certify::channel(&config, identity.roots.clone()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot set up the Identity client; the proxy stays not ready");
            return;
        }
    };
    let mut delay = Duration::ZERO;
    let mut not_after: Option<SystemTime> = None;
    // A stored certificate still valid is presented at once and renewed with.
    if let Some((chain, expires)) = held {
        match certified(&key, chain) {
            Ok(certified) => {
                identity.cert.set(certified);
                not_after = Some(expires);
                metrics.expiration.set(epoch(expires) as i64);
            }
            Err(e) => tracing::error!(error = format!("{e:#}"), "the stored certificate is unusable; joining anew"),
        }
    }
    // After a renewal is refused, a join token (a new one the operator wrote) is tried next.
    let mut prefer_join = false;
    loop {
        // An expired certificate is useless to peers: stop presenting it (and being ready).
        if not_after.is_some_and(|t| t <= SystemTime::now()) {
            tracing::error!(identity = %identity.name, "certificate expired before it could be renewed; not ready");
            identity.cert.clear();
            not_after = None;
        }
        let issued = match &external {
            None => certify::certify(channel.clone(), &config, identity.roots.clone(), &csr).await,
            Some(ext) => {
                let holding = not_after.is_some() && !prefer_join;
                external_certify(&identity, &config, ext, &csr, holding, stored_expired).await
            }
        };
        let result = issued.and_then(|Issued { chain, not_after }| {
            if let Some(ext) = &external {
                super::external::save(&ext.state_dir, &key, &chain)
                    .unwrap_or_else(|e| tracing::warn!(error = format!("{e:#}"), "could not keep the certificate"));
            }
            Ok((certified(&key, chain)?, not_after))
        });
        let wait = match result {
            Ok((certified, expires)) => {
                identity.cert.set(certified);
                not_after = Some(expires);
                prefer_join = false;
                metrics.expiration.set(epoch(expires) as i64);
                metrics.refresh.get_or_create(&RefreshLabels { result: "success".into() }).inc();
                delay = Duration::ZERO;
                let wait = refresh_after(SystemTime::now(), expires);
                tracing::info!(identity = %identity.name, expires_in = ?expires.duration_since(SystemTime::now()).unwrap_or_default(), refresh_in = ?wait, "certificate issued");
                wait
            }
            Err(e) => {
                metrics.refresh.get_or_create(&RefreshLabels { result: "failure".into() }).inc();
                let (next, jittered) = backoff(delay, config.max_backoff);
                delay = next;
                prefer_join = external.is_some() && !prefer_join;
                if not_after.is_some_and(|t| t <= SystemTime::now()) {
                    tracing::error!(error = %e, "certificate expired and could not be renewed; not ready");
                    identity.cert.clear();
                    not_after = None;
                }
                tracing::warn!(identity = %identity.name, error = format!("{e:#}"), retry_in = ?jittered, "certificate request failed");
                jittered
            }
        };
        // Never sleep past expiry without trying again.
        let until_expiry = not_after.and_then(|t| t.duration_since(SystemTime::now()).ok());
        tokio::time::sleep(until_expiry.map_or(wait, |u| wait.min(u))).await;
    }
}

/// One Certify of an ExternalWorkload: holding a certificate, no token and the certificate
/// presented; otherwise the join token (or the error naming the join command).
async fn external_certify(
    identity: &Identity,
    config: &IdentityConfig,
    external: &super::external::ExternalIdentity,
    csr: &[u8],
    holding: bool,
    stored_expired: Option<SystemTime>,
) -> anyhow::Result<Issued> {
    let (channel, token) = match external.join_token()? {
        // Joining: no certificate to present (the channel would refuse to connect without one).
        Some(token) if !holding => (certify::channel(config, identity.roots.clone())?, token),
        _ if holding && identity.cert.get().is_some() => {
            (certify::channel_presenting(config, identity.roots.clone(), identity.cert.clone())?, Vec::new())
        }
        _ => return Err(external.needs_join(stored_expired)),
    };
    certify::certify_with(channel, config, identity.roots.clone(), csr, token).await
}

fn certified(
    key: &cnimesh_identity::ca::KeyPair,
    chain: Vec<rustls_pki_types::CertificateDer<'static>>,
) -> anyhow::Result<Arc<rustls::sign::CertifiedKey>> {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    Ok(cnimesh_identity::tls::certified_key(chain, key)?)
}

fn epoch(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_at_seventy_percent_and_never_negative() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        assert_eq!(refresh_after(now, now + Duration::from_secs(100)), Duration::from_secs(70));
        assert_eq!(refresh_after(now, now + Duration::from_secs(86400)), Duration::from_secs(60480));
        assert_eq!(refresh_after(now, now - Duration::from_secs(1)), Duration::ZERO);
    }
}
