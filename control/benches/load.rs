//! Control plane load run: the real `cnimesh-control serve` process on loopback, on the
//! Kubernetes code path against the in-process API server (`cnimesh-apiserver`), with
//! 10,000 Destination `Get` streams held open and 100 Certify calls a second for 10 minutes, while
//! the process's RSS and the latency of Certify and of a new `Get` (to its first update) are
//! sampled per window; at the end, the slope of RSS and p99 over time.
//!
//! Settable (environment): `CNIMESH_LOAD_SECONDS` (600), `CNIMESH_LOAD_STREAMS` (10000),
//! `CNIMESH_LOAD_CERTIFY_RATE` (100 per second), `CNIMESH_LOAD_WINDOW` (10 seconds),
//! `CNIMESH_LOAD_CONNECTIONS` (100 HTTP/2 connections carrying the streams, as that many proxies).
//! Run: `scripts/load-control.sh` (a release build; the client shares the machine's cores).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cnimesh_apiserver::{ClusterApi, Served};
use cnimesh_identity::{Name, ca, pem, tls};
use futures::StreamExt;
use linkerd2_proxy_api::destination::destination_client::DestinationClient;
use linkerd2_proxy_api::destination::{GetDestination, Update, update};
use linkerd2_proxy_api::identity::CertifyRequest;
use linkerd2_proxy_api::identity::identity_client::IdentityClient;
use tokio::sync::Mutex;
use tonic::transport::Channel;

mod common;
use common::rss_mib;

const SERVICES: usize = 100;
const ENDPOINTS: usize = 10;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Service `s` with its 10 meshed endpoints.
fn service_yaml(s: usize) -> String {
    let mut docs = vec![format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: load}}\nspec:\n  clusterIP: 10.96.0.{s}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n"
    )];
    let mut slice = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{s}-a\n  namespace: load\n  labels: {{kubernetes.io/service-name: svc-{s}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n"
    );
    for e in 0..ENDPOINTS {
        let ip = format!("10.2.{s}.{e}");
        slice += &format!(
            "- addresses: ['{ip}']\n  conditions: {{ready: true}}\n  targetRef: {{kind: Pod, name: pod-{s}-{e}, namespace: load}}\n"
        );
        docs.push(format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: pod-{s}-{e}, namespace: load}}\nspec:\n  serviceAccountName: web\n  containers: [{{name: app}}, {{name: cnimesh-proxy}}]\nstatus: {{phase: Running, podIP: '{ip}', podIPs: [{{ip: '{ip}'}}]}}\n"
        ));
    }
    docs.push(slice);
    docs.join("---\n")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// The cluster: the in-process API server on loopback holding the services, the control plane's
/// kubeconfig (0600) in `dir`, and a token of `load/web` for Identity.
async fn serve_cluster(dir: &Path) -> (Served, PathBuf, String) {
    let api = ClusterApi::new();
    for s in 0..SERVICES {
        let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(&service_yaml(s)).expect("objects");
        docs.into_iter().for_each(|doc| drop(api.put(doc)));
    }
    let served = api.serve().await;
    let kubeconfig = dir.join("kubeconfig");
    let admin = api.issue_token("cnimesh", "cnimesh-control", &[]).expect("a token");
    served.write_kubeconfig(&kubeconfig, "load", &admin).expect("kubeconfig");
    let token = api.issue_token("load", "web", &[cnimesh_identity::TOKEN_AUDIENCE]).expect("a token");
    (served, kubeconfig, token)
}

/// `cnimesh-control serve --kube` on loopback with an issuer from `ca_init` (`cnimesh ca init`).
fn start_control(dir: &Path, kubeconfig: &Path, grpc: u16, admin: u16) -> Child {
    let bin = env!("CARGO_BIN_EXE_cnimesh-control");
    let issuer = dir.join("issuer");
    cnimesh_model::ca_init::run(&cnimesh_model::ca_init::CaInit::new(&issuer)).expect("ca init");
    Command::new(bin)
        .args(["serve", "--addr", &format!("127.0.0.1:{grpc}"), "--admin-addr", &format!("127.0.0.1:{admin}")])
        .arg("--issuer-dir")
        .arg(&issuer)
        .arg("--kube")
        .env("KUBECONFIG", kubeconfig)
        // All the simulated proxies dial from 127.0.0.1 with one identity: lift the per-peer and
        // per-identity bounds (defaults sized for one proxy per pod) to what the run holds.
        .args(["--max-connections-per-peer", "100000", "--max-streams-per-peer", "1000000"])
        .args(["--max-streams-per-identity", "1000000", "--max-streams", "1000000"])
        .env("CNIMESH_CONTROL_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn cnimesh-control")
}

fn percentile(sorted: &[Duration], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

/// Least-squares slope of `ys` over `xs`.
fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let cov: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let var: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
    if var == 0.0 { 0.0 } else { cov / var }
}

fn path(service: usize) -> String {
    format!("svc-{}.load.svc.cluster.local:80", service % SERVICES)
}

/// Whether an update adds endpoints (what a known service with ready endpoints answers first).
fn is_add(update: &Update) -> bool {
    matches!(&update.update, Some(update::Update::Add(set)) if !set.addrs.is_empty())
}

/// Opens a `Get` stream and waits for its first update; the stream is then drained in a task
/// until it ends (counted in `open`).
async fn hold_stream(channel: Channel, service: usize, open: Arc<AtomicUsize>) -> Result<Duration, tonic::Status> {
    let start = Instant::now();
    let request = GetDestination { path: path(service), ..Default::default() };
    let mut stream = DestinationClient::new(channel).get(request).await?.into_inner();
    let first = stream.message().await?;
    let took = start.elapsed();
    if !first.as_ref().is_some_and(is_add) {
        return Err(tonic::Status::failed_precondition(format!("first update of {}: {first:?}", path(service))));
    }
    open.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(async move {
        while let Ok(Some(_)) = stream.message().await {}
        open.fetch_sub(1, Ordering::Relaxed);
    });
    Ok(took)
}

/// One window's samples.
#[derive(Default)]
struct Window {
    certify: Vec<Duration>,
    get: Vec<Duration>,
    errors: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds = setting("CNIMESH_LOAD_SECONDS", 600);
    let streams = setting("CNIMESH_LOAD_STREAMS", 10_000) as usize;
    let rate = setting("CNIMESH_LOAD_CERTIFY_RATE", 100).max(1);
    let window = Duration::from_secs(setting("CNIMESH_LOAD_WINDOW", 10).max(1));
    let connections = setting("CNIMESH_LOAD_CONNECTIONS", 100).max(1) as usize;

    let dir = tempfile::tempdir().expect("tempdir");
    let (grpc, admin) = (free_port(), free_port());
    let (_served, kubeconfig, token) = serve_cluster(dir.path()).await;
    let mut control = start_control(dir.path(), &kubeconfig, grpc, admin);
    let pid = control.id();
    let anchors =
        pem::certs(&std::fs::read(dir.path().join("issuer/ca.crt")).expect("anchors"), "anchors").expect("anchors PEM");
    let roots = tls::roots(&anchors).expect("roots");
    let control_name: Name = cnimesh_identity::name::DEFAULT_CONTROL_NAME.parse().expect("name");
    let addr = format!("127.0.0.1:{grpc}");
    // A proxy's mesh certificate: Destination answers mesh identities only.
    let client_name = Name::for_service_account("web", "load", "cluster.local").expect("name");
    let cert = cnimesh_model::identity::own_cert::issue_from_dir(
        &dir.path().join("issuer"),
        &client_name,
        Duration::from_secs(86400),
    )
    .expect("a client certificate");
    let connect = || cnimesh_identity::grpc_channel::connect(&addr, &control_name, roots.clone(), Some(cert.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        match connect().await {
            Ok(channel) => break channel,
            Err(e) => {
                assert!(Instant::now() < deadline, "control plane not reachable: {e:#}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let mut channels = vec![first];
    for _ in 1..connections {
        channels.push(connect().await.expect("connect"));
    }
    // Until the control plane has listed every service.
    let mut probe = DestinationClient::new(channels[0].clone());
    loop {
        let request = GetDestination { path: path(SERVICES - 1), ..Default::default() };
        let first = async { probe.get(request).await?.into_inner().message().await }.await;
        if first.is_ok_and(|u| u.as_ref().is_some_and(is_add)) {
            break;
        }
        assert!(Instant::now() < deadline, "the cluster's services were not listed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss_idle = rss_mib(pid);

    // The long-lived streams, opened 200 at a time.
    let open = Arc::new(AtomicUsize::new(0));
    let opening = Instant::now();
    let results: Vec<_> = futures::stream::iter(0..streams)
        .map(|i| hold_stream(channels[i % connections].clone(), i, open.clone()))
        .buffer_unordered(200)
        .collect()
        .await;
    let open_time = opening.elapsed();
    let failed_opens = results.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        println!("first failed open: {e}");
    }
    let rss_streams = rss_mib(pid);
    println!(
        "{streams} Destination streams over {connections} connections opened in {:.1} s ({failed_opens} failed); RSS idle {rss_idle:.1} MiB, with the streams {rss_streams:.1} MiB",
        open_time.as_secs_f64()
    );

    // Certify at a fixed rate (open loop: a slow answer does not slow the callers down) and one
    // new `Get` per 100 ms on a connection of its own, sampled per window.
    let name = Name::for_service_account("web", "load", "cluster.local").expect("name");
    let csrs: Arc<Vec<Vec<u8>>> = Arc::new((0..64).map(|_| ca::new_csr(&name).expect("csr").1).collect());
    let current = Arc::new(Mutex::new(Window::default()));
    let identity = IdentityClient::new(channels[0].clone());
    let certify = {
        let (current, csrs, name, token) = (current.clone(), csrs.clone(), name.to_string(), token.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / rate as u32);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            for i in 0usize.. {
                tick.tick().await;
                let (mut client, current) = (identity.clone(), current.clone());
                let request = CertifyRequest {
                    identity: name.clone(),
                    token: token.clone().into(),
                    certificate_signing_request: csrs[i % csrs.len()].clone(),
                };
                tokio::spawn(async move {
                    let start = Instant::now();
                    let ok = client.certify(request).await.is_ok();
                    let mut w = current.lock().await;
                    if ok { w.certify.push(start.elapsed()) } else { w.errors += 1 }
                });
            }
        })
    };
    let churn_channel = connect().await.expect("connect");
    let churn = {
        let current = current.clone();
        tokio::spawn(async move {
            for i in 0usize.. {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let start = Instant::now();
                let request = GetDestination { path: path(i), ..Default::default() };
                let got = async {
                    let mut stream = DestinationClient::new(churn_channel.clone()).get(request).await?.into_inner();
                    stream.message().await
                }
                .await;
                let mut w = current.lock().await;
                if got.is_ok_and(|u| u.as_ref().is_some_and(is_add)) {
                    w.get.push(start.elapsed())
                } else {
                    w.errors += 1
                }
            }
        })
    };

    println!();
    println!(
        "| t s | RSS MiB | streams open | Certify n | Certify p50 ms | Certify p99 ms | Get p50 ms | Get p99 ms | errors |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let (mut ts, mut rss, mut p99s) = (Vec::new(), Vec::new(), Vec::new());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(window).await;
        let mut w = std::mem::take(&mut *current.lock().await);
        w.certify.sort();
        w.get.sort();
        let t = start.elapsed().as_secs_f64();
        let mib = rss_mib(pid);
        let p99 = percentile(&w.certify, 99);
        println!(
            "| {t:.0} | {mib:.1} | {} | {} | {:.2} | {p99:.2} | {:.2} | {:.2} | {} |",
            open.load(Ordering::Relaxed),
            w.certify.len(),
            percentile(&w.certify, 50),
            percentile(&w.get, 50),
            percentile(&w.get, 99),
            w.errors
        );
        ts.push(t / 60.0);
        rss.push(mib);
        p99s.push(p99);
    }
    certify.abort();
    churn.abort();
    // The first window warms up (allocator, caches): the slopes are over the rest.
    let skip = usize::from(ts.len() > 2);
    println!();
    println!(
        "slopes after the first window: RSS {:+.3} MiB/min, Certify p99 {:+.3} ms/min ({} windows of {} s)",
        slope(&ts[skip..], &rss[skip..]),
        slope(&ts[skip..], &p99s[skip..]),
        ts.len() - skip,
        window.as_secs()
    );
    let _ = control.kill();
    let _ = control.wait();
}
