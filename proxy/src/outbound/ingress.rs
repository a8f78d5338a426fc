//! Ingress mode: the proxy of an ingress controller's pod routes each outbound HTTP request by
//! the Service it names, not by the address the controller connected to. An ingress controller
//! resolves Services to pod IPs itself, so without this its requests would skip the Service's
//! routes (splits, retries, timeouts, per-route metrics). The name comes from a destination
//! override header the pod's app set ([`DST_OVERRIDE_HEADERS`], Linkerd's `l5d-dst-override`
//! too), else from the request's authority (`Host`).
//!
//! Only a name of a Service port the control plane knows changes where a request goes: anything
//! else (an external host, a Service that does not exist, a port it does not have) goes to its
//! original destination as in the default mode, under that destination's policy (an
//! EgressNetwork's verdict included). The pod's app can name only what it could reach anyway.
//!
//! An ingress controller that terminates TLS and passes a client's `Host` (a catch-all rule) or
//! override header on lets that client name any Service the ingress's identity is admitted to.
//! [`Namespaces`] bounds the names followed to the namespaces an operator lists
//! (`config.cnimesh.io/ingress-namespaces`); a name in any other namespace keeps the original
//! destination, as an unknown one does.

use http::Request;

use crate::http::headers::{DST_OVERRIDE_HEADERS, authority_of};

/// The cluster domain whose Services an ingress-mode proxy resolves by name, and the
/// namespaces it follows names into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ingress {
    pub cluster_domain: String,
    pub namespaces: Namespaces,
}

/// The namespaces whose Services an ingress-mode proxy routes to by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Namespaces {
    /// Every namespace (`*`, and the default: as Linkerd's ingress mode).
    #[default]
    All,
    /// Only these.
    Only(Vec<String>),
}

/// Why a namespaces list cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a namespace name (expected `*` or a comma-separated list of DNS labels)")]
pub struct NamespacesError(pub String);

impl Namespaces {
    /// `*` (or nothing) for every namespace, else a comma-separated list of namespace names.
    pub fn parse(value: &str) -> Result<Self, NamespacesError> {
        let value = value.trim();
        if value.is_empty() || value == "*" {
            return Ok(Namespaces::All);
        }
        let names = value
            .split(',')
            .map(|n| {
                let n = n.trim();
                dns_label(n).then(|| n.to_string()).ok_or_else(|| NamespacesError(n.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Namespaces::Only(names))
    }

    fn allows(&self, namespace: &str) -> bool {
        match self {
            Namespaces::All => true,
            Namespaces::Only(names) => names.iter().any(|n| n == namespace),
        }
    }
}

/// A Kubernetes name label: lowercase letters, digits and `-`, at most 63, no `-` at either end
/// (a Service's or a namespace's name; the gateway checks the names it forwards to with it too).
pub(crate) fn dns_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

/// Why a request's override cannot be followed: answered 400, never guessed at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverrideError {
    #[error("destination override headers disagree: {0:?}")]
    Ambiguous(Vec<String>),
    #[error("destination override {0:?} is not a host[:port]")]
    Invalid(String),
}

/// The Service a request names: `name.ns.svc.<domain>`, and the port if it gave one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedService {
    pub host: String,
    pub port: Option<u16>,
}

/// HTTP's default port: what a name without a port means when the connection's port is no
/// port of the Service (an ingress that connected to a pod's target port).
const HTTP_PORT: u16 = 80;

impl NamedService {
    /// The Service ports to ask about, in order (`name.ns.svc.<domain>:port`, as discovery and
    /// outbound policy are asked): the one named; without one, the connection's (`conn_port`),
    /// then HTTP's default.
    pub fn candidates(&self, conn_port: u16) -> Vec<String> {
        let ports = match self.port {
            Some(port) => vec![port],
            None if conn_port == HTTP_PORT => vec![HTTP_PORT],
            None => vec![conn_port, HTTP_PORT],
        };
        ports.into_iter().map(|port| format!("{}:{port}", self.host)).collect()
    }
}

impl Ingress {
    /// The Service `req` names, if its override or authority has the form of one; the override
    /// headers are taken off the request whatever they say.
    pub fn named<B>(&self, req: &mut Request<B>) -> Result<Option<NamedService>, OverrideError> {
        let mut overrides: Vec<String> = Vec::new();
        for name in &DST_OVERRIDE_HEADERS {
            for value in req.headers().get_all(name) {
                let value = value.to_str().map_err(|_| OverrideError::Invalid(format!("{value:?}")))?.trim();
                if !overrides.iter().any(|o| o == value) {
                    overrides.push(value.to_string());
                }
            }
        }
        crate::http::headers::strip_dst_override(req.headers_mut());
        let authority = match overrides.len() {
            0 => authority_of(req).to_string(),
            1 => overrides.remove(0),
            _ => return Err(OverrideError::Ambiguous(overrides)),
        };
        let (host, port) = split_port(&authority).ok_or_else(|| OverrideError::Invalid(authority.clone()))?;
        Ok(self.service_host(host).map(|host| NamedService { host, port }))
    }

    /// `name.ns.svc.<domain>` for a host of one of the forms `name.ns`, `name.ns.svc` and
    /// `name.ns.svc.<domain>` (any case, a trailing dot) in a namespace it may route to; `None`
    /// for any other host.
    fn service_host(&self, host: &str) -> Option<String> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let domain = self.cluster_domain.trim_end_matches('.');
        let short = host.strip_suffix(&format!(".svc.{domain}")).or_else(|| host.strip_suffix(".svc")).unwrap_or(&host);
        let (name, ns) = short.split_once('.')?;
        (dns_label(name) && dns_label(ns) && self.namespaces.allows(ns)).then(|| format!("{name}.{ns}.svc.{domain}"))
    }
}

/// `host[:port]` split; `None` when the port is not a number from 1 to 65535. An IPv6 literal
/// (`[..]`) has no port unless one follows the bracket.
fn split_port(authority: &str) -> Option<(&str, Option<u16>)> {
    let port_at = match authority.rfind(':') {
        Some(i) if !authority[i..].contains(']') => Some(i),
        _ => None,
    };
    match port_at {
        Some(i) => {
            let port = authority[i + 1..].parse::<u16>().ok().filter(|p| *p != 0)?;
            Some((&authority[..i], Some(port)))
        }
        None => Some((authority, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ingress() -> Ingress {
        Ingress { cluster_domain: "cluster.local".into(), namespaces: Namespaces::All }
    }

    fn named(headers: &[(&str, &str)]) -> Result<Option<String>, OverrideError> {
        let mut req = Request::get("/").body(()).unwrap();
        for (k, v) in headers {
            req.headers_mut().append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        let named = ingress().named(&mut req);
        for header in &DST_OVERRIDE_HEADERS {
            assert!(!req.headers().contains_key(header), "{header} taken off");
        }
        named.map(|n| n.map(|n| n.candidates(8080).join(" ")))
    }

    #[test]
    fn a_request_names_a_service_by_its_override_else_its_host() {
        let svc = |s: &str| Ok(Some(s.to_string()));
        type Case = (&'static str, Vec<(&'static str, &'static str)>, Result<Option<String>, OverrideError>);
        let table: Vec<Case> = vec![
            (
                "the full name and port",
                vec![("host", "web.shop.svc.cluster.local:80")],
                svc("web.shop.svc.cluster.local:80"),
            ),
            (
                "no port: the connection's, then HTTP's",
                vec![("host", "web.shop.svc.cluster.local")],
                svc("web.shop.svc.cluster.local:8080 web.shop.svc.cluster.local:80"),
            ),
            ("the short forms", vec![("host", "web.shop:80")], svc("web.shop.svc.cluster.local:80")),
            (
                "name.ns.svc",
                vec![("host", "Web.Shop.svc.")],
                svc("web.shop.svc.cluster.local:8080 web.shop.svc.cluster.local:80"),
            ),
            ("a host that is no Service name", vec![("host", "example")], Ok(None)),
            ("another cluster domain", vec![("host", "web.shop.svc.other.domain")], Ok(None)),
            ("an IP", vec![("host", "10.96.0.10:80")], Ok(None)),
            ("an IPv6 literal", vec![("host", "[fd00::1]:80")], Ok(None)),
            (
                "Linkerd's override wins over the host",
                vec![("host", "shop.example"), ("l5d-dst-override", "web.shop.svc.cluster.local:80")],
                svc("web.shop.svc.cluster.local:80"),
            ),
            (
                "ours too, and the same name twice is one",
                vec![("cnimesh-dst-override", "web.shop:80"), ("l5d-dst-override", "web.shop:80")],
                svc("web.shop.svc.cluster.local:80"),
            ),
            (
                "overrides that disagree are refused",
                vec![("cnimesh-dst-override", "web.shop:80"), ("l5d-dst-override", "admin.shop:80")],
                Err(OverrideError::Ambiguous(vec!["web.shop:80".into(), "admin.shop:80".into()])),
            ),
            (
                "an override whose port is not one",
                vec![("l5d-dst-override", "web.shop:http")],
                Err(OverrideError::Invalid("web.shop:http".into())),
            ),
        ];
        for (case, headers, expected) in table {
            assert_eq!(named(&headers), expected, "{case}");
        }
    }

    /// A client of a TLS-terminating ingress controls the `Host` a catch-all rule passes on, and
    /// any override header the controller does not overwrite: with a namespaces list, a name
    /// outside it is no Service name, and the request keeps its original destination.
    #[test]
    fn a_name_outside_the_listed_namespaces_is_not_followed_whoever_wrote_it() {
        let only_shop =
            Ingress { cluster_domain: "cluster.local".into(), namespaces: Namespaces::parse("shop, web").unwrap() };
        let name = |headers: &[(&str, &str)]| {
            let mut req = Request::get("/").body(()).unwrap();
            for (k, v) in headers {
                req.headers_mut().append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
            }
            let named = only_shop.named(&mut req).unwrap().map(|n| n.host);
            assert!(DST_OVERRIDE_HEADERS.iter().all(|h| !req.headers().contains_key(h)), "overrides taken off");
            named
        };
        assert_eq!(name(&[("host", "web.shop")]), Some("web.shop.svc.cluster.local".into()));
        assert_eq!(name(&[("host", "admin.internal")]), None, "a Host into another namespace");
        assert_eq!(name(&[("l5d-dst-override", "admin.internal.svc.cluster.local:80")]), None, "an override into one");
        assert_eq!(name(&[("cnimesh-dst-override", "kube-dns.kube-system:53")]), None);
        assert_eq!(Namespaces::parse("*").unwrap(), Namespaces::All);
        assert_eq!(Namespaces::parse("").unwrap(), Namespaces::All);
        assert_eq!(Namespaces::parse("shop,Bad_NS"), Err(NamespacesError("Bad_NS".into())));
        assert_eq!(Namespaces::parse("shop,,web"), Err(NamespacesError(String::new())));
    }
}
