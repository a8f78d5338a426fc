//! What one request costs each proxy of the mTLS pair, in measures this machine's load does not
//! move: instructions (callgrind), syscalls by kind and TLS records written (strace), context
//! switches (/proc), calls into the allocator (callgrind's call graph), with CPU time beside
//! them; haproxy's one plain HTTP hop on the same kind of path for the syscalls; and a callgrind
//! profile summary by bucket (I/O, TLS, HTTP codec, routing/policy, metrics, tracing, runtime,
//! alloc). With a baseline binary, both run in the same run and every row has a ratio, plus the
//! functions whose cost per request changed most.
//!
//! client pod ─▶ [outbound cnimesh-proxy] ═mTLS═▶ [inbound cnimesh-proxy] ─▶ app   (each binary)
//! client pod ─────────────────▶ haproxy (mode http) ──────────────────▶ app   (reference)
//!
//! Native phase: for each pair, `CNIMESH_COST_REQUESTS` (10 000) HTTP/1.1 requests at 1000 rps
//! (10 connections) three times: once bare (CPU, context switches, write/writev calls from
//! /proc), once under `strace -c` (syscalls by kind), and a fifth of them under
//! `strace -e trace=write…` (TLS records).
//! Callgrind phase: each pair again with both proxies under valgrind, zeroed after a warm-up,
//! `CNIMESH_COST_CALLGRIND_REQUESTS` (1000) requests at `CNIMESH_COST_CALLGRIND_RPS` (100; a
//! proxy under valgrind runs ~50× slower), dumped and read with `callgrind_annotate`; with a
//! baseline, twice per binary in the order this, baseline, baseline, this.
//! Rates phase: the goals measured in one run, rounds interleaved
//! (`CNIMESH_BENCH_ROUNDS`, 3): each binary's pair, haproxy's one plain hop and the path with no
//! proxy, at a fixed 1000 rps (p50/p99 from h2load's log, CPU per request) and unlimited
//! (HTTP/1.1 over 32 connections: requests per second, CPU per request); the pair's ratios
//! against haproxy and its added p50 per hop against the goals. `CNIMESH_COST_WORKERS=N` adds
//! this build on a work-stealing runtime of N threads to the same rounds.
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench proxy_cost` (needs `apt-get install
//! nghttp2-client haproxy valgrind strace`). `CNIMESH_BENCH_PROXY` sets the measured binary and
//! `CNIMESH_BENCH_BASELINE_PROXY` a second one compared with it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::bench::{
    PairSample, Row, cpu_seconds, env_or, h2load, interleaved_rounds, median, rounds, total_requests,
};
use cnimesh_e2e::control::Control;
use cnimesh_e2e::cost::{self, BUCKETS, Profile, Strace};
use cnimesh_e2e::haproxy::haproxy_in;
use cnimesh_e2e::mesh::Pair;
use cnimesh_e2e::sidecar::Sidecar;
use cnimesh_e2e::{Netns, Network, Pod, bins, require_root};
use serde_json::json;

/// Connections of every load; the rate is spread over them.
const CONNECTIONS: u32 = 10;
const RATE: u32 = 1000;

/// One process's cost per request in the native phase.
#[derive(Default, Clone)]
struct Native {
    cpu_us: f64,
    voluntary: f64,
    involuntary: f64,
    /// write/writev calls, from /proc (no strace).
    writes: f64,
    syscalls: BTreeMap<String, f64>,
    tls_app_records: f64,
    tls_records: f64,
}

impl Native {
    fn syscalls_total(&self) -> f64 {
        self.syscalls.values().sum()
    }
}

/// `requests` HTTP/1.1 requests from `netns` at `rate` rps over [`CONNECTIONS`]; the requests
/// sent.
fn load(netns: &Netns, url: &str, requests: u32, rate: u32) -> f64 {
    let (c, rps, n) = (CONNECTIONS.to_string(), (rate / CONNECTIONS).max(1).to_string(), requests.to_string());
    total_requests(&h2load(netns, &["--h1", "-c", &c, "--rps", &rps, "-n", &n, url]))
}

/// The native phase for the processes `pids` carrying `url` from `netns`.
fn native(netns: &Netns, url: &str, pids: &[u32], requests: u32, dir: &Path) -> Vec<Native> {
    load(netns, url, 1000, RATE);
    let mut out = vec![Native::default(); pids.len()];

    let before: Vec<_> =
        pids.iter().map(|p| (cpu_seconds(*p), cost::ctxt_switches(*p), cost::write_syscalls(*p))).collect();
    let n = load(netns, url, requests, RATE);
    for ((pid, (cpu, (vol, invol), writes)), o) in pids.iter().zip(before).zip(&mut out) {
        let ((vol2, invol2), writes2) = (cost::ctxt_switches(*pid), cost::write_syscalls(*pid));
        o.cpu_us = (cpu_seconds(*pid) - cpu) / n * 1e6;
        o.voluntary = (vol2 - vol) as f64 / n;
        o.involuntary = (invol2 - invol) as f64 / n;
        o.writes = (writes2 - writes) as f64 / n;
    }

    let straces: Vec<_> = pids.iter().map(|p| Strace::count(*p, &dir.join(format!("strace-c.{p}")))).collect();
    let n = load(netns, url, requests, RATE);
    for (strace, o) in straces.into_iter().zip(&mut out) {
        o.syscalls = cost::syscall_counts(&strace.finish()).into_iter().map(|(k, v)| (k, v as f64 / n)).collect();
    }

    let straces: Vec<_> = pids.iter().map(|p| Strace::writes(*p, &dir.join(format!("strace-w.{p}")))).collect();
    let n = load(netns, url, (requests / 5).max(100), RATE);
    for (strace, o) in straces.into_iter().zip(&mut out) {
        let (app, all) = cost::tls_records(&strace.finish());
        (o.tls_app_records, o.tls_records) = (app as f64 / n, all as f64 / n);
    }
    out
}

/// The callgrind phase for `proxy`: a pair of its own under valgrind; per proxy (client's,
/// server's), the profile of the measured requests, and their number.
fn callgrind(control: &Control, proxy: &Path, net: &Network, name: &str, dir: &Path) -> (Vec<Profile>, f64) {
    let (requests, rate) =
        (env_or("CNIMESH_COST_CALLGRIND_REQUESTS", 1000u32), env_or("CNIMESH_COST_CALLGRIND_RPS", 100u32));
    let wrapper = cost::callgrind_wrapper(dir);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let start = |bin: &Path, netns: &Netns, env: &[(&str, &str)]| {
        Sidecar::start_wrapped(bin, netns, env, &wrapper, Duration::from_secs(180))
    };
    let pair = Pair::start_by(control, proxy, net, name, &start);
    load(&pair.client.netns, &pair.url, 200, rate);
    let pids = pair.pids();
    pids.iter().for_each(|p| cost::callgrind_zero(*p));
    let n = load(&pair.client.netns, &pair.url, requests, rate);
    let profiles = pids.iter().map(|p| Profile::read(&cost::callgrind_dump(*p, dir))).collect();
    (profiles, n)
}

/// A binary measured: its name in the tables, native costs and profiles of its two proxies.
struct Measured {
    name: String,
    native: Vec<Native>,
    profiles: Vec<Profile>,
    /// Requests of the callgrind window.
    profiled: f64,
}

impl Measured {
    fn pair_profile(&self) -> Profile {
        let mut pair = Profile::default();
        self.profiles.iter().for_each(|p| pair.add(p));
        pair
    }

    fn per_request(&self, instructions: u64) -> f64 {
        instructions as f64 / self.profiled
    }
}

fn main() {
    if !require_root("proxy cost benchmark") {
        return;
    }
    for tool in ["h2load", "haproxy", "valgrind", "strace", "callgrind_annotate"] {
        if Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().map_or(true, |o| !o.status.success())
        {
            eprintln!("{tool} is missing: apt-get install nghttp2-client haproxy valgrind strace");
            std::process::exit(1);
        }
    }
    let requests: u32 = env_or("CNIMESH_COST_REQUESTS", 10_000);
    let bins = bins!();
    let proxy = std::env::var_os("CNIMESH_BENCH_PROXY").map_or(bins.proxy.clone(), PathBuf::from);
    let baseline = std::env::var_os("CNIMESH_BENCH_BASELINE_PROXY").map(PathBuf::from);
    // The profiles and traces: kept in `CNIMESH_COST_DIR` when set (for callgrind_annotate or
    // kcachegrind afterwards), else in a temporary directory. The proxies run as their own user
    // and write their profiles there.
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::env::var_os("CNIMESH_COST_DIR").map_or(tmp.path().to_owned(), PathBuf::from);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    println!("profiles and traces in {}", dir.display());
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let control = Control::start(&bins.control, &control_pod, &[]).unwrap();

    let mut binaries = vec![("this build", proxy.clone())];
    if let Some(b) = &baseline {
        binaries.push(("baseline", b.clone()));
    }
    println!("proxy binary: {}", proxy.display());
    if let Some(b) = &baseline {
        println!("baseline proxy binary: {}", b.display());
    }

    // `CNIMESH_COST_PHASES` (default `native,callgrind,rates`) picks the phases; a phase left
    // out prints zeros (rates: nothing).
    let phases = std::env::var("CNIMESH_COST_PHASES").unwrap_or_else(|_| "native,callgrind,rates".into());
    let (natives, hap) = if phases.contains("native") {
        native_phase(&control, &binaries, &net, requests, &dir)
    } else {
        (vec![vec![Native::default(); 2]; binaries.len()], Native::default())
    };

    // Callgrind phase, one binary at a time (valgrind is slow; two would share the cores). With
    // a baseline, in the order this, baseline, baseline, this, each binary's two windows added:
    // a binary measured second in a run counted a few per cent more than measured first, and
    // the order cancels that (and any drift of the machine) out of the ratios.
    let order: &[usize] = if binaries.len() > 1 { &[0, 1, 1, 0] } else { &[0] };
    let mut windows = vec![(vec![Profile::default(); 2], 0.0); binaries.len()];
    if phases.contains("callgrind") {
        for (k, &i) in order.iter().enumerate() {
            let (profiles, profiled) = callgrind(&control, &binaries[i].1, &net, &format!("cg{k}"), &dir);
            let window = &mut windows[i];
            window.0.iter_mut().zip(&profiles).for_each(|(sum, p)| sum.add(p));
            window.1 += profiled;
        }
    }
    let mut measured = Vec::new();
    for (((name, _), native), (profiles, profiled)) in binaries.iter().zip(natives).zip(windows) {
        measured.push(Measured { name: (*name).to_owned(), native, profiles, profiled: profiled.max(1.0) });
    }
    report(&measured, &hap, requests);
    if phases.contains("rates") {
        rates_phase(&control, &binaries, &net);
    }
}

/// The native phase: the pairs of `binaries` side by side, then haproxy; per pair its two
/// proxies' costs, and haproxy's.
fn native_phase(
    control: &Control,
    binaries: &[(&str, PathBuf)],
    net: &Network,
    requests: u32,
    dir: &Path,
) -> (Vec<Vec<Native>>, Native) {
    let pairs: Vec<Pair<'_>> =
        binaries.iter().enumerate().map(|(i, (_, bin))| Pair::start(control, bin, net, &format!("cost{i}"))).collect();
    std::thread::sleep(Duration::from_millis(300));
    let natives = pairs.iter().map(|p| native(&p.client.netns, &p.url, &p.pids(), requests, dir)).collect();
    drop(pairs);
    let plain = Plain::start(net, "cost");
    let hap = native(&plain.client.netns, &plain.hop_url(), &[plain.haproxy.id()], requests, dir);
    (natives, hap.into_iter().next().unwrap())
}

/// Two unmeshed pods (an excluded namespace): the app on the server, and haproxy in front of it.
struct Plain<'n> {
    client: Pod<'n>,
    server: Pod<'n>,
    haproxy: std::process::Child,
    _apps: Apps,
}

impl<'n> Plain<'n> {
    fn start(net: &'n Network, name: &str) -> Self {
        let client = Pod::named(net, "kube-system", &format!("{name}-client")).unwrap();
        let server = Pod::named(net, "kube-system", &format!("{name}-server")).unwrap();
        let apps = Apps::start(&server.netns.path(), server.ipv4().into(), "plain").unwrap();
        let haproxy = haproxy_in(&server.netns, hop_addr(&server), app_addr(&server));
        Self { client, server, haproxy, _apps: apps }
    }

    fn app_url(&self) -> String {
        format!("http://{}/hello", app_addr(&self.server))
    }

    fn hop_url(&self) -> String {
        format!("http://{}/hello", hop_addr(&self.server))
    }
}

impl Drop for Plain<'_> {
    fn drop(&mut self) {
        let _ = self.haproxy.kill();
        let _ = self.haproxy.wait();
    }
}

fn app_addr(server: &Pod<'_>) -> SocketAddr {
    SocketAddr::new(server.ipv4().into(), apps::HTTP_PORT)
}

fn hop_addr(server: &Pod<'_>) -> SocketAddr {
    SocketAddr::new(server.ipv4().into(), 8090)
}

/// The goals, as ratios against haproxy's one plain hop measured in the same run.
const GOAL_CPU_AT_RATE: f64 = 2.5;
const GOAL_CPU_AT_MAX: f64 = 2.0;
/// Added p50 per hop at 1000 rps, ms (a pair is two hops).
const GOAL_P50_PER_HOP_MS: f64 = 0.25;

/// The rates phase: each binary's pair, haproxy and the direct path in interleaved rounds;
/// printed with the pair's ratios against haproxy and the goals.
fn rates_phase(control: &Control, binaries: &[(&str, PathBuf)], net: &Network) {
    let mut pairs: Vec<Pair<'_>> =
        binaries.iter().enumerate().map(|(i, (_, bin))| Pair::start(control, bin, net, &format!("rate{i}"))).collect();
    let mut names: Vec<String> = binaries.iter().map(|(name, _)| format!("{name}: cnimesh mTLS pair")).collect();
    // The other runtime shape, in the same rounds: this build on a work-stealing runtime of
    // `CNIMESH_COST_WORKERS` threads (the default is one current-thread runtime).
    if let Some(workers) = std::env::var("CNIMESH_COST_WORKERS").ok().filter(|w| w != "1") {
        let settings = [("CNIMESH_PROXY_WORKERS", workers.as_str())];
        pairs.push(Pair::start_with(control, &binaries[0].1, net, "ratew", &settings));
        names.push(format!("{}: cnimesh mTLS pair, {workers} worker threads", binaries[0].0));
    }
    let plain = Plain::start(net, "rate");
    std::thread::sleep(Duration::from_millis(300));
    let mut rows = vec![
        Row { name: "direct (no proxy)", netns: &plain.client.netns, url: plain.app_url(), pids: vec![] },
        Row {
            name: "haproxy, one plain HTTP hop",
            netns: &plain.client.netns,
            url: plain.hop_url(),
            pids: vec![plain.haproxy.id()],
        },
    ];
    rows.extend(pairs.iter().zip(&names).map(|(p, name)| p.row(name)));
    let rounds = rounds();
    let samples = interleaved_rounds(&rows, rounds);
    print_rates(&rows, &samples, rounds, binaries.len() > 1);
}

fn print_rates(rows: &[Row<'_>], samples: &[Vec<PairSample>], rounds: usize, has_baseline: bool) {
    let med = |i: usize, f: fn(&PairSample) -> f64| median(samples[i].iter().map(f).collect());
    println!(
        "\n## Rates: HTTP/1.1 at {RATE} rps ({} connections), then unlimited (32 connections); medians of {rounds} rounds\n",
        cnimesh_e2e::bench::RATE_CLIENTS
    );
    println!("CPU is the row's processes' utime+stime, µs per request (both proxies of a pair).\n");
    println!("| row | p50 ms | p99 ms | added p50 per hop ms | CPU µs at {RATE} rps | max req/s | CPU µs at max |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let direct = med(0, |s| s.p50);
    for (i, row) in rows.iter().enumerate() {
        // haproxy is one hop, a pair two.
        let hops = if i < 2 { 1.0 } else { 2.0 };
        println!(
            "| {} | {:.3} | {:.3} | {:+.3} | {:.1} | {:.0} | {:.1} |",
            row.name,
            med(i, |s| s.p50),
            med(i, |s| s.p99),
            (med(i, |s| s.p50) - direct) / hops,
            med(i, |s| s.cpu_per_1000),
            med(i, |s| s.h1_max),
            med(i, |s| s.h1_cpu_per_1000),
        );
    }
    println!(
        "\n## Goals: the pair's CPU per request against haproxy's one hop (≤ {GOAL_CPU_AT_RATE} at {RATE} rps, ≤ {GOAL_CPU_AT_MAX} at max), added p50 per hop ≤ {GOAL_P50_PER_HOP_MS} ms\n"
    );
    println!(
        "| pair | CPU ratio at {RATE} rps | goal met | CPU ratio at max | goal met | added p50 per hop ms | goal met |"
    );
    println!("|---|---:|---|---:|---|---:|---|");
    let met = |ok: bool| if ok { "yes" } else { "no" };
    for (i, row) in rows.iter().enumerate().skip(2) {
        let at_rate = med(i, |s| s.cpu_per_1000) / med(1, |s| s.cpu_per_1000);
        let at_max = med(i, |s| s.h1_cpu_per_1000) / med(1, |s| s.h1_cpu_per_1000);
        let per_hop = (med(i, |s| s.p50) - direct) / 2.0;
        println!(
            "| {} | {at_rate:.2} | {} | {at_max:.2} | {} | {per_hop:+.3} | {} |",
            row.name,
            met(at_rate <= GOAL_CPU_AT_RATE),
            met(at_max <= GOAL_CPU_AT_MAX),
            met(per_hop <= GOAL_P50_PER_HOP_MS)
        );
    }
    if has_baseline {
        let ratio = |f: fn(&PairSample) -> f64| med(2, f) / med(3, f);
        println!(
            "\nthis build / baseline: CPU at {RATE} rps {:.3}, CPU at max {:.3}, max req/s {:.3}, p50 {:+.3} ms",
            ratio(|s| s.cpu_per_1000),
            ratio(|s| s.h1_cpu_per_1000),
            ratio(|s| s.h1_max),
            med(2, |s| s.p50) - med(3, |s| s.p50)
        );
    }
}

fn report(measured: &[Measured], hap: &Native, requests: u32) {
    let base = measured.get(1);
    println!(
        "\n## Per request, per proxy: HTTP/1.1, {CONNECTIONS} connections, {RATE} rps, {requests} requests (callgrind: {} requests)\n",
        measured[0].profiled
    );
    println!(
        "Instructions and allocator calls from callgrind (load-independent); CPU µs from /proc (noisy on a shared machine); syscalls from strace -c; TLS records (application data / all) from the proxies' writes.\n"
    );
    println!(
        "| row | instructions | ratio | allocations | ratio | write/writev (/proc) | syscalls (strace) | ctx switches vol / invol | TLS records app / all | CPU µs |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let ratio = |this: f64, base: Option<f64>| base.map_or("".to_owned(), |b| format!("{:.3}", this / b));
    for (mi, m) in measured.iter().enumerate() {
        let pair_native = sum(&m.native);
        let pair_profile = m.pair_profile();
        let rows: Vec<(&str, &Native, &Profile, usize)> = vec![
            ("client proxy", &m.native[0], &m.profiles[0], 0),
            ("server proxy", &m.native[1], &m.profiles[1], 1),
            ("pair", &pair_native, &pair_profile, 2),
        ];
        for (what, n, p, which) in rows {
            let (ir, allocs) = (m.per_request(p.instructions), p.allocations as f64 / m.profiled);
            let base_of = |f: &dyn Fn(&Measured, &Profile) -> f64| {
                base.filter(|_| mi == 0).map(|b| {
                    let bp = if which == 2 { b.pair_profile() } else { b.profiles[which].clone() };
                    f(b, &bp)
                })
            };
            println!(
                "| {}, {what} | {ir:.0} | {} | {allocs:.1} | {} | {:.2} | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.1} |",
                m.name,
                ratio(ir, base_of(&|b, bp| b.per_request(bp.instructions))),
                ratio(allocs, base_of(&|b, bp| bp.allocations as f64 / b.profiled)),
                n.writes,
                n.syscalls_total(),
                n.voluntary,
                n.involuntary,
                n.tls_app_records,
                n.tls_records,
                n.cpu_us,
            );
        }
    }
    println!(
        "| haproxy, one plain HTTP hop (sendto: no /proc writes) | | | | | {:.2} | {:.2} | {:.2} / {:.2} | | {:.1} |",
        hap.writes,
        hap.syscalls_total(),
        hap.voluntary,
        hap.involuntary,
        hap.cpu_us
    );

    println!("\n## Syscalls per request by kind\n");
    let mut kinds: Vec<&String> =
        measured.iter().flat_map(|m| m.native.iter().flat_map(|n| n.syscalls.keys())).collect();
    kinds.extend(hap.syscalls.keys());
    kinds.sort();
    kinds.dedup();
    let mut header = "| syscall |".to_owned();
    for m in measured {
        header += &format!(" {} client | {} server |", m.name, m.name);
    }
    println!("{header} haproxy |");
    println!("|---|{}---:|", "---:|".repeat(measured.len() * 2));
    for kind in kinds {
        let mut line = format!("| {kind} |");
        for m in measured {
            for n in &m.native {
                line += &format!(" {:.2} |", n.syscalls.get(kind).copied().unwrap_or(0.0));
            }
        }
        println!("{line} {:.2} |", hap.syscalls.get(kind).copied().unwrap_or(0.0));
    }

    println!("\n## Profile by bucket: instructions per request of the pair (own cost of each function, by symbol)\n");
    let profiles: Vec<(Profile, f64)> = measured.iter().map(|m| (m.pair_profile(), m.profiled)).collect();
    let buckets: Vec<BTreeMap<&str, u64>> = profiles.iter().map(|(p, _)| p.buckets()).collect();
    let mut header = "| bucket |".to_owned();
    for m in measured {
        header += &format!(" {} | % |", m.name);
    }
    println!("{header}{}", if base.is_some() { " ratio |" } else { "" });
    println!("|---|{}{}", "---:|---:|".repeat(measured.len()), if base.is_some() { "---:|" } else { "" });
    for bucket in BUCKETS {
        let mut line = format!("| {bucket} |");
        let per: Vec<f64> =
            buckets.iter().zip(&profiles).map(|(b, (_, n))| b.get(bucket).copied().unwrap_or(0) as f64 / n).collect();
        for ((v, (p, n)), _) in per.iter().zip(&profiles).zip(measured) {
            line += &format!(" {v:.0} | {:.1} |", v / (p.instructions as f64 / n) * 100.0);
        }
        if per.len() > 1 {
            line += &format!(" {:.3} |", per[0] / per[1]);
        }
        println!("{line}");
    }

    let (this, n_this) = &profiles[0];
    if let Some((base_p, n_base)) = profiles.get(1) {
        for (what, a, b) in [("own", &this.own, &base_p.own), ("inclusive", &this.inclusive, &base_p.inclusive)] {
            println!(
                "\n## Functions whose {what} instructions per request (pair) changed most: this build − baseline\n"
            );
            println!("| function | this build | baseline | change |");
            println!("|---|---:|---:|---:|");
            let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
            names.sort();
            names.dedup();
            let mut deltas: Vec<(&String, f64, f64)> = names
                .into_iter()
                .map(|f| {
                    (f, a.get(f).copied().unwrap_or(0) as f64 / n_this, b.get(f).copied().unwrap_or(0) as f64 / n_base)
                })
                .collect();
            deltas.sort_by(|x, y| (y.1 - y.2).abs().total_cmp(&(x.1 - x.2).abs()));
            for (f, t, bv) in deltas.into_iter().take(30) {
                println!("| `{}` | {t:.0} | {bv:.0} | {:+.0} |", short(f), t - bv);
            }
        }
    }
    for (what, costs) in [("own", &this.own), ("inclusive", &this.inclusive)] {
        println!("\n## This build's top functions by {what} instructions per request (pair)\n");
        println!("| function | bucket | instructions | % |");
        println!("|---|---|---:|---:|");
        let mut top: Vec<(&String, &u64)> = costs.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1));
        for (f, c) in top.into_iter().take(30) {
            println!(
                "| `{}` | {} | {:.0} | {:.1} |",
                short(f),
                cost::bucket(f),
                *c as f64 / n_this,
                *c as f64 / this.instructions as f64 * 100.0
            );
        }
    }
}

/// Both proxies' native costs added.
fn sum(natives: &[Native]) -> Native {
    let mut out = Native::default();
    for n in natives {
        out.cpu_us += n.cpu_us;
        out.voluntary += n.voluntary;
        out.involuntary += n.involuntary;
        out.writes += n.writes;
        out.tls_app_records += n.tls_app_records;
        out.tls_records += n.tls_records;
        for (k, v) in &n.syscalls {
            *out.syscalls.entry(k.clone()).or_default() += v;
        }
    }
    out
}

/// A function name cut to fit a table cell.
fn short(name: &str) -> String {
    let name = name.replace('|', "\\|");
    if name.chars().count() > 140 { name.chars().take(140).collect::<String>() + "…" } else { name }
}
