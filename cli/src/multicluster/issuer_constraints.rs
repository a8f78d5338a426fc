//! `multicluster check`'s "linked issuer constrained": the linked cluster's issuer, as its
//! gateway presents it, must be constrained to the Link's trust domain (an X.509 name
//! constraint, as `cnimesh ca issuer` writes it). Clusters share one trust anchor; without the
//! constraint the linked cluster's issuer could issue this cluster's identities, and this
//! cluster's proxies refuse its workloads for that reason.
//!
//! Layer: runtime (operator CLI), beside `probe`, whose chain it reads.

use cnimesh_identity::trust_domain::{self, Scope};
use rustls_pki_types::CertificateDer;

use super::super::check::{Category, Check};

/// The check for the chain a linked cluster's gateway presented (leaf first), whose identity is
/// of `trust_domain`.
pub fn check(category: &Category, chain: &[CertificateDer<'static>], trust_domain: &str) -> Check {
    const NAME: &str = "linked issuer constrained";
    match judge(chain, trust_domain) {
        Ok(what) => Check::ok(category, NAME, what),
        Err(why) => Check::fail(
            category,
            NAME,
            why,
            "re-issue the linked cluster's issuer with `cnimesh ca issuer --trust-domain <its trust domain>` from the shared anchor, and install it there",
        ),
    }
}

/// Why the chain's issuer may not issue `trust_domain`'s identities alone, or what it may issue.
pub fn judge(chain: &[CertificateDer<'static>], trust_domain: &str) -> Result<String, String> {
    let (leaf, intermediates) = chain.split_first().ok_or("the gateway presented no certificate")?;
    let identity = trust_domain::check(leaf, intermediates, &Scope::Constrained).map_err(|e| e.to_string())?;
    if identity.trust_domain() != Some(trust_domain) {
        return Err(format!("the gateway is {identity}, not of the Link's trust domain {trust_domain}"));
    }
    Ok(format!(
        "the issuer may issue identities of {trust_domain} only ({})",
        trust_domain::identity_subtree(trust_domain)
    ))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use cnimesh_identity::ca::{self, CaPem, Signer};

    const DAY: Duration = Duration::from_secs(86400);

    fn gateway_chain(issuer: &CaPem) -> Vec<CertificateDer<'static>> {
        let signer = Signer::new(issuer).unwrap();
        let name = cnimesh_identity::Name::parse(&super::super::gateway_identity("west.local")).unwrap();
        let (key, _) = ca::new_csr(&name).unwrap();
        let now = SystemTime::now();
        vec![signer.sign(&name, &key, now, now + DAY).unwrap(), signer.issuer_der.clone()]
    }

    #[test]
    fn a_linked_issuer_passes_only_when_constrained_to_the_links_trust_domain() {
        let anchor = ca::new_trust_anchor("cluster.local", DAY).unwrap();
        let constrained = gateway_chain(&ca::new_issuer(&anchor, "west.local", DAY).unwrap());
        let ok = judge(&constrained, "west.local").unwrap();
        assert!(ok.contains("identity.cnimesh.west.local"), "{ok}");
        assert!(judge(&constrained, "east.local").unwrap_err().contains("east.local"));
        let legacy = gateway_chain(&ca::new_unconstrained_issuer(&anchor, "west.local", DAY).unwrap());
        let why = judge(&legacy, "west.local").unwrap_err();
        assert!(why.contains("without name constraints"), "{why}");
        assert!(judge(&[], "west.local").is_err());
    }
}
