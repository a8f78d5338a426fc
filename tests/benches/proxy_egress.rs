//! The cost of egress visibility: two meshed clients of this build in the same run,
//! both calling the same plain-HTTP server outside the mesh's networks (203.0.113.10, another
//! netns) through their proxies, with OutboundPolicies from the control plane. One client's
//! namespace has an `Allow` EgressNetwork (every egress request is routed by the EgressNetwork's
//! policy, its hostname recorded in `outbound_egress_requests_total`), the other has none (the
//! control plane answers NotFound: forwarded as before). The server is not meshed, so the rows
//! measure the client proxies only (no mTLS on this path). Rounds interleave the rows; medians
//! are printed with the added p50/p99 and the CPU ratio (target: within noise).
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench proxy_egress` (needs nghttp2-client).
//! `CNIMESH_BENCH_ROUNDS` (default 3) sets the rounds.

use std::time::{Duration, Instant};

use cnimesh_e2e::apps;
use cnimesh_e2e::bench::{Row, interleaved_rounds, print_comparison, rounds};
use cnimesh_e2e::control::{Control, env_refs};
use cnimesh_e2e::outside::{OUTSIDE_IP, Outside};
use cnimesh_e2e::sidecar::{Sidecar, http_in, metric_with};
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const EGRESS: &str = "apiVersion: policy.cnimesh.io/v1alpha1\nkind: EgressNetwork\nmetadata: {name: all, namespace: egress}\nspec: {trafficPolicy: Allow}\n";

fn main() {
    if !require_root("proxy egress benchmark") {
        return;
    }
    let rounds = rounds();
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let plain = Pod::named(&net, "plain", "client").unwrap();
    let egress = Pod::named(&net, "egress", "client").unwrap();
    let outside_pod = Pod::unmeshed(&net, "outside", "world").unwrap();
    let _outside = Outside::start(&outside_pod, &["api.example.test"], &[&plain, &egress]).unwrap();
    let control = Control::start_with_objects(&bins.control, &control_pod, &[], &[("egress.yaml", EGRESS)]).unwrap();
    let proxy = |pod: &Pod<'_>| {
        let ns = &pod.namespace;
        let mut env = control.proxy_env(ns, "client", &control.token(ns, "client").unwrap());
        env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
        env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), format!("{ns}:client")));
        Sidecar::start(&bins.proxy, &pod.netns, &env_refs(&env)).unwrap()
    };
    let (plain_proxy, egress_proxy) = (proxy(&plain), proxy(&egress));
    let addr = format!("{OUTSIDE_IP}:{}", apps::HTTP_PORT);

    // The EgressNetwork is in force before measuring: the client's requests are counted by host.
    let recorded =
        || metric_with(&egress_proxy.metrics(), "outbound_egress_requests_total", &["egress_network=\"egress/all\""]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while recorded() == 0.0 {
        assert!(Instant::now() < deadline, "the EgressNetwork never applied:\n{}", egress_proxy.metrics());
        let _ = http_in(&egress.netns.path(), &addr, "GET", "/hello", "");
        std::thread::sleep(Duration::from_millis(100));
    }
    let url = format!("http://{addr}/hello");
    let rows = vec![
        Row { name: "egress, no EgressNetwork", netns: &plain.netns, url: url.clone(), pids: vec![plain_proxy.pid()] },
        Row { name: "egress, Allow EgressNetwork", netns: &egress.netns, url, pids: vec![egress_proxy.pid()] },
    ];
    let samples = interleaved_rounds(&rows, rounds);
    let seen = recorded();
    assert!(seen > 1000.0, "the measured requests were seen as egress: {seen}");
    assert_eq!(metric_with(&plain_proxy.metrics(), "outbound_egress_requests_total", &[]), 0.0);
    print_comparison(
        "Egress visibility cost, plain HTTP to an outside address",
        &rows,
        &samples,
        "Allow EgressNetwork",
        5.0,
    );
}
