//! The cost of server-side rate limiting (issue 30): two mTLS proxy pairs in the same run, both
//! with inbound policy from the control plane, whose servers' Servers differ only in a
//! HTTPLocalRateLimitPolicy: one limited far above the offered load (total and per identity at
//! 1,000,000 rps, so every request goes through both buckets and none is refused), one with no
//! limit. Rounds interleave the two rows; medians are printed with the added p50/p99 and the CPU
//! ratio (the target: within noise).
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench proxy_ratelimit` (needs nghttp2-client).
//! `CNIMESH_BENCH_ROUNDS` (default 3) sets the rounds.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::bench::{Row, interleaved_rounds, print_comparison, rounds};
use cnimesh_e2e::control::{Control, env_refs, identity};
use cnimesh_e2e::sidecar::Sidecar;
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

struct Pair<'n> {
    client: Pod<'n>,
    server: Pod<'n>,
    _apps: Apps,
    client_proxy: Sidecar,
    server_proxy: Sidecar,
}

impl Pair<'_> {
    fn url(&self) -> String {
        format!("http://{}/hello", SocketAddr::new(self.server.ipv4().into(), apps::HTTP_PORT))
    }

    fn pids(&self) -> [u32; 2] {
        [self.client_proxy.pid(), self.server_proxy.pid()]
    }
}

fn pair<'n>(control: &Control, proxy: &Path, client: Pod<'n>, server: Pod<'n>) -> Pair<'n> {
    let apps = Apps::start(&server.netns.path(), server.ipv4().into(), &server.name).unwrap();
    let mut server_env = control.proxy_env("shop", &server.name, &control.token("shop", &server.name).unwrap());
    server_env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    server_env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), format!("shop:{}", server.name)));
    let mut client_env = control.proxy_env("shop", &client.name, &control.token("shop", &client.name).unwrap());
    client_env.push((
        "CNIMESH_PROXY_OUTBOUND_IDENTITIES".into(),
        format!("{}={}", server.ipv4(), identity("shop", &server.name)),
    ));
    let server_proxy = Sidecar::start(proxy, &server.netns, &env_refs(&server_env)).unwrap();
    let client_proxy = Sidecar::start(proxy, &client.netns, &env_refs(&client_env)).unwrap();
    Pair { client, server, _apps: apps, client_proxy, server_proxy }
}

/// Waits until `pair`'s server proxy admits the client under its Server (the policy is in
/// force before measuring).
fn wait_for_server(pair: &Pair<'_>, name: &str) {
    let admitted = format!("srv_name=\"{name}\"");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pair.server_proxy.metrics().contains(&admitted) {
        assert!(Instant::now() < deadline, "the Server never applied:\n{}", pair.server_proxy.metrics());
        let _ = cnimesh_e2e::sidecar::http_in(
            &pair.client.netns.path(),
            &format!("{}:{}", pair.server.ipv4(), apps::HTTP_PORT),
            "GET",
            "/hello",
            "",
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn main() {
    if !require_root("proxy rate limit benchmark") {
        return;
    }
    let rounds = rounds();
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let cluster = tempfile::tempdir().unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let limited = (Pod::named(&net, "shop", "rl-client").unwrap(), Pod::named(&net, "shop", "rl-server").unwrap());
    let free = (Pod::named(&net, "shop", "free-client").unwrap(), Pod::named(&net, "shop", "free-server").unwrap());
    let yaml = [
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n".to_string(),
        server_yaml(&limited.1, true),
        server_yaml(&free.1, false),
    ]
    .join("---\n");
    std::fs::write(cluster.path().join("cluster.yaml"), yaml).unwrap();
    let cluster_dir = cluster.path().display().to_string();
    let control = Control::start(&bins.control, &control_pod, &["--cluster-dir", &cluster_dir]).unwrap();
    let with = pair(&control, &bins.proxy, limited.0, limited.1);
    let without = pair(&control, &bins.proxy, free.0, free.1);
    wait_for_server(&with, "rl-server");
    wait_for_server(&without, "free-server");

    let rows: Vec<Row<'_>> = [("mTLS pair, no rate limit", &without), ("mTLS pair, rate limit idle", &with)]
        .into_iter()
        .map(|(name, p)| Row { name, netns: &p.client.netns, url: p.url(), pids: p.pids().to_vec() })
        .collect();
    let samples = interleaved_rounds(&rows, rounds);
    let limited = with.server_proxy.metric("inbound_http_local_ratelimit_total");
    assert_eq!(limited, 0.0, "the limit is far above the load: nothing refused");

    print_comparison("Inbound rate limit cost", &rows, &samples, "rate limit", 3.0);
}
