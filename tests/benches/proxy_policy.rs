//! The cost of inbound authorization: two mTLS proxy pairs in the same run, one whose server pod
//! has a Server with 10 AuthorizationPolicies (each requiring a different MeshTLSAuthentication,
//! the client's identity in the last one, so every request's connection scans all ten) and one
//! without policy discovery. Rounds interleave the two rows; medians are printed with the added
//! p50/p99 and the CPU ratio (issue 19's target: under 3 % more CPU).
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench proxy_policy` (needs nghttp2-client).
//! `CNIMESH_BENCH_ROUNDS` (default 3) sets the rounds.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::bench::{RATE_CLIENTS, RATE_PER_CLIENT, fixed_rate, median, unlimited};
use cnimesh_e2e::control::{Control, env_refs, identity};
use cnimesh_e2e::sidecar::Sidecar;
use cnimesh_e2e::{Netns, Network, Pod, bins, require_root};
use serde_json::json;

const POLICIES: usize = 10;
const H1_MAX_REQUESTS: &str = "60000";

/// The server pod, its Server, and [`POLICIES`] AuthorizationPolicies; the last admits `client`.
fn cluster_yaml(server: &Pod<'_>, client_sa: &str) -> String {
    let ip = server.ipv4();
    let mut docs = vec![
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n".to_string(),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {}, namespace: shop, labels: {{app: bench}}}}\nspec:\n  serviceAccountName: {}\n  containers: [{{name: app, image: app, ports: [{{name: http, containerPort: {}}}]}}]\nstatus: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}]}}\n",
            server.name,
            server.name,
            apps::HTTP_PORT
        ),
        "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {name: bench, namespace: shop}\nspec:\n  podSelector: {matchLabels: {app: bench}}\n  port: http\n  proxyProtocol: HTTP/1\n".to_string(),
    ];
    for i in 0..POLICIES {
        let sa = if i == POLICIES - 1 { client_sa.to_string() } else { format!("caller-{i}") };
        docs.push(format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {{name: authn-{i:02}, namespace: shop}}\nspec:\n  identityRefs: [{{kind: ServiceAccount, name: {sa}}}]\n"
        ));
        docs.push(format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {{name: authz-{i:02}, namespace: shop}}\nspec:\n  targetRef: {{group: policy.cnimesh.io, kind: Server, name: bench}}\n  requiredAuthenticationRefs: [{{group: policy.cnimesh.io, kind: MeshTLSAuthentication, name: authn-{i:02}}}]\n"
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

fn pair<'n>(control: &Control, proxy: &Path, client: Pod<'n>, server: Pod<'n>, policy: bool) -> Pair<'n> {
    let apps = Apps::start(&server.netns.path(), server.ipv4().into(), &server.name).unwrap();
    let mut server_env = control.proxy_env("shop", &server.name, &control.token("shop", &server.name).unwrap());
    if policy {
        server_env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
        server_env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), format!("shop:{}", server.name)));
    }
    let mut client_env = control.proxy_env("shop", &client.name, &control.token("shop", &client.name).unwrap());
    client_env.push((
        "CNIMESH_PROXY_OUTBOUND_IDENTITIES".into(),
        format!("{}={}", server.ipv4(), identity("shop", &server.name)),
    ));
    let server_proxy = Sidecar::start(proxy, &server.netns, &env_refs(&server_env)).unwrap();
    let client_proxy = Sidecar::start(proxy, &client.netns, &env_refs(&client_env)).unwrap();
    Pair { client, server, _apps: apps, client_proxy, server_proxy }
}

#[derive(Clone, Copy, Default)]
struct Sample {
    p50: f64,
    p99: f64,
    cpu_per_1000: f64,
    h1_max: f64,
    h1_cpu_per_1000: f64,
}

fn measure(netns: &Netns, url: &str, pids: &[u32]) -> Sample {
    let (p50, p99, cpu_per_1000) = fixed_rate(netns, url, pids);
    let (h1_max, h1_cpu_per_1000) = unlimited(netns, &["--h1", "-c", "32", "-n", H1_MAX_REQUESTS, url], pids);
    Sample { p50, p99, cpu_per_1000, h1_max, h1_cpu_per_1000 }
}

fn main() {
    if !require_root("proxy policy benchmark") {
        return;
    }
    let rounds: usize = std::env::var("CNIMESH_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let cluster = tempfile::tempdir().unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let policed = (Pod::named(&net, "shop", "pol-client").unwrap(), Pod::named(&net, "shop", "pol-server").unwrap());
    std::fs::write(cluster.path().join("cluster.yaml"), cluster_yaml(&policed.1, "pol-client")).unwrap();
    let cluster_dir = cluster.path().display().to_string();
    let control = Control::start(&bins.control, &control_pod, &["--cluster-dir", &cluster_dir]).unwrap();
    let with = pair(&control, &bins.proxy, policed.0, policed.1, true);
    let none = (Pod::named(&net, "shop", "none-client").unwrap(), Pod::named(&net, "shop", "none-server").unwrap());
    let without = pair(&control, &bins.proxy, none.0, none.1, false);

    // The policy is in force before measuring: the client's requests are allowed by the tenth.
    let allowed = "authz_name=\"authz-09\"";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !with.server_proxy.metrics().contains(allowed) {
        assert!(Instant::now() < deadline, "the policy never applied:\n{}", with.server_proxy.metrics());
        let _ = cnimesh_e2e::sidecar::http_in(
            &with.client.netns.path(),
            &format!("{}:{}", with.server.ipv4(), apps::HTTP_PORT),
            "GET",
            "/hello",
            "",
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let rows = [("mTLS pair, no policy", &without), ("mTLS pair, 10 AuthorizationPolicies", &with)];
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); rows.len()];
    for round in 0..rounds {
        for (i, (name, p)) in rows.iter().enumerate() {
            let s = measure(&p.client.netns, &p.url(), &p.pids());
            eprintln!(
                "round {round} {name}: p50 {:.3} p99 {:.3} cpu/1000 {:.1} h1 {:.0} ({:.1})",
                s.p50, s.p99, s.cpu_per_1000, s.h1_max, s.h1_cpu_per_1000
            );
            samples[i].push(s);
        }
    }
    let med = |i: usize, f: fn(&Sample) -> f64| median(samples[i].iter().map(f).collect());
    let denied = with.server_proxy.metric("inbound_http_authz_deny_total");
    assert_eq!(denied, 0.0, "the benchmark's requests are all authorized");

    println!(
        "\n## Inbound authorization cost: HTTP/1.1 at {} rps, then unlimited (32 connections); medians of {rounds} rounds\n",
        RATE_CLIENTS * RATE_PER_CLIENT
    );
    println!("CPU is both proxies' utime+stime, ms per 1000 requests.\n");
    println!("| row | p50 ms | p99 ms | CPU/1000 at 1000 rps | h1 max rps | CPU/1000 at max |");
    println!("|---|---|---|---|---|---|");
    for (i, (name, _)) in rows.iter().enumerate() {
        println!(
            "| {name} | {:.3} | {:.3} | {:.1} | {:.0} | {:.1} |",
            med(i, |s| s.p50),
            med(i, |s| s.p99),
            med(i, |s| s.cpu_per_1000),
            med(i, |s| s.h1_max),
            med(i, |s| s.h1_cpu_per_1000)
        );
    }
    let pct = |f: fn(&Sample) -> f64| (med(1, f) / med(0, f) - 1.0) * 100.0;
    println!(
        "\nadded by policy: p50 {:+.3} ms, p99 {:+.3} ms; CPU {:+.1} % at 1000 rps, {:+.1} % at max (target < 3 %)",
        med(1, |s| s.p50) - med(0, |s| s.p50),
        med(1, |s| s.p99) - med(0, |s| s.p99),
        pct(|s| s.cpu_per_1000),
        pct(|s| s.h1_cpu_per_1000)
    );
}
