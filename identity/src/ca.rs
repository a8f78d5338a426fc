//! Certificate authorities: generating a trust anchor and an issuer (`cnimesh ca init`,
//! local mode, tests) and signing workload leaves with the issuer; also a private CA and a TLS
//! server certificate for DNS names (the injection webhook's), so that every certificate the
//! project makes comes from this one module.
//!
//! Leaves carry exactly one DNS SAN (the identity), both server and client auth (a proxy is
//! both), and nothing the requester asked for beyond its public key: the CSR only proves
//! possession of the key.

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyUsagePurpose, NameConstraints, PublicKeyData, SanType, SerialNumber,
};
use rustls_pki_types::CertificateDer;

/// The key type of [`new_csr`] and [`csr_for`], for holders that keep it (`KeyPair::from_pem`,
/// `serialize_pem`).
pub use rcgen::KeyPair;

use crate::{Name, trust_domain};

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{0} is not a valid DNS name for a certificate")]
    Name(String),
    #[error("issuer certificate: {0}")]
    IssuerCert(String),
    #[error("no DNS names for the certificate")]
    NoNames,
}

/// A CA certificate and its key, both PEM.
#[derive(Debug, Clone)]
pub struct CaPem {
    pub cert_pem: String,
    pub key_pem: String,
}

fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    crate::tls::random(&mut bytes);
    bytes[0] &= 0x7f; // positive
    SerialNumber::from_slice(&bytes)
}

fn ca_params(common_name: &str, path_len: u8, lifetime: Duration) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(path_len));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let now = SystemTime::now();
    params.not_before = (now - Duration::from_secs(300)).into();
    params.not_after = (now + lifetime).into();
    params.serial_number = Some(random_serial());
    params
}

/// A fresh ECDSA P-256 key, the mesh's one kind.
pub fn new_key() -> Result<KeyPair, CaError> {
    Ok(KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?)
}

/// A self-signed root for `trust_domain`.
pub fn new_trust_anchor(trust_domain: &str, lifetime: Duration) -> Result<CaPem, CaError> {
    let key = new_key()?;
    let cert = ca_params(&format!("root.cnimesh.{trust_domain}"), 1, lifetime).self_signed(&key)?;
    Ok(CaPem { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// An intermediate signed by `anchor`: the key the control plane holds (the root's key can then
/// stay offline). It is constrained to `trust_domain` (a permitted DNS subtree
/// `identity.cnimesh.<trust-domain>`): clusters that share the anchor cannot issue each other's
/// identities ([`crate::trust_domain`]).
pub fn new_issuer(anchor: &CaPem, trust_domain: &str, lifetime: Duration) -> Result<CaPem, CaError> {
    let mut params = ca_params(&trust_domain::identity_subtree(trust_domain), 0, lifetime);
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: vec![GeneralSubtree::DnsName(trust_domain::identity_subtree(trust_domain))],
        excluded_subtrees: Vec::new(),
    });
    sign_issuer(anchor, params)
}

/// An issuer without name constraints, as they were made before issuers carried them: what
/// verifiers must refuse wherever it could speak for another cluster's trust domain (tests).
pub fn new_unconstrained_issuer(anchor: &CaPem, trust_domain: &str, lifetime: Duration) -> Result<CaPem, CaError> {
    sign_issuer(anchor, ca_params(&trust_domain::identity_subtree(trust_domain), 0, lifetime))
}

fn sign_issuer(anchor: &CaPem, params: CertificateParams) -> Result<CaPem, CaError> {
    let anchor_key = KeyPair::from_pem(&anchor.key_pem)?;
    let anchor_issuer = Issuer::from_ca_cert_pem(&anchor.cert_pem, anchor_key)?;
    let key = new_key()?;
    let cert = params.signed_by(&key, &anchor_issuer)?;
    Ok(CaPem { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// A self-signed CA that signs leaves only (path length 0), for one private purpose such as the
/// API server's `caBundle` for a webhook: never a mesh trust anchor.
pub fn new_private_ca(common_name: &str, lifetime: Duration) -> Result<CaPem, CaError> {
    let key = new_key()?;
    let cert = ca_params(common_name, 0, lifetime).self_signed(&key)?;
    Ok(CaPem { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// Signs workload leaves with an issuer.
pub struct Signer {
    issuer: Issuer<'static, KeyPair>,
    /// The issuer's own certificate, sent after the leaf.
    pub issuer_der: CertificateDer<'static>,
    /// The issuer's own expiry: no leaf outlives it.
    pub issuer_not_after: SystemTime,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("issuer_not_after", &self.issuer_not_after).finish_non_exhaustive()
    }
}

impl Signer {
    pub fn new(issuer: &CaPem) -> Result<Self, CaError> {
        let key = KeyPair::from_pem(&issuer.key_pem)?;
        let issuer_der = crate::pem::certs(issuer.cert_pem.as_bytes(), "issuer certificate")
            .map_err(|e| CaError::IssuerCert(e.to_string()))?
            .remove(0);
        let issuer_not_after = crate::tls::not_after(&issuer_der).map_err(|e| CaError::IssuerCert(e.to_string()))?;
        Ok(Self { issuer: Issuer::from_ca_cert_der(&issuer_der, key)?, issuer_der, issuer_not_after })
    }

    /// A leaf for `name` and `public_key`, valid from `not_before` until `not_after` (capped at
    /// the issuer's own expiry).
    pub fn sign(
        &self,
        name: &Name,
        public_key: &impl PublicKeyData,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<CertificateDer<'static>, CaError> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name.as_str());
        params.distinguished_name = dn;
        let dns = name.as_str().try_into().map_err(|_| CaError::Name(name.to_string()))?;
        params.subject_alt_names = vec![SanType::DnsName(dns)];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = not_before.into();
        params.not_after = not_after.min(self.issuer_not_after).into();
        params.serial_number = Some(random_serial());
        Ok(params.signed_by(public_key, &self.issuer)?.into())
    }
}

impl Signer {
    /// A fresh key and a TLS server certificate (server auth only) for `dns_names`, the first
    /// also its common name, valid from five minutes ago (clock skew) for `lifetime`, capped at
    /// the issuer's own expiry. Returns the certificate and its key as PEM.
    pub fn new_server_cert(&self, dns_names: &[String], lifetime: Duration) -> Result<CaPem, CaError> {
        let first = dns_names.first().ok_or(CaError::NoNames)?;
        let key = new_key()?;
        let mut params = CertificateParams::new(dns_names.to_vec())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, first.as_str());
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = SystemTime::now();
        params.not_before = (now - Duration::from_secs(300)).into();
        params.not_after = (now + lifetime).min(self.issuer_not_after).into();
        params.serial_number = Some(random_serial());
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CaPem { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

/// A fresh key and a CSR for `name`: what a proxy sends to Certify. The key never leaves memory.
pub fn new_csr(name: &Name) -> Result<(KeyPair, Vec<u8>), CaError> {
    let key = new_key()?;
    let csr = csr_for(&key, name)?;
    Ok((key, csr))
}

/// A CSR for `name` with a key already held (an ExternalWorkload's proxy keeps its key across
/// restarts, in its state directory).
pub fn csr_for(key: &KeyPair, name: &Name) -> Result<Vec<u8>, CaError> {
    let mut params = CertificateParams::new(vec![name.to_string()])?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name.as_str());
    params.distinguished_name = dn;
    let csr = params.serialize_request(key)?;
    Ok(csr.der().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls;

    /// An issuer (of `issuer_lifetime`) under `anchor`, and a fresh key for `web.shop`.
    fn setup(anchor: &CaPem, issuer_lifetime: u64) -> (Signer, Name, KeyPair) {
        let issuer = new_issuer(anchor, "cluster.local", Duration::from_secs(issuer_lifetime)).unwrap();
        let name = Name::for_service_account("web", "shop", "cluster.local").unwrap();
        let (key, _csr) = new_csr(&name).unwrap();
        (Signer::new(&issuer).unwrap(), name, key)
    }

    fn anchor() -> CaPem {
        new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap()
    }

    #[test]
    fn a_signed_leaf_chains_to_the_anchor_for_its_name_only() {
        let anchor = anchor();
        let (signer, name, key) = setup(&anchor, 3600);
        let now = SystemTime::now();
        let leaf = signer.sign(&name, &key, now - Duration::from_secs(10), now + Duration::from_secs(60)).unwrap();
        let roots = tls::roots(&crate::pem::certs(anchor.cert_pem.as_bytes(), "anchor").unwrap()).unwrap();
        let chain = vec![leaf.clone(), signer.issuer_der.clone()];
        tls::verify(roots.clone(), &chain, &name).unwrap();
        let other = Name::for_service_account("db", "shop", "cluster.local").unwrap();
        assert!(tls::verify(roots.clone(), &chain, &other).is_err(), "another name must not verify");
        assert!(tls::verify(roots, &chain[..1], &name).is_err(), "the issuer is needed in the chain");
        assert_eq!(tls::identity_of(&leaf), Some(name));
        let expires = tls::not_after(&leaf).unwrap();
        assert!(expires <= now + Duration::from_secs(61) && expires >= now + Duration::from_secs(58));
    }

    #[test]
    fn leaves_never_outlive_their_issuer() {
        let (signer, name, key) = setup(&anchor(), 120);
        let now = SystemTime::now();
        let leaf = signer.sign(&name, &key, now, now + Duration::from_secs(86400)).unwrap();
        assert_eq!(tls::not_after(&leaf).unwrap(), tls::not_after(&signer.issuer_der).unwrap());
    }

    #[test]
    fn a_server_certificate_verifies_for_its_dns_names_only() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls_pki_types::{ServerName, UnixTime};

        let ca = new_private_ca("test CA", Duration::from_secs(3600)).unwrap();
        let signer = Signer::new(&ca).unwrap();
        let names = ["hook.ns.svc.cluster.local".to_string(), "hook.ns.svc".to_string()];
        let server = signer.new_server_cert(&names, Duration::from_secs(600)).unwrap();
        let leaf = crate::pem::certs(server.cert_pem.as_bytes(), "leaf").unwrap().remove(0);
        crate::pem::key(server.key_pem.as_bytes(), "key").unwrap();
        let roots = tls::roots(&crate::pem::certs(ca.cert_pem.as_bytes(), "ca").unwrap()).unwrap();
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots, tls::provider()).build().unwrap();
        let verify = |name: &str| {
            let name = ServerName::try_from(name.to_string()).unwrap();
            verifier.verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
        };
        for name in &names {
            verify(name).unwrap();
        }
        assert!(verify("other.ns.svc").is_err(), "another name must not verify");
        let expires = tls::not_after(&leaf).unwrap();
        assert!(expires <= SystemTime::now() + Duration::from_secs(601));
        assert!(matches!(signer.new_server_cert(&[], Duration::from_secs(60)), Err(CaError::NoNames)));
    }

    #[test]
    fn an_issuer_from_another_root_does_not_verify() {
        let (stranger, anchor) = (anchor(), anchor());
        let (signer, name, key) = setup(&stranger, 3600);
        let now = SystemTime::now();
        let leaf = signer.sign(&name, &key, now, now + Duration::from_secs(60)).unwrap();
        let roots = tls::roots(&crate::pem::certs(anchor.cert_pem.as_bytes(), "anchor").unwrap()).unwrap();
        assert!(tls::verify(roots, &[leaf, signer.issuer_der.clone()], &name).is_err());
    }
}
