//! The proxy's workload identity: a private key generated in memory (never written anywhere), a
//! certificate obtained from the control plane's Identity service with the pod's projected
//! service-account token, refreshed before it expires, and the TLS configs that present it.

pub mod certify;
pub mod refresh;

use std::sync::Arc;

use anyhow::Context;
use cnimesh_identity::Name;
use cnimesh_identity::tls::{self, ClientAuth, CurrentCert};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::config::IdentityConfig;

pub struct Identity {
    pub name: Name,
    pub roots: Arc<RootCertStore>,
    pub cert: Arc<CurrentCert>,
    /// Inbound mTLS: clients must present a certificate from our trust anchors.
    pub server: Arc<ServerConfig>,
    /// Outbound mTLS: we present ours and check the server's name at connect time.
    pub client: Arc<ClientConfig>,
}

impl Identity {
    pub fn new(config: &IdentityConfig) -> anyhow::Result<Self> {
        let pem = std::fs::read(&config.trust_anchors)
            .with_context(|| format!("reading trust anchors {}", config.trust_anchors.display()))?;
        let anchors = cnimesh_identity::pem::certs(&pem, &config.trust_anchors.display().to_string())?;
        let roots = tls::roots(&anchors)?;
        let cert = Arc::new(CurrentCert::default());
        Ok(Self {
            name: config.name.clone(),
            server: tls::server_config(roots.clone(), cert.clone(), ClientAuth::Required, &[])?,
            client: tls::client_config(roots.clone(), Some(cert.clone()), &[])?,
            roots,
            cert,
        })
    }

    /// Whether a certificate is held: until then the proxy is not ready.
    pub fn has_cert(&self) -> bool {
        self.cert.get().is_some()
    }
}
