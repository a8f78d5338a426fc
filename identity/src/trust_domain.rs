//! Trust domains that mean something. Linked clusters share one trust anchor, each with its own
//! issuer and trust domain, so a chain that verifies against the anchors only proves that *some*
//! issuer signed it. Each issuer is therefore constrained to its own trust domain: an X.509 name
//! constraint permitting the DNS subtree `identity.cnimesh.<trust-domain>` (written by
//! [`crate::ca::new_issuer`]), which every WebPKI verifier enforces (ours and linkerd2-proxy's).
//!
//! [`check`] is what our verifiers add after WebPKI: the peer's identity must be of a trust
//! domain its issuer is constrained to, and an issuer without constraints (made before issuers
//! carried them) is accepted only where it cannot speak for another cluster: for identities of
//! the verifier's own trust domain, in a mesh whose own issuer is unconstrained too. A mesh whose
//! issuer is constrained refuses every unconstrained issuer, so one old issuer in a linked
//! cluster cannot mint this cluster's identities.
//!
//! Layer: certificates (below the TLS configs, which call it at every handshake).

use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use crate::Name;
use crate::current::CurrentCert;

/// The DNS subtree an issuer of `trust_domain` is constrained to: every identity of the trust
/// domain, nothing else.
pub fn identity_subtree(trust_domain: &str) -> String {
    format!("identity.cnimesh.{trust_domain}")
}

/// Why a peer's chain may not vouch for the identity it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssuanceError {
    #[error("the certificate names no mesh identity")]
    NoIdentity,
    #[error("{0} is not a mesh identity of a trust domain (<…>.identity.cnimesh.<trust-domain>)")]
    NoTrustDomain(Name),
    #[error(
        "{identity} is of trust domain {trust_domain}, but its issuer ({issuer}) is constrained to {permitted:?}: \
         one cluster's issuer does not speak for another trust domain"
    )]
    OutsideConstraints { identity: Name, trust_domain: String, issuer: String, permitted: Vec<String> },
    #[error(
        "{identity} comes from an issuer without name constraints ({issuer}), which could speak for any trust \
         domain; it is accepted only for this mesh's own trust domain while this mesh's issuer is unconstrained \
         too. Re-issue it with `cnimesh ca issuer --trust-domain {trust_domain}`"
    )]
    Unconstrained { identity: Name, trust_domain: String, issuer: String },
}

/// What a verifier accepts from issuers, by what its own issuer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every issuer must be constrained to its peer's trust domain.
    Constrained,
    /// A mesh whose own issuer predates constraints: an unconstrained issuer is accepted for
    /// identities of `trust_domain` (the verifier's own) only.
    Unconstrained { trust_domain: String },
}

/// A verifier's own side: its identity and the certificate it presents now, whose issuer
/// decides the [`Scope`] (so an issuer rotated to a constrained one tightens it at once).
#[derive(Debug, Clone)]
pub struct Verifying {
    pub own: Name,
    pub cert: Arc<CurrentCert>,
}

impl Verifying {
    pub fn new(own: Name, cert: Arc<CurrentCert>) -> Self {
        Self { own, cert }
    }

    /// The scope as of now. Without a certificate yet (a proxy's first connection, to Certify)
    /// the issuer it will get is unknown: unconstrained issuers are then accepted for its own
    /// trust domain alone, the control plane's; its own issuer decides from then on.
    pub fn scope(&self) -> Scope {
        let own_issuer_unconstrained = match self.cert.get() {
            None => true,
            Some(key) => match key.cert.split_first() {
                Some((leaf, intermediates)) => {
                    issuers(leaf, intermediates).is_some_and(|i| i.iter().all(|c| c.permitted.is_empty()))
                }
                None => true,
            },
        };
        match (own_issuer_unconstrained, self.own.trust_domain()) {
            (true, Some(trust_domain)) => Scope::Unconstrained { trust_domain: trust_domain.to_string() },
            _ => Scope::Constrained,
        }
    }

    /// [`check`] in this verifier's scope.
    pub fn check(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<Name, IssuanceError> {
        check(leaf, intermediates, &self.scope())
    }
}

/// One certificate that may have issued the leaf, as far as this check cares.
struct Candidate {
    subject: String,
    /// Its permitted DNS subtrees (none: unconstrained).
    permitted: Vec<String>,
}

/// The presented certificates that may have issued `leaf`: those named as its issuer, except
/// self-issued ones (roots: only trust anchors end a path, and WebPKI applies theirs). `None`
/// when the leaf does not parse.
fn issuers(leaf: &CertificateDer<'_>, intermediates: &[CertificateDer<'_>]) -> Option<Vec<Candidate>> {
    let (_, leaf) = x509_parser::parse_x509_certificate(leaf).ok()?;
    let candidates = intermediates
        .iter()
        .filter_map(|der| x509_parser::parse_x509_certificate(der).ok().map(|(_, c)| c))
        .filter(|c| c.subject().as_raw() == leaf.issuer().as_raw() && c.subject().as_raw() != c.issuer().as_raw())
        .map(|c| Candidate { subject: c.subject().to_string(), permitted: permitted_dns(&c) })
        .collect();
    Some(candidates)
}

/// A CA certificate's permitted DNS subtrees (without a leading dot), empty when it has none.
pub fn permitted_dns(cert: &X509Certificate<'_>) -> Vec<String> {
    let Ok(Some(constraints)) = cert.name_constraints() else { return Vec::new() };
    let Some(permitted) = &constraints.value.permitted_subtrees else { return Vec::new() };
    permitted
        .iter()
        .filter_map(|s| match &s.base {
            GeneralName::DNSName(dns) => Some(dns.trim_start_matches('.').to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// The permitted DNS subtrees of a certificate given as DER (e.g. an issuer's), empty when it has
/// none or does not parse.
pub fn permitted_dns_of(cert: &CertificateDer<'_>) -> Vec<String> {
    x509_parser::parse_x509_certificate(cert).map(|(_, c)| permitted_dns(&c)).unwrap_or_default()
}

/// Whether every subtree in `permitted` lies within `trust_domain`'s identities: the issuer may
/// issue for that trust domain and no other.
pub fn confined_to(permitted: &[String], trust_domain: &str) -> bool {
    let root = identity_subtree(trust_domain);
    !permitted.is_empty()
        && permitted.iter().all(|p| *p == root || p.strip_suffix(&root).is_some_and(|head| head.ends_with('.')))
}

/// Checks that the chain a peer presented (already verified by WebPKI) may vouch for the
/// identity its leaf names, in `scope`; returns that identity.
pub fn check(
    leaf: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    scope: &Scope,
) -> Result<Name, IssuanceError> {
    let identity = Name::of_certificate(leaf).ok_or(IssuanceError::NoIdentity)?;
    let trust_domain =
        identity.trust_domain().ok_or_else(|| IssuanceError::NoTrustDomain(identity.clone()))?.to_string();
    let candidates = issuers(leaf, intermediates).ok_or(IssuanceError::NoIdentity)?;
    // No issuer among what was presented: a leaf signed by an anchor itself, constrained by
    // nothing of ours.
    let unconstrained = |issuer: &str| {
        let own = matches!(scope, Scope::Unconstrained { trust_domain: own } if *own == trust_domain);
        if own {
            Ok(())
        } else {
            Err(IssuanceError::Unconstrained {
                identity: identity.clone(),
                trust_domain: trust_domain.clone(),
                issuer: issuer.to_string(),
            })
        }
    };
    if candidates.is_empty() {
        unconstrained("a trust anchor")?;
    }
    for candidate in &candidates {
        if candidate.permitted.is_empty() {
            unconstrained(&candidate.subject)?;
        } else if !confined_to(&candidate.permitted, &trust_domain) {
            return Err(IssuanceError::OutsideConstraints {
                identity: identity.clone(),
                trust_domain: trust_domain.clone(),
                issuer: candidate.subject.clone(),
                permitted: candidate.permitted.clone(),
            });
        }
    }
    Ok(identity)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::ca::{self, CaPem, Signer};

    const HOUR: Duration = Duration::from_secs(3600);

    fn leaf(issuer: &CaPem, name: &Name) -> (CertificateDer<'static>, CertificateDer<'static>) {
        let signer = Signer::new(issuer).unwrap();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let now = SystemTime::now();
        let leaf = signer.sign(name, &key, now - Duration::from_secs(60), now + HOUR).unwrap();
        (leaf, signer.issuer_der.clone())
    }

    /// An issuer as `cnimesh ca issuer` made them before they carried constraints.
    fn unconstrained_issuer(anchor: &CaPem, trust_domain: &str) -> CaPem {
        ca::new_unconstrained_issuer(anchor, trust_domain, HOUR).unwrap()
    }

    fn name(sa: &str, td: &str) -> Name {
        Name::for_service_account(sa, "shop", td).unwrap()
    }

    #[test]
    fn an_issuer_vouches_for_its_own_trust_domain_only() {
        let anchor = ca::new_trust_anchor("cluster.local", HOUR).unwrap();
        let west = ca::new_issuer(&anchor, "west.local", HOUR).unwrap();
        let (ok, issuer) = leaf(&west, &name("web", "west.local"));
        assert_eq!(check(&ok, std::slice::from_ref(&issuer), &Scope::Constrained), Ok(name("web", "west.local")));
        // WebPKI refuses a leaf outside the constraint; the check names why on its own too.
        let (forged, issuer) = leaf(&west, &name("client", "cluster.local"));
        let roots = crate::tls::roots(&crate::pem::certs(anchor.cert_pem.as_bytes(), "anchor").unwrap()).unwrap();
        assert!(
            crate::tls::verify(roots, &[forged.clone(), issuer.clone()], &name("client", "cluster.local")).is_err()
        );
        assert!(matches!(
            check(&forged, &[issuer], &Scope::Constrained),
            Err(IssuanceError::OutsideConstraints { ref trust_domain, .. }) if trust_domain == "cluster.local"
        ));
    }

    #[test]
    fn an_unconstrained_issuer_is_accepted_only_for_the_own_trust_domain_of_an_unconstrained_mesh() {
        let anchor = ca::new_trust_anchor("cluster.local", HOUR).unwrap();
        let legacy = unconstrained_issuer(&anchor, "west.local");
        let (forged, issuer) = leaf(&legacy, &name("client", "cluster.local"));
        let chain = [issuer];
        let error = check(&forged, &chain, &Scope::Constrained).unwrap_err();
        assert!(matches!(error, IssuanceError::Unconstrained { .. }), "{error}");
        assert!(error.to_string().contains("cnimesh ca issuer"), "{error}");
        let own = Scope::Unconstrained { trust_domain: "cluster.local".into() };
        assert_eq!(check(&forged, &chain, &own), Ok(name("client", "cluster.local")), "a mesh of one trust domain");
        let other = Scope::Unconstrained { trust_domain: "east.local".into() };
        assert!(matches!(check(&forged, &chain, &other), Err(IssuanceError::Unconstrained { .. })));
        // A constrained issuer presented beside the unconstrained one changes nothing.
        let east = ca::new_issuer(&anchor, "cluster.local", HOUR).unwrap();
        let (_, east_issuer) = leaf(&east, &name("web", "cluster.local"));
        let mixed = [east_issuer, chain[0].clone()];
        assert!(matches!(check(&forged, &mixed, &Scope::Constrained), Err(IssuanceError::Unconstrained { .. })));
        // Without its issuer in the chain (signed by an anchor): unconstrained as well.
        assert!(matches!(check(&forged, &[], &Scope::Constrained), Err(IssuanceError::Unconstrained { .. })));
    }

    #[test]
    fn the_scope_follows_the_verifiers_own_issuer() {
        let anchor = ca::new_trust_anchor("cluster.local", HOUR).unwrap();
        let own = name("web", "cluster.local");
        let cert = Arc::new(CurrentCert::default());
        let verifying = Verifying::new(own.clone(), cert.clone());
        let own_only = Scope::Unconstrained { trust_domain: "cluster.local".into() };
        assert_eq!(verifying.scope(), own_only, "no certificate yet: the own trust domain's issuer is unknown");
        let present = |issuer: &CaPem| {
            let (leaf, issuer_der) = leaf(issuer, &own);
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            // The key does not matter to the scope; a CertifiedKey needs one that parses.
            let key = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
            cert.set(Arc::new(rustls::sign::CertifiedKey::new(
                vec![leaf, issuer_der],
                crate::tls::provider().key_provider.load_private_key(key).unwrap(),
            )));
        };
        present(&unconstrained_issuer(&anchor, "cluster.local"));
        assert_eq!(verifying.scope(), own_only);
        present(&ca::new_issuer(&anchor, "cluster.local", HOUR).unwrap());
        assert_eq!(verifying.scope(), Scope::Constrained);
    }

    #[test]
    fn confinement_is_to_the_trust_domains_identities() {
        assert!(confined_to(&["identity.cnimesh.west.local".into()], "west.local"));
        assert!(confined_to(&["shop.identity.cnimesh.west.local".into()], "west.local"));
        assert!(!confined_to(&["identity.cnimesh.west.local".into(), "local".into()], "west.local"));
        assert!(!confined_to(&["xidentity.cnimesh.west.local".into()], "west.local"));
        assert!(!confined_to(&["cnimesh.west.local".into()], "west.local"));
        assert!(!confined_to(&[], "west.local"));
    }
}
