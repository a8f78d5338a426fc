//! The inbound proxy under connection floods and slow clients, measured on pods wired
//! by the real CNI chain. A captured server pod runs the test apps and its proxy with an
//! open-file limit of `CNIMESH_OVERLOAD_OPEN_FILES` (default 20 000, this kind of host's hard
//! limit). From one unmeshed pod, normal traffic: 1 000 keep-alive HTTP/1.1 connections at one
//! request per second each (h2load), and one request per 100 ms on a fresh connection. From
//! another unmeshed pod, in turn, for a window of `CNIMESH_OVERLOAD_WINDOW_SECONDS` (default 25,
//! longer than the 10 s detect timeout): nothing (baseline); `CNIMESH_OVERLOAD_IDLE` (default
//! 10 000) idle connections; 1 000 slowloris connections sending a header byte per second after a
//! whole request line; 1 000 sending their request a byte per second from the first byte.
//!
//! Per phase: normal traffic's success rate, p50 and p99; the proxy's peak RSS and descriptors;
//! how many flood connections the proxy closed, and how many were open at the app at the end of
//! the window (the flood goes to another app port than the normal traffic); after the flood
//! closes, the proxy's descriptors and RSS (5 s and 60 s later).
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench overload` (needs `apt-get install
//! nghttp2-client`). `CNIMESH_BENCH_PROXY` runs another proxy binary (e.g. one built from an
//! older commit, or the jemalloc `cnimesh-proxy`) in the same harness, for before/after tables.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::bench::{RateRun, env_or, open_fds, rate_run, require_h2load, rss_mib};
use cnimesh_e2e::flood::{Flood, Kind};
use cnimesh_e2e::sidecar::{Sidecar, http_in};
use cnimesh_e2e::{Netns, Network, Pod, bins, require_root};
use serde_json::json;

const SLOWLORIS: usize = 1000;
/// The flood starts this long after the normal traffic, so its connections are established first.
const FLOOD_DELAY: Duration = Duration::from_secs(2);

/// Peak RSS (MiB) and descriptors of `pid`, sampled every 100 ms while `f` runs.
fn peaks<T>(pid: u32, f: impl FnOnce() -> T) -> (T, f64, usize) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut rss, mut fds) = (0.0f64, 0usize);
            while !stop.load(Ordering::Relaxed) {
                rss = rss.max(rss_mib(pid));
                fds = fds.max(open_fds(pid));
                std::thread::sleep(Duration::from_millis(100));
            }
            (rss, fds)
        })
    };
    let out = f();
    stop.store(true, Ordering::Relaxed);
    let (rss, fds) = sampler.join().unwrap();
    (out, rss, fds)
}

/// What one phase measured.
struct Phase {
    name: String,
    normal: RateRun,
    fresh_ok: usize,
    fresh_total: usize,
    rss_peak: f64,
    fds_peak: usize,
    flood_connected: usize,
    flood_closed: usize,
    flood_closed_after: f64,
    /// Flood connections open at the app at the end of the window.
    app_connections: usize,
    shed: f64,
    detect_timeouts: f64,
    fds_after: usize,
    rss_after: f64,
}

impl Phase {
    /// This phase as a row of the table.
    fn row(&self) -> String {
        format!(
            "| {} | {:.4} | {:.2} | {:.2} | {}/{} | {:.1} | {} | {} | {} ({:.1}) | {} | {} | {} | {} | {:.1} |",
            self.name,
            self.normal.success_rate(),
            self.normal.p(0.5),
            self.normal.p(0.99),
            self.fresh_ok,
            self.fresh_total,
            self.rss_peak,
            self.fds_peak,
            self.flood_connected,
            self.flood_closed,
            self.flood_closed_after,
            self.shed,
            self.detect_timeouts,
            self.app_connections,
            self.fds_after,
            self.rss_after,
        )
    }
}

/// Connections established to the app's `port` in `netns` now (the app's side of them).
fn established(netns: &Netns, port: u16) -> usize {
    let filter = format!("( sport = :{port} )");
    netns.exec("ss", &["-Htn", "state", "established", &filter]).map_or(0, |out| out.lines().count())
}

/// Requests on fresh connections, one per 100 ms, until `until`: (200s, total).
fn fresh_requests(netns: PathBuf, addr: String, until: Instant) -> std::thread::JoinHandle<(usize, usize)> {
    std::thread::spawn(move || {
        let (mut ok, mut total) = (0, 0);
        while Instant::now() < until {
            total += 1;
            if matches!(http_in(&netns, &addr, "GET", "/hello", ""), Ok((200, _))) {
                ok += 1;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        (ok, total)
    })
}

fn main() {
    if !require_root("overload benchmark") {
        return;
    }
    require_h2load();
    // This process holds the flood's sockets, h2load (a child) the normal traffic's.
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let open_files: u64 = env_or("CNIMESH_OVERLOAD_OPEN_FILES", 20_000);
    let idle: usize = env_or("CNIMESH_OVERLOAD_IDLE", 10_000);
    let window: u32 = env_or("CNIMESH_OVERLOAD_WINDOW_SECONDS", 25);
    let normal_clients: u32 = env_or("CNIMESH_OVERLOAD_NORMAL_CLIENTS", 1000);
    let only: String = env_or("CNIMESH_OVERLOAD_PHASES", "baseline,idle,headers,first-byte".to_string());
    assert!(idle as u64 + 64 < hard, "this process needs {idle} descriptors for the flood; the hard limit is {hard}");
    let mut bins = bins!();
    if let Ok(proxy) = std::env::var("CNIMESH_BENCH_PROXY") {
        bins.proxy = PathBuf::from(proxy);
    }
    println!("proxy binary: {}; open files {open_files}; window {window} s", bins.proxy.display());

    let net = Network::bridge(&bins, json!({})).unwrap();
    let server = Pod::named(&net, "shop", "server").unwrap();
    let _apps = Apps::start(&server.netns.path(), server.ipv4().into(), "server").unwrap();
    let proxy = Sidecar::start_with_open_files(&bins.proxy, &server.netns, &[], open_files).unwrap();
    let normal = Pod::unmeshed(&net, "shop", "normal").unwrap();
    let flooder = Pod::unmeshed(&net, "shop", "flooder").unwrap();
    let to = SocketAddr::new(server.ipv4().into(), apps::HTTP_PORT);
    let url = format!("http://{to}/hello");
    // The flood goes to another port of the app than the normal traffic, so the app's sockets on
    // it are the flood's alone.
    let flood_to = SocketAddr::new(server.ipv4().into(), apps::HALF_CLOSE_PORT);
    let pid = proxy.pid();
    let metric = |error: &str| proxy.metric(&format!("inbound_tcp_accept_errors_total{{error=\"{error}\"}}"));
    let idle_rss = rss_mib(pid);
    let idle_fds = open_fds(pid);

    let phases: Vec<(String, Option<(usize, Kind)>)> = [
        ("baseline", "baseline (normal traffic only)".to_string(), None),
        ("idle", format!("{idle} idle connections"), Some((idle, Kind::Idle))),
        (
            "headers",
            format!("{SLOWLORIS} slowloris, header byte/s after the request line"),
            Some((SLOWLORIS, Kind::SlowHeaders)),
        ),
        (
            "first-byte",
            format!("{SLOWLORIS} slowloris, byte/s from the first byte"),
            Some((SLOWLORIS, Kind::SlowFromFirstByte)),
        ),
    ]
    .into_iter()
    .filter(|(key, _, _)| only.split(',').any(|o| o.trim() == *key))
    .map(|(_, name, flood)| (name, flood))
    .collect();
    let mut results = Vec::new();
    for (name, flood) in phases {
        let shed_before = metric("source_limit") + metric("connection_limit");
        let detect_before = metric("detect_timeout");
        let until = Instant::now() + Duration::from_secs(window.into());
        let fresh = fresh_requests(normal.netns.path(), to.to_string(), until);
        let ((normal_run, flood), rss_peak, fds_peak) = peaks(pid, || {
            std::thread::scope(|scope| {
                let load = scope.spawn(|| rate_run(&normal.netns, normal_clients, 1, window, &url));
                std::thread::sleep(FLOOD_DELAY);
                let flood = flood.map(|(n, kind)| Flood::start(&flooder.netns.path(), flood_to, n, kind).unwrap());
                (load.join().unwrap(), flood)
            })
        });
        let (fresh_ok, fresh_total) = fresh.join().unwrap();
        let (flood_connected, flood_closed, flood_closed_after) = flood.as_ref().map_or((0, 0, f64::NAN), |f| {
            (f.connected(), f.counts.closed_by_peer.load(Ordering::Relaxed), f.counts.mean_closed_after_s())
        });
        let app_connections = established(&server.netns, apps::HALF_CLOSE_PORT);
        drop(flood);
        std::thread::sleep(Duration::from_secs(5));
        let phase = Phase {
            name,
            normal: normal_run,
            fresh_ok,
            fresh_total,
            rss_peak,
            fds_peak,
            flood_connected,
            flood_closed,
            flood_closed_after,
            app_connections,
            shed: metric("source_limit") + metric("connection_limit") - shed_before,
            detect_timeouts: metric("detect_timeout") - detect_before,
            fds_after: open_fds(pid),
            rss_after: rss_mib(pid),
        };
        eprintln!("{}", phase.row());
        results.push(phase);
    }
    std::thread::sleep(Duration::from_secs(55));
    let rss_60s = rss_mib(pid);

    println!(
        "\n## Normal traffic during each phase ({normal_clients} keep-alive HTTP/1.1 connections at 1 req/s; fresh = one new connection per 100 ms)\n"
    );
    println!(
        "Proxy idle before the run: RSS {idle_rss:.1} MiB, {idle_fds} descriptors; open-file limit {open_files}.\n"
    );
    println!(
        "| phase | success | p50 ms | p99 ms | fresh ok | proxy RSS peak MiB | proxy fds peak | flood connected | closed by proxy (mean s) | shed | detect timeouts | flood conns at the app at the end | fds 5 s after | RSS 5 s after |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in &results {
        println!("{}", p.row());
    }
    if let [baseline, flood, ..] = &results[..] {
        let per_conn_kib = (flood.rss_peak - baseline.rss_peak) * 1024.0 / flood.flood_connected.max(1) as f64;
        println!(
            "\nRSS per connection of the second phase's flood (peak over the first's peak): {per_conn_kib:.1} KiB"
        );
    }
    println!("RSS 60 s after the last phase: {rss_60s:.1} MiB (idle before: {idle_rss:.1})");
}
