//! `cnimesh multicluster check` against a real control plane: east's control plane on
//! the files backend runs its mirror controller over a Link to west made by the real
//! `cnimesh multicluster link --local`; west runs its own control plane and a real gateway (a
//! proxy in gateway mode). The real `cnimesh` binary checks east (`--local`, east's root) from
//! east's control plane pod, as an operator would from a node: it passes while the link is up,
//! fails naming the lost link and its reason once east's control plane marks it lost, passes
//! again once west is back, and names a Link whose credentials Secret is missing.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use cnimesh_common::names::{GATEWAY_NAME, MULTICLUSTER_NAMESPACE, PROXY_INBOUND_PORT};
use cnimesh_e2e::control::{Control, write_atomically};
use cnimesh_e2e::multicluster::{LocalRoot, link_local, service_yaml, start_gateway};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use cnimesh_mirror::crd::LinkState;
use serde_json::{Value, json};

/// Only guards against a hung test; nothing here measures time.
const PATIENCE: Duration = Duration::from_secs(30);
const CLI: &str = env!("CARGO_BIN_EXE_cnimesh-cli-e2e");

/// One run of `cnimesh multicluster check --local <root> -o <output>` inside `pod`'s netns:
/// whether it passed (exit 0) and what it printed.
fn check(pod: &Pod<'_>, root: &LocalRoot, output: &str) -> (bool, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", pod.netns.name(), CLI, "multicluster", "check", "-o", output, "--local"])
        .arg(root.path())
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

fn json_check(pod: &Pod<'_>, root: &LocalRoot) -> (bool, Value) {
    let (passed, text) = check(pod, root, "json");
    let report: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("check's JSON: {e}\n{text}"));
    assert_eq!(report["success"], passed, "the exit code agrees with the report: {report:#}");
    (passed, report)
}

/// A Link to `cluster` as `link` prints it, without its credentials Secret.
fn link_without_secret(cluster: &str) -> String {
    format!(
        "apiVersion: multicluster.cnimesh.io/v1alpha1\nkind: Link\nmetadata: {{name: {cluster}, namespace: cnimesh}}\nspec:\n  targetClusterName: {cluster}\n  targetTrustDomain: {cluster}.local\n  clusterCredentialsSecret: cluster-credentials-{cluster}\n"
    )
}

/// East's control plane on its files backend with the mirror controller on, and west's, which
/// shares east's trust anchor under its own trust domain.
fn controls(
    bins: &cnimesh_e2e::cni::Bins,
    (east_pod, east_root): (&Pod<'_>, &LocalRoot),
    (west_pod, west_root): (&Pod<'_>, &LocalRoot),
) -> (Control, Control) {
    let (east_cluster, west_cluster) =
        (east_root.cluster().display().to_string(), west_root.cluster().display().to_string());
    let east = Control::start(
        &bins.control,
        east_pod,
        &["--cluster-dir", &east_cluster, "--mirror-service-cidr", "10.96.0.0/12"],
    )
    .unwrap();
    let west =
        Control::start_sharing_anchor(&bins.control, west_pod, &["--cluster-dir", &west_cluster], &east, "west.local")
            .unwrap();
    (east, west)
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
    let (east_root, west_root) = (LocalRoot::new(), LocalRoot::new());
    let east_pod = Pod::unmeshed(&net, "cnimesh", "control-east").unwrap();
    let west_pod = Pod::unmeshed(&net, "cnimesh", "control-west").unwrap();
    let gateway_pod = Pod::unmeshed(&net, MULTICLUSTER_NAMESPACE, GATEWAY_NAME).unwrap();
    // West exports web through the gateway and db by remote discovery (no traffic here: the
    // pods are records only).
    let exported = "mirror.cnimesh.io/exported: \"true\"";
    let flat = "mirror.cnimesh.io/exported: remote-discovery";
    write_atomically(
        &west_root.file("web.yaml"),
        &service_yaml("web", exported, "10.97.0.10", &[("web-0", Ipv4Addr::new(10, 2, 0, 4))]),
    );
    write_atomically(
        &west_root.file("db.yaml"),
        &service_yaml("db", flat, "10.97.0.11", &[("db-0", Ipv4Addr::new(10, 2, 0, 5))]),
    );
    let (east, west) = controls(&bins, (&east_pod, &east_root), (&west_pod, &west_root));
    let _gateway = start_gateway(&bins, &west, &gateway_pod);
    east_root.record(&east, None);
    west_root.record(&west, Some(SocketAddr::new(gateway_pod.ipv4().into(), PROXY_INBOUND_PORT)));
    link_local(CLI.as_ref(), &east_root, &west_root, "west");

    // Up: the mirrors are made and the gateway answers its probe; every check passes.
    eventually("east's control plane says the link is up with both mirrors and the gateway alive", PATIENCE, || {
        east_root.link_status("west").is_some_and(|s| {
            s.state == Some(LinkState::Up) && s.mirrors.len() == 2 && s.gateway.is_some_and(|g| g.alive)
        })
    });
    let (passed, report) = json_check(&east_pod, &east_root);
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

    // West's directory goes away: once east's control plane marks the link lost, check fails
    // and names the link and why.
    let away = west_root.path().join("cluster-away");
    std::fs::rename(west_root.cluster(), &away).unwrap();
    eventually("east's control plane marks the link lost", PATIENCE, || {
        east_root.link_status("west").is_some_and(|s| s.state == Some(LinkState::Lost))
    });
    let reason = east_root.link_status("west").and_then(|s| s.reason).unwrap();
    let (passed, report) = json_check(&east_pod, &east_root);
    assert!(!passed, "check fails with the link lost: {report:#}");
    let west_checks = checks_of(&report, "link west");
    let status = west_checks.iter().find(|(n, _, _)| n == "link status").unwrap();
    assert_eq!(status.1, "fail", "{west_checks:#?}");
    assert!(status.2.starts_with("lost: ") && status.2.contains(&reason), "names the reason {reason:?}: {status:?}");
    let mirrors = west_checks.iter().find(|(n, _, _)| n == "mirrors").unwrap();
    assert!(mirrors.1 == "fail" && mirrors.2.contains("2 mirror(s) keep the endpoints"), "{mirrors:?}");
    let (_, table) = check(&east_pod, &east_root, "table");
    assert!(table.contains("link west") && table.contains(&format!("lost: {reason}")), "{table}");

    // West back: the control plane resyncs and check passes again.
    std::fs::rename(&away, west_root.cluster()).unwrap();
    eventually("east's control plane says the link is up again", PATIENCE, || {
        east_root.link_status("west").is_some_and(|s| s.state == Some(LinkState::Up))
    });
    eventually("check passes again", PATIENCE, || json_check(&east_pod, &east_root).0);

    // A Link whose Secret is missing: check names it and its Secret; west's checks still pass.
    write_atomically(&east_root.file("link-north.yaml"), &link_without_secret("north"));
    let (passed, report) = json_check(&east_pod, &east_root);
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
    let (east_root, west_root) = (LocalRoot::new(), LocalRoot::new());
    let east_pod = Pod::unmeshed(&net, "cnimesh", "control-east").unwrap();
    let west_pod = Pod::unmeshed(&net, "cnimesh", "control-west").unwrap();
    // No gateway: no probe writes the status; only the heartbeat can keep it fresh.
    write_atomically(
        &west_root.file("db.yaml"),
        &service_yaml(
            "db",
            "mirror.cnimesh.io/exported: remote-discovery",
            "10.97.0.11",
            &[("db-0", Ipv4Addr::new(10, 2, 0, 5))],
        ),
    );
    let (mut east, west) = controls(&bins, (&east_pod, &east_root), (&west_pod, &west_root));
    east_root.record(&east, None);
    west_root.record(&west, None);
    link_local(CLI.as_ref(), &east_root, &west_root, "west");
    eventually("east's control plane says the link is up with its mirror", PATIENCE, || {
        east_root.link_status("west").is_some_and(|s| s.state == Some(LinkState::Up) && s.mirrors.len() == 1)
    });
    let synced = east_root.link_status("west").unwrap().last_sync;

    // Nothing changes in west: the last change goes older than the stale bound, the heartbeat
    // keeps coming, and check stays green.
    eventually("the heartbeat moves past the last change by more than the stale bound", 3 * PATIENCE, || {
        east_root.link_status("west").is_some_and(|s| {
            s.last_heartbeat.is_some() && at(&s.last_heartbeat) > at(&s.last_sync) + HEARTBEAT_STALE_AFTER
        })
    });
    assert_eq!(east_root.link_status("west").unwrap().last_sync, synced, "idle: no change synced meanwhile");
    let (passed, report) = json_check(&east_pod, &east_root);
    assert!(passed, "an idle healthy link passes: {report:#}");
    let status = checks_of(&report, "link west").into_iter().find(|(n, _, _)| n == "link status").unwrap();
    assert!(status.1 == "ok" && status.2.starts_with("up: heartbeat"), "{status:?}");

    // The mirror controller dies (its control plane stops): the heartbeat goes old and check
    // fails, naming the mirror controller rather than the remote cluster.
    east.stop();
    eventually("check fails once the heartbeat is older than the stale bound", 3 * PATIENCE, || {
        !json_check(&east_pod, &east_root).0
    });
    let (_, report) = json_check(&east_pod, &east_root);
    let status = checks_of(&report, "link west").into_iter().find(|(n, _, _)| n == "link status").unwrap();
    assert!(status.1 == "fail" && status.2.contains("no heartbeat from the mirror controller"), "{status:?}");
    drop(west);
}
