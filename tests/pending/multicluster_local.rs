//! NOT REGISTERED YET (issue 28, part C → lead): the two-cluster local mode end to end. Move the
//! first test into tests/tests/local_mode.rs as it is (it needs only part C); the second needs
//! part A's mirror controller (`cnimesh-control serve --mirror-service-cidr`) and part B's
//! gateway mode and Destination changes, so turn it on after merging A and B.
//!
//! It uses local_mode.rs's `local(slot)` helper and imports (`LocalMode`, `local_bins!`,
//! `require_root`, `serde_json::Value`, `Path`, `Command`).

/// Part C alone: west comes up beside east, routed, linked, with its gateway running; `check`
/// sees the Link, its credentials and the shared anchor; `down` removes both clusters and the
/// forwarding table.
#[test]
fn up_with_two_clusters_links_west_to_east_and_down_removes_both() {
    if !require_root("up_with_two_clusters_links_west_to_east_and_down_removes_both") {
        return;
    }
    let lm = local(3);
    let west_subnet = format!("10.251.{}.0/24", std::process::id() % 200);
    let out = lm.up_command().args(["--clusters", "2", "--west-subnet", &west_subnet]).output().unwrap();
    assert!(out.status.success(), "up failed: {}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mc = &summary["multicluster"];
    let west = lm.root.join("west");
    assert_eq!(mc["west_root"], west.display().to_string());
    // West's records: its trust domain and gateway, which `link --local` read.
    let record: Value = serde_json::from_slice(&std::fs::read(west.join("local.json")).unwrap()).unwrap();
    assert_eq!(record["trust_domain"], "west.local");
    assert_eq!(record["gateway"], mc["gateway"]);
    // The Link in east's cluster dir, root-only, pointing at west's cluster dir.
    let link_file = lm.root.join("cluster/link-west.yaml");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&link_file).unwrap().permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&link_file).unwrap();
    assert!(text.contains("targetTrustDomain: west.local"), "{text}");
    // West's issuer chains to east's anchor: one anchor.
    assert_eq!(std::fs::read(west.join("ca/ca.crt")).unwrap(), std::fs::read(lm.root.join("ca/ca.crt")).unwrap());
    // Routing: east's unmeshed `legacy` pod reaches west's gateway's admin port directly.
    let gateway: std::net::SocketAddr = mc["gateway"].as_str().unwrap().parse().unwrap();
    let ready = Command::new("ip")
        .args(["netns", "exec", &format!("{}-legacy", lm.prefix), "curl", "-sf", "--max-time", "3"])
        .arg(format!("http://{}:4191/ready", gateway.ip()))
        .status()
        .unwrap();
    assert!(ready.success(), "east's pods reach west's pod network");
    let check = Command::new(CLI).args(["multicluster", "check", "-o", "json", "--local"]).arg(&lm.root).output().unwrap();
    let report: Value = serde_json::from_slice(&check.stdout).unwrap();
    let status = |name: &str| {
        report["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).map(|c| c["status"].clone()).unwrap()
    };
    for name in ["link is valid", "credentials", "remote API", "gateway reachable", "trust anchors match"] {
        assert_eq!(status(name), "ok", "{name}: {report:#}");
    }
    let table = format!("inet cnimesh-local-{}", lm.prefix);
    let down = lm.down();
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
    assert!(lm.leftovers().is_empty(), "{:?}", lm.leftovers());
    assert!(!Path::new("/sys/class/net").join(format!("{}w0", lm.prefix)).exists(), "west's bridge is gone");
    let tables = Command::new("nft").args(["list", "tables"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&tables.stdout).contains(&table), "the forwarding table is gone");
}

/// Needs parts A and B merged: east's `client` reaches `web-west` through west's gateway and
/// `web-flat-west` directly, both mTLS; west's servers behind the gateway see the gateway's
/// identity, `web-flat`'s see east's client; `multicluster check` passes every check.
#[test]
fn two_local_clusters_carry_traffic_through_the_gateway_and_flat_with_the_documented_identities() {
    if !require_root("two_local_clusters_carry_traffic_through_the_gateway_and_flat_with_the_documented_identities") {
        return;
    }
    let lm = local(4);
    let west_subnet = format!("10.252.{}.0/24", std::process::id() % 200);
    let out = lm.up_command().args(["--clusters", "2", "--west-subnet", &west_subnet]).output().unwrap();
    assert!(out.status.success(), "up failed: {}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mc = &summary["multicluster"];
    assert_eq!(mc["mirror_controller"], true, "east's control plane runs the mirror controller");
    assert!(mc["notes"].as_array().unwrap().is_empty(), "{mc:#}");
    for mirror in ["web-west", "web-flat-west"] {
        let edge = mc["edges"].as_array().unwrap().iter().find(|e| e["to"] == mirror).unwrap();
        assert_eq!(edge["success_rate"], 1.0, "{edge:#}");
        assert_eq!(edge["tls"], true, "{edge:#}");
    }
    let gateway_id = "cnimesh-gateway.cnimesh-multicluster.serviceaccount.identity.cnimesh.west.local";
    let client_id = "client.demo.serviceaccount.identity.cnimesh.cluster.local";
    let seen = &mc["identities_seen"];
    assert_eq!(seen["gateway"], serde_json::json!([client_id]), "the gateway sees east's client");
    for pod in ["web-0", "web-1"] {
        assert!(seen[pod].as_array().unwrap().iter().any(|id| id == gateway_id), "{pod} sees the gateway: {seen:#}");
    }
    assert!(seen["web-flat"].as_array().unwrap().iter().any(|id| id == client_id), "flat: east's client: {seen:#}");
    let check = Command::new(CLI).args(["multicluster", "check", "--local"]).arg(&lm.root).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
}
