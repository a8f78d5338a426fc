//! Would-be denials: for the ports a report shows in audit mode, what the workload's proxies let
//! through only because of audit, read from their own `/metrics`
//! (`inbound_{http,tcp}_authz_allow_total{authz_kind="audit"}`, per Server and client identity).
//! Pure: metrics text in, rows out; the scrape is the caller's ([`super::report`]).

use std::collections::BTreeMap;

use serde::Serialize;

/// The requests (or opaque connections) one client got through one Server only by audit mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WouldBeDenial {
    pub pod: String,
    /// `server/NAME` or `default/audit`.
    pub server: String,
    /// The client's mesh identity, or `(no identity)` for plaintext clients.
    pub client: String,
    /// `http` (requests) or `tcp` (opaque connections).
    pub protocol: String,
    pub count: u64,
}

/// The would-be denials in one proxy's metrics, summed over target address and route.
pub fn from_metrics(pod: &str, text: &str) -> Vec<WouldBeDenial> {
    let mut sums: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    for line in text.lines() {
        let protocol = if line.starts_with("inbound_http_authz_allow_total{") {
            "http"
        } else if line.starts_with("inbound_tcp_authz_allow_total{") {
            "tcp"
        } else {
            continue;
        };
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let labels = labels_of(labels);
        if labels.get("authz_kind").map(String::as_str) != Some(cnimesh_policy_rules::AUDIT_KIND) {
            continue;
        }
        let Ok(count) = value.parse::<f64>() else { continue };
        let server = match (labels.get("srv_kind").map(String::as_str), labels.get("srv_name")) {
            (Some("default"), Some(name)) => format!("default/{name}"),
            (_, Some(name)) => format!("server/{name}"),
            _ => continue,
        };
        let client = labels.get("client_id").cloned().unwrap_or_else(|| "(no identity)".to_string());
        // Counters are integers; the text form may print them as floats.
        *sums.entry((server, client, protocol.to_string())).or_default() += count as u64;
    }
    sums.into_iter()
        .filter(|(_, count)| *count > 0)
        .map(|((server, client, protocol), count)| WouldBeDenial {
            pod: pod.to_string(),
            server,
            client,
            protocol,
            count,
        })
        .collect()
}

/// `{a="x",b="y"}` (with `\"` and `\\` escapes) as a map.
fn labels_of(text: &str) -> BTreeMap<String, String> {
    let inner = text.split_once('{').map_or("", |(_, rest)| rest.trim_end_matches('}'));
    let mut out = BTreeMap::new();
    let mut chars = inner.chars().peekable();
    loop {
        let key: String =
            chars.by_ref().take_while(|c| *c != '=').collect::<String>().trim_start_matches(',').to_string();
        if key.is_empty() || chars.next() != Some('"') {
            break;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.extend(chars.next()),
                '"' => break,
                c => value.push(c),
            }
        }
        out.insert(key, value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_admissions_are_summed_per_server_client_and_protocol() {
        let text = r#"# HELP inbound_http_authz_allow_total HTTP requests authorized by policy
inbound_http_authz_allow_total{target_addr="10.0.0.1:8080",srv_group="policy.cnimesh.io",srv_kind="server",srv_name="api",route_group="",route_kind="default",route_name="default",authz_group="",authz_kind="audit",authz_name="audit",tls="false"} 3
inbound_http_authz_allow_total{target_addr="10.0.0.1:8080",srv_group="policy.cnimesh.io",srv_kind="server",srv_name="api",route_group="",route_kind="default",route_name="probe",authz_group="",authz_kind="audit",authz_name="audit",tls="false"} 2
inbound_http_authz_allow_total{target_addr="10.0.0.1:8080",srv_group="policy.cnimesh.io",srv_kind="server",srv_name="api",authz_group="policy.cnimesh.io",authz_kind="authorizationpolicy",authz_name="web",tls="true",client_id="web.shop.serviceaccount.identity.cnimesh.cluster.local"} 9
inbound_tcp_authz_allow_total{target_addr="10.0.0.1:9000",srv_group="",srv_kind="default",srv_name="audit",authz_group="",authz_kind="audit",authz_name="audit",tls="true",client_id="x.shop.serviceaccount.identity.cnimesh.cluster.local"} 1
"#;
        let rows = from_metrics("api-0", text);
        let brief: Vec<(&str, &str, &str, u64)> =
            rows.iter().map(|r| (r.server.as_str(), r.client.as_str(), r.protocol.as_str(), r.count)).collect();
        assert_eq!(
            brief,
            [
                ("default/audit", "x.shop.serviceaccount.identity.cnimesh.cluster.local", "tcp", 1),
                ("server/api", "(no identity)", "http", 5),
            ]
        );
    }

    #[test]
    fn escaped_label_values_are_read_whole() {
        let labels = labels_of(r#"x{a="q\"uote",b="back\\slash",c=""}"#);
        assert_eq!(labels["a"], "q\"uote");
        assert_eq!(labels["b"], "back\\slash");
        assert_eq!(labels["c"], "");
    }
}
