//! Trust anchors that can change under running TLS configs: the rotation of the mesh's root
//! adds a new anchor beside the old one, then drops the old one, and a proxy must
//! follow both steps without a restart (a restart drops its connections). Configs built on
//! [`Trust::Following`] ask the [`Anchors`] at every handshake; handshakes already done keep
//! what they verified.
//!
//! [`Trust::Fixed`] is a root store that never changes (the control plane's tests, `check`).
//!
//! Anchors that know whose they are ([`Anchors::verifying`], a proxy's) also check, after
//! WebPKI, that the peer's issuer may vouch for its identity's trust domain
//! ([`crate::trust_domain`]): linked clusters share the anchors, not the right to name each
//! other's workloads.

use std::sync::Arc;

use parking_lot::RwLock;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::provider::provider;
use crate::trust_domain::{IssuanceError, Verifying};

/// A root store no verifier can be built on (empty, or unusable certificates).
#[derive(Debug, thiserror::Error)]
#[error("trust anchors: {0}")]
pub struct AnchorsError(String);

/// The anchors in force now, with the verifiers built on them (built once per change, not per
/// handshake).
struct Current {
    roots: Arc<RootCertStore>,
    server: Arc<WebPkiServerVerifier>,
    client: Arc<dyn ClientCertVerifier>,
}

impl Current {
    fn new(roots: Arc<RootCertStore>) -> Result<Self, AnchorsError> {
        let error = |e: rustls::server::VerifierBuilderError| AnchorsError(e.to_string());
        let server = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider()).build().map_err(error)?;
        let client = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider()).build().map_err(error)?;
        Ok(Self { roots, server, client })
    }
}

/// Replaceable trust anchors.
pub struct Anchors {
    current: RwLock<Current>,
    /// Whose verifiers these are: with it, every peer's issuer is checked against its trust
    /// domain.
    verifying: Option<Verifying>,
}

impl std::fmt::Debug for Anchors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Anchors").field(&self.len()).finish()
    }
}

impl Anchors {
    pub fn new(roots: Arc<RootCertStore>) -> Result<Arc<Self>, AnchorsError> {
        Ok(Arc::new(Self { current: RwLock::new(Current::new(roots)?), verifying: None }))
    }

    /// Anchors of `verifying`'s TLS configs: peers are also held to their issuers' trust
    /// domains ([`crate::trust_domain::check`]).
    pub fn verifying(roots: Arc<RootCertStore>, verifying: Verifying) -> Result<Arc<Self>, AnchorsError> {
        Ok(Arc::new(Self { current: RwLock::new(Current::new(roots)?), verifying: Some(verifying) }))
    }

    /// From now on, new handshakes verify against `roots`.
    pub fn set(&self, roots: Arc<RootCertStore>) -> Result<(), AnchorsError> {
        let current = Current::new(roots)?;
        *self.current.write() = current;
        Ok(())
    }

    pub fn roots(&self) -> Arc<RootCertStore> {
        self.current.read().roots.clone()
    }

    /// How many anchors are trusted now.
    pub fn len(&self) -> usize {
        self.current.read().roots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn server(&self) -> Arc<WebPkiServerVerifier> {
        self.current.read().server.clone()
    }

    fn client(&self) -> Arc<dyn ClientCertVerifier> {
        self.current.read().client.clone()
    }

    /// The trust-domain check after WebPKI's, for anchors that know whose they are.
    fn check_issuer(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<(), rustls::Error> {
        match &self.verifying {
            Some(verifying) => verifying.check(end_entity, intermediates).map(drop).map_err(refusal),
            None => Ok(()),
        }
    }
}

/// A chain refused for its issuer's trust domain, as a handshake error that keeps the typed
/// reason (`rustls::OtherError` holds the [`IssuanceError`]).
pub fn refusal(error: IssuanceError) -> rustls::Error {
    rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(Arc::new(error))))
}

/// What a TLS config verifies peers against.
#[derive(Clone, Debug)]
pub enum Trust {
    Fixed(Arc<RootCertStore>),
    Following(Arc<Anchors>),
}

impl From<Arc<RootCertStore>> for Trust {
    fn from(roots: Arc<RootCertStore>) -> Self {
        Self::Fixed(roots)
    }
}

impl From<Arc<Anchors>> for Trust {
    fn from(anchors: Arc<Anchors>) -> Self {
        Self::Following(anchors)
    }
}

impl Trust {
    /// The anchors as of now.
    pub fn roots(&self) -> Arc<RootCertStore> {
        match self {
            Self::Fixed(roots) => roots.clone(),
            Self::Following(anchors) => anchors.roots(),
        }
    }

    pub(crate) fn server_verifier(&self) -> Result<Arc<dyn ServerCertVerifier>, AnchorsError> {
        let verifier: Arc<dyn ServerCertVerifier> = match self {
            Self::Fixed(roots) => WebPkiServerVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .map_err(|e| AnchorsError(e.to_string()))?,
            Self::Following(anchors) => Arc::new(FollowingServer(anchors.clone())),
        };
        Ok(verifier)
    }

    pub(crate) fn client_verifier(&self) -> Result<Arc<dyn ClientCertVerifier>, AnchorsError> {
        let verifier: Arc<dyn ClientCertVerifier> = match self {
            Self::Fixed(roots) => WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .map_err(|e| AnchorsError(e.to_string()))?,
            Self::Following(anchors) => Arc::new(FollowingClient(anchors.clone())),
        };
        Ok(verifier)
    }
}

/// Verifies servers against the anchors in force at the handshake.
#[derive(Debug)]
struct FollowingServer(Arc<Anchors>);

impl ServerCertVerifier for FollowingServer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified =
            self.0.server().verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
        self.0.check_issuer(end_entity, intermediates)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.server().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.server().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.server().supported_verify_schemes()
    }
}

/// Verifies (required) client certificates against the anchors in force at the handshake.
#[derive(Debug)]
struct FollowingClient(Arc<Anchors>);

impl ClientCertVerifier for FollowingClient {
    /// No hints: they would have to outlive a change of anchors, and mesh clients hold one
    /// certificate whatever the server hints.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.0.client().verify_client_cert(end_entity, intermediates, now)?;
        self.0.check_issuer(end_entity, intermediates)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.client().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.client().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.client().supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::{Name, ca, pem, tls};

    fn roots_of(pems: &[&str]) -> Arc<RootCertStore> {
        let certs: Vec<_> = pems.iter().flat_map(|p| pem::certs(p.as_bytes(), "anchor").unwrap()).collect();
        tls::roots(&certs).unwrap()
    }

    #[test]
    fn a_following_verifier_trusts_what_the_anchors_hold_at_each_handshake() {
        let old = ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap();
        let new = ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap();
        let name = Name::parse("web.shop.serviceaccount.identity.cnimesh.cluster.local").unwrap();
        let leaf_of = |anchor: &ca::CaPem| {
            let issuer = ca::new_issuer(anchor, "cluster.local", Duration::from_secs(3600)).unwrap();
            let signer = ca::Signer::new(&issuer).unwrap();
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            let now = SystemTime::now();
            let leaf = signer.sign(&name, &key, now - Duration::from_secs(60), now + Duration::from_secs(600)).unwrap();
            (leaf, pem::certs(issuer.cert_pem.as_bytes(), "issuer").unwrap().remove(0))
        };
        let anchors = Anchors::new(roots_of(&[&old.cert_pem])).unwrap();
        let verifier = Trust::from(anchors.clone()).server_verifier().unwrap();
        let server_name = ServerName::try_from(name.as_str().to_string()).unwrap();
        let verify = |(leaf, issuer): &(CertificateDer<'static>, CertificateDer<'static>)| {
            verifier.verify_server_cert(leaf, std::slice::from_ref(issuer), &server_name, &[], UnixTime::now()).is_ok()
        };
        let (from_old, from_new) = (leaf_of(&old), leaf_of(&new));
        assert!(verify(&from_old) && !verify(&from_new));
        anchors.set(roots_of(&[&old.cert_pem, &new.cert_pem])).unwrap();
        assert!(verify(&from_old) && verify(&from_new), "the bundle trusts both");
        anchors.set(roots_of(&[&new.cert_pem])).unwrap();
        assert!(!verify(&from_old) && verify(&from_new), "the old anchor is dropped");
        assert_eq!(anchors.len(), 1);
    }
}
