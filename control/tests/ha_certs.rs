//! Managed webhook certificates against the in-memory API server: creation, renewal at 2/3 of
//! the serving certificate's life, a caBundle patch that leaves the rest of the configuration
//! alone, the CA rotation's order, and a replica serving the new certificate without a restart
//! (a real TLS handshake with the webhook listener).

mod ha_mock;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cnimesh_model::inject::{InjectConfig, webhook_dns_names, webhook_tls_from};

use cnimesh_control::inject::{Webhook, serve_webhook};
use cnimesh_control::webhook_certs::{CertPolicy, Manager, Step, WEBHOOK_CONFIGURATION, watch_secret};
use cnimesh_identity::pem::split_pem;
use cnimesh_runtime::leader::{Leadership, WEBHOOK_WRITE};
use ha_mock::{Faults, Store};
use kube::api::Api;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::sync::watch;

const SECRET: &str = "/api/v1/namespaces/cnimesh/secrets/cnimesh-webhook-tls";
const MWC: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/cnimesh-proxy-injector";
const DAY: Duration = Duration::from_secs(86400);

fn policy() -> CertPolicy {
    CertPolicy {
        dns_names: webhook_dns_names("cnimesh", "cluster.local"),
        serving_lifetime: 30 * DAY,
        ca_lifetime: 365 * DAY,
        check_interval: Duration::from_millis(50),
        rotation_grace: Duration::from_secs(600),
    }
}

/// The configuration as `daemonset/control-webhook.yaml` has it, with fields the manager must
/// never touch.
fn webhook_configuration() -> Value {
    let entry = |name: &str, path: &str| {
        json!({"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": {"service": {"name": "cnimesh-webhook", "namespace": "cnimesh", "path": path, "port": 443}},
            "namespaceSelector": {"matchExpressions": [{"key": "cnimesh.io/inject", "operator": "In", "values": ["enabled"]}]},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]})
    };
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION, "labels": {"app.kubernetes.io/part-of": "cnimesh"}},
        "webhooks": [entry("inject.cnimesh.io", "/inject"), entry("inject-opt-in.cnimesh.io", "/inject/opt-in")]})
}

fn setup() -> (Arc<Store>, Manager) {
    let store = Store::new();
    store.insert(MWC, webhook_configuration());
    let client = store.client(Arc::new(Faults::default()));
    let manager = Manager::new(
        client,
        "cnimesh",
        "cnimesh-webhook-tls",
        WEBHOOK_CONFIGURATION,
        Leadership::always(WEBHOOK_WRITE),
        policy(),
    );
    (store, manager)
}

fn data(store: &Store, key: &str) -> String {
    let secret = store.get(SECRET).expect("the Secret");
    let value: k8s_openapi::ByteString = serde_json::from_value(secret["data"][key].clone()).expect(key);
    String::from_utf8(value.0).unwrap()
}

fn has(store: &Store, key: &str) -> bool {
    store.get(SECRET).is_some_and(|s| !s["data"][key].is_null())
}

/// The caBundle of each webhook, decoded.
fn ca_bundles(store: &Store) -> Vec<String> {
    let mwc = store.get(MWC).unwrap();
    mwc["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let bytes: k8s_openapi::ByteString = serde_json::from_value(w["clientConfig"]["caBundle"].clone()).unwrap();
            String::from_utf8(bytes.0).unwrap()
        })
        .collect()
}

/// Everything but the caBundles and the resourceVersion.
fn without_bundles(mut mwc: Value) -> Value {
    for w in mwc["webhooks"].as_array_mut().unwrap() {
        w["clientConfig"].as_object_mut().unwrap().remove("caBundle");
    }
    mwc["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    mwc
}

#[tokio::test]
async fn creates_the_secret_then_patches_only_the_ca_bundle() {
    let (store, manager) = setup();
    let now = SystemTime::now();
    assert_eq!(manager.reconcile(now).await.unwrap(), Step::Created);
    for key in ["ca.crt", "tls.crt", "tls.key", "issuer.crt", "issuer.key"] {
        assert!(has(&store, key), "{key}");
    }
    assert_eq!(store.get(SECRET).unwrap()["type"], "kubernetes.io/tls");
    assert_eq!(data(&store, "ca.crt"), data(&store, "issuer.crt"));

    assert_eq!(manager.reconcile(now).await.unwrap(), Step::PatchedBundle);
    assert_eq!(ca_bundles(&store), [data(&store, "ca.crt"), data(&store, "ca.crt")]);
    assert_eq!(without_bundles(store.get(MWC).unwrap()), without_bundles(webhook_configuration()));
    let patch = store.writes_to(MWC).pop().unwrap();
    assert_eq!(patch.method, http::Method::PATCH);
    let ops = patch.body.as_array().unwrap();
    assert!(
        ops.iter()
            .all(|op| op["path"].as_str().unwrap().ends_with("/name")
                || op["path"].as_str().unwrap().ends_with("/caBundle")),
        "{ops:?}"
    );
    assert_eq!(manager.reconcile(now).await.unwrap(), Step::Idle);

    // Someone re-applies control-webhook.yaml (no caBundle): it is patched back.
    store.insert(MWC, webhook_configuration());
    assert_eq!(manager.reconcile(now).await.unwrap(), Step::PatchedBundle);
    assert_eq!(ca_bundles(&store)[1], data(&store, "ca.crt"));
}

#[tokio::test]
async fn renews_the_serving_certificate_at_two_thirds_of_its_life() {
    let (store, manager) = setup();
    let now = SystemTime::now();
    manager.reconcile(now).await.unwrap();
    manager.reconcile(now).await.unwrap();
    let (ca, cert) = (data(&store, "ca.crt"), data(&store, "tls.crt"));
    assert_eq!(manager.reconcile(now + 19 * DAY).await.unwrap(), Step::Idle);
    assert_eq!(data(&store, "tls.crt"), cert);
    assert_eq!(manager.reconcile(now + 21 * DAY).await.unwrap(), Step::RenewedServing);
    assert_ne!(data(&store, "tls.crt"), cert);
    assert_eq!(data(&store, "ca.crt"), ca, "a serving renewal keeps the CA");
    assert_eq!(manager.reconcile(now).await.unwrap(), Step::Idle, "the caBundle needed nothing");
}

#[tokio::test]
async fn the_ca_rotates_in_the_order_that_keeps_the_api_server_verifying() {
    let (store, manager) = setup();
    let now = SystemTime::now();
    manager.reconcile(now).await.unwrap();
    manager.reconcile(now).await.unwrap();
    let old_ca = data(&store, "ca.crt");

    // At each step the API server's caBundle holds the CA that signed the serving certificate
    // stored at that moment (replicas serve it soon after), and during the grace period the
    // previous one too.
    let later = now + 250 * DAY;
    let mut steps = Vec::new();
    let check = |store: &Store, steps: &Vec<Step>| {
        let issuer = data(store, "issuer.crt");
        for bundle in ca_bundles(store) {
            assert!(split_pem(&bundle).contains(&issuer), "after {steps:?} the caBundle lacks the serving CA");
        }
    };
    for _ in 0..3 {
        steps.push(manager.reconcile(later).await.unwrap());
        check(&store, &steps);
    }
    assert_eq!(steps, [Step::StagedCa, Step::PatchedBundle, Step::SwitchedServing]);
    let new_ca = data(&store, "issuer.crt");
    assert_ne!(new_ca, old_ca);
    assert_eq!(split_pem(&ca_bundles(&store)[0]), [old_ca.clone(), new_ca.clone()], "both CAs during the grace");
    // Within the grace period the old CA stays (250 days on, the serving certificate, issued
    // today, is renewed meanwhile: by the new CA).
    assert_ne!(manager.reconcile(later + Duration::from_secs(60)).await.unwrap(), Step::DroppedOldCa);
    assert_eq!(data(&store, "issuer.crt"), new_ca);
    assert_eq!(split_pem(&ca_bundles(&store)[0]).len(), 2);
    // After it: dropped from the Secret, then from the caBundle.
    let after = later + Duration::from_secs(601);
    assert_eq!(manager.reconcile(after).await.unwrap(), Step::DroppedOldCa);
    assert_eq!(split_pem(&ca_bundles(&store)[0]).len(), 2, "the caBundle follows the Secret, never leads");
    assert_eq!(manager.reconcile(after).await.unwrap(), Step::PatchedBundle);
    assert_eq!(ca_bundles(&store), [new_ca.clone(), new_ca]);
    assert!(!has(&store, "next.crt") && !has(&store, "next.key"));
    assert_eq!(manager.reconcile(now).await.unwrap(), Step::Idle);
}

#[tokio::test]
async fn a_bring_your_own_secret_is_only_read_unless_managed_and_then_adopted_by_rotation() {
    let (store, manager) = setup();
    let pem =
        cnimesh_model::inject::new_webhook_cert(&webhook_dns_names("cnimesh", "cluster.local"), 365 * DAY).unwrap();
    let b = |s: &str| serde_json::to_value(k8s_openapi::ByteString(s.as_bytes().to_vec())).unwrap();
    store.insert(
        SECRET,
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "cnimesh-webhook-tls", "namespace": "cnimesh"},
        "data": {"ca.crt": b(&pem.ca), "tls.crt": b(&pem.cert), "tls.key": b(&pem.key)}}),
    );
    // Managed: no CA key to renew with, so a CA of its own is staged beside the operator's.
    assert_eq!(manager.reconcile(SystemTime::now()).await.unwrap(), Step::PatchedBundle);
    assert_eq!(manager.reconcile(SystemTime::now()).await.unwrap(), Step::StagedCa);
    assert_eq!(split_pem(&data(&store, "ca.crt"))[0], pem.ca);
}

/// The PEM certificate the listener at `addr` presents, trusting `ca` for the webhook's name.
async fn served(addr: std::net::SocketAddr, ca: &str) -> Option<CertificateDer<'static>> {
    let anchors = cnimesh_identity::pem::certs(ca.as_bytes(), "ca").ok()?;
    let roots = cnimesh_identity::tls::roots(&anchors).ok()?;
    let config = rustls::ClientConfig::builder_with_provider(cnimesh_identity::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let name = ServerName::try_from("cnimesh-webhook.cnimesh.svc").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.ok()?;
    tls.get_ref().1.peer_certificates().map(|c| c[0].clone().into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_serves_the_renewed_certificate_without_a_restart() {
    let (store, manager) = setup();
    let now = SystemTime::now();
    manager.reconcile(now).await.unwrap();

    // A replica (not the leader: its own client, it only reads) serving the webhook.
    let current = Arc::new(cnimesh_identity::tls::CurrentCert::default());
    let tls = webhook_tls_from(current.clone()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let anchors = cnimesh_identity::ca::new_trust_anchor("cluster.local", DAY).unwrap().cert_pem;
    let webhook = Arc::new(Webhook::new(InjectConfig { trust_anchors_pem: anchors, ..Default::default() }).unwrap());
    let (stop, stopped) = watch::channel(false);
    let until = {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let server = tokio::spawn(serve_webhook(listener, tls, webhook, until));
    let replica = store.client(Arc::new(Faults::default()));
    let watcher =
        tokio::spawn(watch_secret(Api::namespaced(replica, "cnimesh"), "cnimesh-webhook-tls".into(), current, stopped));

    let pem_der = |pem: &str| cnimesh_identity::pem::certs(pem.as_bytes(), "tls.crt").unwrap().remove(0);
    let wait_served = |want: CertificateDer<'static>| {
        let store = store.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                if served(addr, &data(&store, "ca.crt")).await.as_ref() == Some(&want) {
                    return;
                }
                assert!(tokio::time::Instant::now() < deadline, "the listener never served the Secret's certificate");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_served(pem_der(&data(&store, "tls.crt"))).await;
    assert_eq!(manager.reconcile(now + 21 * DAY).await.unwrap(), Step::PatchedBundle);
    assert_eq!(manager.reconcile(now + 21 * DAY).await.unwrap(), Step::RenewedServing);
    wait_served(pem_der(&data(&store, "tls.crt"))).await;

    // A broken Secret is refused by the replica, which keeps serving the last good certificate.
    let good = pem_der(&data(&store, "tls.crt"));
    let mut broken = store.get(SECRET).unwrap();
    broken["data"]["tls.crt"] = serde_json::to_value(k8s_openapi::ByteString(b"garbage".to_vec())).unwrap();
    store.insert(SECRET, broken);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(served(addr, &data(&store, "ca.crt")).await, Some(good));

    stop.send_replace(true);
    server.await.unwrap();
    watcher.await.unwrap();
}

/// Two managed replicas through `webhook_certs::spawn`: the Lease's holder creates the Secret and
/// patches the caBundle, the other only reads; both serve; no write comes from a non-holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_managed_replicas_one_writes_both_serve() {
    use cnimesh_control::webhook_certs::{SecretSource, spawn};
    use cnimesh_runtime::leader::ElectionConfig;
    let store = Store::new();
    store.insert(MWC, webhook_configuration());
    *store.guard.lock() =
        Some("/apis/coordination.k8s.io/v1/namespaces/cnimesh/leases/cnimesh-control-webhook-write".into());
    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut currents = Vec::new();
    for name in ["a", "b"] {
        let identity = ElectionConfig::unique_identity(name);
        let faults = Arc::new(Faults::default());
        *faults.identity.lock() = identity.clone();
        let current = Arc::new(cnimesh_identity::tls::CurrentCert::default());
        currents.push(current.clone());
        let election = ElectionConfig {
            namespace: "cnimesh".into(),
            identity,
            lease_duration: Duration::from_millis(300),
            renew_interval: Duration::from_millis(20),
        };
        let source = SecretSource {
            client: store.client(faults),
            namespace: "cnimesh".into(),
            secret: "cnimesh-webhook-tls".into(),
            current,
            manage: Some((election, policy())),
        };
        tasks.extend(spawn(source, Arc::new(cnimesh_model::metrics::Metrics::default()), stopped.clone()));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !(store.get(MWC).is_some_and(|m| !m["webhooks"][1]["clientConfig"]["caBundle"].is_null())
        && currents.iter().all(|c| c.get().is_some()))
    {
        assert!(tokio::time::Instant::now() < deadline, "no certificate managed and served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cert = cnimesh_identity::pem::certs(data(&store, "tls.crt").as_bytes(), "tls.crt").unwrap().remove(0);
    for current in &currents {
        assert_eq!(current.get().unwrap().cert[0], cert);
    }
    assert_eq!(store.writes_to(SECRET).len() + store.writes_to("/api/v1/namespaces/cnimesh/secrets").len(), 1);
    assert!(store.violations.lock().is_empty(), "{:?}", store.violations.lock());
    stop.send_replace(true);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
    }
}

/// `serve` wired for managed certificates: the webhook listener presents the certificate the
/// elected replica wrote to the Secret, and `/metrics` shows the leadership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_managed_certificates_serves_the_secret_and_reports_leadership() {
    use cnimesh_control::webhook_certs::SecretSource;
    use cnimesh_control::{Config, Listeners, WebhookConfig};
    use cnimesh_model::identity::Policy;
    use cnimesh_runtime::leader::ElectionConfig;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let store = Store::new();
    store.insert(MWC, webhook_configuration());
    let pki = tempfile::tempdir().unwrap();
    cnimesh_model::ca_init::run(&cnimesh_model::ca_init::CaInit {
        dir: pki.path().to_path_buf(),
        trust_domain: "cluster.local".into(),
        anchor_lifetime: DAY,
        issuer_lifetime: DAY,
        force: false,
    })
    .unwrap();
    let current = Arc::new(cnimesh_identity::tls::CurrentCert::default());
    let anchors = std::fs::read_to_string(pki.path().join("ca.crt")).unwrap();
    let webhook = Webhook::new(InjectConfig { trust_anchors_pem: anchors, ..Default::default() }).unwrap();
    let election = ElectionConfig {
        namespace: "cnimesh".into(),
        identity: ElectionConfig::unique_identity("serve"),
        // Long enough that a loaded test machine never lets it lapse between renewals.
        lease_duration: Duration::from_secs(3),
        renew_interval: Duration::from_millis(100),
    };
    let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
    let (grpc, admin, hook) = (bind().await.unwrap(), bind().await.unwrap(), bind().await.unwrap());
    let (admin_addr, hook_addr) = (admin.local_addr().unwrap(), hook.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let control = cnimesh_identity::Name::for_service_account("cnimesh-control", "cnimesh", "cluster.local").unwrap();
    let issuing = Policy { trust_domain: "cluster.local".into(), lifetime: DAY, clock_skew: Duration::ZERO };
    let tokens = cnimesh_apiserver::ClusterApi::new().client();
    let listeners = Listeners { grpc: grpc.into(), admin: admin.into() };
    let shutdown = async {
        let _ = stopped.await;
    };
    let config = Config {
        webhook: Some(WebhookConfig {
            webhook,
            tls: webhook_tls_from(current.clone()).unwrap(),
            listener: hook.into(),
        }),
        webhook_certs: Some(SecretSource {
            client: store.client(Arc::new(Faults::default())),
            namespace: "cnimesh".into(),
            secret: "cnimesh-webhook-tls".into(),
            current,
            manage: Some((election, policy())),
        }),
        ..Config::new(pki.path().to_path_buf(), control, issuing, tokens, listeners, shutdown)
    };
    let task = tokio::spawn(cnimesh_control::run(config));

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if store.get(SECRET).is_some() {
            let want = cnimesh_identity::pem::certs(data(&store, "tls.crt").as_bytes(), "tls.crt").unwrap().remove(0);
            // Serving the Secret and patching the caBundle are two loops (the watch serves what
            // the Secret holds; the writer patches after writing): wait for both.
            if served(hook_addr, &data(&store, "ca.crt")).await.as_ref() == Some(&want)
                && ca_bundles(&store)[0] == data(&store, "ca.crt")
            {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the webhook never served the managed certificate with its CA in the caBundle"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut admin = tokio::net::TcpStream::connect(admin_addr).await.unwrap();
    admin.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut metrics = String::new();
    admin.read_to_string(&mut metrics).await.unwrap();
    assert!(metrics.contains("control_leader{role=\"webhook-write\"} 1"), "{metrics}");

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), task).await.unwrap().unwrap().unwrap();
    // Stopping released the Lease for the next replica.
    let lease =
        store.get("/apis/coordination.k8s.io/v1/namespaces/cnimesh/leases/cnimesh-control-webhook-write").unwrap();
    assert!(lease["spec"]["holderIdentity"].is_null(), "{lease}");
}
