//! Certificate signing requests: what a proxy may ask for. The CSR only proves possession of a
//! key; the leaf we sign is built from scratch (identity SAN, our usages), so anything in the CSR
//! beyond the identity and the key is a sign of a confused or hostile client and is refused
//! rather than silently dropped.
//!
//! Layer: model (pure).

use cnimesh_identity::Name;
use rcgen::{CertificateSigningRequestParams, IsCa, PublicKey, SanType};
use rustls_pki_types::CertificateSigningRequestDer;
use rustls_pki_types::pem::PemObject;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_SIG_ED25519};
use x509_parser::prelude::FromDer;

/// Larger than any honest CSR (an ECDSA one is about 300 bytes), small enough that parsing
/// cannot be used to make us work hard.
pub const MAX_CSR_LEN: usize = 8 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CsrError {
    #[error("the certificate signing request is empty")]
    Empty,
    #[error("the certificate signing request is {0} bytes, more than the {MAX_CSR_LEN} allowed")]
    TooLarge(usize),
    #[error("the certificate signing request does not parse or its signature does not verify: {0}")]
    Malformed(String),
    #[error("the CSR's key is {0}; accepted: ECDSA P-256, Ed25519")]
    KeyType(String),
    #[error("the CSR's signature algorithm does not match its key")]
    SignatureAlgorithm,
    #[error("the CSR must name exactly one DNS SAN, {expected}; it has {found}")]
    Sans { expected: String, found: String },
    #[error("the CSR's subject common name {found:?} is not {expected}")]
    CommonName { expected: String, found: String },
    #[error("the CSR asks for a CA certificate")]
    Ca,
}

/// A CSR that passed every check: the public key to certify.
#[derive(Debug)]
pub struct ValidCsr {
    pub public_key: PublicKey,
}

/// Checks that `csr` (DER; PEM is accepted too because the protocol's comments say PEM while
/// proxies send DER) is signed by its own key, that the key is of a type we issue for, and that
/// it asks for `name` and nothing else.
pub fn validate(csr: &[u8], name: &Name) -> Result<ValidCsr, CsrError> {
    if csr.is_empty() {
        return Err(CsrError::Empty);
    }
    if csr.len() > MAX_CSR_LEN {
        return Err(CsrError::TooLarge(csr.len()));
    }
    let der = if csr.starts_with(b"-----BEGIN") {
        CertificateSigningRequestDer::from_pem_slice(csr).map_err(|e| CsrError::Malformed(format!("PEM: {e}")))?
    } else {
        CertificateSigningRequestDer::from(csr.to_vec())
    };
    // rcgen verifies the self-signature and refuses extensions it does not understand.
    let params = CertificateSigningRequestParams::from_der(&der).map_err(|e| CsrError::Malformed(e.to_string()))?;
    let (_, parsed) = X509CertificationRequest::from_der(&der).map_err(|e| CsrError::Malformed(e.to_string()))?;
    let info = &parsed.certification_request_info;

    // rcgen derives the key's algorithm from the *signature* algorithm, so a P-384 key signed
    // with ecdsa-with-SHA256 would pass as P-256: the key type comes from the SPKI.
    let spki = &info.subject_pki.algorithm;
    let expected = if spki.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki.parameters.as_ref().and_then(|p| p.as_oid().ok());
        match curve {
            Some(curve) if curve == OID_EC_P256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            Some(curve) => return Err(CsrError::KeyType(format!("ECDSA on curve {curve}"))),
            None => return Err(CsrError::KeyType("ECDSA without a named curve".into())),
        }
    } else if spki.algorithm == OID_SIG_ED25519 {
        &rcgen::PKCS_ED25519
    } else {
        return Err(CsrError::KeyType(format!("algorithm {}", spki.algorithm)));
    };
    if params.public_key.algorithm() != expected {
        return Err(CsrError::SignatureAlgorithm);
    }

    let sans = &params.params.subject_alt_names;
    match sans.as_slice() {
        [SanType::DnsName(dns)] if dns.as_str() == name.as_str() => {}
        _ => return Err(CsrError::Sans { expected: name.to_string(), found: format!("{sans:?}") }),
    }
    for cn in info.subject.iter_common_name() {
        let found = cn.as_str().map_err(|e| CsrError::Malformed(format!("common name: {e}")))?;
        if found != name.as_str() {
            return Err(CsrError::CommonName { expected: name.to_string(), found: found.to_string() });
        }
    }
    if matches!(params.params.is_ca, IsCa::Ca(_)) {
        return Err(CsrError::Ca);
    }
    Ok(ValidCsr { public_key: params.public_key })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, KeyPair, PKCS_ECDSA_P256_SHA256,
        PKCS_ECDSA_P384_SHA384, PKCS_ED25519, SignatureAlgorithm,
    };

    fn name() -> Name {
        Name::for_service_account("web", "shop", "cluster.local").unwrap()
    }

    fn csr_with(alg: &'static SignatureAlgorithm, edit: impl FnOnce(&mut CertificateParams)) -> Vec<u8> {
        let key = KeyPair::generate_for(alg).unwrap();
        let mut params = CertificateParams::new(vec![name().to_string()]).unwrap();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name().as_str());
        params.distinguished_name = dn;
        edit(&mut params);
        params.serialize_request(&key).unwrap().der().to_vec()
    }

    fn csr(edit: impl FnOnce(&mut CertificateParams)) -> Vec<u8> {
        csr_with(&PKCS_ECDSA_P256_SHA256, edit)
    }

    #[test]
    fn accepts_what_proxies_send() {
        let (_, der) = cnimesh_identity::ca::new_csr(&name()).unwrap();
        validate(&der, &name()).unwrap();
        validate(&csr_with(&PKCS_ED25519, |_| {}), &name()).unwrap();
        validate(&csr(|p| p.distinguished_name = DistinguishedName::new()), &name()).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name().to_string()]).unwrap();
        params.distinguished_name = DistinguishedName::new();
        validate(params.serialize_request(&key).unwrap().pem().unwrap().as_bytes(), &name()).unwrap();
    }

    #[test]
    fn refuses_another_name() {
        let other = Name::for_service_account("db", "shop", "cluster.local").unwrap();
        assert!(matches!(validate(&csr(|_| {}), &other), Err(CsrError::Sans { .. })));
        let cn = csr(|p| {
            p.distinguished_name = DistinguishedName::new();
            p.distinguished_name.push(DnType::CommonName, other.as_str());
        });
        assert!(matches!(validate(&cn, &name()), Err(CsrError::CommonName { .. })));
    }

    #[test]
    fn refuses_extra_or_foreign_sans() {
        let extra = csr(|p| p.subject_alt_names.push(SanType::DnsName("evil.example".try_into().unwrap())));
        assert!(matches!(validate(&extra, &name()), Err(CsrError::Sans { .. })));
        let ip = csr(|p| p.subject_alt_names.push(SanType::IpAddress([10, 0, 0, 1].into())));
        assert!(matches!(validate(&ip, &name()), Err(CsrError::Sans { .. })));
        let none = csr(|p| p.subject_alt_names.clear());
        assert!(matches!(validate(&none, &name()), Err(CsrError::Sans { .. })));
    }

    #[test]
    fn refuses_a_ca_request() {
        let ca = csr(|p| p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained));
        assert_eq!(validate(&ca, &name()).unwrap_err(), CsrError::Ca);
    }

    #[test]
    fn refuses_other_key_types() {
        let p384 = csr_with(&PKCS_ECDSA_P384_SHA384, |_| {});
        let err = validate(&p384, &name()).unwrap_err();
        assert!(matches!(&err, CsrError::KeyType(k) if k.contains("1.3.132.0.34")), "{err}");
        let rsa = csr_with(&rcgen::PKCS_RSA_SHA256, |_| {});
        let err = validate(&rsa, &name()).unwrap_err();
        assert!(matches!(&err, CsrError::KeyType(k) if k.contains("1.2.840.113549.1.1.1")), "{err}");
    }

    #[test]
    fn refuses_garbage_and_bad_signatures() {
        assert_eq!(validate(b"", &name()).unwrap_err(), CsrError::Empty);
        assert!(matches!(validate(&[0u8; MAX_CSR_LEN + 1], &name()), Err(CsrError::TooLarge(_))));
        assert!(matches!(validate(b"\x30\x03garbage", &name()), Err(CsrError::Malformed(_))));
        let mut der = csr(|_| {});
        let last = der.len() - 1;
        der[last] ^= 0x01; // inside the signature
        assert!(matches!(validate(&der, &name()), Err(CsrError::Malformed(_))));
    }
}
