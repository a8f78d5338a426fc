//! PEM input: certificates and keys as Kubernetes Secrets and ConfigMaps hold them.

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

/// The first private key in `pem` (PKCS#8, SEC1 or PKCS#1).
pub fn key(pem: &[u8], what: &str) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|source| match source {
        rustls_pki_types::pem::Error::NoItemsFound => PemError::Empty { what: what.into(), kind: "PRIVATE KEY" },
        source => PemError::Parse { what: what.into(), source },
    })
}
