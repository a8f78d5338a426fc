//! The least-privilege policy for observed traffic: per workload port, a Server selecting the
//! workload's pods, and per target (the Server, or an inbound HTTPRoute the requests matched) a
//! MeshTLSAuthentication naming exactly the client identities seen and an AuthorizationPolicy
//! requiring it. Applied, it allows what was observed and nothing else: any other client gets
//! 403 (HTTP) or a refused connection, as with any Server whose authorizations do not name it.
//!
//! A port some Server already governs gets no second Server (the proxy would serve only one of
//! them): the new authentication and authorization target the existing Server, extending its
//! policy. Traffic that was let in without being evidence (the probe route, audit's would-be
//! denials, clients an AuthorizationPolicy already allows) is listed, never granted.
//!
//! Layer: model (pure).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::observe::{NotGranted, Observed, PortTraffic, Target, Workload};

const GROUP: &str = "policy.cnimesh.io";
const API_VERSION: &str = "policy.cnimesh.io/v1alpha1";
/// On every generated object: what made it, so that a reviewer knows it was not written by hand.
pub const GENERATED_BY_ANNOTATION: &str = "policy.cnimesh.io/generated-by";
/// On each MeshTLSAuthentication: the traffic each identity was seen sending, for review.
pub const OBSERVED_ANNOTATION: &str = "policy.cnimesh.io/observed";

/// How the generated Servers treat traffic their authorizations do not name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Deny it (the Server's default `accessPolicy`).
    Enforce,
    /// Let it through and count it as a would-be denial (`accessPolicy: audit`), to roll the
    /// policy out without breaking traffic.
    Audit,
}

/// The objects, and what the operator should know about what they leave out.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    pub objects: Vec<Value>,
    pub notes: Vec<String>,
    /// Traffic that was let in but is not granted (probe route, audit, already allowed), one
    /// line per client and reason: the output's "seen, not granted" comments.
    pub not_granted: Vec<String>,
}

/// One "seen, not granted" line.
fn not_granted_line(workload: &Workload, port: u16, client: &str, why: &NotGranted, count: f64, unit: &str) -> String {
    let who = if client.is_empty() { "clients without a mesh identity" } else { client };
    let why = match why {
        NotGranted::ProbeRoute => "on the kubelet probe route, which admits anyone".to_string(),
        NotGranted::Audit => "let in only by audit mode (would-be denials; --include-audited grants them)".to_string(),
        NotGranted::AlreadyAllowed(policy) => format!("already allowed by AuthorizationPolicy {policy}"),
    };
    format!("{}/{} port {port}: {who}: {count} {unit} {why}", workload.kind, workload.name)
}

/// `sa.ns.serviceaccount.identity.<trust domain>` as a ServiceAccount reference; other names
/// (foreign trust domains' peers, say) stay names.
fn identity_ref(id: &str) -> Result<Value, &str> {
    let (sa_ns, _) = id.split_once(".serviceaccount.identity.").ok_or(id)?;
    let (sa, ns) = sa_ns.split_once('.').ok_or(id)?;
    Ok(json!({"kind": "ServiceAccount", "name": sa, "namespace": ns}))
}

fn metadata(name: &str, ns: &str, extra: BTreeMap<&str, String>) -> Value {
    let mut annotations = BTreeMap::from([(GENERATED_BY_ANNOTATION, "cnimesh policy generate".to_string())]);
    annotations.extend(extra);
    json!({"name": name, "namespace": ns, "annotations": annotations})
}

/// Object names: DNS labels, so a long workload name is cut, never the port or the suffix.
fn name(parts: &[&str]) -> String {
    let (head, tail) = parts.split_first().map_or(("", &[][..]), |(h, t)| (*h, t));
    let rest: String = tail.iter().map(|p| format!("-{p}")).collect();
    let keep = 63usize.saturating_sub(rest.len()).min(head.len());
    format!("{}{rest}", head[..keep].trim_end_matches('-'))
}

fn unit(traffic: &PortTraffic) -> &'static str {
    if traffic.http { "requests" } else { "connections" }
}

/// The objects for `observed` in namespace `ns`.
pub fn generate(ns: &str, observed: &Observed, mode: Mode) -> Generated {
    let mut objects = Vec::new();
    let mut notes: Vec<String> = observed.skipped.clone();
    let mut not_granted = Vec::new();
    for ((workload, port), traffic) in &observed.ports {
        for ((client, why), count) in &traffic.not_granted {
            not_granted.push(not_granted_line(workload, *port, client, why, *count, unit(traffic)));
        }
        let port_text = port.to_string();
        // An existing Server is extended under names of their own, so nothing of its policy is
        // replaced.
        let (server, suffix) = match &traffic.server {
            Some(existing) => (existing.clone(), "observed-clients"),
            None => (name(&[&workload.name, &port_text]), "clients"),
        };
        if traffic.unauthenticated > 0.0 {
            notes.push(format!(
                "{}/{} port {port}: {} {} without a mesh identity are not allowed by this policy; \
                 add a NetworkAuthentication for their networks if they must keep working",
                workload.kind,
                workload.name,
                traffic.unauthenticated,
                unit(traffic)
            ));
        }
        match (&traffic.server, traffic.clients.is_empty()) {
            (None, true) => notes.push(format!(
                "{}/{} port {port}: no client authorized over mTLS was seen; its Server allows nothing",
                workload.kind, workload.name
            )),
            (None, false) => {}
            (Some(existing), empty) => notes.push(format!(
                "{}/{} port {port}: governed by the existing Server {existing}: {}",
                workload.kind,
                workload.name,
                if empty {
                    "nothing to add to its policy"
                } else {
                    "its policy is extended, no second Server is written"
                }
            )),
        }
        if traffic.server.is_none() {
            objects.push(server_object(ns, &server, workload, *port, traffic, mode));
        }
        for (target, clients) in &traffic.clients {
            let (auth_name, target_ref) = match target {
                Target::Server => (name(&[&server, suffix]), json!({"group": GROUP, "kind": "Server", "name": server})),
                Target::Route { group, name: route } => {
                    (name(&[&server, route, suffix]), json!({"group": group, "kind": "HTTPRoute", "name": route}))
                }
            };
            let (refs, names): (Vec<_>, Vec<_>) = clients.keys().map(|id| identity_ref(id)).partition(Result::is_ok);
            let refs: Vec<Value> = refs.into_iter().flatten().collect();
            let names: Vec<&str> = names.into_iter().filter_map(Result::err).collect();
            let seen: Vec<String> = clients.iter().map(|(id, n)| format!("{id}: {n} {}", unit(traffic))).collect();
            let mut spec = serde_json::Map::new();
            if !refs.is_empty() {
                spec.insert("identityRefs".into(), Value::Array(refs));
            }
            if !names.is_empty() {
                spec.insert("identities".into(), json!(names));
            }
            objects.push(json!({
                "apiVersion": API_VERSION, "kind": "MeshTLSAuthentication",
                "metadata": metadata(&auth_name, ns, BTreeMap::from([(OBSERVED_ANNOTATION, seen.join(", "))])),
                "spec": spec,
            }));
            objects.push(json!({
                "apiVersion": API_VERSION, "kind": "AuthorizationPolicy",
                "metadata": metadata(&auth_name, ns, BTreeMap::new()),
                "spec": {
                    "targetRef": target_ref,
                    "requiredAuthenticationRefs": [{"group": GROUP, "kind": "MeshTLSAuthentication", "name": auth_name}],
                },
            }));
        }
    }
    Generated { objects, notes, not_granted }
}

fn server_object(ns: &str, server: &str, workload: &Workload, port: u16, traffic: &PortTraffic, mode: Mode) -> Value {
    // Detection for HTTP (HTTP/1 and HTTP/2 both work), opaque where only connections were seen.
    let protocol = if traffic.http { "unknown" } else { "opaque" };
    let mut spec = json!({"podSelector": {"matchLabels": workload.selector}, "port": port, "proxyProtocol": protocol});
    if mode == Mode::Audit {
        spec["accessPolicy"] = json!("audit");
    }
    json!({"apiVersion": API_VERSION, "kind": "Server", "metadata": metadata(server, ns, BTreeMap::new()), "spec": spec})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn web() -> Workload {
        Workload {
            kind: "deployment".into(),
            name: "web".into(),
            selector: BTreeMap::from([("cnimesh.io/proxy-deployment".into(), "web".into())]),
        }
    }

    const CLIENT: &str = "client.demo.serviceaccount.identity.cnimesh.cluster.local";

    fn observed(traffic: PortTraffic) -> Observed {
        Observed { ports: BTreeMap::from([((web(), 8080), traffic)]), ..Default::default() }
    }

    #[test]
    fn observed_clients_become_a_server_an_authentication_and_an_authorization() {
        let traffic = PortTraffic {
            http: true,
            clients: BTreeMap::from([(
                Target::Server,
                BTreeMap::from([(CLIENT.to_string(), 40.0), ("peer.example".to_string(), 1.0)]),
            )]),
            unauthenticated: 0.0,
            ..Default::default()
        };
        let out = generate("demo", &observed(traffic), Mode::Enforce);
        assert!(out.notes.is_empty(), "{:?}", out.notes);
        let kinds: Vec<&str> = out.objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["Server", "MeshTLSAuthentication", "AuthorizationPolicy"]);
        let [server, auth, authz] = &out.objects[..] else { unreachable!() };
        assert_eq!(server["metadata"]["name"], "web-8080");
        assert_eq!(
            server["spec"],
            json!({"podSelector": {"matchLabels": {"cnimesh.io/proxy-deployment": "web"}}, "port": 8080, "proxyProtocol": "unknown"})
        );
        assert_eq!(
            auth["spec"]["identityRefs"],
            json!([{"kind": "ServiceAccount", "name": "client", "namespace": "demo"}])
        );
        assert_eq!(auth["spec"]["identities"], json!(["peer.example"]));
        assert!(auth["metadata"]["annotations"][OBSERVED_ANNOTATION].as_str().unwrap().contains("40 requests"));
        assert_eq!(authz["spec"]["targetRef"], json!({"group": GROUP, "kind": "Server", "name": "web-8080"}));
        assert_eq!(authz["spec"]["requiredAuthenticationRefs"][0]["name"], "web-8080-clients");
    }

    #[test]
    fn routes_get_their_own_authorization_and_audit_mode_is_set_on_the_server() {
        let route = Target::Route { group: "gateway.networking.k8s.io".into(), name: "api".into() };
        let traffic = PortTraffic {
            http: true,
            clients: BTreeMap::from([(route, BTreeMap::from([(CLIENT.to_string(), 2.0)]))]),
            unauthenticated: 5.0,
            ..Default::default()
        };
        let out = generate("demo", &observed(traffic), Mode::Audit);
        assert_eq!(out.objects[0]["spec"]["accessPolicy"], "audit");
        assert_eq!(
            out.objects[2]["spec"]["targetRef"],
            json!({"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "api"})
        );
        assert_eq!(out.objects[2]["metadata"]["name"], "web-8080-api-clients");
        assert!(out.notes[0].contains("without a mesh identity"), "{:?}", out.notes);
    }

    #[test]
    fn a_port_that_saw_only_unidentified_traffic_gets_a_server_that_allows_nothing_and_a_note() {
        let traffic = PortTraffic { http: false, clients: BTreeMap::new(), unauthenticated: 3.0, ..Default::default() };
        let out = generate("demo", &observed(traffic), Mode::Enforce);
        assert_eq!(out.objects.len(), 1);
        assert_eq!(out.objects[0]["spec"]["proxyProtocol"], "opaque");
        assert!(out.notes.iter().any(|n| n.contains("allows nothing")), "{:?}", out.notes);
    }

    #[test]
    fn long_names_stay_dns_labels_and_keep_the_port() {
        let long = "w".repeat(80);
        let n = name(&[&long, "8080", "clients"]);
        assert!(n.len() <= 63 && n.ends_with("-8080-clients"), "{n}");
    }
}
