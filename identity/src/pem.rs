//! PEM input: certificates and keys as Kubernetes Secrets and ConfigMaps hold them; and a chain
//! written back as PEM ([`encode_certs`]).

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("{what}: no PEM {kind} found")]
    Empty { what: String, kind: &'static str },
    #[error("{what}: {source}")]
    Parse { what: String, source: rustls_pki_types::pem::Error },
}

/// The PEM blocks of a bundle as text, each with its own END line: how a bundle's certificates
/// are compared and rewritten one by one (the webhook's caBundle, an issuer rotation's anchors).
pub fn split_pem(bundle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in bundle.lines() {
        current.push_str(line);
        current.push('\n');
        if line.starts_with("-----END ") {
            out.push(std::mem::take(&mut current));
        }
    }
    out
}

/// Every certificate in `pem`, in order; at least one. `what` names the source for errors.
pub fn certs(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| PemError::Parse { what: what.into(), source })?;
    if certs.is_empty() {
        return Err(PemError::Empty { what: what.into(), kind: "CERTIFICATE" });
    }
    Ok(certs)
}

/// `chain` as PEM, one CERTIFICATE block each, in order (64-character lines, as OpenSSL writes).
pub fn encode_certs(chain: &[CertificateDer<'_>]) -> String {
    use base64::Engine;
    let mut out = String::new();
    for cert in chain {
        let text = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in text.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

/// The first private key in `pem` (PKCS#8, SEC1 or PKCS#1).
pub fn key(pem: &[u8], what: &str) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|source| match source {
        rustls_pki_types::pem::Error::NoItemsFound => PemError::Empty { what: what.into(), kind: "PRIVATE KEY" },
        source => PemError::Parse { what: what.into(), source },
    })
}
