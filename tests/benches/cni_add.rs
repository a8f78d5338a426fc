//! ADD latency of `cnimesh-cni` over fresh network namespaces, next to — in the same run and on
//! the same namespaces' twins — the same rules loaded by `nft -f` and by `iptables-restore` (both
//! families), and the floor of exec'ing a no-op binary.
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench cni_add` (`CNIMESH_BENCH_N` sets the number of
//! namespaces per method, at least 200). Methods are interleaved so drift on the machine hits all
//! of them alike. Prints p50/p99/mean and ratios against the no-op floor.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cnimesh_cni::iptables::{Family, restore_input};
use cnimesh_cni::rules::Ruleset;
use cnimesh_cni::spec::RedirectSpec;
use cnimesh_e2e::cni::{Call, exec_raw};
use cnimesh_e2e::pod::container_id;
use cnimesh_e2e::{Netns, PluginDir, bins, require_root};
use serde_json::json;

const METHODS: [&str; 6] = [
    "exec no-op (floor)",
    "cnimesh-cni ADD",
    "nft -f",
    "iptables-nft-restore x2",
    "iptables-legacy-restore x2",
    "cnimesh-cni ADD, iptables-legacy backend",
];

/// Spawns `program` with `stdin`, from inside `netns` when given, and times spawn-to-exit.
fn timed(netns: Option<&Path>, program: &str, args: &[&str], stdin: &str) -> Duration {
    let run = || {
        let start = Instant::now();
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let elapsed = start.elapsed();
        assert!(out.status.success(), "{program}: {}", String::from_utf8_lossy(&out.stderr));
        elapsed
    };
    match netns {
        Some(path) => cnimesh_cni::netns::run_in(path, run).expect("enter netns"),
        None => run(),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    if !require_root("cni_add benchmark") {
        return;
    }
    let n: usize = std::env::var("CNIMESH_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(200).max(200);
    let bins = bins!();
    let plugins = PluginDir::new(&bins.plugin).unwrap();
    let state = tempfile::tempdir().unwrap();
    let ruleset = Ruleset::from_spec(&RedirectSpec::default());
    let nft_script = ruleset.to_string();
    let ipt = [Family::V4, Family::V6].map(|f| restore_input(&ruleset, f, ""));
    let conf_for = |backend: &str| {
        json!({
            "cniVersion": "1.0.0", "name": "bench", "type": "cnimesh-cni", "stateDir": state.path(), "backend": backend,
            "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}], "ips": [{"address": "10.244.0.2/24", "interface": 0}]}
        })
        .to_string()
    };
    let confs = [conf_for("nftables"), conf_for("iptables-legacy")];
    // The plugin's own ADD: spawn to exit, including its setns thread and record write.
    let plugin_add = |path: &Path, conf: &str| {
        let (cid, netns) = (container_id(), path.display().to_string());
        let call = Call { container_id: &cid, netns: &netns, ifname: "eth0", args: "K8S_POD_NAMESPACE=bench" };
        let start = Instant::now();
        let out = exec_raw(plugins.path(), "cnimesh-cni", "ADD", &call, conf.as_bytes()).unwrap();
        let d = start.elapsed();
        assert!(out.success, "ADD failed: {}", out.stdout);
        d
    };

    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(n); METHODS.len()];
    for i in 0..n {
        for (m, out) in samples.iter_mut().enumerate() {
            // A fresh namespace per sample, created and removed outside the timed section.
            let ns = Netns::new().unwrap();
            let path = ns.path();
            let d = match m {
                0 => timed(None, "/bin/true", &[], ""),
                1 => plugin_add(&path, &confs[0]),
                5 => plugin_add(&path, &confs[1]),
                2 => timed(Some(&path), "nft", &["-f", "-"], &nft_script),
                3 => {
                    timed(Some(&path), "iptables-nft-restore", &["--noflush"], &ipt[0])
                        + timed(Some(&path), "ip6tables-nft-restore", &["--noflush"], &ipt[1])
                }
                4 => {
                    timed(Some(&path), "iptables-legacy-restore", &["--noflush"], &ipt[0])
                        + timed(Some(&path), "ip6tables-legacy-restore", &["--noflush"], &ipt[1])
                }
                _ => unreachable!("one arm per method"),
            };
            out.push(d);
        }
        if (i + 1) % 50 == 0 {
            eprintln!("{}/{n} namespaces per method", i + 1);
        }
    }

    let floor_p50 = {
        let mut f = samples[0].clone();
        f.sort();
        percentile(&f, 0.5)
    };
    println!("\nADD of the default ruleset into a fresh netns, n={n} per method ({} cores)\n", num_cpus());
    println!("| method | p50 ms | p99 ms | mean ms | p50 / floor |");
    println!("|---|---:|---:|---:|---:|");
    for (name, mut s) in METHODS.iter().zip(samples) {
        s.sort();
        let mean = s.iter().sum::<Duration>() / s.len() as u32;
        let (p50, p99) = (percentile(&s, 0.5), percentile(&s, 0.99));
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.1}x |",
            ms(p50),
            ms(p99),
            ms(mean),
            p50.as_secs_f64() / floor_p50.as_secs_f64()
        );
    }
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
