//! ServiceAccounts Identity does not serve: those of the control plane's namespace and the node
//! agent's. None of them runs a proxy (both namespaces are kept out of capture), and the control
//! plane issues its own certificate in process (`own_cert`), not through Certify. A token for
//! one of them is still a valid token, though, and some are easy to mint: whoever may use the tap
//! Role can request a token for `cnimesh-tap` with any audience. Certifying such a
//! token would hand out a mesh identity the policy of every workload may trust.
//!
//! Layer: model: a pure check on the requested identity, applied before the token is reviewed.

use std::collections::BTreeSet;

use cnimesh_common::names::{AGENT_NAMESPACE, CONTROL_NAMESPACE};

/// Which namespaces' ServiceAccounts are refused, and the explicit exceptions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    pub namespaces: BTreeSet<String>,
    /// `(namespace, serviceaccount)` pairs served even though their namespace is reserved:
    /// for an operator who does mesh a pod of those namespaces on purpose.
    pub allowed: BTreeSet<(String, String)>,
}

impl Default for Reserved {
    fn default() -> Self {
        Self::for_namespaces([CONTROL_NAMESPACE, AGENT_NAMESPACE])
    }
}

/// The reason a reserved account is refused, for the PERMISSION_DENIED message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "service account {namespace}/{name} belongs to the control plane (namespace {namespace} is reserved): Identity issues no mesh certificates to it"
)]
pub struct ReservedAccount {
    pub namespace: String,
    pub name: String,
}

impl Reserved {
    pub fn for_namespaces<S: Into<String>>(namespaces: impl IntoIterator<Item = S>) -> Self {
        Self { namespaces: namespaces.into_iter().map(Into::into).collect(), allowed: BTreeSet::new() }
    }

    /// Serves `namespace/name` even though its namespace is reserved.
    pub fn allow(mut self, namespace: &str, name: &str) -> Self {
        self.allowed.insert((namespace.to_string(), name.to_string()));
        self
    }

    pub fn check(&self, namespace: &str, name: &str) -> Result<(), ReservedAccount> {
        if !self.namespaces.contains(namespace) || self.allowed.contains(&(namespace.to_string(), name.to_string())) {
            return Ok(());
        }
        Err(ReservedAccount { namespace: namespace.to_string(), name: name.to_string() })
    }
}

/// `namespace/name`, as `--identity-allow-service-account` takes it.
pub fn parse_account(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("{s:?}: expected namespace/serviceaccount")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_plane_and_agent_namespaces_are_refused_unless_an_account_is_allowed() {
        let reserved = Reserved::default();
        let e = reserved.check("cnimesh", "cnimesh-tap").unwrap_err();
        assert!(e.to_string().contains("cnimesh/cnimesh-tap belongs to the control plane"), "{e}");
        assert!(reserved.check("cnimesh-system", "cnimesh-node").is_err());
        assert!(reserved.check("cnimesh", "anything").is_err());
        assert!(reserved.check("shop", "cnimesh-tap").is_ok());
        let reserved = reserved.allow("cnimesh", "grafana");
        assert!(reserved.check("cnimesh", "grafana").is_ok());
        assert!(reserved.check("cnimesh", "cnimesh-tap").is_err());
    }

    #[test]
    fn allowed_accounts_are_written_namespace_slash_name() {
        assert_eq!(parse_account("cnimesh/grafana"), Ok(("cnimesh".into(), "grafana".into())));
        for bad in ["cnimesh", "/x", "x/", "a/b/c", ""] {
            assert!(parse_account(bad).is_err(), "{bad}");
        }
    }
}
