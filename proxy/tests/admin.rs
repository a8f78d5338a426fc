//! The admin server's status pages, served in-process on loopback: `/env.json` shows the
//! effective configuration with secrets redacted, `/identity.json` the certificate held, and
//! `/endpoints.json` what discovery has been asked and answered.

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cnimesh_proxy::app::admin::{Admin, status};
use cnimesh_proxy::app::config::{Config, IdentityConfig, TrustAnchors};
use cnimesh_proxy::app::drain::Drain;
use cnimesh_proxy::app::metrics::Metrics;
use cnimesh_proxy::client::discovery::Discovery;
use cnimesh_proxy::transport::identity::Identity;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use support::FixedLevel;
use tokio::net::{TcpListener, TcpStream};

const NAME: &str = "web.shop.serviceaccount.identity.cnimesh.cluster.local";

/// An identity from a fresh trust anchor, holding a certificate its issuer signed for [`NAME`].
fn identity(anchor_pem: &str, issuer: &cnimesh_identity::ca::CaPem) -> (IdentityConfig, Arc<Identity>) {
    let config = IdentityConfig {
        name: NAME.parse().unwrap(),
        trust_anchors: TrustAnchors::Pem(anchor_pem.to_string()),
        token_file: "/var/run/secrets/tokens/cnimesh-identity-token".into(),
        control_addr: "cnimesh-control.cnimesh.svc.cluster.local:4190".into(),
        control_name: "cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local".parse().unwrap(),
        max_backoff: Duration::from_secs(30),
    };
    let identity = Arc::new(Identity::new(&config).unwrap());
    let signer = cnimesh_identity::ca::Signer::new(issuer).unwrap();
    let leaf = signer.new_server_cert(&[NAME.to_string()], Duration::from_secs(3600)).unwrap();
    let mut chain = cnimesh_identity::pem::certs(leaf.cert_pem.as_bytes(), "leaf").unwrap();
    chain.extend(cnimesh_identity::pem::certs(issuer.cert_pem.as_bytes(), "issuer").unwrap());
    let key = cnimesh_identity::pem::key(leaf.key_pem.as_bytes(), "leaf key").unwrap();
    identity.cert.set(cnimesh_identity::tls::certified_key(chain, key).unwrap());
    (config, identity)
}

async fn get_json(addr: std::net::SocketAddr, path: &str) -> Value {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let request = http::Request::get(path).header("host", "admin").body(Empty::<Bytes>::new()).unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200, "{path}");
    assert_eq!(response.headers()["content-type"], "application/json", "{path}");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{path}: {e}: {}", String::from_utf8_lossy(&body)))
}

#[tokio::test]
async fn status_pages_show_configuration_identity_and_discovery_without_secrets() {
    let anchor = cnimesh_identity::ca::new_trust_anchor("cluster.local", Duration::from_secs(86400)).unwrap();
    let issuer = cnimesh_identity::ca::new_issuer(&anchor, "cluster.local", Duration::from_secs(86400)).unwrap();
    let (identity_config, identity) = identity(&anchor.cert_pem, &issuer);
    let config = Config { identity: Some(identity_config), ..Config::default() };
    let metrics = Arc::new(Metrics::default());
    // Discovery towards a control plane that never answers: the lookup shows, unanswered.
    let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:9").connect_lazy();
    let discovery = Arc::new(Discovery::new(
        channel,
        Duration::from_millis(50),
        Duration::from_secs(1),
        metrics.outbound_endpoints.clone(),
    ));
    let target: std::net::SocketAddr = "10.96.0.10:80".parse().unwrap();
    discovery.profile(target).await;

    let token = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2Vu.sig";
    let env = status::redacted_env([
        ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM".to_string(), anchor.cert_pem.clone()),
        ("CNIMESH_PROXY_IDENTITY_TOKEN".to_string(), token.to_string()),
        ("CNIMESH_PROXY_LOG".to_string(), "info".to_string()),
    ]);
    let admin = Arc::new(Admin {
        tap: None,
        metrics,
        ready: true.into(),
        log: Box::new(FixedLevel),
        drain: Drain::default(),
        identity: Some(identity),
        config,
        env,
        discovery: Some(discovery),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(admin.serve(listener));

    let env = get_json(addr, "/env.json").await;
    let text = env.to_string();
    let pem_body = anchor.cert_pem.lines().nth(1).unwrap();
    assert!(!text.contains(pem_body) && !text.contains("c2VjcmV0"), "no PEM, no token: {text}");
    assert_eq!(env["env"]["CNIMESH_PROXY_LOG"], "info");
    assert!(env["env"]["CNIMESH_PROXY_IDENTITY_TOKEN"].as_str().unwrap().starts_with("<redacted"), "{text}");
    assert_eq!(env["config"]["identity"]["name"], NAME);
    assert_eq!(env["config"]["identity"]["token_file"], "/var/run/secrets/tokens/cnimesh-identity-token");
    assert_eq!(env["config"]["admin"], "0.0.0.0:4191");
    assert_eq!(env["config"]["opaque_ports"][0], 25);

    let id = get_json(addr, "/identity.json").await;
    assert_eq!(id["name"], NAME);
    assert_eq!(id["certificate"]["identity"], NAME);
    assert_eq!(id["certificate"]["subject"], format!("CN={NAME}"));
    assert_eq!(id["certificate"]["chain_length"], 2);
    let left = id["certificate"]["expires_in_seconds"].as_u64().unwrap();
    assert!((3500..=3600).contains(&left), "{id}");
    let not_after = id["certificate"]["not_after_unix"].as_u64().unwrap();
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    assert!(not_after > now, "{id}");

    let endpoints = get_json(addr, "/endpoints.json").await;
    assert_eq!(endpoints["discovery"], true);
    assert_eq!(endpoints["profiles"][0]["addr"], "10.96.0.10:80", "{endpoints}");
    assert_eq!(endpoints["profiles"][0]["answered"], false, "{endpoints}");
}
