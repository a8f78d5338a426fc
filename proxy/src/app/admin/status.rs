//! The admin server's status pages for operators: `/env.json` (the effective configuration and
//! the `CNIMESH_*` environment it came from, secrets redacted), `/identity.json` (the certificate
//! held now) and `/endpoints.json` (what discovery answered). Read-only views of state the proxy
//! keeps anyway: nothing here is recorded for them.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::app::config::{Config, EndpointMatch, TrustAnchors};
use crate::client::discovery::{Discovery, Endpoint};
use crate::transport::identity::Identity;

/// The environment a proxy reads its configuration from; only these variables are shown.
const ENV_PREFIX: &str = "CNIMESH_";

/// Whether a variable's value is a secret (or too bulky to be useful): tokens, keys, passwords,
/// PEM. A variable naming a file (`…_FILE`) holds a path, which is shown.
fn is_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    !upper.ends_with("_FILE") && ["TOKEN", "SECRET", "PASSWORD", "KEY", "PEM"].iter().any(|w| upper.contains(w))
}

/// The `CNIMESH_*` variables of `vars`, sorted, secret values replaced by their length.
pub fn redacted_env(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(name, _)| name.starts_with(ENV_PREFIX))
        .map(|(name, value)| {
            let value = if is_secret(&name) { format!("<redacted: {} bytes>", value.len()) } else { value };
            (name, value)
        })
        .collect();
    env.sort();
    env
}

fn duration(d: std::time::Duration) -> String {
    format!("{d:?}")
}

/// `/env.json`: the configuration the proxy runs with, after defaults and parsing.
pub fn env_json(config: &Config, env: &[(String, String)]) -> Value {
    let identity = config.identity.as_ref().map(|id| {
        json!({
            "name": id.name.as_str(),
            "trust_anchors": match &id.trust_anchors {
                TrustAnchors::File(path) => json!({ "file": path }),
                TrustAnchors::Pem(pem) => json!({ "pem": format!("<{} bytes, not shown>", pem.len()) }),
            },
            "token_file": id.token_file,
            "control_addr": id.control_addr,
            "control_name": id.control_name.as_str(),
            "max_backoff": duration(id.max_backoff),
        })
    });
    let outbound_identities: Vec<Value> = config
        .outbound_identities
        .iter()
        .map(|(matches, name)| {
            let endpoint = match matches {
                EndpointMatch::Addr(addr) => addr.to_string(),
                EndpointMatch::Ip(ip) => ip.to_string(),
            };
            json!({ "endpoint": endpoint, "identity": name.as_str() })
        })
        .collect();
    json!({
        "config": {
            "inbound": config.inbound,
            "outbound": config.outbound,
            "admin": config.admin,
            "detect_timeout": duration(config.detect_timeout),
            "header_timeout": duration(config.header_timeout),
            "opaque_ports": config.opaque_ports,
            "idle_timeout": duration(config.idle_timeout),
            "connect_timeout": duration(config.connect_timeout),
            "shutdown_grace": duration(config.shutdown_grace),
            "log_level": config.log_level,
            "workers": config.workers,
            "identity": identity,
            "inbound_require_tls": config.inbound_require_tls,
            "opaque_tls_wait": duration(config.opaque_tls_wait),
            "outbound_h2_upgrade": config.outbound_h2_upgrade,
            "outbound_identities": outbound_identities,
            "tap_identities": config.tap_identities.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
            "destination": config.destination.as_ref().map(|d| json!({
                "addr": d.addr,
                "name": d.name.as_str(),
                "first_answer": duration(d.first_answer),
            })),
            "policy": config.policy.as_ref().map(|p| json!({
                "workload": p.workload,
                "default": format!("{:?}", p.default),
                "cluster_networks": p.cluster_networks.iter().map(ToString::to_string).collect::<Vec<_>>(),
            })),
        },
        "env": env.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
    })
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `/identity.json`: the identity the proxy was given and the certificate it holds now.
pub fn identity_json(identity: Option<&Identity>, now: SystemTime) -> Value {
    let Some(identity) = identity else {
        return json!({ "configured": false });
    };
    let held = identity.cert.get();
    let leaf = held.as_ref().and_then(|key| key.cert.first());
    let certificate = leaf.map(|leaf| {
        let not_after = cnimesh_identity::tls::not_after(leaf).ok();
        json!({
            "subject": cnimesh_identity::tls::subject_of(leaf),
            // The issuer that signed it (sent after the leaf): across an issuer rotation, the
            // serial says which one (`cnimesh check` compares it with the issuer Secret).
            "issuer": held.as_ref().and_then(|k| k.cert.get(1)).map(|issuer| json!({
                "subject": cnimesh_identity::tls::subject_of(issuer),
                "serial": cnimesh_identity::tls::serial_of(issuer),
            })),
            "identity": cnimesh_identity::tls::identity_of(leaf).map(|n| n.as_str().to_string()),
            "not_after_unix": not_after.map(unix_seconds),
            "expires_in_seconds": not_after.map(|t| t.duration_since(now).map_or(0, |d| d.as_secs())),
            "chain_length": held.as_ref().map_or(0, |k| k.cert.len()),
        })
    });
    json!({
        "configured": true,
        "name": identity.name.as_str(),
        "trust_anchors": identity.roots.len(),
        "certificate": certificate,
    })
}

fn endpoint_json(e: &Endpoint) -> Value {
    json!({ "addr": e.addr, "identity": e.identity.as_ref().map(|n| n.as_str().to_string()) })
}

/// `/endpoints.json`: every address and service this proxy has looked up, and the answer.
pub fn endpoints_json(discovery: Option<&Discovery>) -> Value {
    let Some(discovery) = discovery else {
        return json!({ "discovery": false, "profiles": [], "services": [] });
    };
    let snapshot = discovery.snapshot();
    let profiles: Vec<Value> = snapshot
        .profiles
        .iter()
        .map(|(addr, profile)| {
            json!({
                "addr": addr,
                "answered": profile.is_some(),
                "service": profile.as_ref().and_then(|p| p.service.clone()),
                "endpoint": profile.as_ref().and_then(|p| p.endpoint.as_deref()).map(endpoint_json),
            })
        })
        .collect();
    let services: Vec<Value> = snapshot
        .services
        .iter()
        .map(|(authority, endpoints)| {
            json!({
                "authority": authority,
                "known": endpoints.known,
                "exists": endpoints.exists,
                "endpoints": endpoints.list.iter().map(|e| endpoint_json(e)).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "discovery": true, "profiles": profiles, "services": services })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_the_environment_are_redacted_and_paths_kept() {
        let env = redacted_env([
            ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM".to_string(), "-----BEGIN CERTIFICATE-----".to_string()),
            ("CNIMESH_PROXY_IDENTITY_TOKEN".to_string(), "eyJhbGciOi".to_string()),
            ("CNIMESH_PROXY_IDENTITY_TOKEN_FILE".to_string(), "/var/run/secrets/tokens/t".to_string()),
            ("CNIMESH_PROXY_LOG".to_string(), "info".to_string()),
            ("HOME".to_string(), "/root".to_string()),
        ]);
        let text = format!("{env:?}");
        assert!(!text.contains("BEGIN") && !text.contains("eyJ"), "{text}");
        assert!(!text.contains("HOME"), "only our variables: {text}");
        assert!(text.contains("/var/run/secrets/tokens/t") && text.contains("info"), "{text}");
        assert_eq!(env[0], ("CNIMESH_PROXY_IDENTITY_TOKEN".to_string(), "<redacted: 10 bytes>".to_string()));
    }

    #[test]
    fn without_identity_or_discovery_the_pages_say_so() {
        assert_eq!(identity_json(None, SystemTime::now()), json!({ "configured": false }));
        assert_eq!(endpoints_json(None)["discovery"], false);
        let config = Config::default();
        let page = env_json(&config, &[]);
        assert_eq!(page["config"]["admin"], "0.0.0.0:4191");
        assert_eq!(page["config"]["identity"], Value::Null);
    }
}
