//! The admin server's status pages for operators: `/env.json` (the effective configuration and
//! the `CNIMESH_*` environment it came from, secrets redacted), `/identity.json` (the certificate
//! held now, its issuer and the trust anchors' fingerprints), `/endpoints.json` (what discovery
//! answered, with each endpoint's load estimate) and `/policy.json` (the inbound policy enforced
//! on each port, where it came from and when). Read-only views of state the proxy keeps anyway:
//! nothing here is recorded for them, and no key or token is ever shown.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::app::config::{Config, EndpointMatch, TrustAnchors};
use crate::client::discovery::{Discovery, Endpoint};
use crate::inbound::policy::discover::Policies;
use crate::inbound::policy::model::{Authn, Authz, PathMatch, PortPolicy, PortProtocol, Resource};
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
                TrustAnchors::Endorsed { pem, file, signer, since } => json!({
                    "pem": format!("<{} bytes, not shown>", pem.len()),
                    "file": file,
                    "endorsed_by": signer.as_str(),
                    "endorsed_since": since,
                }),
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
            "shutdown_delay": duration(config.shutdown_delay),
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

/// SHA-256 of `bytes` in lowercase hex, with the TLS provider's own hash (no extra crate).
fn sha256_hex(bytes: &[u8]) -> Option<String> {
    let provider = cnimesh_identity::tls::provider();
    let hash = provider
        .cipher_suites
        .iter()
        .filter_map(|suite| suite.tls13())
        .map(|suite| suite.common.hash_provider)
        .find(|h| h.algorithm() == rustls::crypto::hash::HashAlgorithm::SHA256)?;
    Some(hash.hash(bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect())
}

/// `/identity.json`: the identity the proxy was given, the certificate it holds now and the
/// issuer that signed it, and the trust anchors it verifies peers with (SHA-256 of each anchor's
/// public key: compare with `cnimesh identity`/`check` output; the key itself is never shown).
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
    let anchors: Vec<Value> = identity
        .roots
        .roots()
        .roots
        .iter()
        .map(|anchor| json!({ "spki_sha256": sha256_hex(&anchor.subject_public_key_info) }))
        .collect();
    json!({
        "configured": true,
        "name": identity.name.as_str(),
        "trust_anchors": identity.roots.len(),
        "anchors": anchors,
        "certificate": certificate,
    })
}

/// One endpoint: its address and identity, and the balancer's view of it: requests in flight and
/// the latency estimate (peak EWMA, decayed to now) that picks between endpoints. Destination
/// sends no weights that this proxy uses: every endpoint weighs the same.
fn endpoint_json(e: &Endpoint) -> Value {
    let pending = e.stats.pending();
    let estimate = e.stats.cost() / (pending as f64 + 1.0);
    json!({
        "addr": e.addr,
        "identity": e.identity.as_ref().map(|n| n.as_str().to_string()),
        "pending": pending,
        "ewma_ms": (estimate * 1e6).round() / 1e3,
    })
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

fn resource_json(r: &Resource) -> Value {
    json!({ "group": &*r.group, "kind": &*r.kind, "name": &*r.name })
}

fn authz_json(a: &Authz) -> Value {
    let authentication = match &a.authn {
        Authn::Unauthenticated => json!({ "unauthenticated": true }),
        Authn::MeshTls { identities, suffixes } => json!({
            "mesh_tls": {
                "identities": identities.iter().map(|i| &**i).collect::<Vec<_>>(),
                // Stored with their leading dot; `""` admits any identity.
                "suffixes": suffixes.iter().map(|s| if s.is_empty() { "*".to_string() } else { format!("*{s}") }).collect::<Vec<_>>(),
            }
        }),
    };
    let networks: Vec<Value> = a
        .networks
        .iter()
        .map(|n| json!({ "net": n.net.to_string(), "except": n.except.iter().map(ToString::to_string).collect::<Vec<_>>() }))
        .collect();
    json!({ "authorization": resource_json(&a.meta), "networks": networks, "authentication": authentication })
}

fn port_policy_json(p: &PortPolicy) -> Value {
    let protocol = match p.protocol {
        PortProtocol::Detect => "detect",
        PortProtocol::Http1 => "http1",
        PortProtocol::Http2 => "http2",
        PortProtocol::Opaque => "opaque",
    };
    let routes: Vec<Value> = p
        .routes
        .iter()
        .map(|r| {
            let matches: Vec<Value> = r
                .matches
                .iter()
                .map(|m| {
                    let path = match &m.path {
                        PathMatch::Any => json!(null),
                        PathMatch::Exact(p) => json!({ "exact": &**p }),
                        PathMatch::Prefix(p) => json!({ "prefix": &**p }),
                    };
                    json!({ "path": path, "method": m.method.as_ref().map(|m| m.as_str()) })
                })
                .collect();
            json!({
                "route": resource_json(&r.meta),
                "matches": matches,
                // Empty: the server's authorizations apply.
                "authorizations": r.authorizations.iter().map(authz_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut page = json!({
        "protocol": protocol,
        "server": resource_json(&p.server),
        "authorizations": p.authorizations.iter().map(authz_json).collect::<Vec<_>>(),
        "routes": routes,
    });
    if let (Some(limited), Value::Object(page)) = (&p.rate_limit, &mut page) {
        let l = &limited.limit;
        let overrides: Vec<Value> = l
            .overrides
            .iter()
            .map(|(rps, clients)| json!({ "requests_per_second": rps, "clients": clients.iter().map(|c| &**c).collect::<Vec<_>>() }))
            .collect();
        // `full`: every bucket has refilled (nothing spent is still owed), read now.
        page.insert(
            "rate_limit".to_string(),
            json!({
                "policy": resource_json(&l.meta),
                "total_per_second": l.total,
                "identity_per_second": l.identity,
                "overrides": overrides,
                "full": limited.limiter.full(),
            }),
        );
    }
    page
}

/// `/policy.json`: the inbound policy enforced now on every port the proxy watches, with its
/// source (`discovered`: the control plane's answer; `default`: the fallback, as injected or as
/// the control plane last stated it) and how fresh it is. Without policy discovery every client
/// is allowed, and the page says so.
pub fn policy_json(policies: Option<&Policies>, now: SystemTime) -> Value {
    let Some(policies) = policies else {
        return json!({
            "discovery": false,
            "note": "inbound policy discovery is not configured: every client is allowed",
            "ports": [],
        });
    };
    let age = |t: SystemTime| now.duration_since(t).map_or(0, |d| d.as_secs());
    let ports: Vec<Value> = policies
        .status()
        .iter()
        .map(|s| {
            let mut page = port_policy_json(&s.policy);
            let extra = json!({
                "port": s.port,
                "declared": s.declared,
                "source": if s.answered { "discovered" } else { "default" },
                "last_answer_unix": s.last_answer.map(unix_seconds),
                "last_answer_age_seconds": s.last_answer.map(age),
            });
            if let (Value::Object(page), Value::Object(extra)) = (&mut page, extra) {
                // The port first: the page reads port by port.
                let mut ordered = extra;
                ordered.append(page);
                *page = ordered;
            }
            page
        })
        .collect();
    let stated = policies.fallback_stated();
    json!({
        "discovery": true,
        "default": {
            "policy": port_policy_json(&policies.fallback()),
            "source": if stated.is_some() { "stated by the control plane" } else { "as injected" },
            "stated_unix": stated.map(unix_seconds),
        },
        "undeclared_watched": policies.undeclared_watched(),
        "ports": ports,
    })
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
