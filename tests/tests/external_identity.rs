//! An ExternalWorkload's proxy getting and keeping its identity: the control plane served in
//! process (real TLS, the in-process API server as Kubernetes), a join token made as `cnimesh
//! external-workload join` makes it, and the proxy's own identity task (`refresh::run`) running
//! with `--external-workload`, `--identity-join-token-file` and `--identity-state-dir`: it joins
//! once, keeps key and certificate (0600), renews with the certificate, survives a restart
//! without a new token, and is cut off when the ExternalWorkload is revoked.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use cnimesh_apiserver::ClusterApi;
use cnimesh_control::serve::{self, Listeners};
use cnimesh_identity::Name;
use cnimesh_model::external::join_store::JoinStore;
use cnimesh_model::identity::Policy;
use cnimesh_model::identity::join::{JoinToken, Pending};
use cnimesh_proxy::serve::metrics::Metrics;
use cnimesh_proxy::transport::identity::config::{IdentityConfig, TrustAnchors};
use cnimesh_proxy::transport::identity::external::{CERT_FILE, ExternalIdentity, KEY_FILE};
use cnimesh_proxy::transport::identity::{Identity, refresh};

/// Only guards against a hung test; nothing here measures time.
const PATIENCE: Duration = Duration::from_secs(30);

struct Control {
    addr: String,
    api: Arc<ClusterApi>,
    control: Name,
    anchors: std::path::PathBuf,
    dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// The control plane, issuing certificates of `lifetime`.
async fn start(lifetime: Duration) -> Control {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    let anchor = cnimesh_model::identity::issuer::tests::write_pki(&pki, Duration::from_secs(3600));
    let anchors = dir.path().join("ca.crt");
    std::fs::write(&anchors, &anchor.cert_pem).unwrap();
    let api = ClusterApi::new();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let control = Name::for_service_account("cnimesh-control", "cnimesh", "cluster.local").unwrap();
    let policy = Policy { trust_domain: "cluster.local".into(), lifetime, clock_skew: Duration::ZERO };
    let listeners = Listeners { grpc: grpc.into(), admin: admin.into() };
    let config = serve::Config::new(pki, control.clone(), policy, api.client(), listeners, async {
        let _ = stopped.await;
    });
    tokio::spawn(serve::run(config));
    api.put(json!({"apiVersion": "workload.cnimesh.io/v1alpha1", "kind": "ExternalWorkload",
        "metadata": {"namespace": "shop", "name": "db-vm", "labels": {"app": "db"}},
        "spec": {"workloadIPs": ["192.0.2.10"], "serviceAccountName": "db"}}));
    Control { addr, api, control, anchors, dir, _stop: stop }
}

impl Control {
    /// `cnimesh external-workload join db-vm -n shop --output-file <dir>/join-token`.
    async fn join(&self) -> std::path::PathBuf {
        let store = JoinStore::new(self.api.client(), "cnimesh");
        let (workload, record) = store.workload("shop", "db-vm").await.unwrap();
        let token = JoinToken::generate("shop", "db-vm").unwrap();
        let uid = workload.metadata.uid.clone().unwrap();
        store
            .put(&token, &Pending::new(&token, &uid, &record.service_account, Duration::from_secs(600)))
            .await
            .unwrap();
        let path = self.dir.path().join("join-token");
        std::fs::write(&path, format!("{}\n", token.reveal())).unwrap();
        path
    }

    fn revoke(&self, revoked: bool) {
        self.api.put(json!({"apiVersion": "workload.cnimesh.io/v1alpha1", "kind": "ExternalWorkload",
            "metadata": {"namespace": "shop", "name": "db-vm", "labels": {"app": "db"}},
            "spec": {"workloadIPs": ["192.0.2.10"], "serviceAccountName": "db", "revoked": revoked}}));
    }

    /// The proxy's identity task, as `cnimesh-proxy --external-workload shop/db-vm` runs it.
    fn proxy(&self, state: &Path, token: Option<&Path>) -> (Arc<Identity>, tokio::task::JoinHandle<()>, Metrics) {
        let config = IdentityConfig {
            name: "db.shop.serviceaccount.identity.cnimesh.cluster.local".parse().unwrap(),
            trust_anchors: TrustAnchors::File(self.anchors.clone()),
            token_file: "/nonexistent/serviceaccount-token".into(),
            control_addr: self.addr.clone(),
            control_name: self.control.clone(),
            max_backoff: Duration::from_millis(200),
            external: Some(ExternalIdentity {
                namespace: "shop".into(),
                name: "db-vm".into(),
                join_token_file: token.map(Path::to_path_buf),
                state_dir: state.to_path_buf(),
            }),
        };
        let identity = Arc::new(Identity::new(&config).unwrap());
        let metrics = Metrics::default();
        let task = tokio::spawn(refresh::run(identity.clone(), config, metrics.identity()));
        (identity, task, metrics)
    }
}

fn serial(identity: &Identity) -> Option<String> {
    let key = identity.cert.get()?;
    cnimesh_identity::tls::serial_of(&key.cert[0])
}

/// Waits until `identity` holds a certificate other than `previous`.
async fn next_cert(identity: &Identity, previous: Option<&str>) -> String {
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(serial) = serial(identity).filter(|s| Some(s.as_str()) != previous) {
                return serial;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a certificate in time")
}

fn refreshes(metrics: &Metrics, result: &str) -> u64 {
    let labels = cnimesh_proxy::serve::metrics::RefreshLabels { result: result.into() };
    metrics.identity().refresh.get_or_create(&labels).get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_workloads_proxy_joins_once_renews_with_its_certificate_and_restarts_without_a_new_token() {
    // Short certificates: renewals come every ~2 s (70% of 3 s).
    let control = start(Duration::from_secs(3)).await;
    let token = control.join().await;
    let state = control.dir.path().join("state");

    let (identity, task, metrics) = control.proxy(&state, Some(&token));
    let first = next_cert(&identity, None).await;
    for file in [KEY_FILE, CERT_FILE] {
        let mode = std::fs::metadata(state.join(file)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{file}");
    }
    // Renewed with the certificate: the join token is used up, so only the renewal path works.
    let second = next_cert(&identity, Some(&first)).await;
    assert!(refreshes(&metrics, "success") >= 2);
    task.abort();

    // A restart: the stored certificate is presented at once and renewed, no new token needed.
    let (restarted, task, _) = control.proxy(&state, Some(&token));
    // Held before any Certify could answer: the stored one (or its renewal, which only the
    // certificate path can give: the join token is used up).
    let stored = next_cert(&restarted, None).await;
    assert_ne!(stored, first, "the latest certificate was kept");
    let _ = second;
    next_cert(&restarted, Some(&stored)).await;

    // Revoked: renewals are refused, and the certificate runs out.
    control.revoke(true);
    tokio::time::timeout(PATIENCE, async {
        while restarted.has_cert() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the certificate expires unrenewed");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_whose_stored_certificate_expired_says_to_run_join_again() {
    let control = start(Duration::from_secs(2)).await;
    let token = control.join().await;
    let state = control.dir.path().join("state");
    let (identity, task, _) = control.proxy(&state, Some(&token));
    next_cert(&identity, None).await;
    task.abort();
    // Down longer than the certificate lives.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stored = cnimesh_identity::pem::certs(&std::fs::read(state.join(CERT_FILE)).unwrap(), "stored").unwrap();
    assert!(cnimesh_identity::tls::not_after(&stored[0]).unwrap() < std::time::SystemTime::now());

    let (identity, task, metrics) = control.proxy(&state, None);
    tokio::time::timeout(PATIENCE, async {
        while refreshes(&metrics, "failure") == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a failed attempt");
    assert!(!identity.has_cert(), "an expired certificate is never presented");
    let error = format!(
        "{:#}",
        ExternalIdentity {
            namespace: "shop".into(),
            name: "db-vm".into(),
            join_token_file: None,
            state_dir: state.clone()
        }
        .needs_join(Some(std::time::SystemTime::now()))
    );
    assert!(error.contains("cnimesh external-workload join db-vm -n shop"), "{error}");
    task.abort();

    // A new join brings it back.
    let token = control.join().await;
    let (identity, task, _) = control.proxy(&state, Some(&token));
    next_cert(&identity, None).await;
    task.abort();
}
