//! rustls configuration for mesh traffic and the control plane. Every config is built with the
//! aws-lc-rs provider passed explicitly: with another provider compiled in (kube pulls ring in
//! some feature sets), rustls's implicit default panics (docs/architecture.md, "Dependencies and their pitfalls"). Mesh TLS is TLS 1.3 only.

use std::sync::Arc;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::client::danger::ServerCertVerifier;
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::server::ResolvesServerCert;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use crate::Name;
pub use crate::anchors::{Anchors, Trust};
pub use crate::current::CurrentCert;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("trust anchors: {0}")]
    Anchors(String),
    #[error("certificate does not parse: {0}")]
    Parse(String),
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

pub use crate::provider::provider;

/// Fills `buf` from the provider's CSPRNG.
pub fn random(buf: &mut [u8]) {
    provider().secure_random.fill(buf).expect("the system CSPRNG works");
}

/// A root store holding exactly `anchors`.
pub fn roots(anchors: &[CertificateDer<'static>]) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    let (added, ignored) = store.add_parsable_certificates(anchors.iter().cloned());
    if added == 0 || ignored > 0 {
        return Err(TlsError::Anchors(format!("{added} usable, {ignored} unusable certificates")));
    }
    Ok(Arc::new(store))
}

/// A certificate chain and its key, ready for rustls.
pub fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<CertifiedKey>, TlsError> {
    Ok(Arc::new(CertifiedKey::from_der(chain, key, &provider())?))
}

/// Whether a server asks its clients for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Mesh traffic: only clients with a certificate from our trust anchors get through.
    Required,
    /// The Identity service: a proxy asking for its first certificate has none yet.
    None,
}

/// A TLS 1.3 server presenting `cert`, with ALPN `alpn`.
pub fn server_config(
    roots: impl Into<Trust>,
    cert: Arc<dyn ResolvesServerCert>,
    client_auth: ClientAuth,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let builder =
        ServerConfig::builder_with_provider(provider.clone()).with_protocol_versions(&[&rustls::version::TLS13])?;
    let builder = match client_auth {
        ClientAuth::Required => builder
            .with_client_cert_verifier(roots.into().client_verifier().map_err(|e| TlsError::Anchors(e.to_string()))?),
        ClientAuth::None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A TLS 1.3 client that checks the server's certificate against `roots` and the name it is
/// given at connect time (the expected identity), presenting `cert` when there is one.
pub fn client_config(
    roots: impl Into<Trust>,
    cert: Option<Arc<dyn ResolvesClientCert>>,
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider()).with_protocol_versions(&[&rustls::version::TLS13])?;
    let builder = match roots.into() {
        Trust::Fixed(roots) => builder.with_root_certificates(roots),
        // Not dangerous: the same WebPKI verification, against the anchors in force now.
        following => builder.dangerous().with_custom_certificate_verifier(
            following.server_verifier().map_err(|e| TlsError::Anchors(e.to_string()))?,
        ),
    };
    let mut config = match cert {
        Some(cert) => builder.with_client_cert_resolver(cert),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Checks that `chain` (leaf first) is valid now for `name` under `roots`: what a peer will check.
pub fn verify(roots: impl Into<Trust>, chain: &[CertificateDer<'static>], name: &Name) -> Result<(), TlsError> {
    let verifier = WebPkiServerVerifier::builder_with_provider(roots.into().roots(), provider())
        .build()
        .map_err(|e| TlsError::Anchors(e.to_string()))?;
    let (leaf, intermediates) = chain.split_first().ok_or_else(|| TlsError::Parse("empty chain".into()))?;
    let server_name = ServerName::try_from(name.as_str().to_string()).map_err(|e| TlsError::Parse(e.to_string()))?;
    verifier.verify_server_cert(leaf, intermediates, &server_name, &[], UnixTime::now())?;
    Ok(())
}

/// The identity a certificate names: its first DNS SAN that is a valid identity name.
pub fn identity_of(cert: &CertificateDer<'_>) -> Option<Name> {
    Name::of_certificate(cert)
}

/// A certificate's subject as text (`CN=…`), for operators' status pages.
pub fn subject_of(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert).ok()?;
    Some(x509.subject().to_string())
}

/// A certificate's serial number as colon-separated hex: with the subject, what tells two
/// issuers apart (every cnimesh issuer of a trust domain has the same subject).
pub fn serial_of(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert).ok()?;
    Some(x509.raw_serial_as_string())
}

/// When a certificate stops being valid.
pub fn not_after(cert: &CertificateDer<'_>) -> Result<SystemTime, TlsError> {
    Ok(validity(cert)?.1)
}

/// When a certificate starts and stops being valid.
pub fn validity(cert: &CertificateDer<'_>) -> Result<(SystemTime, SystemTime), TlsError> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert).map_err(|e| TlsError::Parse(e.to_string()))?;
    let at = |secs: i64| UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64);
    Ok((at(x509.validity().not_before.timestamp()), at(x509.validity().not_after.timestamp())))
}

/// Whether the first certificate of `pem` has passed 2/3 of its life at `now`, the point where
/// its keeper replaces it (a PEM that does not parse is due: replace it).
pub fn past_two_thirds(pem: &str, now: SystemTime) -> bool {
    let Some((from, until)) = first_validity(pem) else { return true };
    now >= from + until.duration_since(from).unwrap_or_default() * 2 / 3
}

/// The validity of the first certificate of `pem`, if it holds one that parses.
pub fn first_validity(pem: &str) -> Option<(SystemTime, SystemTime)> {
    let certs = crate::pem::certs(pem.as_bytes(), "certificate").ok()?;
    validity(certs.first()?).ok()
}
