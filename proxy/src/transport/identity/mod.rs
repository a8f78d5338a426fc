//! The proxy's workload identity: a private key generated in memory (never written anywhere), a
//! certificate obtained from the control plane's Identity service with the pod's projected
//! service-account token, refreshed before it expires, and the TLS configs that present it. A
//! proxy running as an ExternalWorkload ([`external`]) joins with a one-time token instead,
//! renews with its certificate, and keeps key and certificate in its state directory.

pub mod anchors_file;
pub mod certify;
pub mod config;
pub mod external;
pub mod refresh;

use std::sync::Arc;

use anyhow::Context;
use cnimesh_identity::Name;
use cnimesh_identity::tls::{self, Anchors, ClientAuth, CurrentCert};
use cnimesh_identity::trust_domain::Verifying;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use config::{IdentityConfig, TrustAnchors};

pub struct Identity {
    pub name: Name,
    /// The trust anchors in force: every config below follows them, so a bundle file that
    /// changes ([`anchors_file`]) changes whom the proxy trusts without a restart.
    pub roots: Arc<Anchors>,
    pub cert: Arc<CurrentCert>,
    /// Inbound mTLS: clients must present a certificate from our trust anchors, from an issuer
    /// of their identity's trust domain.
    pub server: Arc<ServerConfig>,
    /// Outbound mTLS: we present ours and check the server's name at connect time.
    pub client: Arc<ClientConfig>,
}

impl Identity {
    pub fn new(config: &IdentityConfig) -> anyhow::Result<Self> {
        let cert = Arc::new(CurrentCert::default());
        // Every peer is also held to its issuer's trust domain, in the scope our own issuer sets.
        let verifying = Verifying::new(config.name.clone(), cert.clone());
        let roots = Anchors::verifying(trust_anchors(&config.trust_anchors)?, verifying)?;
        Ok(Self {
            name: config.name.clone(),
            server: tls::server_config(roots.clone(), cert.clone(), ClientAuth::Required, &[])?,
            client: tls::client_config(roots.clone(), Some(cert.clone()), &[])?,
            roots,
            cert,
        })
    }

    /// An identity named `name` under a fresh trust anchor, without a certificate yet: what
    /// in-process tests refuse, peek and fail to connect with.
    #[cfg(test)]
    pub(crate) fn without_certificate(name: &str) -> Self {
        let anchor =
            cnimesh_identity::ca::new_trust_anchor("cluster.local", std::time::Duration::from_secs(3600)).unwrap();
        Self::new(&IdentityConfig {
            name: name.parse().unwrap(),
            trust_anchors: TrustAnchors::Pem(anchor.cert_pem),
            token_file: "/nonexistent".into(),
            control_addr: "control:4190".into(),
            control_name: cnimesh_identity::name::DEFAULT_CONTROL_NAME.parse().unwrap(),
            max_backoff: std::time::Duration::from_secs(1),
            external: None,
        })
        .unwrap()
    }

    /// Whether a certificate is held: until then the proxy is not ready.
    pub fn has_cert(&self) -> bool {
        self.cert.get().is_some()
    }
}

/// Loads the trust anchors from a file or from the PEM text; errors name the file or the
/// variable the PEM came from (never the PEM itself).
pub(crate) fn trust_anchors(anchors: &TrustAnchors) -> anyhow::Result<Arc<RootCertStore>> {
    let source = anchors.source();
    let certs = match anchors {
        TrustAnchors::File(path) => {
            let pem = std::fs::read(path).with_context(|| format!("reading trust anchors {source}"))?;
            cnimesh_identity::pem::certs(&pem, &format!("trust anchors {source}"))?
        }
        TrustAnchors::Pem(pem) | TrustAnchors::Endorsed { pem, .. } => {
            cnimesh_identity::pem::certs(pem.as_bytes(), &format!("trust anchors {source}"))?
        }
    };
    tls::roots(&certs).with_context(|| format!("trust anchors {source}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_anchors_load_from_pem_text_or_a_file_and_errors_name_the_source() {
        let pem = cnimesh_identity::ca::new_trust_anchor("cluster.local", std::time::Duration::from_secs(3600))
            .unwrap()
            .cert_pem;
        assert_eq!(trust_anchors(&TrustAnchors::Pem(pem.clone())).unwrap().len(), 1);
        let file = std::env::temp_dir().join(format!("cnimesh-proxy-anchors-{}.crt", std::process::id()));
        std::fs::write(&file, &pem).unwrap();
        let loaded = trust_anchors(&TrustAnchors::File(file.clone()));
        let _ = std::fs::remove_file(&file);
        assert_eq!(loaded.unwrap().len(), 1);

        let garbage = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n".to_string();
        let e = format!("{:#}", trust_anchors(&TrustAnchors::Pem(garbage)).unwrap_err());
        assert!(e.contains("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM"), "{e}");
        assert!(!e.contains("c2VjcmV0"), "the PEM itself stays out of errors: {e}");
        let e = format!("{:#}", trust_anchors(&TrustAnchors::File("/nonexistent/ca.crt".into())).unwrap_err());
        assert!(e.contains("/nonexistent/ca.crt"), "{e}");
    }
}
