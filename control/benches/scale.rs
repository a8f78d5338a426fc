//! The control plane at cluster scale, in Kubernetes mode: the real `cnimesh-control serve --kube`
//! process against the in-process API server (served on loopback, watched through kube-rs like a
//! real one), N Services × K endpoints (each endpoint a meshed Pod and an EndpointSlice entry),
//! and S Destination streams held by real mTLS gRPC clients. It reports, per binary:
//!
//! - RSS with an empty cluster and with the N × K endpoints (→ KiB per endpoint), time to ready;
//! - idle CPU (share of a core over 10 s, nothing changing), and RSS after that idle time;
//! - RSS per open stream, streams spread over distinct Services, and what stays after they close;
//! - fan-out: S subscribers of one Service, one endpoint added or removed at a time, the time from
//!   the API server's write to the update's arrival at each subscriber (p50/p99/max), and the
//!   server's CPU per subscriber per change;
//! - churn: a fixed rate of endpoint changes over Services with 1 000 subscribers in all, and the
//!   lag (write → arrival at every subscriber of that Service) in the first and the last third.
//!
//! With `CNIMESH_BENCH_BASELINE_CONTROL` set, the baseline binary runs the same sequence first
//! and the table shows both with their ratio (new / baseline), measured in the same run.
//!
//! Settable (environment): `CNIMESH_SCALE_SERVICES` (2000), `CNIMESH_SCALE_ENDPOINTS` (25),
//! `CNIMESH_SCALE_STREAMS` (subscriber counts, "1000,5000"), `CNIMESH_SCALE_CHANGES` (20 per
//! fan-out), `CNIMESH_SCALE_CHURN_RATE` (100 per second), `CNIMESH_SCALE_CHURN_SECONDS` (30),
//! `CNIMESH_SCALE_CONNECTIONS` (100 HTTP/2 connections, as that many proxies),
//! `CNIMESH_SCALE_IDLE_SECONDS` (10, the idle CPU's window),
//! `CNIMESH_BENCH_CONTROL` (the binary measured; default: this build's).
//! Run: `scripts/bench-control-scale.sh` (release builds; the clients share the machine's cores,
//! so the figures are for comparing binaries in one run, not absolute).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cnimesh_apiserver::{ClusterApi, Served};
use cnimesh_identity::{Name, pem, tls};
use linkerd2_proxy_api::destination::destination_client::DestinationClient;
use linkerd2_proxy_api::destination::{GetDestination, Update, update};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tonic::transport::Channel;

mod common;
use common::rss_mib;

/// The API server's token (required, as a real server's).
const TOKEN: &str = "scale-admin-token";
/// Only guards against a hung run; nothing here asserts time.
const PATIENCE: Duration = Duration::from_secs(120);

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Clone)]
struct Settings {
    services: usize,
    endpoints: usize,
    streams: Vec<usize>,
    changes: usize,
    churn_rate: u64,
    churn_seconds: u64,
    connections: usize,
    idle_seconds: u64,
}

impl Settings {
    fn from_env() -> Self {
        let streams = std::env::var("CNIMESH_SCALE_STREAMS")
            .ok()
            .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![1000, 5000]);
        Self {
            services: setting("CNIMESH_SCALE_SERVICES", 2000).max(1) as usize,
            endpoints: setting("CNIMESH_SCALE_ENDPOINTS", 25).clamp(1, 250) as usize,
            streams,
            changes: setting("CNIMESH_SCALE_CHANGES", 20).max(1) as usize,
            churn_rate: setting("CNIMESH_SCALE_CHURN_RATE", 100).max(1),
            churn_seconds: setting("CNIMESH_SCALE_CHURN_SECONDS", 30),
            connections: setting("CNIMESH_SCALE_CONNECTIONS", 100).max(1) as usize,
            idle_seconds: setting("CNIMESH_SCALE_IDLE_SECONDS", 10).max(1),
        }
    }
}

fn ip(service: usize, endpoint: usize) -> String {
    format!("10.{}.{}.{}", 64 + service / 250, service % 250, endpoint + 1)
}

fn service(s: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "scale", "name": format!("svc-{s}")},
        "spec": {"clusterIP": format!("10.96.{}.{}", s / 250, s % 250 + 1), "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
}

/// Service `s`'s one EndpointSlice with its first `count` endpoints.
fn slice(s: usize, count: usize) -> Value {
    let endpoints: Vec<Value> = (0..count)
        .map(|e| {
            json!({"addresses": [ip(s, e)], "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "namespace": "scale", "name": format!("pod-{s}-{e}")}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "scale", "name": format!("svc-{s}-a"), "labels": {"kubernetes.io/service-name": format!("svc-{s}")}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": endpoints})
}

fn pod(s: usize, e: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "scale", "name": format!("pod-{s}-{e}")},
        "spec": {"serviceAccountName": "web", "containers": [{"name": "app"}, {"name": "cnimesh-proxy"}]},
        "status": {"phase": "Running", "podIP": ip(s, e), "podIPs": [{"ip": ip(s, e)}]}})
}

/// The cluster: N Services with K meshed endpoints each, plus one spare Pod per Service that the
/// fan-out and churn phases add to and remove from its slice.
fn populate(api: &ClusterApi, settings: &Settings) {
    api.put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scale"}}));
    for s in 0..settings.services {
        api.put(service(s));
        for e in 0..=settings.endpoints {
            api.put(pod(s, e));
        }
        api.put(slice(s, settings.endpoints));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// One control plane process against one API server.
struct Run {
    child: Child,
    pid: u32,
    channels: Vec<Channel>,
    _served: Served,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `bin` in Kubernetes mode against `api` and connects `connections` mesh clients.
async fn start(bin: &Path, dir: &Path, api: &Arc<ClusterApi>, connections: usize) -> Run {
    let served = api.serve().await;
    let kubeconfig = dir.join("kubeconfig");
    served.write_kubeconfig(&kubeconfig, "scale", TOKEN).expect("kubeconfig");
    let issuer = dir.join("issuer");
    if !issuer.exists() {
        cnimesh_model::ca_init::run(&cnimesh_model::ca_init::CaInit::new(&issuer)).expect("ca init");
    }
    let (grpc, admin) = (free_port(), free_port());
    let child = Command::new(bin)
        .args([
            "serve",
            "--kube",
            "--addr",
            &format!("127.0.0.1:{grpc}"),
            "--admin-addr",
            &format!("127.0.0.1:{admin}"),
        ])
        .arg("--issuer-dir")
        .arg(&issuer)
        // Every simulated proxy dials from 127.0.0.1 with one identity: lift the per-peer and
        // per-identity bounds (sized for one proxy per pod) to what the run holds.
        .args(["--max-connections-per-peer", "100000", "--max-streams-per-peer", "1000000"])
        .args(["--max-streams-per-identity", "1000000", "--max-streams", "1000000"])
        .env("KUBECONFIG", &kubeconfig)
        .env("CNIMESH_CONTROL_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let pid = child.id();
    let anchors = pem::certs(&std::fs::read(issuer.join("ca.crt")).expect("anchors"), "anchors").expect("anchors PEM");
    let roots = tls::roots(&anchors).expect("roots");
    let control_name: Name = cnimesh_identity::name::DEFAULT_CONTROL_NAME.parse().expect("name");
    let client_name = Name::for_service_account("web", "scale", "cluster.local").expect("name");
    let cert = cnimesh_model::identity::own_cert::issue_from_dir(&issuer, &client_name, Duration::from_secs(86400))
        .expect("a client certificate");
    let addr = format!("127.0.0.1:{grpc}");
    let connect = || cnimesh_identity::grpc_channel::connect(&addr, &control_name, roots.clone(), Some(cert.clone()));
    let deadline = Instant::now() + PATIENCE;
    let first = loop {
        match connect().await {
            Ok(channel) => break channel,
            Err(e) => {
                assert!(Instant::now() < deadline, "{} not reachable: {e:#}", bin.display());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let mut channels = vec![first];
    for _ in 1..connections {
        channels.push(connect().await.expect("connect"));
    }
    Run { child, pid, channels, _served: served }
}

fn path(service: usize) -> String {
    format!("svc-{service}.scale.svc.cluster.local:80")
}

fn addrs_in(update: &Update) -> Option<usize> {
    match &update.update {
        Some(update::Update::Add(set)) => Some(set.addrs.len()),
        _ => None,
    }
}

/// Until Destination answers the last Service with all its endpoints: the cluster is loaded.
async fn wait_loaded(run: &Run, settings: &Settings) {
    let deadline = Instant::now() + PATIENCE;
    let last = settings.services - 1;
    loop {
        let mut client = DestinationClient::new(run.channels[0].clone());
        let request = GetDestination { path: path(last), ..Default::default() };
        let first = async { client.get(request).await?.into_inner().message().await }.await;
        if first.is_ok_and(|u| u.as_ref().and_then(addrs_in) == Some(settings.endpoints)) {
            return;
        }
        assert!(Instant::now() < deadline, "the control plane did not load the cluster");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What one subscriber has received: how many updates, and when the last arrived.
#[derive(Default)]
struct Seen {
    count: AtomicUsize,
    last: Mutex<Option<Instant>>,
}

/// `count` streams, the i-th on Service `service_of(i)`, each drained by a task that notes its
/// updates; returns once every stream has its first answer. Dropping the handles ends them.
async fn subscribe(
    run: &Run,
    count: usize,
    service_of: impl Fn(usize) -> usize,
) -> (Vec<Arc<Seen>>, Vec<tokio::task::JoinHandle<()>>) {
    let mut seen = Vec::with_capacity(count);
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        let s = Arc::new(Seen::default());
        let mut client = DestinationClient::new(run.channels[i % run.channels.len()].clone());
        let request = GetDestination { path: path(service_of(i)), ..Default::default() };
        let noted = s.clone();
        tasks.push(tokio::spawn(async move {
            let Ok(response) = client.get(request).await else { return };
            let mut stream = response.into_inner();
            while let Ok(Some(_)) = stream.message().await {
                *noted.last.lock() = Some(Instant::now());
                noted.count.fetch_add(1, Ordering::Release);
            }
        }));
        seen.push(s);
    }
    let deadline = Instant::now() + PATIENCE;
    while seen.iter().any(|s| s.count.load(Ordering::Acquire) == 0) {
        assert!(Instant::now() < deadline, "not every stream got its first answer");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (seen, tasks)
}

/// Waits until each of `seen` has more than `before[i]` updates; the delays from `at`.
async fn arrivals(seen: &[Arc<Seen>], before: &[usize], at: Instant) -> Vec<Duration> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if seen.iter().zip(before).all(|(s, b)| s.count.load(Ordering::Acquire) > *b) {
            return seen
                .iter()
                .map(|s| s.last.lock().map(|t| t.saturating_duration_since(at)).unwrap_or_default())
                .collect();
        }
        assert!(Instant::now() < deadline, "an update did not reach every subscriber");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn counts(seen: &[Arc<Seen>]) -> Vec<usize> {
    seen.iter().map(|s| s.count.load(Ordering::Acquire)).collect()
}

fn ms(sorted: &[Duration], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

/// One binary's figures, by row name, in the order measured.
type Figures = Vec<(String, f64)>;

async fn measure(bin: &Path, settings: &Settings) -> Figures {
    let mut out: Figures = Vec::new();
    let dir = tempfile::tempdir().expect("tempdir");
    eprintln!("## {}", bin.display());

    // Empty cluster: the process's own floor.
    let empty = ClusterApi::new();
    empty.require_token(TOKEN);
    empty.put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scale"}}));
    let floor = {
        let run = start(bin, dir.path(), &empty, 1).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        rss_mib(run.pid)
    };
    out.push(("RSS, empty cluster (MiB)".into(), floor));

    let api = ClusterApi::new();
    api.require_token(TOKEN);
    populate(&api, settings);
    let endpoints = settings.services * settings.endpoints;
    let started = Instant::now();
    let run = start(bin, dir.path(), &api, settings.connections).await;
    wait_loaded(&run, settings).await;
    out.push(("time to ready with the cluster (s)".into(), started.elapsed().as_secs_f64()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let loaded = rss_mib(run.pid);
    out.push((format!("RSS, {endpoints} endpoints (MiB)"), loaded));
    out.push(("RSS per endpoint (KiB)".into(), (loaded - floor).max(0.0) * 1024.0 / endpoints as f64));
    let cpu = cpu_seconds(run.pid);
    let idle = settings.idle_seconds;
    tokio::time::sleep(Duration::from_secs(idle)).await;
    out.push(("idle CPU (% of a core)".into(), (cpu_seconds(run.pid) - cpu) * 100.0 / idle as f64));
    // What the load costs once the allocator has given back what loading freed: what the
    // process holds for as long as the cluster is there (the figure above still holds some of
    // the list's transient memory).
    let settled = rss_mib(run.pid);
    out.push((format!("RSS, {endpoints} endpoints, after the idle time (MiB)"), settled));
    out.push((
        "RSS per endpoint, after the idle time (KiB)".into(),
        (settled - floor).max(0.0) * 1024.0 / endpoints as f64,
    ));

    for &count in &settings.streams {
        // Streams over distinct Services: memory per stream, and what closing them gives back.
        let before = rss_mib(run.pid);
        let (seen, tasks) = subscribe(&run, count, |i| i % settings.services).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let with = rss_mib(run.pid);
        out.push((
            format!("RSS per stream, {count} over distinct Services (KiB)"),
            (with - before) * 1024.0 / count as f64,
        ));
        tasks.iter().for_each(|t| t.abort());
        drop((seen, tasks));
        tokio::time::sleep(Duration::from_secs(5)).await;
        out.push((format!("RSS held 5 s after closing {count} streams (MiB)"), (rss_mib(run.pid) - before).max(0.0)));

        // Fan-out: every stream on svc-0; its spare endpoint added, then removed, and so on.
        let (seen, tasks) = subscribe(&run, count, |_| 0).await;
        let mut delays = Vec::new();
        let cpu = cpu_seconds(run.pid);
        for c in 0..settings.changes {
            let before = counts(&seen);
            let at = Instant::now();
            api.put(slice(0, settings.endpoints + (c + 1) % 2));
            delays.extend(arrivals(&seen, &before, at).await);
        }
        let per = (cpu_seconds(run.pid) - cpu) * 1e6 / (settings.changes * count) as f64;
        delays.sort();
        out.push((format!("fan-out to {count}: p50 (ms)"), ms(&delays, 50)));
        out.push((format!("fan-out to {count}: p99 (ms)"), ms(&delays, 99)));
        out.push((
            format!("fan-out to {count}: max (ms)"),
            delays.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0),
        ));
        out.push((format!("server CPU per subscriber per change, {count} (µs)"), per));
        // Back to K endpoints for the next round.
        if settings.changes % 2 == 1 {
            let before = counts(&seen);
            api.put(slice(0, settings.endpoints));
            arrivals(&seen, &before, Instant::now()).await;
        }
        tasks.iter().for_each(|t| t.abort());
    }

    if settings.churn_seconds > 0 {
        // Churn: 1 000 subscribers over 100 Services, endpoint changes at a fixed rate, round robin.
        let services = 100.min(settings.services);
        let (seen, tasks) = subscribe(&run, 1000, |i| i % services).await;
        let mut lags: Vec<(f64, Duration)> = Vec::new();
        let interval = Duration::from_secs(1) / settings.churn_rate as u32;
        let start = Instant::now();
        let mut tick = tokio::time::interval(interval);
        let mut pending: Vec<(Instant, usize, Vec<usize>)> = Vec::new();
        let mut added = vec![false; services];
        let mut n = 0usize;
        while start.elapsed() < Duration::from_secs(settings.churn_seconds) {
            tick.tick().await;
            let s = n % services;
            n += 1;
            // A Service changed again before its last change arrived would merge the two.
            if pending.iter().any(|(_, p, _)| *p == s) {
                continue;
            }
            let subscribers: Vec<usize> = (s..1000).step_by(services).collect();
            let before: Vec<usize> = subscribers.iter().map(|&i| seen[i].count.load(Ordering::Acquire)).collect();
            added[s] = !added[s];
            api.put(slice(s, settings.endpoints + usize::from(added[s])));
            pending.push((Instant::now(), s, before));
            pending.retain(|(at, p, before)| {
                let subscribers: Vec<usize> = (*p..1000).step_by(services).collect();
                let arrived = subscribers.iter().zip(before).all(|(&i, b)| seen[i].count.load(Ordering::Acquire) > *b);
                if arrived {
                    let last = subscribers.iter().filter_map(|&i| *seen[i].last.lock()).max().unwrap_or(*at);
                    lags.push((at.duration_since(start).as_secs_f64(), last.saturating_duration_since(*at)));
                }
                !arrived
            });
        }
        let third = settings.churn_seconds as f64 / 3.0;
        let mut first: Vec<Duration> = lags.iter().filter(|(t, _)| *t < third).map(|(_, l)| *l).collect();
        let mut last: Vec<Duration> = lags.iter().filter(|(t, _)| *t >= 2.0 * third).map(|(_, l)| *l).collect();
        first.sort();
        last.sort();
        let rate = settings.churn_rate;
        out.push((format!("churn {rate}/s, 1000 streams: applied changes"), lags.len() as f64));
        out.push((format!("churn {rate}/s: lag p99, first third (ms)"), ms(&first, 99)));
        out.push((format!("churn {rate}/s: lag p99, last third (ms)"), ms(&last, 99)));
        tasks.iter().for_each(|t| t.abort());
    }
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; anything else (a `cargo test` of benches) only builds.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let settings = Settings::from_env();
    let bin: PathBuf = std::env::var_os("CNIMESH_BENCH_CONTROL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_cnimesh-control")));
    let baseline = std::env::var_os("CNIMESH_BENCH_BASELINE_CONTROL").map(PathBuf::from);
    println!(
        "control plane at scale (Kubernetes mode, in-process API server): {} Services × {} endpoints, streams {:?} over {} connections",
        settings.services, settings.endpoints, settings.streams, settings.connections
    );
    let base = match &baseline {
        Some(b) => Some(measure(b, &settings).await),
        None => None,
    };
    let new = measure(&bin, &settings).await;
    println!();
    match base {
        Some(base) => {
            println!("| measure | baseline | new | new / baseline |");
            println!("|---|---:|---:|---:|");
            for ((name, b), (_, n)) in base.iter().zip(&new) {
                println!("| {name} | {b:.2} | {n:.2} | {:.2} |", n / b);
            }
        }
        None => {
            println!("| measure | value |");
            println!("|---|---:|");
            for (name, n) in &new {
                println!("| {name} | {n:.2} |");
            }
        }
    }
}
