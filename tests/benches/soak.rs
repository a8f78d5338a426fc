//! A soak of the proxy pair at a fixed rate: client pod ─▶ [outbound cnimesh-proxy] ─▶
//! [inbound cnimesh-proxy] ─▶ app, on pods wired by the real CNI chain, for `SOAK_SECONDS`
//! (default 1 800). Load: 20 HTTP/1.1 connections at 25 requests per second each (500 rps),
//! in windows of `SOAK_WINDOW_SECONDS` (default 30; each window's h2load opens new connections).
//! Per window: success rate, p50, p99, both proxies' RSS and descriptors; at the end, the
//! least-squares slopes of RSS and p99 per hour, which a leak or a growing queue makes positive.
//!
//! Run as root: `SOAK_SECONDS=300 cargo bench -p cnimesh-e2e --bench soak` (needs
//! `apt-get install nghttp2-client`). `CNIMESH_BENCH_PROXY` runs another proxy binary (e.g. the
//! jemalloc `cnimesh-proxy`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::bench::{env_or, open_fds, rate_run, require_h2load, rss_mib, slope};
use cnimesh_e2e::sidecar::Sidecar;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const CLIENTS: u32 = 20;
const RATE_PER_CLIENT: u32 = 25;

fn main() {
    if !require_root("soak benchmark") {
        return;
    }
    require_h2load();
    let seconds: u64 = env_or("SOAK_SECONDS", 1800);
    let window: u32 = env_or("SOAK_WINDOW_SECONDS", 30);
    let mut bins = bins!();
    if let Ok(proxy) = std::env::var("CNIMESH_BENCH_PROXY") {
        bins.proxy = PathBuf::from(proxy);
    }
    println!(
        "proxy binary: {}; {seconds} s at {} rps in {window} s windows",
        bins.proxy.display(),
        CLIENTS * RATE_PER_CLIENT
    );
    let net = Network::bridge(&bins, json!({})).unwrap();
    let client = Pod::named(&net, "shop", "soak-client").unwrap();
    let server = Pod::named(&net, "shop", "soak-server").unwrap();
    let _apps = Apps::start(&server.netns.path(), server.ipv4().into(), "server").unwrap();
    let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &[]).unwrap();
    let server_proxy = Sidecar::start(&bins.proxy, &server.netns, &[]).unwrap();
    let url = format!("http://{}/hello", SocketAddr::new(server.ipv4().into(), apps::HTTP_PORT));
    let pids = [client_proxy.pid(), server_proxy.pid()];

    println!(
        "\n| window end s | success | p50 ms | p99 ms | outbound RSS MiB | inbound RSS MiB | outbound fds | inbound fds |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let start = Instant::now();
    let (mut rss, mut p99) = (vec![Vec::new(), Vec::new()], Vec::new());
    let mut worst_success: f64 = 1.0;
    while start.elapsed().as_secs() + u64::from(window) <= seconds.max(u64::from(window)) {
        let run = rate_run(&client.netns, CLIENTS, RATE_PER_CLIENT, window, &url);
        let hours = start.elapsed().as_secs_f64() / 3600.0;
        let (out_rss, in_rss) = (rss_mib(pids[0]), rss_mib(pids[1]));
        rss[0].push((hours, out_rss));
        rss[1].push((hours, in_rss));
        p99.push((hours, run.p(0.99)));
        worst_success = worst_success.min(run.success_rate());
        println!(
            "| {:.0} | {:.4} | {:.2} | {:.2} | {out_rss:.1} | {in_rss:.1} | {} | {} |",
            start.elapsed().as_secs_f64(),
            run.success_rate(),
            run.p(0.5),
            run.p(0.99),
            open_fds(pids[0]),
            open_fds(pids[1]),
        );
    }
    // The first window warms up (pools, allocator arenas); slopes start from the second.
    let steady = |v: &[(f64, f64)]| if v.len() > 2 { v[1..].to_vec() } else { v.to_vec() };
    println!("\n## Slopes over {} windows (first excluded as warm-up)\n", p99.len());
    println!("| measure | slope per hour |");
    println!("|---|---:|");
    println!("| outbound proxy RSS | {:+.2} MiB/h |", slope(&steady(&rss[0])));
    println!("| inbound proxy RSS | {:+.2} MiB/h |", slope(&steady(&rss[1])));
    println!("| p99 | {:+.3} ms/h |", slope(&steady(&p99)));
    println!("\nworst window success rate: {worst_success:.4}");
}
