//! The certificate a proxy or the control plane presents now, shared by its TLS configs and read
//! by its verifiers (their [`crate::trust_domain::Scope`] follows its issuer).

use std::sync::Arc;

use parking_lot::RwLock;
use rustls::SignatureScheme;
use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The certificate presented now. Replaced on rotation; handshakes already done keep what they
/// had, new ones get the new certificate without a config rebuild.
#[derive(Debug, Default)]
pub struct CurrentCert(RwLock<Option<Arc<CertifiedKey>>>);

impl CurrentCert {
    pub fn set(&self, key: Arc<CertifiedKey>) {
        *self.0.write() = Some(key);
    }
    pub fn clear(&self) {
        *self.0.write() = None;
    }
    pub fn get(&self) -> Option<Arc<CertifiedKey>> {
        self.0.read().clone()
    }
}

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.get()
    }
}

impl ResolvesClientCert for CurrentCert {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.get()
    }
    fn has_certs(&self) -> bool {
        self.get().is_some()
    }
}
