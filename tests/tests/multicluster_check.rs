//! `cnimesh multicluster check` against real clusters: east and west, each a control plane on
//! its own API server, east linked to west with what `cnimesh multicluster link` prints and
//! east's mirror (`cnimesh-mirror`) in a pod of its own; west runs a real gateway (a proxy in
//! gateway mode). The real `cnimesh` binary checks east (`--kubeconfig`, east's API server) from
//! east's control plane pod, as an operator would: it passes while the link is up, fails naming
//! the lost link and its reason once the mirror marks it lost, passes again once west is back,
//! and names a Link whose credentials Secret is missing.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use cnimesh_common::names::{GATEWAY_NAME, MULTICLUSTER_NAMESPACE, PROXY_INBOUND_PORT};
use cnimesh_e2e::multicluster::{Clusters, link_without_secret, service_yaml, start_gateway};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use cnimesh_mirror::crd::LinkState;
use serde_json::{Value, json};

/// Only guards against a hung test; nothing here measures time.
const PATIENCE: Duration = Duration::from_secs(30);
const CLI: &str = env!("CARGO_BIN_EXE_cnimesh-cli-e2e");
const MIRROR: &str = env!("CARGO_BIN_EXE_cnimesh-mirror-e2e");

/// One run of `cnimesh multicluster check --kubeconfig <east's> -o <output>` inside east's
/// control plane pod: whether it passed (exit 0) and what it printed.
fn check(c: &Clusters<'_>, output: &str) -> (bool, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", c.east_pod.netns.name(), CLI, "multicluster", "check", "-o", output, "--kubeconfig"])
        .arg(c.east.cluster.kubeconfig())
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() || out.status.code() == Some(1),
        "check ran: {out:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The checks of `report` (check's JSON) in `category`, by name: (status, message).
fn checks_of(report: &Value, category: &str) -> Vec<(String, String, String)> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["category"] == category)
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("name"), s("status"), s("message"))
        })
        .collect()
}

fn json_check(c: &Clusters<'_>) -> (bool, Value) {
    let (passed, text) = check(c, "json");
    let report: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("check's JSON: {e}\n{text}"));
    assert_eq!(report["success"], passed, "the exit code agrees with the report: {report:#}");
    (passed, report)
}

#[test]
fn multicluster_check_names_a_lost_link_with_its_reason_and_passes_again_once_it_is_back_and_names_a_missing_secret() {
    if !require_root(
        "multicluster_check_names_a_lost_link_with_its_reason_and_passes_again_once_it_is_back_and_names_a_missing_secret",
    ) {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let c = Clusters::start(&bins, &net);
    let gateway_pod = Pod::unmeshed(&net, MULTICLUSTER_NAMESPACE, GATEWAY_NAME).unwrap();
    // West exports web through the gateway and db by remote discovery (no traffic here: the
    // pods are records only).
    let exported = "mirror.cnimesh.io/exported: \"true\"";
    let flat = "mirror.cnimesh.io/exported: remote-discovery";
    let west = &c.west.cluster;
    west.apply_yaml("web.yaml", &service_yaml("web", exported, "10.97.0.10", &[("web-0", Ipv4Addr::new(10, 2, 0, 4))]))
        .unwrap();
    west.apply_yaml("db.yaml", &service_yaml("db", flat, "10.97.0.11", &[("db-0", Ipv4Addr::new(10, 2, 0, 5))]))
        .unwrap();
    let _gateway = start_gateway(&bins, &c.west, &gateway_pod);
    c.link(Some(SocketAddr::new(gateway_pod.ipv4().into(), PROXY_INBOUND_PORT)));
    let _mirror = c.start_mirror(MIRROR.as_ref());

    // Up: the mirrors are made and the gateway answers its probe; every check passes.
    eventually("east's mirror says the link is up with both mirrors and the gateway alive", PATIENCE, || {
        c.link_status("west").is_some_and(|s| {
            s.state == Some(LinkState::Up) && s.mirrors.len() == 2 && s.gateway.is_some_and(|g| g.alive)
        })
    });
    let (passed, report) = json_check(&c);
    assert!(passed, "check passes with the link up: {report:#}");
    let west_checks = checks_of(&report, "link west");
    for name in [
        "link is valid",
        "credentials",
        "remote API",
        "gateway reachable",
        "gateway certificate",
        "linked issuer constrained",
        "trust anchors match",
        "link status",
        "mirrors",
    ] {
        assert!(west_checks.iter().any(|(n, status, _)| n == name && status == "ok"), "{name} is ok: {west_checks:#?}");
    }

    // West's API server refuses everything: once east's mirror marks the link lost, check
    // fails and names the link and why.
    west.api.refuse(true);
    eventually("east's mirror marks the link lost", PATIENCE, || {
        c.link_status("west").is_some_and(|s| s.state == Some(LinkState::Lost))
    });
    let reason = c.link_status("west").and_then(|s| s.reason).unwrap();
    let (passed, report) = json_check(&c);
    assert!(!passed, "check fails with the link lost: {report:#}");
    let west_checks = checks_of(&report, "link west");
    let status = west_checks.iter().find(|(n, _, _)| n == "link status").unwrap();
    assert_eq!(status.1, "fail", "{west_checks:#?}");
    assert!(status.2.starts_with("lost: ") && status.2.contains(&reason), "names the reason {reason:?}: {status:?}");
    let mirrors = west_checks.iter().find(|(n, _, _)| n == "mirrors").unwrap();
    assert!(mirrors.1 == "fail" && mirrors.2.contains("2 mirror(s) keep the endpoints"), "{mirrors:?}");
    let (_, table) = check(&c, "table");
    assert!(table.contains("link west") && table.contains(&format!("lost: {reason}")), "{table}");

    // West back: the mirror resyncs and check passes again.
    west.api.refuse(false);
    eventually("east's mirror says the link is up again", PATIENCE, || {
        c.link_status("west").is_some_and(|s| s.state == Some(LinkState::Up))
    });
    eventually("check passes again", PATIENCE, || json_check(&c).0);

    // A Link whose Secret is missing: check names it and its Secret; west's checks still pass.
    c.east.cluster.apply_yaml("link-north.yaml", &link_without_secret("north")).unwrap();
    let (passed, report) = json_check(&c);
    assert!(!passed, "{report:#}");
    let north = checks_of(&report, "link north");
    let credentials = north.iter().find(|(n, _, _)| n == "credentials").unwrap();
    assert_eq!(credentials.1, "fail", "{north:#?}");
    assert!(credentials.2.contains("cnimesh/cluster-credentials-north"), "names the Secret: {credentials:?}");
    assert!(
        checks_of(&report, "link west").iter().all(|(_, status, _)| status == "ok"),
        "the other link is unaffected: {report:#}"
    );
}

/// An RFC 3339 time of a Link status, parsed.
fn at(time: &Option<String>) -> std::time::SystemTime {
    humantime::parse_rfc3339_weak(time.as_deref().expect("a time")).expect("RFC 3339")
}

#[test]
fn an_idle_healthy_link_stays_green_past_the_stale_bound_and_goes_red_once_its_mirror_controller_dies() {
    if !require_root(
        "an_idle_healthy_link_stays_green_past_the_stale_bound_and_goes_red_once_its_mirror_controller_dies",
    ) {
        return;
    }
    use cnimesh_mirror::crd::HEARTBEAT_STALE_AFTER;
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let c = Clusters::start(&bins, &net);
    // No gateway: no probe writes the status; only the heartbeat can keep it fresh.
    let db = [("db-0", Ipv4Addr::new(10, 2, 0, 5))];
    c.west
        .cluster
        .apply_yaml("db.yaml", &service_yaml("db", "mirror.cnimesh.io/exported: remote-discovery", "10.97.0.11", &db))
        .unwrap();
    c.link(None);
    let mirror = c.start_mirror(MIRROR.as_ref());
    eventually("east's mirror says the link is up with its mirror", PATIENCE, || {
        c.link_status("west").is_some_and(|s| s.state == Some(LinkState::Up) && s.mirrors.len() == 1)
    });
    let synced = c.link_status("west").unwrap().last_sync;

    // Nothing changes in west: the last change goes older than the stale bound, the heartbeat
    // keeps coming, and check stays green.
    eventually("the heartbeat moves past the last change by more than the stale bound", 3 * PATIENCE, || {
        c.link_status("west").is_some_and(|s| {
            s.last_heartbeat.is_some() && at(&s.last_heartbeat) > at(&s.last_sync) + HEARTBEAT_STALE_AFTER
        })
    });
    assert_eq!(c.link_status("west").unwrap().last_sync, synced, "idle: no change synced meanwhile");
    let (passed, report) = json_check(&c);
    assert!(passed, "an idle healthy link passes: {report:#}");
    let status = checks_of(&report, "link west").into_iter().find(|(n, _, _)| n == "link status").unwrap();
    assert!(status.1 == "ok" && status.2.starts_with("up: heartbeat"), "{status:?}");

    // The mirror dies: the heartbeat goes old and check fails, naming the mirror controller
    // rather than the remote cluster.
    drop(mirror);
    eventually("check fails once the heartbeat is older than the stale bound", 3 * PATIENCE, || !json_check(&c).0);
    let (_, report) = json_check(&c);
    let status = checks_of(&report, "link west").into_iter().find(|(n, _, _)| n == "link status").unwrap();
    assert!(status.1 == "fail" && status.2.contains("no heartbeat from the mirror controller"), "{status:?}");
}
