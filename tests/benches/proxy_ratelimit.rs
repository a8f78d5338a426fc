//! The cost of server-side rate limiting: two mTLS proxy pairs in the same run, both
//! with inbound policy from the control plane, whose servers' Servers differ only in a
//! HTTPLocalRateLimitPolicy: one limited far above the offered load (total and per identity at
//! 1,000,000 rps, so every request goes through both buckets and none is refused), one with no
//! limit. Rounds interleave the two rows; medians are printed with the added p50/p99 and the CPU
//! ratio (the target: within noise).
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench proxy_ratelimit` (needs nghttp2-client).
//! `CNIMESH_BENCH_ROUNDS` (default 3) sets the rounds.

use cnimesh_e2e::apps;
use cnimesh_e2e::bench::{interleaved_rounds, print_comparison, rounds};
use cnimesh_e2e::control::Control;
use cnimesh_e2e::mesh::Pair;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

/// A server pod and its Server (anyone may call it), limited or not.
fn server_yaml(server: &Pod<'_>, limited: bool) -> String {
    let (ip, name) = (server.ipv4(), &server.name);
    let mut docs = vec![
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop, labels: {{app: {name}}}}}\nspec:\n  serviceAccountName: {name}\n  containers: [{{name: app, image: app, ports: [{{name: http, containerPort: {}}}]}}]\nstatus: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}]}}\n",
            apps::HTTP_PORT
        ),
        format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  podSelector: {{matchLabels: {{app: {name}}}}}\n  port: http\n  proxyProtocol: HTTP/1\n  accessPolicy: all-unauthenticated\n"
        ),
    ];
    if limited {
        docs.push(format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: HTTPLocalRateLimitPolicy\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  targetRef: {{group: policy.cnimesh.io, kind: Server, name: {name}}}\n  total: {{requestsPerSecond: 1000000}}\n  identity: {{requestsPerSecond: 1000000}}\n"
        ));
    }
    docs.join("---\n")
}

fn main() {
    if !require_root("proxy rate limit benchmark") {
        return;
    }
    let rounds = rounds();
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let limited = (Pod::named(&net, "shop", "rl-client").unwrap(), Pod::named(&net, "shop", "rl-server").unwrap());
    let free = (Pod::named(&net, "shop", "free-client").unwrap(), Pod::named(&net, "shop", "free-server").unwrap());
    let yaml = [
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n".to_string(),
        server_yaml(&limited.1, true),
        server_yaml(&free.1, false),
    ]
    .join("---\n");
    let control = Control::start_with_objects(&bins.control, &control_pod, &[], &[("cluster.yaml", &yaml)]).unwrap();
    let with = Pair::policed(&control, &bins.proxy, limited.0, limited.1, true);
    let without = Pair::policed(&control, &bins.proxy, free.0, free.1, true);
    // Both Servers are in force before measuring.
    with.wait_for_server_metric("srv_name=\"rl-server\"");
    without.wait_for_server_metric("srv_name=\"free-server\"");

    let rows = [without.row("mTLS pair, no rate limit"), with.row("mTLS pair, rate limit idle")];
    let samples = interleaved_rounds(&rows, rounds);
    let limited = with.server_proxy.metric("inbound_http_local_ratelimit_total");
    assert_eq!(limited, 0.0, "the limit is far above the load: nothing refused");

    print_comparison("Inbound rate limit cost", &rows, &samples, "rate limit", 3.0);
}
