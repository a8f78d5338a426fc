//! ExternalWorkload identity without SPIRE, attacked: the control plane served in process (real
//! TLS on 127.0.0.1, the in-process API server as Kubernetes, kube-rs clients), a join token made
//! as `cnimesh external-workload join` makes it (`JoinStore::put`), then Certify with it, with a
//! certificate, and with everything an attacker could try instead.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use linkerd2_proxy_api::identity::identity_client::IdentityClient;
use linkerd2_proxy_api::identity::{CertifyRequest, CertifyResponse};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

use cnimesh_apiserver::ClusterApi;
use cnimesh_control::serve::{self, Listeners};
use cnimesh_identity::Name;
use cnimesh_identity::tls::CurrentCert;
use cnimesh_model::external::join_store::JoinStore;
use cnimesh_model::identity::Policy;
use cnimesh_model::identity::issuer::tests::write_pki;
use cnimesh_model::identity::join::{self, JoinToken, Pending};

const CONTROL_NS: &str = "cnimesh";

struct Control {
    grpc: SocketAddr,
    api: Arc<ClusterApi>,
    roots: Arc<rustls::RootCertStore>,
    control: Name,
    _pki: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start() -> Control {
    let pki = tempfile::tempdir().unwrap();
    let anchor = write_pki(pki.path(), Duration::from_secs(3600));
    let api = ClusterApi::new();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let control = Name::for_service_account("cnimesh-control", CONTROL_NS, "cluster.local").unwrap();
    let policy = Policy {
        trust_domain: "cluster.local".into(),
        lifetime: Duration::from_secs(3600),
        clock_skew: Duration::ZERO,
    };
    let listeners = Listeners { grpc: grpc.into(), admin: admin.into() };
    let config =
        serve::Config::new(pki.path().to_path_buf(), control.clone(), policy, api.client(), listeners, async {
            let _ = stopped.await;
        });
    tokio::spawn(serve::run(config));
    let anchors = cnimesh_identity::pem::certs(anchor.cert_pem.as_bytes(), "anchor").unwrap();
    let roots = cnimesh_identity::tls::roots(&anchors).unwrap();
    Control { grpc: grpc_addr, api, roots, control, _pki: pki, _stop: stop }
}

impl Control {
    /// A channel that pins the trust anchor and the control plane's identity, presenting `cert`
    /// when given (a renewal).
    async fn channel(&self, cert: Option<Arc<CurrentCert>>) -> Channel {
        for _ in 0..200 {
            let addr = self.grpc.to_string();
            match cnimesh_identity::grpc_channel::connect(&addr, &self.control, self.roots.clone(), cert.clone()).await
            {
                Ok(channel) => return channel,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        panic!("the control plane never served its certificate");
    }

    fn external_workload(&self, name: &str, service_account: &str, revoked: bool) -> String {
        let stored = self.api.put(json!({
            "apiVersion": "workload.cnimesh.io/v1alpha1", "kind": "ExternalWorkload",
            "metadata": {"namespace": "shop", "name": name, "labels": {"app": name}},
            "spec": {"workloadIPs": ["192.0.2.10"], "serviceAccountName": service_account, "revoked": revoked},
        }));
        stored["metadata"]["uid"].as_str().expect("a uid").to_string()
    }

    /// What `cnimesh external-workload join NAME -n shop --ttl <ttl>` does.
    async fn join(&self, name: &str, ttl: Duration) -> JoinToken {
        let store = JoinStore::new(self.api.client(), CONTROL_NS);
        let (workload, record) = store.workload("shop", name).await.unwrap();
        let token = JoinToken::generate("shop", name).unwrap();
        let pending = Pending::new(&token, workload.metadata.uid.as_deref().unwrap(), &record.service_account, ttl);
        store.put(&token, &pending).await.unwrap();
        token
    }
}

fn shop(service_account: &str) -> Name {
    Name::for_service_account(service_account, "shop", "cluster.local").unwrap()
}

/// A CSR for `name`, and the key it holds.
fn csr(name: &Name) -> (rcgen::KeyPair, Vec<u8>) {
    cnimesh_identity::ca::new_csr(name).unwrap()
}

async fn certify(
    channel: &Channel,
    name: &Name,
    token: &[u8],
) -> Result<(rcgen::KeyPair, CertifyResponse), tonic::Status> {
    let (key, csr) = csr(name);
    let request =
        CertifyRequest { identity: name.to_string(), token: token.to_vec(), certificate_signing_request: csr };
    IdentityClient::new(channel.clone()).certify(request).await.map(|r| (key, r.into_inner()))
}

/// Certify for `key`, kept: what a proxy does when it renews (it keeps its key).
async fn certify_with(
    channel: &Channel,
    name: &Name,
    token: &[u8],
    key: &rcgen::KeyPair,
) -> Result<CertifyResponse, tonic::Status> {
    let csr = cnimesh_identity::ca::csr_for(key, name).unwrap();
    let request =
        CertifyRequest { identity: name.to_string(), token: token.to_vec(), certificate_signing_request: csr };
    IdentityClient::new(channel.clone()).certify(request).await.map(|r| r.into_inner())
}

/// The issued certificate and its key, as a proxy would present it.
fn presented(key: &rcgen::KeyPair, rsp: &CertifyResponse) -> Arc<CurrentCert> {
    let chain: Vec<CertificateDer<'static>> = std::iter::once(rsp.leaf_certificate.clone())
        .chain(rsp.intermediate_certificates.iter().cloned())
        .map(CertificateDer::from)
        .collect();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let cert = Arc::new(CurrentCert::default());
    cert.set(cnimesh_identity::tls::certified_key(chain, key).unwrap());
    cert
}

fn code<T>(result: Result<T, tonic::Status>) -> (Code, String) {
    match result {
        Ok(_) => (Code::Ok, String::new()),
        Err(status) => (status.code(), status.message().to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_token_certifies_its_external_workload_once_and_the_certificate_then_renews_it() {
    let control = start().await;
    control.external_workload("db-vm", "db", false);
    let token = control.join("db-vm", Duration::from_secs(600)).await;
    let anonymous = control.channel(None).await;

    let (key, first) =
        certify(&anonymous, &shop("db"), token.reveal().as_bytes()).await.expect("the join is certified");
    let leaf = CertificateDer::from(first.leaf_certificate.clone());
    assert_eq!(cnimesh_identity::tls::identity_of(&leaf), Some(shop("db")));
    let secret = control.api.get("v1", "Secret", CONTROL_NS, join::SECRET_NAME).expect("the Secret");
    let entry = base64_decoded(secret["data"]["shop_db-vm"].as_str().expect("the workload's entry"));
    let entry: join::Entry = serde_json::from_slice(&entry).unwrap();
    assert!(matches!(entry, join::Entry::Bound(_)), "the token is used up, the key bound: {entry:?}");

    // Used twice: refused.
    let (code_, message) = code(certify(&anonymous, &shop("db"), token.reveal().as_bytes()).await);
    assert_eq!(code_, Code::Unauthenticated, "{message}");
    assert!(message.contains("already used"), "{message}");

    // Renewal: no token, the certificate as client certificate; again with the renewed one.
    let mut current = presented(&key, &first);
    for _ in 0..2 {
        let with_cert = control.channel(Some(current.clone())).await;
        let renewed = certify_with(&with_cert, &shop("db"), b"", &key).await.expect("renewed with its certificate");
        current = presented(&key, &renewed);
    }
    // A renewal for another key than the certificate's is refused: the binding is to the key.
    let with_cert = control.channel(Some(current)).await;
    let (code_, message) = code(certify(&with_cert, &shop("db"), b"").await);
    assert_eq!(code_, Code::PermissionDenied, "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_certifies_racing_with_one_join_token_certify_exactly_one() {
    let control = start().await;
    control.external_workload("db-vm", "db", false);
    let anonymous = control.channel(None).await;
    for _ in 0..5 {
        let token = control.join("db-vm", Duration::from_secs(600)).await;
        let text = token.reveal().as_bytes().to_vec();
        let db = shop("db");
        let (a, b) = tokio::join!(certify(&anonymous, &db, &text), certify(&anonymous, &db, &text));
        let codes = [code(a).0, code(b).0];
        assert_eq!(codes.iter().filter(|c| **c == Code::Ok).count(), 1, "exactly one wins: {codes:?}");
        assert!(codes.contains(&Code::Unauthenticated), "{codes:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_join_token_is_unauthenticated() {
    let control = start().await;
    control.external_workload("db-vm", "db", false);
    let token = control.join("db-vm", Duration::ZERO).await;
    let (code_, message) = code(certify(&control.channel(None).await, &shop("db"), token.reveal().as_bytes()).await);
    assert_eq!(code_, Code::Unauthenticated, "{message}");
    assert!(message.contains("expired"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_token_for_one_external_workload_cannot_certify_another_or_a_pods_identity() {
    let control = start().await;
    control.external_workload("db-a", "db-a", false);
    control.external_workload("db-b", "db-b", false);
    let token = control.join("db-a", Duration::from_secs(600)).await;
    let anonymous = control.channel(None).await;
    let other_namespace = Name::for_service_account("db-a", "bank", "cluster.local").unwrap();
    for name in [shop("db-b"), shop("web"), other_namespace] {
        let (code_, message) = code(certify(&anonymous, &name, token.reveal().as_bytes()).await);
        assert_eq!(code_, Code::PermissionDenied, "{name}: {message}");
    }
    // Refusals do not use the token up: its own identity is still certified.
    certify(&anonymous, &shop("db-a"), token.reveal().as_bytes()).await.expect("still good for db-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_token_whose_external_workload_was_deleted_or_made_again_is_refused() {
    let control = start().await;
    control.external_workload("db-vm", "db", false);
    let token = control.join("db-vm", Duration::from_secs(600)).await;
    let anonymous = control.channel(None).await;
    control.api.remove("workload.cnimesh.io/v1alpha1", "ExternalWorkload", "shop", "db-vm");
    let (code_, message) = code(certify(&anonymous, &shop("db"), token.reveal().as_bytes()).await);
    assert_eq!(code_, Code::PermissionDenied, "{message}");
    assert!(message.contains("does not exist"), "{message}");

    // Made again under the same name: another workload (another uid), not the one joined.
    control.external_workload("db-vm", "db", false);
    let (code_, message) = code(certify(&anonymous, &shop("db"), token.reveal().as_bytes()).await);
    assert_eq!(code_, Code::PermissionDenied, "{message}");
    assert!(message.contains("made again"), "{message}");

    // Revoked: refused too.
    let token = control.join("db-vm", Duration::from_secs(600)).await;
    control.external_workload("db-vm", "db", true);
    let (code_, message) = code(certify(&anonymous, &shop("db"), token.reveal().as_bytes()).await);
    assert_eq!(code_, Code::PermissionDenied, "{message}");
    assert!(message.contains("revoked"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guessed_join_token_with_the_right_prefix_is_unauthenticated() {
    let control = start().await;
    control.external_workload("db-vm", "db", false);
    let real = control.join("db-vm", Duration::from_secs(600)).await;
    let anonymous = control.channel(None).await;
    let guessed = JoinToken::generate("shop", "db-vm").unwrap();
    let (code_, message) = code(certify(&anonymous, &shop("db"), guessed.reveal().as_bytes()).await);
    assert_eq!(code_, Code::Unauthenticated, "{message}");
    // A workload with no pending token at all.
    control.external_workload("cache-vm", "cache", false);
    let none = JoinToken::generate("shop", "cache-vm").unwrap();
    assert_eq!(code(certify(&anonymous, &shop("cache"), none.reveal().as_bytes()).await).0, Code::Unauthenticated);
    certify(&anonymous, &shop("db"), real.reveal().as_bytes()).await.expect("the real one still works");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_with_the_certificate_of_a_deleted_or_revoked_external_workload_is_refused() {
    let control = start().await;
    control.external_workload("db-vm", "db", false);
    let token = control.join("db-vm", Duration::from_secs(600)).await;
    let (key, issued) = certify(&control.channel(None).await, &shop("db"), token.reveal().as_bytes()).await.unwrap();
    let with_cert = control.channel(Some(presented(&key, &issued))).await;

    control.external_workload("db-vm", "db", true);
    let (code_, message) = code(certify_with(&with_cert, &shop("db"), b"", &key).await);
    assert_eq!(code_, Code::PermissionDenied, "revoked: {message}");
    control.external_workload("db-vm", "db", false);
    certify_with(&with_cert, &shop("db"), b"", &key).await.expect("un-revoked, it renews again");

    control.api.remove("workload.cnimesh.io/v1alpha1", "ExternalWorkload", "shop", "db-vm");
    let (code_, message) = code(certify_with(&with_cert, &shop("db"), b"", &key).await);
    assert_eq!(code_, Code::PermissionDenied, "deleted: {message}");
    assert!(message.contains("deleted or revoked"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_meshed_pods_certificate_cannot_renew_itself_or_mint_another_through_the_renewal_path() {
    let control = start().await;
    control.external_workload("db-vm", "db", false);
    let pod_token = control.api.issue_token("shop", "web", &[cnimesh_identity::TOKEN_AUDIENCE]).unwrap();
    let (key, issued) = certify(&control.channel(None).await, &shop("web"), pod_token.as_bytes()).await.unwrap();
    let with_pod_cert = control.channel(Some(presented(&key, &issued))).await;
    for name in [shop("web"), shop("db"), shop("admin")] {
        let (code_, message) = code(certify(&with_pod_cert, &name, b"").await);
        assert_eq!(code_, Code::PermissionDenied, "{name}: {message}");
    }
    // The pod keeps renewing as it always did: with its service-account token.
    certify(&with_pod_cert, &shop("web"), pod_token.as_bytes()).await.expect("a pod renews with its token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_certificate_cannot_renew_when_an_external_workload_shares_its_service_account() {
    let control = start().await;
    control.external_workload("db-vm", "db", false);
    // A pod running as shop/db: the same identity as the ExternalWorkload, but no join.
    let pod_token = control.api.issue_token("shop", "db", &[cnimesh_identity::TOKEN_AUDIENCE]).unwrap();
    let (key, issued) = certify(&control.channel(None).await, &shop("db"), pod_token.as_bytes()).await.unwrap();
    let with_pod_cert = control.channel(Some(presented(&key, &issued))).await;
    let (code_, message) = code(certify_with(&with_pod_cert, &shop("db"), b"", &key).await);
    assert_eq!(
        code_,
        Code::PermissionDenied,
        "a pod's certificate renewed through the ExternalWorkload path: {message}"
    );
    // Even after the ExternalWorkload joined: its binding is its own key, not the pod's.
    let token = control.join("db-vm", Duration::from_secs(600)).await;
    certify(&control.channel(None).await, &shop("db"), token.reveal().as_bytes()).await.expect("the host joins");
    let (code_, message) = code(certify_with(&with_pod_cert, &shop("db"), b"", &key).await);
    assert_eq!(code_, Code::PermissionDenied, "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_one_external_workload_stops_its_renewal_even_when_another_shares_its_service_account() {
    let control = start().await;
    control.external_workload("db-a", "db", false);
    control.external_workload("db-b", "db", false);
    let token = control.join("db-a", Duration::from_secs(600)).await;
    let (key, issued) = certify(&control.channel(None).await, &shop("db"), token.reveal().as_bytes()).await.unwrap();
    let with_cert = control.channel(Some(presented(&key, &issued))).await;
    certify_with(&with_cert, &shop("db"), b"", &key).await.expect("db-a renews");

    control.external_workload("db-a", "db", true);
    let (code_, message) = code(certify_with(&with_cert, &shop("db"), b"", &key).await);
    assert_eq!(code_, Code::PermissionDenied, "db-a is revoked but renewed through db-b: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_a_deleted_and_recreated_external_workload_does_not_renew() {
    let control = start().await;
    control.external_workload("db-vm", "db", false);
    let token = control.join("db-vm", Duration::from_secs(600)).await;
    let (key, issued) = certify(&control.channel(None).await, &shop("db"), token.reveal().as_bytes()).await.unwrap();
    let with_cert = control.channel(Some(presented(&key, &issued))).await;
    certify_with(&with_cert, &shop("db"), b"", &key).await.expect("it renews");

    control.api.remove("workload.cnimesh.io/v1alpha1", "ExternalWorkload", "shop", "db-vm");
    control.external_workload("db-vm", "db", false);
    let (code_, message) = code(certify_with(&with_cert, &shop("db"), b"", &key).await);
    assert_eq!(code_, Code::PermissionDenied, "the old certificate renewed the new workload: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_token_secret_outside_the_control_planes_namespace_or_of_another_type_is_never_read() {
    let control = start().await;
    let uid = control.external_workload("db-vm", "db", false);
    let forged = JoinToken::generate("shop", "db-vm").unwrap();
    let pending = Pending::new(&forged, &uid, "db", Duration::from_secs(600));
    let data = json!({"shop_db-vm": base64_of(&serde_json::to_vec(&pending).unwrap())});
    // Whoever may write Secrets in the workload's namespace writes a forged hash there.
    control.api.put(json!({"apiVersion": "v1", "kind": "Secret", "type": join::SECRET_TYPE,
        "metadata": {"namespace": "shop", "name": join::SECRET_NAME}, "data": data}));
    let anonymous = control.channel(None).await;
    let (code_, message) = code(certify(&anonymous, &shop("db"), forged.reveal().as_bytes()).await);
    assert_eq!(code_, Code::Unauthenticated, "{message}");

    // In the control plane's namespace but of another type: not read either.
    control.api.put(json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"namespace": CONTROL_NS, "name": join::SECRET_NAME}, "data": data}));
    let (code_, message) = code(certify(&anonymous, &shop("db"), forged.reveal().as_bytes()).await);
    assert_eq!(code_, Code::Unauthenticated, "{message}");
    assert!(message.contains("not read"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_or_malformed_join_tokens_are_invalid_arguments() {
    let control = start().await;
    control.external_workload("db-vm", "db", false);
    let anonymous = control.channel(None).await;
    let long = format!("cnimesh-join.v1.shop.db-vm.{}", "A".repeat(4000));
    for bad in [
        long.as_bytes(),
        b"cnimesh-join.v1.".as_slice(),
        b"cnimesh-join.v1.shop.db-vm.not-base64!".as_slice(),
        b"cnimesh-join.v1.SHOP.db-vm.AAAA".as_slice(),
        &[b'c', b'n', b'i', b'm', b'e', b's', b'h', b'-', b'j', b'o', b'i', b'n', b'.', b'v', b'1', b'.', 0xff, 0xfe],
    ] {
        let (code_, message) = code(certify(&anonymous, &shop("db"), bad).await);
        assert_eq!(code_, Code::InvalidArgument, "{}: {message}", String::from_utf8_lossy(bad));
    }
    // The control plane is still serving.
    let token = control.join("db-vm", Duration::from_secs(600)).await;
    certify(&anonymous, &shop("db"), token.reveal().as_bytes()).await.expect("still serving");
}

fn base64_decoded(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(text).unwrap()
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
