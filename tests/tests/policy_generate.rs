//! `cnimesh policy generate` end to end: local mode runs a mesh with no
//! policy, where `client` calls `web` and a meshed `intruder` could too; the command turns what
//! web's proxies let in into a Server + MeshTLSAuthentication + AuthorizationPolicy, and once the
//! control plane serves that, client → web stays at 100 % while the intruder is denied.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cnimesh_e2e::local_mode::LocalMode;
use cnimesh_e2e::{local_bins, require_root};
use cnimesh_local::traffic::{http_get_in, load};

const CLI: &str = env!("CARGO_BIN_EXE_cnimesh-cli-e2e");

/// `web` has no `allow`: the demo's own policy is not there, only the default (all traffic).
const WORKLOADS: &str = "namespace: demo
services:
  - {name: web, clusterIP: 10.96.0.10, port: 80, replicas: 2, meshed: true}
clients:
  - {name: client, meshed: true, calls: [web]}
  - {name: intruder, meshed: true, calls: []}
";

#[test]
fn the_policy_generated_from_observed_traffic_keeps_the_client_and_denies_the_intruder() {
    if !require_root("the_policy_generated_from_observed_traffic_keeps_the_client_and_denies_the_intruder") {
        return;
    }
    let pid = std::process::id();
    let local = LocalMode::new(format!("cnmp{:x}", pid & 0xffff), format!("10.246.{}.0/24", pid % 100), local_bins!());
    let out = local.up_with_workloads(WORKLOADS);
    assert!(out.status.success(), "up failed: {}", String::from_utf8_lossy(&out.stderr));
    let web = "10.96.0.10:80".parse().unwrap();
    let (intruder, client) = (local.netns("intruder"), local.netns("client"));

    // Without policy the intruder gets in: whatever denies it later is the generated policy.
    let (status, _) = http_get_in(&intruder, web, "web", "/").unwrap();
    assert_eq!(status, 200, "no policy yet");
    // Only the client's traffic is counted from here: the window starts after the intruder's
    // request and ends before the next one.
    let mut generate = Command::new(CLI)
        .args(["policy", "generate", "demo", "--window", "3s", "--local"])
        .arg(&local.root)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The window starts with the CLI's first reading, which it says on stderr.
    let mut stderr = BufReader::new(generate.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("first reading taken") {
        if stderr.read_line(&mut said).unwrap() == 0 {
            break;
        }
    }
    assert!(said.contains("first reading taken"), "policy generate never started its window: {said}");
    assert!(load(&client, web, "web", 2, Duration::from_secs(2)).failures.is_empty());
    let out = generate.wait_with_output().unwrap();
    stderr.read_to_string(&mut said).unwrap();
    assert!(out.status.success(), "policy generate: {said}");
    let yaml = String::from_utf8(out.stdout).unwrap();
    let docs = cnimesh_cli::yaml::documents(&yaml, "policy generate").unwrap();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(kinds, ["Server", "MeshTLSAuthentication", "AuthorizationPolicy"], "{yaml}");
    assert_eq!(docs[0]["spec"]["podSelector"]["matchLabels"]["cnimesh.io/proxy-deployment"], "web", "{yaml}");
    assert_eq!(docs[0]["spec"]["port"], 8080, "{yaml}");
    let refs = docs[1]["spec"]["identityRefs"].to_string();
    assert!(refs.contains("\"client\"") && !refs.contains("intruder"), "exactly the observed client: {yaml}");

    // Enforced: applied to local mode's API server with kubectl.
    local.kubectl(&["apply", "-f", "-"], &yaml);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (status, body) = loop {
        let (status, body) = http_get_in(&intruder, web, "web", "/").unwrap();
        if status != 200 || Instant::now() > deadline {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status, 403, "the generated policy denies the intruder: {body}");
    let after = load(&client, web, "web", 2, Duration::from_secs(2));
    assert!(after.failures.is_empty(), "client -> web stays at 100 %: {:?}", after.failures);
    assert!(after.statuses.get(&200).is_some_and(|n| *n > 0), "{:?}", after.statuses);

    let down = local.down();
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
}
