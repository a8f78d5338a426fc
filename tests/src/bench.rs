//! What the proxy benchmarks share: h2load runs inside a pod, percentiles, the CPU time
//! (utime+stime from /proc) and resident memory of the measured processes, and slopes, so every
//! bench measures alike.

use std::process::{Command, Stdio};

use crate::netns::Netns;

/// The fixed-rate latency load: 10 HTTP/1.1 clients at 100 rps each for 10 s.
pub const RATE_CLIENTS: u32 = 10;
pub const RATE_PER_CLIENT: u32 = 100;
pub const RATE_SECONDS: u32 = 10;

/// Runs h2load in `netns`; panics unless every request succeeded.
pub fn h2load(netns: &Netns, args: &[&str]) -> String {
    let (ran, text) = h2load_unchecked(netns, args);
    assert!(ran && text.contains(" 0 failed"), "h2load {args:?} failed:\n{text}");
    text
}

/// Runs h2load in `netns`: whether it exited successfully, and its output, failures included
/// (for measurements of how many requests an overloaded proxy still serves).
pub fn h2load_unchecked(netns: &Netns, args: &[&str]) -> (bool, String) {
    let mut full = vec!["netns", "exec", netns.name(), "h2load"];
    full.extend_from_slice(args);
    let out = Command::new("ip").args(&full).stderr(Stdio::inherit()).output().expect("h2load runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One fixed-rate HTTP/1.1 run that may partly fail.
#[derive(Debug, Clone)]
pub struct RateRun {
    /// Requests the rate asked for (clients × rate × seconds).
    pub expected: f64,
    /// Responses with a 2xx status.
    pub ok: f64,
    /// Latency of every completed request, ms, sorted.
    pub latencies_ms: Vec<f64>,
}

impl RateRun {
    /// 2xx responses as a share of the requests the rate asked for.
    pub fn success_rate(&self) -> f64 {
        (self.ok / self.expected).min(1.0)
    }

    pub fn p(&self, p: f64) -> f64 {
        if self.latencies_ms.is_empty() { f64::NAN } else { percentile(&self.latencies_ms, p) }
    }
}

/// `clients` HTTP/1.1 connections at `rate` requests per second each, for `seconds`, against
/// `url` from `netns`; failures are counted, not fatal.
pub fn rate_run(netns: &Netns, clients: u32, rate: u32, seconds: u32, url: &str) -> RateRun {
    let log = std::env::temp_dir().join(format!("cnimesh-h2load-rate-{}.log", netns.name()));
    let (c, r, d, logarg) =
        (clients.to_string(), rate.to_string(), seconds.to_string(), format!("--log-file={}", log.display()));
    let (_, out) = h2load_unchecked(netns, &["--h1", "-c", &c, "--rps", &r, "-D", &d, &logarg, url]);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let ok = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("status codes: "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let mut latencies_ms = request_log_ms(&text);
    latencies_ms.sort_by(f64::total_cmp);
    RateRun { expected: f64::from(clients * rate * seconds), ok, latencies_ms }
}

/// Durations (ms) from an h2load request log; each line: start time (µs), status, duration (µs).
fn request_log_ms(log: &str) -> Vec<f64> {
    log.lines().filter_map(|l| l.split('\t').nth(2)?.trim().parse::<f64>().ok()).map(|us| us / 1e3).collect()
}

/// Fails with the package to install when h2load is missing.
pub fn require_h2load() {
    assert!(
        Command::new("h2load").arg("--version").output().is_ok(),
        "h2load is missing: apt-get install nghttp2-client"
    );
}

/// A setting of a benchmark from the environment, or `default`.
pub fn env_or<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Descriptors `pid` holds open now.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// Resident memory of `pid`, MiB.
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// The largest RSS of any of `pids`, sampled every 100 ms while `f` runs.
pub fn peak_rss<T>(pids: &[u32], f: impl FnOnce() -> T) -> (T, f64) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (stop, pids) = (stop.clone(), pids.to_vec());
        std::thread::spawn(move || {
            let mut peak: f64 = 0.0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = pids.iter().map(|p| rss_mib(*p)).fold(peak, f64::max);
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            peak
        })
    };
    let out = f();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    (out, sampler.join().expect("sampler"))
}

/// Least-squares slope of `points` (x, y).
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let cov: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let var: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    if var == 0.0 { 0.0 } else { cov / var }
}

/// Requests h2load sent in total, warm-up included (what the CPU was spent on).
pub fn total_requests(out: &str) -> f64 {
    out.lines()
        .find_map(|l| l.trim().strip_prefix("requests: "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .expect("h2load's requests line")
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(") ").map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks: f64 = fields.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64
}

pub fn cpu(pids: &[u32]) -> f64 {
    pids.iter().map(|p| cpu_seconds(*p)).sum()
}

/// p50 and p99 (ms) of `url` from `netns` at the fixed rate of HTTP/1.1, and the CPU ms `pids`
/// spent per 1000 requests.
pub fn fixed_rate(netns: &Netns, url: &str, pids: &[u32]) -> (f64, f64, f64) {
    let log = std::env::temp_dir().join(format!("cnimesh-h2load-{}.log", netns.name()));
    let (c, rps, d, logarg) = (
        RATE_CLIENTS.to_string(),
        RATE_PER_CLIENT.to_string(),
        RATE_SECONDS.to_string(),
        format!("--log-file={}", log.display()),
    );
    let before = cpu(pids);
    let out = h2load(netns, &["--h1", "-c", &c, "--rps", &rps, "-D", &d, "--warm-up-time", "2", &logarg, url]);
    let spent = cpu(pids) - before;
    let text = std::fs::read_to_string(&log).expect("h2load log");
    let _ = std::fs::remove_file(&log);
    let mut ms = request_log_ms(&text);
    ms.sort_by(f64::total_cmp);
    assert!(ms.len() > 1000, "too few samples: {}", ms.len());
    let requests = total_requests(&out).max(1.0);
    (percentile(&ms, 0.5), percentile(&ms, 0.99), spent / requests * 1e6)
}

/// h2load with `args` and no rate limit: requests per second, and the CPU ms `pids` spent per
/// 1000 requests.
pub fn unlimited(netns: &Netns, args: &[&str], pids: &[u32]) -> (f64, f64) {
    let before = cpu(pids);
    let out = h2load(netns, args);
    let spent = cpu(pids) - before;
    let line = out.lines().find(|l| l.starts_with("finished in")).expect("summary line");
    let rps =
        line.split(", ").nth(1).and_then(|s| s.split_whitespace().next()).and_then(|v| v.parse().ok()).expect("req/s");
    (rps, spent / total_requests(&out).max(1.0) * 1e6)
}

/// Requests of the unlimited HTTP/1.1 run of [`measure_pair`].
pub const H1_MAX_REQUESTS: &str = "60000";

/// One round's measurements of a proxy pair.
#[derive(Clone, Copy, Default)]
pub struct PairSample {
    pub p50: f64,
    pub p99: f64,
    pub cpu_per_1000: f64,
    pub h1_max: f64,
    pub h1_cpu_per_1000: f64,
}

/// [`fixed_rate`], then [`unlimited`] HTTP/1.1 over 32 connections, of `url` from `netns`.
pub fn measure_pair(netns: &Netns, url: &str, pids: &[u32]) -> PairSample {
    let (p50, p99, cpu_per_1000) = fixed_rate(netns, url, pids);
    let (h1_max, h1_cpu_per_1000) = unlimited(netns, &["--h1", "-c", "32", "-n", H1_MAX_REQUESTS, url], pids);
    PairSample { p50, p99, cpu_per_1000, h1_max, h1_cpu_per_1000 }
}

/// A row of a comparison: its name, where its client runs, the URL, the proxies' PIDs.
pub struct Row<'a> {
    pub name: &'a str,
    pub netns: &'a Netns,
    pub url: String,
    pub pids: Vec<u32>,
}

/// `rounds` rounds of [`measure_pair`] over `rows`, interleaved so that noise on the machine
/// falls on every row alike; each row's samples.
pub fn interleaved_rounds(rows: &[Row<'_>], rounds: usize) -> Vec<Vec<PairSample>> {
    let mut samples = vec![Vec::new(); rows.len()];
    for round in 0..rounds {
        for (row, out) in rows.iter().zip(&mut samples) {
            let s = measure_pair(row.netns, &row.url, &row.pids);
            eprintln!(
                "round {round} {}: p50 {:.3} p99 {:.3} cpu/1000 {:.1} h1 {:.0} ({:.1})",
                row.name, s.p50, s.p99, s.cpu_per_1000, s.h1_max, s.h1_cpu_per_1000
            );
            out.push(s);
        }
    }
    samples
}

/// Prints the medians of each row as a Markdown table under `title`, then what the second row
/// adds to the first (`what`: the feature measured) against a CPU target in percent.
pub fn print_comparison(title: &str, rows: &[Row<'_>], samples: &[Vec<PairSample>], what: &str, target: f64) {
    let rounds = samples.first().map_or(0, Vec::len);
    let med = |i: usize, f: fn(&PairSample) -> f64| median(samples[i].iter().map(f).collect());
    println!(
        "\n## {title}: HTTP/1.1 at {} rps, then unlimited (32 connections); medians of {rounds} rounds\n",
        RATE_CLIENTS * RATE_PER_CLIENT
    );
    println!("CPU is both proxies' utime+stime, ms per 1000 requests.\n");
    println!("| row | p50 ms | p99 ms | CPU/1000 at 1000 rps | h1 max rps | CPU/1000 at max |");
    println!("|---|---|---|---|---|---|");
    for (i, row) in rows.iter().enumerate() {
        println!(
            "| {} | {:.3} | {:.3} | {:.1} | {:.0} | {:.1} |",
            row.name,
            med(i, |s| s.p50),
            med(i, |s| s.p99),
            med(i, |s| s.cpu_per_1000),
            med(i, |s| s.h1_max),
            med(i, |s| s.h1_cpu_per_1000)
        );
    }
    let pct = |f: fn(&PairSample) -> f64| (med(1, f) / med(0, f) - 1.0) * 100.0;
    let (added_rate, added_max) = (pct(|s| s.cpu_per_1000), pct(|s| s.h1_cpu_per_1000));
    println!(
        "\nadded by {what}: p50 {:+.3} ms, p99 {:+.3} ms; CPU {added_rate:+.1} % at 1000 rps, {added_max:+.1} % at max (target < {target} %)",
        med(1, |s| s.p50) - med(0, |s| s.p50),
        med(1, |s| s.p99) - med(0, |s| s.p99),
    );
    // The noise: how far the baseline's own rounds are apart. An added cost inside it cannot be
    // told from the machine's variation, however the medians fall.
    let baseline = samples.first().map_or(&[][..], Vec::as_slice);
    let spread_rate = spread_pct(&baseline.iter().map(|s| s.cpu_per_1000).collect::<Vec<_>>());
    let spread_max = spread_pct(&baseline.iter().map(|s| s.h1_cpu_per_1000).collect::<Vec<_>>());
    println!(
        "noise: the baseline's CPU spread (max-min)/median over {rounds} rounds: {spread_rate:.1} % at 1000 rps, {spread_max:.1} % at max"
    );
    println!(
        "verdict: {what} at 1000 rps {added_rate:+.1} % vs {spread_rate:.1} %: {}; at max {added_max:+.1} % vs {spread_max:.1} %: {}",
        verdict(added_rate, spread_rate, rounds),
        verdict(added_max, spread_max, rounds)
    );
}

/// How far apart `values` are, as a share of their median: (max − min) / median, in percent
/// (0 for fewer than two).
pub fn spread_pct(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let (min, max) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    (max - min) / median(values.to_vec()) * 100.0
}

/// Whether a cost of `added` % stands out of the baseline's round-to-round `spread` (%): within
/// noise when it is no larger (a saving is within noise too); with one round there is no spread
/// to tell.
pub fn verdict(added: f64, spread: f64, rounds: usize) -> &'static str {
    if rounds < 2 {
        "unknown (one round has no spread; run 3 or more)"
    } else if added <= spread {
        "within noise"
    } else {
        "above noise"
    }
}

/// Rounds per row: `CNIMESH_BENCH_ROUNDS`, 3 by default.
pub fn rounds() -> usize {
    std::env::var("CNIMESH_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_inside_the_baselines_spread_is_within_noise_and_one_outside_is_not() {
        let spread = spread_pct(&[237.0, 260.0, 242.0]);
        assert!((spread - 23.0 / 242.0 * 100.0).abs() < 1e-9, "{spread}");
        assert_eq!(verdict(9.0, spread, 3), "within noise");
        assert_eq!(verdict(-4.0, spread, 3), "within noise", "a saving is no cost");
        assert_eq!(verdict(13.6, spread, 3), "above noise");
        assert_eq!(spread_pct(&[250.0]), 0.0);
        assert!(verdict(0.0, 0.0, 1).starts_with("unknown"), "one round tells nothing");
    }
}
