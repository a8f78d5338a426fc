//! Latency, throughput, CPU and memory of the proxy pair, measured against the same path with no
//! proxy and against one haproxy HTTP hop, all in one run, on pods wired by the real CNI chain.
//!
//! client pod ─▶ [outbound cnimesh-proxy] ─▶ [inbound cnimesh-proxy] ─▶ app   (cnimesh)
//! client pod ─────────────────────────────────────────────────────────▶ app   (direct)
//! client pod ─────────────────────▶ haproxy (mode http) ──────────────▶ app   (haproxy)
//! client pod ─▶ [outbound cnimesh-proxy] ═mTLS═▶ [inbound cnimesh-proxy] ─▶ app (cnimesh, mTLS)
//!
//! Load comes from h2load (Debian's nghttp2-client): a fixed rate for latency (per-request times
//! from its log), then unlimited for throughput. Run as root:
//! `cargo bench -p cnimesh-e2e --bench proxy` (needs `apt-get install nghttp2-client haproxy`).

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, env_refs, identity};
use cnimesh_e2e::sidecar::Sidecar;
use cnimesh_e2e::{Netns, Network, Pod, bins, require_root};
use serde_json::json;

const RATE_CLIENTS: u32 = 10;
const RATE_PER_CLIENT: u32 = 100;
const RATE_SECONDS: u32 = 10;

fn h2load(netns: &Netns, args: &[&str]) -> String {
    let mut full = vec!["netns", "exec", netns.name(), "h2load"];
    full.extend_from_slice(args);
    let out = Command::new("ip").args(&full).stderr(Stdio::inherit()).output().expect("h2load runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && text.contains(" 0 failed"), "h2load {args:?} failed:\n{text}");
    text
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// p50 and p99 request latency (ms) at a fixed 1000 rps.
fn latency(netns: &Netns, url: &str, h1: bool) -> (f64, f64) {
    let log = std::env::temp_dir().join(format!("cnimesh-h2load-{}.log", netns.name()));
    let (c, rps, d, logarg) = (
        RATE_CLIENTS.to_string(),
        RATE_PER_CLIENT.to_string(),
        RATE_SECONDS.to_string(),
        format!("--log-file={}", log.display()),
    );
    let mut args = vec!["-c", &c, "--rps", &rps, "-D", &d, "--warm-up-time", "2", &logarg];
    if h1 {
        args.push("--h1");
    }
    args.push(url);
    h2load(netns, &args);
    let text = std::fs::read_to_string(&log).expect("h2load log");
    let _ = std::fs::remove_file(&log);
    // Each line: start time (µs), status, duration (µs).
    let mut ms: Vec<f64> =
        text.lines().filter_map(|l| l.split('\t').nth(2)?.trim().parse::<f64>().ok()).map(|us| us / 1e3).collect();
    ms.sort_by(f64::total_cmp);
    assert!(ms.len() > 1000, "too few samples: {}", ms.len());
    (percentile(&ms, 0.5), percentile(&ms, 0.99))
}

/// Requests per second with no rate limit.
fn throughput(netns: &Netns, url: &str, h1: bool) -> f64 {
    let args: Vec<&str> = if h1 {
        vec!["--h1", "-c", "32", "-n", "60000", url]
    } else {
        vec!["-c", "8", "-m", "16", "-n", "100000", url]
    };
    let out = h2load(netns, &args);
    let line = out.lines().find(|l| l.starts_with("finished in")).expect("summary line");
    line.split(", ").nth(1).and_then(|s| s.split_whitespace().next()).and_then(|v| v.parse().ok()).expect("req/s")
}

fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(") ").map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks: f64 = fields.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn haproxy_in(netns: &Netns, listen: SocketAddr, backend: SocketAddr) -> std::process::Child {
    let cfg = std::env::temp_dir().join(format!("cnimesh-haproxy-{}.cfg", netns.name()));
    std::fs::write(
        &cfg,
        format!(
            "global\n  maxconn 4096\n  nbthread 1\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n  option http-keep-alive\nfrontend f\n  bind {listen}\n  default_backend b\nbackend b\n  http-reuse always\n  server app {backend}\n"
        ),
    )
    .unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", netns.name(), "haproxy", "-db", "-f"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("haproxy starts (apt-get install haproxy)");
    std::thread::sleep(Duration::from_millis(500));
    child
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
    let bins = bins!();
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
    // The same pair with identities: mTLS between the proxies.
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let control = Control::start(&bins.control, &control_pod, &[]).unwrap();
    let tls_client = Pod::named(&net, "shop", "tls-client").unwrap();
    let tls_server = Pod::named(&net, "shop", "tls-server").unwrap();
    let _tls_apps = Apps::start(&tls_server.netns.path(), tls_server.ipv4().into(), "mtls").unwrap();
    let mut server_env = control.proxy_env("shop", "tls-server", &control.token("shop", "tls-server").unwrap());
    server_env.push(("CNIMESH_PROXY_WORKERS".into(), workers.clone()));
    let mut client_env = control.proxy_env("shop", "tls-client", &control.token("shop", "tls-client").unwrap());
    client_env.extend([
        ("CNIMESH_PROXY_WORKERS".into(), workers.clone()),
        (
            "CNIMESH_PROXY_OUTBOUND_IDENTITIES".into(),
            format!("{}={}", tls_server.ipv4(), identity("shop", "tls-server")),
        ),
    ]);
    let tls_server_proxy = Sidecar::start(&bins.proxy, &tls_server.netns, &env_refs(&server_env)).unwrap();
    let tls_client_proxy = Sidecar::start(&bins.proxy, &tls_client.netns, &env_refs(&client_env)).unwrap();
    println!("proxy runtime worker threads: {workers}");
    std::thread::sleep(Duration::from_millis(300));
    let idle_rss = (rss_mib(client_proxy.pid()), rss_mib(server_proxy.pid()));

    let app = SocketAddr::new(plain_server.ipv4().into(), apps::HTTP_PORT);
    let hop = SocketAddr::new(plain_server.ipv4().into(), 8090);
    let mut haproxy = haproxy_in(&plain_server.netns, hop, app);
    let meshed = SocketAddr::new(server.ipv4().into(), apps::HTTP_PORT);
    let paths = [
        ("direct (no proxy)", &plain_client.netns, format!("http://{app}/hello")),
        ("cnimesh pair (outbound + inbound)", &client.netns, format!("http://{meshed}/hello")),
        ("haproxy, one HTTP hop", &plain_client.netns, format!("http://{hop}/hello")),
        (
            "cnimesh pair, mTLS",
            &tls_client.netns,
            format!("http://{}/hello", SocketAddr::new(tls_server.ipv4().into(), apps::HTTP_PORT)),
        ),
    ];
    let pids = [(client_proxy.pid(), server_proxy.pid()), (tls_client_proxy.pid(), tls_server_proxy.pid())];
    let pair_cpu = |pair: (u32, u32)| cpu_seconds(pair.0) + cpu_seconds(pair.1);

    println!(
        "\n## Latency at {} rps ({} clients × {} rps, {} s; ms)\n",
        RATE_CLIENTS * RATE_PER_CLIENT,
        RATE_CLIENTS,
        RATE_PER_CLIENT,
        RATE_SECONDS
    );
    println!("| path | HTTP/1.1 p50 | p99 | HTTP/2 p50 | p99 | added p50 (h1/h2) | added p99 (h1/h2) |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut base = None;
    for (name, ns, url) in &paths {
        let h1 = latency(ns, url, true);
        let h2 = latency(ns, url, false);
        let (b1, b2) = *base.get_or_insert((h1, h2));
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {:.3} | {:+.3} / {:+.3} | {:+.3} / {:+.3} |",
            h1.0,
            h1.1,
            h2.0,
            h2.1,
            h1.0 - b1.0,
            h2.0 - b2.0,
            h1.1 - b1.1,
            h2.1 - b2.1
        );
    }

    println!("\n## Maximum throughput (req/s; h1: 32 connections, h2: 8 connections × 16 streams)\n");
    println!("| path | HTTP/1.1 | ratio | HTTP/2 | ratio |");
    println!("|---|---:|---:|---:|---:|");
    let mut base = None;
    let mut cpu_per_1000 = Vec::new();
    for (i, (name, ns, url)) in paths.iter().enumerate() {
        let pair = match i {
            1 => Some(pids[0]),
            3 => Some(pids[1]),
            _ => None,
        };
        let cpu_before = pair.map_or(0.0, pair_cpu);
        let h1 = throughput(ns, url, true);
        let cpu_mid = pair.map_or(0.0, pair_cpu);
        let h2 = throughput(ns, url, false);
        let cpu_after = pair.map_or(0.0, pair_cpu);
        if pair.is_some() {
            // 60000 HTTP/1.1 and 100000 HTTP/2 requests: CPU seconds per request × 1e6 = ms per 1000.
            cpu_per_1000.push((name, (cpu_mid - cpu_before) / 60.0 * 1e3, (cpu_after - cpu_mid) / 100.0 * 1e3));
        }
        let (b1, b2) = *base.get_or_insert((h1, h2));
        println!("| {name} | {h1:.0} | {:.2} | {h2:.0} | {:.2} |", h1 / b1, h2 / b2);
    }
    for (name, h1, h2) in cpu_per_1000 {
        println!("\n{name}: proxy pair CPU per 1000 requests: HTTP/1.1 {h1:.1} ms, HTTP/2 {h2:.1} ms");
    }

    // Memory under 1000 concurrent (mostly idle) connections through the pair.
    let url = format!("http://{meshed}/hello");
    let sampler = {
        let pids = (client_proxy.pid(), server_proxy.pid());
        std::thread::spawn(move || {
            let mut peak: (f64, f64) = (0.0, 0.0);
            for _ in 0..40 {
                std::thread::sleep(Duration::from_millis(100));
                peak = (peak.0.max(rss_mib(pids.0)), peak.1.max(rss_mib(pids.1)));
            }
            peak
        })
    };
    h2load(&client.netns, &["--h1", "-c", "1000", "--rps", "1", "-D", "4", &url]);
    let busy_rss = sampler.join().unwrap();
    println!(
        "\nRSS (MiB): idle outbound {:.1}, inbound {:.1}; with 1000 concurrent connections outbound {:.1}, inbound {:.1}",
        idle_rss.0, idle_rss.1, busy_rss.0, busy_rss.1
    );
    let _ = haproxy.kill();
    let _ = haproxy.wait();
}
