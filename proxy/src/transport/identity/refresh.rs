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
    let (key, csr) = match cnimesh_identity::ca::new_csr(&identity.name) {
        Ok(k) => k,
        Err(e) => {
            tracing::error!(error = %e, "cannot generate a key; the proxy stays not ready");
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
    loop {
        // An expired certificate is useless to peers: stop presenting it (and being ready).
        if not_after.is_some_and(|t| t <= SystemTime::now()) {
            tracing::error!(identity = %identity.name, "certificate expired before it could be renewed; not ready");
            identity.cert.clear();
            not_after = None;
        }
        let result = certify::certify(channel.clone(), &config, identity.roots.clone(), &csr).await.and_then(
            |Issued { chain, not_after }| {
                let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
                Ok((cnimesh_identity::tls::certified_key(chain, key)?, not_after))
            },
        );
        let wait = match result {
            Ok((certified, expires)) => {
                identity.cert.set(certified);
                not_after = Some(expires);
                let secs = expires.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs();
                metrics.expiration.set(secs as i64);
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
