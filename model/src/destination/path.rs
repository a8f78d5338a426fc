//! What a `GetDestination.path` names: a service port or a socket address.
//!
//! Layer: model/index (pure).

use std::net::SocketAddr;

use crate::meta::NsName;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Service { key: NsName, port: u16 },
    Addr(SocketAddr),
}

/// Each message says what was wrong and what would have been right: it ends up in a proxy's log.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    #[error("path {0:?} has no port: expected <service>.<namespace>.svc.{1}:<port> or <ip>:<port>")]
    NoPort(String, String),
    #[error("path {0:?} has an invalid port {1:?}: expected 1-65535")]
    BadPort(String, String),
    #[error(
        "path {0:?} is not a service in cluster domain {1:?}: expected <service>.<namespace>.svc.{1}:<port> (or <service>.<namespace>[.svc]:<port>)"
    )]
    NotService(String, String),
}

/// Accepts `svc.ns.svc.<domain>:port`, the short forms `svc.ns.svc:port` and `svc.ns:port`, a
/// trailing dot, any letter case, and `ip:port` / `[ipv6]:port`.
pub fn parse(path: &str, cluster_domain: &str) -> Result<Target, PathError> {
    if let Ok(addr) = path.parse::<SocketAddr>() {
        return Ok(Target::Addr(addr));
    }
    let domain = || cluster_domain.to_string();
    let (host, port) = path.rsplit_once(':').ok_or_else(|| PathError::NoPort(path.to_string(), domain()))?;
    let port = match port.parse::<u16>() {
        Ok(p) if p != 0 => p,
        _ => return Err(PathError::BadPort(path.to_string(), port.to_string())),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let full_suffix = format!(".svc.{}", cluster_domain.trim_end_matches('.').to_ascii_lowercase());
    let short = host.strip_suffix(&full_suffix).or_else(|| host.strip_suffix(".svc")).unwrap_or(&host);
    match short.split_once('.') {
        Some((name, namespace)) if !name.is_empty() && !namespace.is_empty() && !namespace.contains('.') => {
            Ok(Target::Service { key: NsName::new(namespace, name), port })
        }
        _ => Err(PathError::NotService(path.to_string(), domain())),
    }
}

/// [`parse`] for the fuzz crate (fuzz/), which feeds it untrusted paths: the service (its key and
/// port) or the socket address the path names, or the error message a proxy would see.
#[doc(hidden)]
pub fn parse_for_fuzzing(path: &str, cluster_domain: &str) -> Result<Result<(NsName, u16), SocketAddr>, String> {
    match parse(path, cluster_domain) {
        Ok(Target::Service { key, port }) => Ok(Ok((key, port))),
        Ok(Target::Addr(addr)) => Ok(Err(addr)),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, port: u16) -> Result<Target, PathError> {
        Ok(Target::Service { key: NsName::new(ns, name), port })
    }

    #[test]
    fn service_forms() {
        for path in
            ["web.shop.svc.cluster.local:80", "web.shop.svc:80", "web.shop:80", "Web.Shop.svc.cluster.local.:80"]
        {
            assert_eq!(parse(path, "cluster.local"), svc("shop", "web", 80), "{path}");
        }
        assert_eq!(parse("web.shop.svc.corp.example:80", "corp.example"), svc("shop", "web", 80));
    }

    #[test]
    fn addresses() {
        assert_eq!(parse("10.1.2.3:8080", "cluster.local"), Ok(Target::Addr("10.1.2.3:8080".parse().unwrap())));
        assert_eq!(parse("[fd00::1]:443", "cluster.local"), Ok(Target::Addr("[fd00::1]:443".parse().unwrap())));
    }

    #[test]
    fn errors_are_precise() {
        let err = |p: &str| parse(p, "cluster.local").unwrap_err();
        assert!(matches!(err("web.shop.svc.cluster.local"), PathError::NoPort(..)));
        assert!(matches!(err("web.shop:http"), PathError::BadPort(..)));
        assert!(matches!(err("web.shop:0"), PathError::BadPort(..)));
        assert!(matches!(err("web:80"), PathError::NotService(..)));
        assert!(matches!(err("web.shop.svc.other.domain:80"), PathError::NotService(..)));
        assert_eq!(
            err("web:80").to_string(),
            "path \"web:80\" is not a service in cluster domain \"cluster.local\": expected \
             <service>.<namespace>.svc.cluster.local:<port> (or <service>.<namespace>[.svc]:<port>)"
        );
    }
}
