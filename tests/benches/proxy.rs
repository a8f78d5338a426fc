//! Latency, CPU per request, throughput and memory of the proxy pair, measured against the same
//! path with no proxy and against one haproxy HTTP hop, all in one run, on pods wired by the real
//! CNI chain. Every row is measured in each round (rounds interleave the rows, so a noisy
//! neighbour hits them alike) and the medians are printed, with ratios against haproxy.
//!
//! client pod ─▶ [outbound cnimesh-proxy] ─▶ [inbound cnimesh-proxy] ─▶ app   (cnimesh)
//! client pod ─────────────────────────────────────────────────────────▶ app   (direct)
//! client pod ─────────────────────▶ haproxy (mode http) ──────────────▶ app   (haproxy)
//! client pod ─▶ [outbound cnimesh-proxy] ═mTLS═▶ [inbound cnimesh-proxy] ─▶ app (cnimesh, mTLS)
//! the same with HTTP/1 carried over HTTP/2 between the proxies (`l5d-orig-proto`)
//!
//! Load comes from h2load (Debian's nghttp2-client): a fixed 1000 rps of HTTP/1.1 for latency
//! (per-request times from its log) and CPU per request (the proxies' or haproxy's utime+stime
//! from /proc), then unlimited for throughput. Memory: RSS idle, the peak under the HTTP/1.1
//! maximum load, and 60 s after a burst of 1000 connections. Run as root:
//! `cargo bench -p cnimesh-e2e --bench proxy` (needs `apt-get install nghttp2-client haproxy`).
//! `CNIMESH_BENCH_ROUNDS` (default 3) sets the rounds; `CNIMESH_BENCH_PROXY` runs another proxy
//! binary (e.g. one built from an older commit) in the same harness, for before/after tables;
//! `CNIMESH_BENCH_BASELINE_PROXY` adds a row with a second binary's mTLS pair to the same rounds,
//! so the before/after comparison shares each round's conditions.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::bench::{RATE_CLIENTS, RATE_PER_CLIENT, fixed_rate, h2load, median, peak_rss, rss_mib, unlimited};
use cnimesh_e2e::control::{Control, env_refs, identity};
use cnimesh_e2e::haproxy::haproxy_in;
use cnimesh_e2e::sidecar::Sidecar;
use cnimesh_e2e::{Netns, Network, Pod, bins, require_root};
use serde_json::json;

const H1_MAX_REQUESTS: u32 = 60_000;
const H2_MAX_REQUESTS: u32 = 100_000;
const BURST_CONNECTIONS: u32 = 1000;
const AFTER_BURST: Duration = Duration::from_secs(60);

/// One path through the network, with the processes (proxies or haproxy) that carry it.
struct Row<'a> {
    name: &'static str,
    netns: &'a Netns,
    url: String,
    pids: Vec<u32>,
}

/// One round's measurements of a row.
#[derive(Default, Clone)]
struct Sample {
    p50: f64,
    p99: f64,
    cpu_per_1000: f64,
    h1_max: f64,
    h1_cpu_per_1000: f64,
    h2_max: f64,
    rss_load: f64,
}

/// p50 and p99 (ms) at a fixed 1000 rps of HTTP/1.1, and the CPU ms per 1000 requests.
fn latency(row: &Row<'_>) -> (f64, f64, f64) {
    fixed_rate(row.netns, &row.url, &row.pids)
}

/// Requests per second with no rate limit, and the CPU ms per 1000 requests.
fn throughput(row: &Row<'_>, h1: bool) -> (f64, f64) {
    let (n1, n2) = (H1_MAX_REQUESTS.to_string(), H2_MAX_REQUESTS.to_string());
    let args: Vec<&str> = if h1 {
        vec!["--h1", "-c", "32", "-n", &n1, &row.url]
    } else {
        vec!["-c", "8", "-m", "16", "-n", &n2, &row.url]
    };
    unlimited(row.netns, &args, &row.pids)
}

fn measure(row: &Row<'_>) -> Sample {
    let (p50, p99, cpu_per_1000) = latency(row);
    let ((h1_max, h1_cpu_per_1000), rss_load) = peak_rss(&row.pids, || throughput(row, true));
    let (h2_max, _) = throughput(row, false);
    Sample { p50, p99, cpu_per_1000, h1_max, h1_cpu_per_1000, h2_max, rss_load }
}

fn main() {
    if !require_root("proxy benchmark") {
        return;
    }
    for tool in ["h2load", "haproxy"] {
        if Command::new(tool).arg("-v").output().is_err() && Command::new(tool).arg("--version").output().is_err() {
            eprintln!("{tool} is missing: apt-get install nghttp2-client haproxy");
            std::process::exit(1);
        }
    }
    let rounds: usize = std::env::var("CNIMESH_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    let mut bins = bins!();
    if let Ok(proxy) = std::env::var("CNIMESH_BENCH_PROXY") {
        bins.proxy = PathBuf::from(proxy);
    }
    println!("proxy binary: {}", bins.proxy.display());
    let net = Network::bridge(&bins, json!({})).unwrap();
    // Uncaptured pair (excluded namespace) for the direct and haproxy paths.
    let plain_client = Pod::named(&net, "kube-system", "bench-client").unwrap();
    let plain_server = Pod::named(&net, "kube-system", "bench-server").unwrap();
    let _plain_apps = Apps::start(&plain_server.netns.path(), plain_server.ipv4().into(), "plain").unwrap();
    // Captured pair with proxies.
    let client = Pod::named(&net, "shop", "bench-client").unwrap();
    let server = Pod::named(&net, "shop", "bench-server").unwrap();
    let _apps = Apps::start(&server.netns.path(), server.ipv4().into(), "meshed").unwrap();
    // CNIMESH_PROXY_WORKERS passes through, to compare runtime shapes in the same conditions.
    let workers = std::env::var("CNIMESH_PROXY_WORKERS").unwrap_or_else(|_| "1".into());
    let env = [("CNIMESH_PROXY_WORKERS", workers.as_str())];
    let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env).unwrap();
    let server_proxy = Sidecar::start(&bins.proxy, &server.netns, &env).unwrap();
    // The same pair with identities: mTLS between the proxies; then again with HTTP/1 carried
    // over HTTP/2 between them (Linkerd's orig-proto upgrade), and explicitly without it.
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let control = Control::start(&bins.control, &control_pod, &[]).unwrap();
    // A baseline binary (e.g. the previous release) gets its own mTLS pair, measured in the same
    // rounds as the others, so a before/after comparison shares every round's conditions.
    let baseline = std::env::var("CNIMESH_BENCH_BASELINE_PROXY").ok().map(PathBuf::from);
    let mut pairs =
        vec![("tls-client", "tls-server", "false", &bins.proxy), ("up-client", "up-server", "true", &bins.proxy)];
    if let Some(baseline) = &baseline {
        println!("baseline proxy binary: {}", baseline.display());
        pairs.push(("base-client", "base-server", "false", baseline));
    }
    let mut mtls_pairs = Vec::new();
    for (client_name, server_name, upgrade, proxy) in pairs {
        let tls_client = Pod::named(&net, "shop", client_name).unwrap();
        let tls_server = Pod::named(&net, "shop", server_name).unwrap();
        let tls_apps = Apps::start(&tls_server.netns.path(), tls_server.ipv4().into(), server_name).unwrap();
        let mut server_env = control.proxy_env("shop", server_name, &control.token("shop", server_name).unwrap());
        server_env.push(("CNIMESH_PROXY_WORKERS".into(), workers.clone()));
        let mut client_env = control.proxy_env("shop", client_name, &control.token("shop", client_name).unwrap());
        client_env.extend([
            ("CNIMESH_PROXY_WORKERS".into(), workers.clone()),
            ("CNIMESH_PROXY_OUTBOUND_H2_UPGRADE".into(), upgrade.into()),
            (
                "CNIMESH_PROXY_OUTBOUND_IDENTITIES".into(),
                format!("{}={}", tls_server.ipv4(), identity("shop", server_name)),
            ),
        ]);
        let server_proxy = Sidecar::start(proxy, &tls_server.netns, &env_refs(&server_env)).unwrap();
        let client_proxy = Sidecar::start(proxy, &tls_client.netns, &env_refs(&client_env)).unwrap();
        mtls_pairs.push((tls_client, tls_server, tls_apps, client_proxy, server_proxy));
    }
    println!("proxy runtime worker threads: {workers}; rounds: {rounds}");
    std::thread::sleep(Duration::from_millis(300));

    let app = SocketAddr::new(plain_server.ipv4().into(), apps::HTTP_PORT);
    let hop = SocketAddr::new(plain_server.ipv4().into(), 8090);
    let mut haproxy = haproxy_in(&plain_server.netns, hop, app);
    let meshed = |pod: &Pod<'_>| format!("http://{}/hello", SocketAddr::new(pod.ipv4().into(), apps::HTTP_PORT));
    let (tls, up) = (&mtls_pairs[0], &mtls_pairs[1]);
    let mut rows = vec![
        Row { name: "direct (no proxy)", netns: &plain_client.netns, url: format!("http://{app}/hello"), pids: vec![] },
        Row {
            name: "haproxy, one HTTP hop",
            netns: &plain_client.netns,
            url: format!("http://{hop}/hello"),
            pids: vec![haproxy.id()],
        },
        Row {
            name: "cnimesh pair, plaintext",
            netns: &client.netns,
            url: meshed(&server),
            pids: vec![client_proxy.pid(), server_proxy.pid()],
        },
        Row {
            name: "cnimesh pair, mTLS",
            netns: &tls.0.netns,
            url: meshed(&tls.1),
            pids: vec![tls.3.pid(), tls.4.pid()],
        },
        Row {
            name: "cnimesh pair, mTLS, h1 over h2 (orig-proto)",
            netns: &up.0.netns,
            url: meshed(&up.1),
            pids: vec![up.3.pid(), up.4.pid()],
        },
    ];
    if let Some(base) = mtls_pairs.get(2) {
        rows.push(Row {
            name: "baseline binary: cnimesh pair, mTLS",
            netns: &base.0.netns,
            url: meshed(&base.1),
            pids: vec![base.3.pid(), base.4.pid()],
        });
    }
    let idle_rss: Vec<f64> = rows.iter().map(|r| r.pids.iter().map(|p| rss_mib(*p)).fold(0.0, f64::max)).collect();

    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); rows.len()];
    for round in 0..rounds {
        for (i, row) in rows.iter().enumerate() {
            let s = measure(row);
            eprintln!(
                "round {round} {}: p50 {:.3} p99 {:.3} cpu/1000 {:.1} h1 {:.0} ({:.1}) h2 {:.0} rss {:.1}",
                row.name, s.p50, s.p99, s.cpu_per_1000, s.h1_max, s.h1_cpu_per_1000, s.h2_max, s.rss_load
            );
            samples[i].push(s);
        }
    }
    let med = |i: usize, f: fn(&Sample) -> f64| median(samples[i].iter().map(f).collect());

    // A burst of concurrent (mostly idle) connections through every proxied row, then quiet.
    let mut burst_rss = vec![f64::NAN; rows.len()];
    let burst_c = BURST_CONNECTIONS.to_string();
    for (i, row) in rows.iter().enumerate().filter(|(_, r)| !r.pids.is_empty()) {
        let ((), peak) = peak_rss(&row.pids, || {
            h2load(row.netns, &["--h1", "-c", &burst_c, "--rps", "1", "-D", "4", &row.url]);
        });
        burst_rss[i] = peak;
    }
    std::thread::sleep(AFTER_BURST);
    let after_rss: Vec<f64> = rows.iter().map(|r| r.pids.iter().map(|p| rss_mib(*p)).fold(0.0, f64::max)).collect();

    println!(
        "\n## HTTP/1.1 at {} rps; maxima (h1: 32 connections, h2: 8 × 16 streams); medians of {rounds} rounds\n",
        RATE_CLIENTS * RATE_PER_CLIENT
    );
    println!(
        "CPU is the proxies' (or haproxy's) utime+stime per 1000 requests; RSS is the largest process of the row, MiB.\n"
    );
    println!(
        "| path | p50 ms | p99 ms | added p50 | CPU ms/1000 | h1 max req/s | h1 CPU ms/1000 | h2 max req/s | RSS idle | RSS h1 max | RSS {BURST_CONNECTIONS} conns | RSS +{}s |",
        AFTER_BURST.as_secs()
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let direct_p50 = med(0, |s| s.p50);
    for (i, row) in rows.iter().enumerate() {
        println!(
            "| {} | {:.3} | {:.3} | {:+.3} | {:.1} | {:.0} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} |",
            row.name,
            med(i, |s| s.p50),
            med(i, |s| s.p99),
            med(i, |s| s.p50) - direct_p50,
            med(i, |s| s.cpu_per_1000),
            med(i, |s| s.h1_max),
            med(i, |s| s.h1_cpu_per_1000),
            med(i, |s| s.h2_max),
            idle_rss[i],
            med(i, |s| s.rss_load),
            burst_rss[i],
            after_rss[i],
        );
    }
    println!("\n## Ratios against one haproxy hop (targets: CPU ≤ 2, h1 max ≥ 0.45, added p50 per hop ≤ 1.3)\n");
    println!("| path | CPU/1000 at 1000 rps | h1 max | h2 max | added p50 per hop | RSS +60 s ≤ 16 MiB |");
    println!("|---|---:|---:|---:|---:|---|");
    let hap_added = med(1, |s| s.p50) - direct_p50;
    for (i, row) in rows.iter().enumerate().skip(2) {
        let per_hop_added = (med(i, |s| s.p50) - direct_p50) / 2.0;
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            row.name,
            med(i, |s| s.cpu_per_1000) / med(1, |s| s.cpu_per_1000),
            med(i, |s| s.h1_max) / med(1, |s| s.h1_max),
            med(i, |s| s.h2_max) / med(1, |s| s.h2_max),
            per_hop_added / hap_added,
            if after_rss[i] <= 16.0 { "yes" } else { "no" },
        );
    }
    let _ = haproxy.kill();
    let _ = haproxy.wait();
    drop(mtls_pairs);
}
