//! Proxy configuration from `CNIMESH_PROXY_*` environment variables. With none set, the proxy runs
//! with DESIGN.md §2's defaults.

use std::net::SocketAddr;
use std::time::Duration;

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
}

pub const DEFAULT_OPAQUE_PORTS: &[u16] = &[25, 587, 3306, 4444, 5432, 6379, 9300, 11211];

impl Default for Config {
    fn default() -> Self {
        let addrs = |list: &[&str]| list.iter().map(|a| a.parse().expect("valid default")).collect();
        Self {
            inbound: addrs(&["0.0.0.0:4143", "[::]:4143"]),
            outbound: addrs(&["127.0.0.1:4140", "[::1]:4140"]),
            admin: "0.0.0.0:4191".parse().expect("valid default"),
            detect_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(120),
            opaque_ports: DEFAULT_OPAQUE_PORTS.to_vec(),
            idle_timeout: Duration::from_secs(3600),
            connect_timeout: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(30),
            log_level: "info".into(),
            workers: 1,
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
            c.admin = v.trim().parse().map_err(|e: std::net::AddrParseError| ConfigError {
                var: n,
                value: v.clone(),
                why: e.to_string(),
            })?;
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
        Ok(c)
    }
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
}
