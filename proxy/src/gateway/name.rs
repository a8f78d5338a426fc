//! Which names a gateway forwards to: Services of its own cluster domain only.

use super::Refusal;

/// Why a transport header's name is not one the gateway serves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{0:?} is an address; the gateway forwards to Service names only")]
    Address(String),
    #[error("{name:?} is not a Service of this cluster (<service>.<namespace>.svc.{domain})")]
    Foreign { name: String, domain: String },
}

impl NameError {
    pub fn refusal(&self) -> Refusal {
        match self {
            NameError::Address(_) => Refusal::address_target,
            NameError::Foreign { .. } => Refusal::foreign_name,
        }
    }
}

/// `name` must be `<service>.<namespace>.svc.<domain>` with DNS labels for service and
/// namespace, and not an IP address in any spelling.
pub fn check(name: &str, domain: &str) -> Result<(), NameError> {
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return Err(NameError::Address(name.to_string()));
    }
    let foreign = || NameError::Foreign { name: name.to_string(), domain: domain.to_string() };
    let name_lower = name.trim_end_matches('.').to_ascii_lowercase();
    let suffix = format!(".svc.{}", domain.trim_end_matches('.').to_ascii_lowercase());
    let head = name_lower.strip_suffix(&suffix).ok_or_else(foreign)?;
    let (service, namespace) = head.split_once('.').ok_or_else(foreign)?;
    if [service, namespace].iter().all(|l| crate::outbound::ingress::dns_label(l)) { Ok(()) } else { Err(foreign()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_service_names_of_the_gateways_own_domain_pass() {
        assert_eq!(check("web.shop.svc.cluster.local", "cluster.local"), Ok(()));
        assert_eq!(check("Web.Shop.svc.cluster.local.", "cluster.local"), Ok(()));
        for ip in ["10.0.0.1", "::1", "[fd00::1]", "127.0.0.1"] {
            assert!(matches!(check(ip, "cluster.local"), Err(NameError::Address(_))), "{ip}");
        }
        for foreign in [
            "web.shop.svc.east.local",
            "example.com",
            "web.svc.cluster.local",
            "a.web.shop.svc.cluster.local",
            "web.shop.svc.cluster.local.evil.com",
            "web_x.shop.svc.cluster.local",
            ".shop.svc.cluster.local",
        ] {
            let e = check(foreign, "cluster.local").unwrap_err();
            assert_eq!(e.refusal(), Refusal::foreign_name, "{foreign}");
            assert!(e.to_string().contains(foreign.trim_end_matches('.')) || e.to_string().contains(foreign), "{e}");
        }
    }
}
