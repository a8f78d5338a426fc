//! Reaching a linked cluster's gateway as its clients would: a TCP connect, then a TLS 1.3
//! handshake naming the Link's gatewayIdentity, recording the certificate chain the gateway
//! presents. The handshake then fails (we have no mesh certificate to offer, and the gateway
//! accepts only mesh mTLS), but the chain is what `check` judges: does it chain to THIS cluster's
//! trust anchors, and does it name the gatewayIdentity the Link says?

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;

/// Connect and handshake bound.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// What the gateway answered.
#[derive(Debug)]
pub struct Probe {
    /// The TCP connect's duration.
    pub connect: Duration,
    /// The chain the gateway presented (leaf first); empty when the handshake got no certificate.
    pub chain: Vec<CertificateDer<'static>>,
    /// How the handshake ended, in words (it is expected to fail without a client certificate).
    pub handshake: String,
}

/// Accepts any chain and keeps it: judged afterwards, against the anchors, with reasons.
#[derive(Debug)]
struct Recorder {
    chain: Mutex<Vec<CertificateDer<'static>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let chain = std::iter::once(end_entity).chain(intermediates).map(|c| c.clone().into_owned()).collect();
        *self.chain.lock() = chain;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// TCP to `address:port`, then the recorded handshake with SNI `identity`.
pub async fn probe(address: &str, port: u16, identity: &str) -> Result<Probe, String> {
    let started = Instant::now();
    let tcp = match tokio::time::timeout(TIMEOUT, TcpStream::connect((address, port))).await {
        Err(_) => return Err(format!("{address}:{port}: no TCP connection within {} s", TIMEOUT.as_secs())),
        Ok(Err(e)) => return Err(format!("{address}:{port}: {e}")),
        Ok(Ok(tcp)) => tcp,
    };
    let connect = started.elapsed();
    let provider = cnimesh_identity::tls::provider();
    let recorder = Arc::new(Recorder { chain: Mutex::new(Vec::new()), provider: provider.clone() });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS configuration: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(recorder.clone())
        .with_no_client_auth();
    let name = ServerName::try_from(identity.to_string()).map_err(|e| format!("gatewayIdentity {identity:?}: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let handshake = match tokio::time::timeout(TIMEOUT, connector.connect(name, tcp)).await {
        Err(_) => format!("no TLS handshake within {} s", TIMEOUT.as_secs()),
        Ok(Err(e)) => format!("handshake ended: {e}"),
        Ok(Ok(_)) => "handshake completed without a client certificate".to_string(),
    };
    let chain = recorder.chain.lock().clone();
    Ok(Probe { connect, chain, handshake })
}

/// Why the chain is not the gateway the Link names, or `Ok` with the identity it proves.
pub fn judge(chain: &[CertificateDer<'static>], anchors_pem: &str, identity: &str) -> Result<String, String> {
    let leaf = chain.first().ok_or("the gateway presented no certificate")?;
    let named = cnimesh_identity::tls::identity_of(leaf).map(|n| n.to_string());
    if named.as_deref() != Some(identity) {
        return Err(format!(
            "the gateway's certificate names {}, not the Link's gatewayIdentity {identity}",
            named.unwrap_or_else(|| "no identity".into())
        ));
    }
    let anchors = cnimesh_identity::pem::certs(anchors_pem.as_bytes(), "trust anchors").map_err(|e| e.to_string())?;
    let roots = cnimesh_identity::tls::roots(&anchors).map_err(|e| e.to_string())?;
    let name = cnimesh_identity::Name::parse(identity).map_err(|e| e.to_string())?;
    cnimesh_identity::tls::verify(roots, chain, &name).map_err(|e| {
        let issuer = chain.last().and_then(|c| issuer_of(c)).unwrap_or_else(|| "an unknown issuer".into());
        format!("the gateway's certificate (issued under {issuer}) does not chain to this cluster's trust anchors: {e}")
    })?;
    Ok(identity.to_string())
}

fn issuer_of(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    Some(x509.issuer().to_string())
}
