//! Local mode with an ingress controller: `cnimesh-local up` with a workloads file whose
//! `ingress:` puts Debian's nginx in a meshed pod annotated `cnimesh.io/inject: ingress`, routing
//! `Host: web.shop` to the `web` Service, whose HTTPRoute splits 90/10 with `web-canary`. Requests
//! sent from the host to the ingress pod's address get the split, reach the targets over mTLS
//! under the ingress's identity, and are admitted by Servers that allow only the ingress (a meshed
//! client of another identity gets 403s). `down` removes everything, nginx included. (A bad
//! `ingress:` is refused before anything is created: local_mode.rs's bad workloads file test.)

use std::collections::BTreeMap;
use std::net::SocketAddr;

use cnimesh_common::names::PROXY_ADMIN_PORT;
use cnimesh_e2e::local_mode::LocalMode;
use cnimesh_e2e::sidecar::metric_with;
use cnimesh_e2e::{local_bins, require_root};
use cnimesh_local::traffic::{http_get, http_get_in};
use serde_json::Value;

/// Requests sent through the ingress.
const N: usize = 400;

const WORKLOADS: &str = r#"namespace: shop
services:
  - name: web
    clusterIP: 10.96.0.10
    meshed: true
    allow: [ingress]
    split: [{service: web, weight: 90}, {service: web-canary, weight: 10}]
  - name: web-canary
    clusterIP: 10.96.0.11
    meshed: true
    allow: [ingress]
clients:
  # Meshed under an identity of its own, which web's Server does not allow.
  - name: intruder
    meshed: true
    calls: [web]
ingress:
  routes: [{host: web.shop, service: web}]
"#;

/// A local mode instance with names and a subnet of its own (10.248.100–199; other test files
/// use 10.245–10.248.99).
fn local() -> LocalMode {
    let pid = std::process::id();
    LocalMode::new(format!("cnmi{:x}", pid & 0xffff), format!("10.248.{}.0/24", 100 + pid % 100), local_bins!())
}

/// Inbound mTLS requests `pod`'s proxy counted from `client_id`.
fn inbound_mtls_from(local: &LocalMode, pod: &str, client_id: &str) -> f64 {
    let (_, metrics) =
        http_get_in(&local.netns(pod), SocketAddr::from(([127, 0, 0, 1], PROXY_ADMIN_PORT)), "proxy", "/metrics")
            .unwrap();
    metric_with(
        &metrics,
        "request_total",
        &["direction=\"inbound\"", "tls=\"true\"", &format!("client_id=\"{client_id}\"")],
    )
}

#[test]
fn an_ingress_in_local_mode_gets_the_split_over_mtls_under_its_identity_and_down_removes_nginx() {
    if !require_root("an_ingress_in_local_mode_gets_the_split_over_mtls_under_its_identity_and_down_removes_nginx") {
        return;
    }
    let local = local();
    let out = local.up_with_workloads(WORKLOADS);
    assert!(out.status.success(), "up failed: {}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();

    // The summary says where the ingress is.
    let address: SocketAddr = summary["ingress"]["address"].as_str().unwrap().parse().unwrap();
    assert_eq!(summary["ingress"]["routes"]["web.shop"], "web", "{summary:#}");
    let nginx_pid: u32 = std::fs::read_to_string(local.root.join("run/nginx.pid")).unwrap().trim().parse().unwrap();

    // From the host through nginx: web's split, every request admitted by Servers that allow only
    // the ingress. The canary's share lies within five standard deviations of 10 % (binomial:
    // for 400 requests, 40 ± 30).
    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..N {
        let (status, body) = http_get(address, "web.shop", "/").unwrap();
        assert_eq!(status, 200, "{body}");
        *answered.entry(body).or_default() += 1;
    }
    let (web, canary) = (answered.get("web").copied().unwrap_or(0), answered.get("web-canary").copied().unwrap_or(0));
    assert_eq!(web + canary, N, "{answered:?}");
    let (mean, sd) = (N as f64 * 0.1, (N as f64 * 0.1 * 0.9).sqrt());
    assert!((canary as f64 - mean).abs() <= 5.0 * sd, "canary {canary} of {N}, expected {mean} ± {}", 5.0 * sd);
    // A host no route names: nginx's default server, not a Service.
    let (status, _) = http_get(address, "nobody.shop", "/").unwrap();
    assert_eq!(status, 404);

    // The targets' proxies saw them as mTLS requests of the ingress's identity.
    let ingress_id = "ingress.shop.serviceaccount.identity.cnimesh.cluster.local";
    assert!(inbound_mtls_from(&local, "web", ingress_id) >= web as f64);
    assert!(inbound_mtls_from(&local, "web-canary", ingress_id) >= canary as f64);

    // Another meshed client of web is refused: the allow list names only the ingress.
    let intruder = summary["edges"].as_array().unwrap().iter().find(|e| e["from"] == "intruder").unwrap();
    assert_eq!(intruder["successes"], 0, "{intruder:#}");
    assert!(intruder["statuses"]["403"].as_u64().unwrap() > 0, "{intruder:#}");

    let down = local.down();
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
    assert!(!std::path::Path::new(&format!("/proc/{nginx_pid}")).exists(), "nginx ({nginx_pid}) still runs");
    assert_eq!(local.leftovers(), Vec::<String>::new());
}
