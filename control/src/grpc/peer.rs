//! Who is calling: the gRPC port asks every client for a mesh certificate but does not insist,
//! because a proxy asking Identity for its first certificate has none. A certificate that is
//! presented must chain to the issuer's current trust anchors (the handshake fails otherwise);
//! the identity it names is then the caller's, and every service but Identity requires one
//! (Destination and policy reveal the mesh to whoever asks, and cost memory).
//!
//! Layer: gRPC: TLS client authentication and the per-call check, before any service.

use std::fmt;
use std::sync::Arc;

use parking_lot::RwLock;

use cnimesh_identity::Name;
use cnimesh_identity::tls as mesh_tls;
use cnimesh_identity::trust_domain::Verifying;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};

use cnimesh_model::identity::IssuerRx;

/// The one call a client without a mesh certificate may make, as an exact path: anything
/// else (another method, a path the router might read differently) needs an identity.
pub const CERTIFY_PATH: &str = "/io.linkerd.proxy.identity.Identity/Certify";

/// Client certificates are asked for, optional, and checked against the trust anchors of the
/// issuer loaded now (anchors are reloaded with the issuer, so the verifier follows them), and
/// their issuer against the identity's trust domain, in the scope the control plane's own issuer
/// sets ([`cnimesh_identity::trust_domain`]).
pub struct OptionalMeshClientVerifier {
    current: RwLock<Option<Arc<dyn ClientCertVerifier>>>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
    verifying: Option<Verifying>,
}

impl fmt::Debug for OptionalMeshClientVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OptionalMeshClientVerifier").field("anchors_loaded", &self.loaded()).finish()
    }
}

impl OptionalMeshClientVerifier {
    /// A verifier that refuses every certificate until [`Self::set_roots`] is called; with
    /// `verifying` (the control plane's own identity and certificate), issuers are held to their
    /// trust domains too.
    pub fn new(verifying: Option<Verifying>) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(None),
            algorithms: mesh_tls::provider().signature_verification_algorithms,
            verifying,
        })
    }

    /// A verifier kept on the trust anchors of `issuer` for as long as the issuer is watched.
    pub fn following(mut issuer: IssuerRx, verifying: Verifying) -> Arc<Self> {
        let verifier = Self::new(Some(verifying));
        if let Some(loaded) = issuer.borrow_and_update().clone() {
            verifier.set_roots(loaded.roots.clone());
        }
        let weak = Arc::downgrade(&verifier);
        tokio::spawn(async move {
            while issuer.changed().await.is_ok() {
                let Some(verifier) = weak.upgrade() else { return };
                if let Some(loaded) = issuer.borrow_and_update().clone() {
                    verifier.set_roots(loaded.roots.clone());
                }
            }
        });
        verifier
    }

    pub fn set_roots(&self, roots: Arc<RootCertStore>) {
        match WebPkiClientVerifier::builder_with_provider(roots, mesh_tls::provider()).allow_unauthenticated().build() {
            Ok(verifier) => *self.current.write() = Some(verifier),
            // Only an empty root store fails here, and the issuer never loads without anchors.
            Err(error) => {
                tracing::error!(%error, "trust anchors unusable for client certificates; keeping the previous ones")
            }
        }
    }

    fn loaded(&self) -> bool {
        self.current.read().is_some()
    }
}

impl ClientCertVerifier for OptionalMeshClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    /// No hints: proxies hold one certificate and present it whatever we name.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let current = self.current.read().clone();
        let verified = match current {
            Some(verifier) => verifier.verify_client_cert(end_entity, intermediates, now)?,
            None => return Err(rustls::Error::General("no trust anchors loaded yet".into())),
        };
        if let Some(verifying) = &self.verifying {
            verifying.check(end_entity, intermediates).map_err(cnimesh_identity::anchors::refusal)?;
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The TLS 1.3 server config of the gRPC port: our certificate, optional verified client
/// certificates, h2.
pub fn server_config(
    cert: Arc<dyn rustls::server::ResolvesServerCert>,
    verifier: Arc<OptionalMeshClientVerifier>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(mesh_tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The caller's verified mesh identity, in every request's extensions when it presented a
/// certificate (`tonic::Request::extensions().get::<PeerIdentity>()`). Identity reads it: an
/// ExternalWorkload's proxy renews by presenting its certificate (`super::identity`), which
/// must be for the key the workload joined with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    pub name: Name,
    /// SHA-256 of the certificate's public key ([`cnimesh_model::identity::join::key_sha256`]).
    pub key_sha256: String,
}

/// Who a connection's verified client certificate names, and its key, if it presented one.
pub fn identity_of(conn: &rustls::ServerConnection) -> Option<PeerIdentity> {
    let leaf = conn.peer_certificates()?.first()?;
    Some(PeerIdentity {
        name: mesh_tls::identity_of(leaf)?,
        key_sha256: cnimesh_model::identity::join::certificate_key_sha256(leaf)?,
    })
}

/// Whether a call to `path` needs a mesh identity: everything but Certify does.
pub fn requires_identity(path: &str) -> bool {
    path != CERTIFY_PATH
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_certify_is_open_to_callers_without_a_certificate() {
        assert!(!requires_identity("/io.linkerd.proxy.identity.Identity/Certify"));
        assert!(requires_identity("/io.linkerd.proxy.destination.Destination/Get"));
        assert!(requires_identity("/io.linkerd.proxy.inbound.InboundServerPolicies/WatchPort"));
        assert!(requires_identity("/io.linkerd.proxy.outbound.OutboundPolicies/Watch"));
        // A path that merely starts like Identity's is another service.
        assert!(requires_identity("/io.linkerd.proxy.identity.IdentityX/Certify"));
        assert!(requires_identity("/io.linkerd.proxy.identity.Identity.evil/Certify"));
        assert!(requires_identity("//io.linkerd.proxy.identity.Identity/Certify"));
        assert!(requires_identity(
            "/io.linkerd.proxy.identity.Identity/Certify/../../io.linkerd.proxy.destination.Destination/Get"
        ));
        assert!(requires_identity("/"));
        assert!(requires_identity(""));
    }
}
