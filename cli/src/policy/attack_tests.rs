//! Attacks on `policy generate`'s evidence: what a real proxy counts as allowed although no
//! policy granted it (the probe route's own authorization, audit mode's would-be denials) must
//! never become a grant.

use std::collections::BTreeMap;

use cnimesh_common::prom_text::Sample;

use super::generate::{Mode, generate};
use super::observe::{Observed, Workload, add_pod};

const CLIENT: &str = "client.demo.serviceaccount.identity.cnimesh.cluster.local";
const INTRUDER: &str = "intruder.demo.serviceaccount.identity.cnimesh.cluster.local";
const AUDITED: &str = "auditee.demo.serviceaccount.identity.cnimesh.cluster.local";

fn web() -> Workload {
    Workload {
        kind: "deployment".into(),
        name: "web".into(),
        selector: BTreeMap::from([("cnimesh.io/proxy-deployment".into(), "web".into())]),
    }
}

/// An allowed request as web's proxy counts it: on `port`, under the Server `srv`
/// (kind, name), the route (kind, name) and the authorization (kind, name), from `client`.
fn allowed(port: u16, srv: (&str, &str), route: (&str, &str), authz: (&str, &str), client: &str) -> Sample {
    let group = |kind: &str| if kind == "default" { "" } else { "policy.cnimesh.io" };
    let labels = [
        ("target_addr", format!("10.0.0.5:{port}")),
        ("srv_group", group(srv.0).into()),
        ("srv_kind", srv.0.into()),
        ("srv_name", srv.1.into()),
        ("route_group", group(route.0).into()),
        ("route_kind", route.0.into()),
        ("route_name", route.1.into()),
        ("authz_group", group(authz.0).into()),
        ("authz_kind", authz.0.into()),
        ("authz_name", authz.1.into()),
        ("tls", "true".into()),
        ("client_id", client.into()),
    ];
    Sample {
        name: "inbound_http_authz_allow_total".into(),
        labels: labels.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        value: 0.0,
    }
}

#[test]
fn an_intruder_seen_only_on_the_probe_route_or_under_audit_is_never_granted() {
    let samples = vec![
        // Port 8080 is under `deny` with a kubelet probe on /ready: the intruder's three
        // GET /ready were let in by the probe route's own authorization.
        (allowed(8080, ("default", "deny"), ("default", "probe"), ("default", "probe"), INTRUDER), 3.0),
        // Port 9090 has the Server web-9090 in audit mode: a would-be denial.
        (allowed(9090, ("server", "web-9090"), ("default", "default"), ("audit", "audit"), AUDITED), 5.0),
        // Port 7070 has no policy yet: the client, authorized over mTLS by the default.
        (
            allowed(
                7070,
                ("default", "all-unauthenticated"),
                ("default", "default"),
                ("default", "all-unauthenticated"),
                CLIENT,
            ),
            40.0,
        ),
    ];
    let mut observed = Observed::default();
    add_pod(&mut observed, &web(), &samples);
    let out = generate("demo", &observed, Mode::Enforce);
    let granted: Vec<String> =
        out.objects.iter().filter(|o| o["kind"] == "MeshTLSAuthentication").map(|o| o["spec"].to_string()).collect();
    assert!(granted.iter().any(|g| g.contains("\"client\"")), "the client is granted: {granted:?}");
    for who in ["intruder", "auditee"] {
        assert!(
            !granted.iter().any(|g| g.contains(&format!("\"{who}\""))),
            "{who} is granted although no policy authorized it: {granted:?}"
        );
    }
}

#[test]
fn what_is_not_granted_is_listed_audit_is_granted_only_on_request_and_an_existing_server_is_extended() {
    let samples = vec![
        (allowed(8080, ("default", "deny"), ("default", "probe"), ("default", "probe"), INTRUDER), 3.0),
        (allowed(9090, ("server", "web-api"), ("default", "default"), ("audit", "audit"), AUDITED), 5.0),
        (
            allowed(
                9090,
                ("server", "web-api"),
                ("default", "default"),
                ("authorizationpolicy", "web-api-clients"),
                CLIENT,
            ),
            7.0,
        ),
    ];
    let mut observed = Observed::default();
    add_pod(&mut observed, &web(), &samples);
    let out = generate("demo", &observed, Mode::Enforce);
    let lines = out.not_granted.join("\n");
    assert!(lines.contains(&format!("port 8080: {INTRUDER}: 3 requests on the kubelet probe route")), "{lines}");
    assert!(lines.contains(&format!("port 9090: {AUDITED}: 5 requests let in only by audit mode")), "{lines}");
    assert!(lines.contains("already allowed by AuthorizationPolicy web-api-clients"), "{lines}");
    // Port 9090's Server exists: it is never written a second time.
    let servers: Vec<&serde_json::Value> = out.objects.iter().filter(|o| o["kind"] == "Server").collect();
    assert!(servers.iter().all(|s| s["spec"]["port"] != 9090), "{servers:?}");

    // --include-audited: the would-be denial is granted, by extending the existing Server.
    let mut observed = Observed { include_audited: true, ..Default::default() };
    add_pod(&mut observed, &web(), &samples);
    let out = generate("demo", &observed, Mode::Enforce);
    let kinds: Vec<(&str, &str)> =
        out.objects.iter().map(|o| (o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap())).collect();
    assert_eq!(
        kinds,
        [
            ("Server", "web-8080"),
            ("MeshTLSAuthentication", "web-api-observed-clients"),
            ("AuthorizationPolicy", "web-api-observed-clients")
        ],
        "{:#?}",
        out.objects
    );
    let authz = &out.objects[2];
    assert_eq!(
        authz["spec"]["targetRef"],
        serde_json::json!({"group": "policy.cnimesh.io", "kind": "Server", "name": "web-api"})
    );
    let granted = out.objects[1]["spec"].to_string();
    assert!(granted.contains("\"auditee\"") && !granted.contains("\"client\""), "{granted}");
    assert!(out.notes.iter().any(|n| n.contains("existing Server web-api")), "{:?}", out.notes);
}
