//! Certify latency: the control plane in-process over real TLS on loopback, one HTTP/2
//! connection, requests one after another (each with a fresh P-256 CSR made before timing).
//!
//! Same-run baselines, to tell what the figure is made of:
//! - `grpc-trivial`: a Certify refused at once (empty identity): TLS + HTTP/2 + gRPC round trip.
//! - `service`: the Certify handler called directly (TokenReview against the in-process API
//!   server, CSR check, signing).
//! - `sign`: CSR validation and signing alone.
//!
//! `cargo bench -p cnimesh-control --bench certify` (CNIMESH_BENCH_N to change the count).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use cnimesh_control::grpc::identity::IdentityService;
use cnimesh_control::{Config, Listeners};
use cnimesh_identity::{Name, ca, pem, tls};
use cnimesh_model::identity::{Issuer, KubeTokens, Policy, csr};
use cnimesh_model::metrics::Metrics;
use linkerd2_proxy_api::identity::CertifyRequest;
use linkerd2_proxy_api::identity::identity_client::IdentityClient;
use linkerd2_proxy_api::identity::identity_server::Identity;
use tokio::net::TcpListener;

struct Stats(Vec<Duration>);

impl Stats {
    fn pct(&self, p: f64) -> Duration {
        let mut sorted = self.0.clone();
        sorted.sort();
        sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
    }
    fn mean(&self) -> Duration {
        self.0.iter().sum::<Duration>() / self.0.len() as u32
    }
    fn print(&self, what: &str, baseline: Option<&Stats>) {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        print!(
            "{what:<14} n={:<5} p50 {:>8.1} µs  p99 {:>8.1} µs  mean {:>8.1} µs",
            self.0.len(),
            us(self.pct(0.50)),
            us(self.pct(0.99)),
            us(self.mean())
        );
        match baseline {
            Some(b) => println!(
                "   certify/this: p50 {:.2}x  mean {:.2}x",
                us(b.pct(0.50)) / us(self.pct(0.50)),
                us(b.mean()) / us(self.mean())
            ),
            None => println!(),
        }
    }
}

fn write_fixture(pki: &Path) {
    let anchor = ca::new_trust_anchor("cluster.local", Duration::from_secs(86400)).unwrap();
    let issuer = ca::new_issuer(&anchor, "cluster.local", Duration::from_secs(86400)).unwrap();
    std::fs::write(pki.join("ca.crt"), &anchor.cert_pem).unwrap();
    std::fs::write(pki.join("tls.crt"), &issuer.cert_pem).unwrap();
    std::fs::write(pki.join("tls.key"), &issuer.key_pem).unwrap();
}

fn requests(name: &Name, token: &str, n: usize) -> Vec<CertifyRequest> {
    (0..n)
        .map(|_| CertifyRequest {
            identity: name.to_string(),
            token: token.into(),
            certificate_signing_request: ca::new_csr(name).unwrap().1,
        })
        .collect()
}

fn policy() -> Policy {
    Policy {
        trust_domain: "cluster.local".into(),
        lifetime: Duration::from_secs(86400),
        clock_skew: Duration::from_secs(20),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("CNIMESH_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let pki = tempfile::tempdir().unwrap();
    write_fixture(pki.path());
    let api = cnimesh_apiserver::ClusterApi::new();
    let token = api.issue_token("bench", "web", &[cnimesh_identity::TOKEN_AUDIENCE]).unwrap();
    let name = Name::for_service_account("web", "bench", "cluster.local").unwrap();
    let control = Name::for_service_account("cnimesh-control", "cnimesh", "cluster.local").unwrap();

    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let listeners = Listeners { grpc: grpc.into(), admin: admin.into() };
    let config = Config::new(pki.path().to_path_buf(), control.clone(), policy(), api.client(), listeners, async {
        let _ = stopped.await;
    });
    let server = tokio::spawn(cnimesh_control::run(config));

    let anchors = pem::certs(&std::fs::read(pki.path().join("ca.crt")).unwrap(), "anchors").unwrap();
    let roots = tls::roots(&anchors).unwrap();
    let channel = loop {
        // The server's own certificate is issued just after start.
        match cnimesh_identity::grpc_channel::connect(&addr.to_string(), &control, roots.clone(), None).await {
            Ok(channel) => break channel,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let mut client = IdentityClient::new(channel);

    let reqs = requests(&name, &token, n + 50);
    // Warm up the connection, allocator and caches.
    for req in &reqs[n..] {
        client.certify(req.clone()).await.unwrap();
    }
    let mut certify = Vec::with_capacity(n);
    for req in reqs.iter().take(n) {
        let start = Instant::now();
        client.certify(req.clone()).await.unwrap();
        certify.push(start.elapsed());
    }
    let certify = Stats(certify);

    let mut trivial = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let refused = client.certify(CertifyRequest::default()).await.unwrap_err();
        trivial.push(start.elapsed());
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    }

    let issuer = Arc::new(Issuer::load(pki.path()).unwrap());
    let (_tx, rx) = tokio::sync::watch::channel(Some(issuer.clone()));
    let service =
        IdentityService::new(rx, Arc::new(KubeTokens::new(api.client())), policy(), Arc::new(Metrics::default()));
    let reqs = requests(&name, &token, n);
    let mut direct = Vec::with_capacity(n);
    for req in reqs.iter().cloned() {
        let start = Instant::now();
        service.certify(tonic::Request::new(req)).await.unwrap();
        direct.push(start.elapsed());
    }

    let mut sign = Vec::with_capacity(n);
    for req in &reqs {
        let start = Instant::now();
        let valid = csr::validate(&req.certificate_signing_request, &name).unwrap();
        let now = SystemTime::now();
        issuer.signer.sign(&name, &valid.public_key, now, now + Duration::from_secs(86400)).unwrap();
        sign.push(start.elapsed());
    }

    println!("Certify, {n} sequential requests on one TLS connection (loopback):");
    certify.print("certify", None);
    Stats(trivial).print("grpc-trivial", Some(&certify));
    Stats(direct).print("service", Some(&certify));
    Stats(sign).print("sign", Some(&certify));

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
