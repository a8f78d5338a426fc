//! Proxy configuration from `CNIMESH_PROXY_*` environment variables. With none set, the proxy runs
//! with DESIGN.md §2's defaults.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use cnimesh_common::names::{PROXY_ADMIN_PORT, PROXY_INBOUND_PORT, PROXY_OUTBOUND_PORT};
use cnimesh_identity::Name;

#[derive(Debug, Clone)]
pub struct Config {
    pub inbound: Vec<SocketAddr>,
    pub outbound: Vec<SocketAddr>,
    pub admin: SocketAddr,
    pub detect_timeout: Duration,
    /// HTTP/1: time for a request's headers to arrive, which includes a keep-alive connection's
    /// idle wait for its next request (hyper counts both), so it is far longer than detection.
    pub header_timeout: Duration,
    /// Ports whose traffic is forwarded as opaque TCP without detection (server-speaks-first).
    pub opaque_ports: Vec<u16>,
    /// Opaque connections with no bytes either way for this long are closed.
    pub idle_timeout: Duration,
    /// How long to upstream connect before answering 504 / closing.
    pub connect_timeout: Duration,
    /// On SIGTERM, how long in-flight work may take before the proxy exits anyway.
    pub shutdown_grace: Duration,
    pub log_level: String,
    /// Runtime worker threads; 1 runs everything on one thread (no cross-thread wake-ups).
    pub workers: usize,
    /// This workload's identity; without it the proxy neither originates nor terminates mTLS.
    pub identity: Option<IdentityConfig>,
    /// Inbound connections that are not mTLS to our identity are refused (default: accepted as
    /// plaintext, so non-meshed clients keep working).
    pub inbound_require_tls: bool,
    /// On an opaque port, how long to wait for a client's ClientHello before treating the
    /// connection as plaintext (a server-speaks-first protocol from a non-meshed client waits
    /// this long for its greeting).
    pub opaque_tls_wait: Duration,
    /// Outbound endpoints known to be meshed, with the identity each must prove, for
    /// destinations that discovery does not resolve to a service (a pod IP's profile wins).
    pub outbound_identities: Vec<(EndpointMatch, Name)>,
    /// The Destination service; without it outbound traffic goes to its original destination.
    pub destination: Option<DestinationConfig>,
}

/// Where discovery comes from. The channel is TLS checked against the identity's trust anchors,
/// so discovery needs an identity configured.
#[derive(Debug, Clone)]
pub struct DestinationConfig {
    /// `host:port` of the Destination service.
    pub addr: String,
    /// The identity the Destination service must prove.
    pub name: Name,
    /// How long a new connection waits for the first answer about its destination.
    pub first_answer: Duration,
}

/// Where the proxy gets its certificate.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    pub name: Name,
    pub trust_anchors: TrustAnchors,
    /// The projected service-account token (audience `identity.cnimesh.io`), re-read on every
    /// refresh because the kubelet rotates it.
    pub token_file: PathBuf,
    /// The Identity service, `host:port`.
    pub control_addr: String,
    /// The identity the Identity service must prove.
    pub control_name: Name,
    /// Longest wait between failed refreshes (jittered exponential backoff up to this).
    pub max_backoff: Duration,
}

/// Where the PEM trust anchors come from: exactly one of the two variables.
#[derive(Clone, PartialEq, Eq)]
pub enum TrustAnchors {
    /// A file (`CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS`), e.g. a mounted ConfigMap.
    File(PathBuf),
    /// The PEM text itself (`CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM`), as the injector passes
    /// it, so a proxy needs no volume (Linkerd's `LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS` does the
    /// same).
    Pem(String),
}

pub const TRUST_ANCHORS_FILE_VAR: &str = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS";
pub const TRUST_ANCHORS_PEM_VAR: &str = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM";

impl TrustAnchors {
    /// Where the anchors came from, for messages: the file's path, or the variable's name
    /// (never the PEM itself).
    pub fn source(&self) -> String {
        match self {
            Self::File(path) => format!("{} ({TRUST_ANCHORS_FILE_VAR})", path.display()),
            Self::Pem(_) => TRUST_ANCHORS_PEM_VAR.to_string(),
        }
    }
}

/// Debug output (a config can end up in a log line or a panic) names the PEM variable, not its
/// text.
impl std::fmt::Debug for TrustAnchors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
            Self::Pem(pem) => write!(f, "Pem({TRUST_ANCHORS_PEM_VAR}, {} bytes)", pem.len()),
        }
    }
}

/// Stands in for a PEM value in errors.
fn redacted(pem: &str) -> String {
    format!("<{} bytes of PEM, not shown>", pem.len())
}

pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/tokens/cnimesh-identity-token";
/// The control plane's identity (its ServiceAccount `names::CONTROL_NAME` in
/// `names::CONTROL_NAMESPACE`, default trust domain); a test keeps the two in step.
pub const DEFAULT_CONTROL_NAME: &str = "cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local";

/// A meshed endpoint: one address, or every port of an IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndpointMatch {
    Addr(SocketAddr),
    Ip(std::net::IpAddr),
}

impl std::str::FromStr for EndpointMatch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.parse()
            .map(Self::Addr)
            .or_else(|_| s.parse().map(Self::Ip))
            .map_err(|_| format!("{s:?} is neither ip:port nor ip"))
    }
}

/// `ip:port=identity` or `ip=identity`.
fn endpoint_identity(s: &str) -> Result<(EndpointMatch, Name), String> {
    let (addr, name) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected ADDR=IDENTITY"))?;
    Ok((addr.trim().parse()?, name.trim().parse().map_err(|e: cnimesh_identity::NameError| e.to_string())?))
}

pub const DEFAULT_OPAQUE_PORTS: &[u16] = &[25, 587, 3306, 4444, 5432, 6379, 9300, 11211];

impl Default for Config {
    fn default() -> Self {
        let (any4, any6) = (IpAddr::from(Ipv4Addr::UNSPECIFIED), IpAddr::from(Ipv6Addr::UNSPECIFIED));
        let (lo4, lo6) = (IpAddr::from(Ipv4Addr::LOCALHOST), IpAddr::from(Ipv6Addr::LOCALHOST));
        Self {
            inbound: vec![SocketAddr::new(any4, PROXY_INBOUND_PORT), SocketAddr::new(any6, PROXY_INBOUND_PORT)],
            // Loopback only: outbound traffic is redirected from inside the pod.
            outbound: vec![SocketAddr::new(lo4, PROXY_OUTBOUND_PORT), SocketAddr::new(lo6, PROXY_OUTBOUND_PORT)],
            admin: SocketAddr::new(any4, PROXY_ADMIN_PORT),
            detect_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(120),
            opaque_ports: DEFAULT_OPAQUE_PORTS.to_vec(),
            idle_timeout: Duration::from_secs(3600),
            connect_timeout: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(30),
            log_level: "info".into(),
            workers: 1,
            identity: None,
            inbound_require_tls: false,
            opaque_tls_wait: Duration::from_millis(1000),
            outbound_identities: Vec::new(),
            destination: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{var}={value:?}: {why}")]
pub struct ConfigError {
    pub var: String,
    pub value: String,
    pub why: String,
}

fn list<T: std::str::FromStr>(var: &str, value: &str) -> Result<Vec<T>, ConfigError>
where
    T::Err: std::fmt::Display,
{
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse().map_err(|e: T::Err| ConfigError { var: var.into(), value: value.into(), why: e.to_string() })
        })
        .collect()
}

fn parse<T: std::str::FromStr>(var: &str, value: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    value.trim().parse().map_err(|e: T::Err| ConfigError { var: var.into(), value: value.into(), why: e.to_string() })
}

fn millis(var: &str, value: &str) -> Result<Duration, ConfigError> {
    value.trim().parse::<u64>().map(Duration::from_millis).map_err(|e| ConfigError {
        var: var.into(),
        value: value.into(),
        why: format!("milliseconds expected: {e}"),
    })
}

impl Config {
    /// Reads the configuration through `get` (the process environment in production).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut c = Self::default();
        let var = |name: &str| get(&format!("CNIMESH_PROXY_{name}")).map(|v| (format!("CNIMESH_PROXY_{name}"), v));
        if let Some((n, v)) = var("INBOUND_ADDRS") {
            c.inbound = list(&n, &v)?;
        }
        if let Some((n, v)) = var("OUTBOUND_ADDRS") {
            c.outbound = list(&n, &v)?;
        }
        if let Some((n, v)) = var("ADMIN_ADDR") {
            c.admin = parse(&n, &v)?;
        }
        if let Some((n, v)) = var("OPAQUE_PORTS") {
            c.opaque_ports = list(&n, &v)?;
        }
        if let Some((n, v)) = var("DETECT_TIMEOUT_MS") {
            c.detect_timeout = millis(&n, &v)?;
        }
        if let Some((n, v)) = var("HEADER_TIMEOUT_MS") {
            c.header_timeout = millis(&n, &v)?;
        }
        if let Some((n, v)) = var("IDLE_TIMEOUT_MS") {
            c.idle_timeout = millis(&n, &v)?;
        }
        if let Some((n, v)) = var("CONNECT_TIMEOUT_MS") {
            c.connect_timeout = millis(&n, &v)?;
        }
        if let Some((n, v)) = var("SHUTDOWN_GRACE_MS") {
            c.shutdown_grace = millis(&n, &v)?;
        }
        if let Some((n, v)) = var("WORKERS") {
            c.workers = v.trim().parse().ok().filter(|w| *w > 0).ok_or_else(|| ConfigError {
                var: n,
                value: v.clone(),
                why: "a positive number of threads expected".into(),
            })?;
        }
        if let Some((_, v)) = var("LOG") {
            c.log_level = v;
        }
        if let Some((n, v)) = var("INBOUND_REQUIRE_TLS") {
            c.inbound_require_tls = match v.trim() {
                "true" | "1" => true,
                "false" | "0" | "" => false,
                _ => return Err(ConfigError { var: n, value: v, why: "true or false expected".into() }),
            };
        }
        if let Some((n, v)) = var("OPAQUE_TLS_WAIT_MS") {
            c.opaque_tls_wait = millis(&n, &v)?;
        }
        if let Some((n, v)) = var("OUTBOUND_IDENTITIES") {
            c.outbound_identities = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(endpoint_identity)
                .collect::<Result<_, _>>()
                .map_err(|why| ConfigError { var: n, value: v.clone(), why })?;
        }
        c.identity = identity(&var)?;
        if c.identity.is_none() && !c.outbound_identities.is_empty() {
            return Err(ConfigError {
                var: "CNIMESH_PROXY_OUTBOUND_IDENTITIES".into(),
                value: String::new(),
                why: "meshed endpoints need CNIMESH_PROXY_IDENTITY_* (they would be sent plaintext)".into(),
            });
        }
        c.destination = destination(&var, c.identity.as_ref())?;
        Ok(c)
    }
}

/// The identity settings: all or nothing. A name without an Identity service to ask is an error,
/// never a silent plaintext proxy.
fn identity(var: &impl Fn(&str) -> Option<(String, String)>) -> Result<Option<IdentityConfig>, ConfigError> {
    let Some((n, v)) = var("IDENTITY_NAME") else {
        for other in ["IDENTITY_TRUST_ANCHORS", "IDENTITY_TRUST_ANCHORS_PEM", "IDENTITY_ADDR"] {
            if let Some((n, v)) = var(other) {
                let value = if n == TRUST_ANCHORS_PEM_VAR { redacted(&v) } else { v };
                return Err(ConfigError { var: n, value, why: "set without CNIMESH_PROXY_IDENTITY_NAME".into() });
            }
        }
        return Ok(None);
    };
    let name = parse(&n, &v)?;
    let required = |key: &str| {
        var(key).map(|(_, v)| v).ok_or_else(|| ConfigError {
            var: format!("CNIMESH_PROXY_{key}"),
            value: String::new(),
            why: format!("required when {n} is set"),
        })
    };
    let control_name = match var("IDENTITY_SVC_NAME") {
        Some((n, v)) => parse(&n, &v)?,
        None => DEFAULT_CONTROL_NAME.parse().expect("valid default"),
    };
    let max_backoff = match var("IDENTITY_MAX_BACKOFF_MS") {
        Some((n, v)) => millis(&n, &v)?,
        None => Duration::from_secs(30),
    };
    let trust_anchors = match (var("IDENTITY_TRUST_ANCHORS"), var("IDENTITY_TRUST_ANCHORS_PEM")) {
        (Some(_), Some((p, pem))) => {
            return Err(ConfigError {
                var: p,
                value: redacted(&pem),
                why: format!("set together with {TRUST_ANCHORS_FILE_VAR}; set exactly one of the two"),
            });
        }
        (Some((_, path)), None) => TrustAnchors::File(path.into()),
        (None, Some((p, pem))) if pem.trim().is_empty() => {
            return Err(ConfigError { var: p, value: String::new(), why: "empty: PEM certificates expected".into() });
        }
        (None, Some((_, pem))) => TrustAnchors::Pem(pem),
        (None, None) => {
            return Err(ConfigError {
                var: TRUST_ANCHORS_FILE_VAR.into(),
                value: String::new(),
                why: format!(
                    "{TRUST_ANCHORS_FILE_VAR} (a file) or {TRUST_ANCHORS_PEM_VAR} (the PEM) is required when {n} is set"
                ),
            });
        }
    };
    Ok(Some(IdentityConfig {
        name,
        trust_anchors,
        token_file: var("IDENTITY_TOKEN_FILE").map_or_else(|| DEFAULT_TOKEN_FILE.into(), |(_, v)| v.into()),
        control_addr: required("IDENTITY_ADDR")?,
        control_name,
        max_backoff,
    }))
}

fn destination(
    var: &impl Fn(&str) -> Option<(String, String)>,
    identity: Option<&IdentityConfig>,
) -> Result<Option<DestinationConfig>, ConfigError> {
    let Some((n, addr)) = var("DESTINATION_ADDR") else { return Ok(None) };
    let Some(identity) = identity else {
        return Err(ConfigError {
            var: n,
            value: addr,
            why: "discovery needs CNIMESH_PROXY_IDENTITY_* (its channel is verified mTLS)".into(),
        });
    };
    let name = match var("DESTINATION_SVC_NAME") {
        Some((n, v)) => parse(&n, &v)?,
        None => identity.control_name.clone(),
    };
    let first_answer = match var("DISCOVERY_WAIT_MS") {
        Some((n, v)) => millis(&n, &v)?,
        None => Duration::from_secs(2),
    };
    Ok(Some(DestinationConfig { addr: addr.trim().to_string(), name, first_answer }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn defaults_without_configuration() {
        let c = Config::from_vars(vars(&[])).unwrap();
        assert_eq!(c.inbound.len(), 2);
        assert_eq!(c.outbound[0].to_string(), "127.0.0.1:4140");
        assert_eq!(c.admin.port(), 4191);
        assert!(c.opaque_ports.contains(&5432));
    }

    #[test]
    fn default_control_name_is_the_control_planes_service_account() {
        let name = Name::for_service_account(
            cnimesh_common::names::CONTROL_NAME,
            cnimesh_common::names::CONTROL_NAMESPACE,
            cnimesh_identity::name::DEFAULT_TRUST_DOMAIN,
        );
        assert_eq!(name.unwrap().as_str(), DEFAULT_CONTROL_NAME);
    }

    #[test]
    fn overrides_and_errors() {
        let c = Config::from_vars(vars(&[
            ("CNIMESH_PROXY_OPAQUE_PORTS", "5432, 7000"),
            ("CNIMESH_PROXY_DETECT_TIMEOUT_MS", "250"),
            ("CNIMESH_PROXY_OUTBOUND_ADDRS", "127.0.0.1:5140"),
        ]))
        .unwrap();
        assert_eq!(c.opaque_ports, vec![5432, 7000]);
        assert_eq!(c.detect_timeout, Duration::from_millis(250));
        assert_eq!(c.outbound.len(), 1);
        let e = Config::from_vars(vars(&[("CNIMESH_PROXY_OPAQUE_PORTS", "x")])).unwrap_err();
        assert!(e.to_string().contains("CNIMESH_PROXY_OPAQUE_PORTS"));
    }

    #[test]
    fn identity_is_all_or_nothing() {
        assert!(Config::from_vars(vars(&[])).unwrap().identity.is_none());
        let name = ("CNIMESH_PROXY_IDENTITY_NAME", "web.shop.serviceaccount.identity.cnimesh.cluster.local");
        let e = Config::from_vars(vars(&[name])).unwrap_err();
        assert!(e.to_string().contains("IDENTITY_TRUST_ANCHORS"), "{e}");
        let e = Config::from_vars(vars(&[("CNIMESH_PROXY_IDENTITY_ADDR", "x:1")])).unwrap_err();
        assert!(e.to_string().contains("without CNIMESH_PROXY_IDENTITY_NAME"), "{e}");
        let c = Config::from_vars(vars(&[
            name,
            ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS", "/ca.crt"),
            ("CNIMESH_PROXY_IDENTITY_ADDR", "control:4190"),
            ("CNIMESH_PROXY_OUTBOUND_IDENTITIES", "10.0.0.1:80=a.b, 10.0.0.2=c.d"),
        ]))
        .unwrap();
        let id = c.identity.unwrap();
        assert_eq!(id.control_name.as_str(), DEFAULT_CONTROL_NAME);
        assert_eq!(id.token_file.to_str(), Some(DEFAULT_TOKEN_FILE));
        assert_eq!(c.outbound_identities.len(), 2);
        assert!(Config::from_vars(vars(&[("CNIMESH_PROXY_OUTBOUND_IDENTITIES", "10.0.0.1:80=Bad_Name")])).is_err());
        assert!(Config::from_vars(vars(&[("CNIMESH_PROXY_INBOUND_REQUIRE_TLS", "yes")])).is_err());
        let e = Config::from_vars(vars(&[("CNIMESH_PROXY_OUTBOUND_IDENTITIES", "10.0.0.1=a.b")])).unwrap_err();
        assert!(e.to_string().contains("would be sent plaintext"), "{e}");
        let e = Config::from_vars(vars(&[("CNIMESH_PROXY_DESTINATION_ADDR", "control:4190")])).unwrap_err();
        assert!(e.to_string().contains("needs CNIMESH_PROXY_IDENTITY"), "{e}");
    }

    #[test]
    fn trust_anchors_come_from_exactly_one_of_a_file_or_pem_text() {
        const PEM: &str = "-----BEGIN CERTIFICATE-----\nTUlJQ2FuY2hvcg==\n-----END CERTIFICATE-----\n";
        let name = ("CNIMESH_PROXY_IDENTITY_NAME", "web.shop.serviceaccount.identity.cnimesh.cluster.local");
        let addr = ("CNIMESH_PROXY_IDENTITY_ADDR", "control:4190");
        let file = ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS", "/ca.crt");
        let pem = ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM", PEM);
        let anchors =
            |pairs: &[(&str, &str)]| Config::from_vars(vars(pairs)).map(|c| c.identity.unwrap().trust_anchors);

        assert_eq!(anchors(&[name, addr, file]).unwrap(), TrustAnchors::File("/ca.crt".into()));
        let from_pem = anchors(&[name, addr, pem]).unwrap();
        assert_eq!(from_pem, TrustAnchors::Pem(PEM.into()));
        assert!(!format!("{from_pem:?}").contains("TUlJQ2FuY2hvcg"), "{from_pem:?}");

        let both = anchors(&[name, addr, file, pem]).unwrap_err().to_string();
        assert!(both.contains(TRUST_ANCHORS_FILE_VAR) && both.contains(TRUST_ANCHORS_PEM_VAR), "{both}");
        assert!(both.contains("exactly one"), "{both}");
        let neither = anchors(&[name, addr]).unwrap_err().to_string();
        assert!(neither.contains(TRUST_ANCHORS_FILE_VAR) && neither.contains(TRUST_ANCHORS_PEM_VAR), "{neither}");
        let empty = anchors(&[name, addr, ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM", " \n")]).unwrap_err();
        assert!(empty.to_string().contains("empty"), "{empty}");
        let orphan = anchors(&[pem]).unwrap_err().to_string();
        assert!(orphan.contains("without CNIMESH_PROXY_IDENTITY_NAME"), "{orphan}");
        for e in [both, orphan] {
            assert!(!e.contains("TUlJQ2FuY2hvcg"), "the PEM itself stays out of errors: {e}");
        }
    }
}
