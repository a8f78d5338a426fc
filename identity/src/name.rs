//! Workload identity names. A name is a DNS name so that it can sit in a certificate's DNS SAN and
//! be checked by a stock TLS verifier: `<sa>.<ns>.serviceaccount.identity.cnimesh.<trust-domain>`.

use std::fmt;

pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// The audience a projected service-account token must carry to be accepted by Certify.
pub const TOKEN_AUDIENCE: &str = "identity.cnimesh.io";

/// The control plane's identity (its ServiceAccount `cnimesh_common::names::CONTROL_NAME` in
/// `CONTROL_NAMESPACE`, default trust domain); a test in the proxy keeps the two in step.
pub const DEFAULT_CONTROL_NAME: &str = "cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    #[error("{0:?} is not a DNS name (labels of a-z, 0-9 and '-', each 1..=63 long, 253 in all)")]
    NotDns(String),
    #[error("{0:?} is not a service-account identity of trust domain {1:?}")]
    NotServiceAccount(String, String),
}

/// A validated identity name (lower-case DNS name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

fn valid_label(label: &str) -> bool {
    (1..=63).contains(&label.len())
        && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

impl Name {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        if s.len() > 253 || !s.split('.').all(valid_label) {
            return Err(NameError::NotDns(s.to_string()));
        }
        Ok(Self(s.to_string()))
    }

    /// The identity of a Kubernetes service account.
    pub fn for_service_account(sa: &str, ns: &str, trust_domain: &str) -> Result<Self, NameError> {
        Self::parse(&format!("{sa}.{ns}.serviceaccount.identity.cnimesh.{trust_domain}"))
    }

    /// The `(service account, namespace)` this name stands for, if it is one of `trust_domain`.
    pub fn service_account(&self, trust_domain: &str) -> Result<(&str, &str), NameError> {
        let not = || NameError::NotServiceAccount(self.0.clone(), trust_domain.to_string());
        let rest =
            self.0.strip_suffix(trust_domain).and_then(|r| r.strip_suffix(".identity.cnimesh.")).ok_or_else(not)?;
        let rest = rest.strip_suffix(".serviceaccount").ok_or_else(not)?;
        match rest.split_once('.') {
            Some((sa, ns)) if !ns.contains('.') => Ok((sa, ns)),
            _ => Err(not()),
        }
    }

    /// The trust domain of a mesh identity (`<…>.identity.cnimesh.<trust-domain>`): what follows
    /// the first `identity.cnimesh.` label pair; `None` for other names.
    pub fn trust_domain(&self) -> Option<&str> {
        let at = self.0.find(".identity.cnimesh.")?;
        Some(&self.0[at + ".identity.cnimesh.".len()..])
    }

    /// The identity a certificate names: its first DNS SAN that is a valid name.
    pub fn of_certificate(cert: &[u8]) -> Option<Self> {
        let (_, x509) = x509_parser::parse_x509_certificate(cert).ok()?;
        let san = x509.subject_alternative_name().ok()??;
        san.value.general_names.iter().find_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(dns) => Self::parse(dns).ok(),
            _ => None,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Name {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_names_round_trip() {
        let n = Name::for_service_account("web", "shop", DEFAULT_TRUST_DOMAIN).unwrap();
        assert_eq!(n.as_str(), "web.shop.serviceaccount.identity.cnimesh.cluster.local");
        assert_eq!(n.service_account("cluster.local").unwrap(), ("web", "shop"));
        assert!(n.service_account("example.org").is_err());
        assert_eq!(n.trust_domain(), Some("cluster.local"));
        let west = Name::for_service_account("cnimesh-gateway", "cnimesh-multicluster", "west.local").unwrap();
        assert_eq!(west.trust_domain(), Some("west.local"));
        assert_eq!(Name::parse("hook.ns.svc").unwrap().trust_domain(), None);
        assert!(
            Name::parse("a.b.c.serviceaccount.identity.cnimesh.cluster.local")
                .unwrap()
                .service_account("cluster.local")
                .is_err()
        );
    }

    #[test]
    fn rejects_what_is_not_a_dns_name() {
        for bad in ["", "UPPER.x", "a..b", "-a.b", "a_b.c", &"a".repeat(64), "a b"] {
            assert!(Name::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Name::for_service_account("Web", "shop", "cluster.local").is_err());
    }
}
