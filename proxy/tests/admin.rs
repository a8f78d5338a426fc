//! The admin server's status pages, served in-process on loopback: `/env.json` shows the
//! effective configuration with secrets redacted, `/identity.json` the certificate held,
//! `/endpoints.json` what discovery has been asked and answered, and `/policy.json` the inbound
//! policy each port enforces (against a mock `InboundServerPolicies` on loopback).

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cnimesh_proxy::app::admin::{Admin, status};
use cnimesh_proxy::app::config::{Config, IdentityConfig, TrustAnchors};
use cnimesh_proxy::client::discovery::Discovery;
use cnimesh_proxy::inbound::policy::discover::Policies;
use cnimesh_proxy::inbound::policy::model::DefaultPolicy;
use cnimesh_proxy::serve::drain::Drain;
use cnimesh_proxy::serve::metrics::Metrics;
use cnimesh_proxy::transport::identity::Identity;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use linkerd2_proxy_api::inbound as api;
use linkerd2_proxy_api::inbound::inbound_server_policies_server::{InboundServerPolicies, InboundServerPoliciesServer};
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
        external: None,
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
    let discovery =
        Arc::new(Discovery::new(channel, Duration::from_millis(50), Duration::from_secs(1), metrics.discovery()));
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
        policies: None,
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
    assert!(id["certificate"]["issuer"]["subject"].as_str().unwrap().starts_with("CN="), "the issuer's subject: {id}");
    assert!(
        id["certificate"]["issuer"]["serial"].as_str().is_some_and(|s| s.contains(':')),
        "the issuer's serial: {id}"
    );
    let fingerprint = id["anchors"][0]["spki_sha256"].as_str().unwrap();
    assert_eq!(fingerprint.len(), 64, "a SHA-256 in hex: {id}");
    assert!(!id.to_string().contains("PRIVATE"), "no key: {id}");
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

/// Answers port 8080 with a Server allowing one mesh identity, never answers the others.
#[derive(Clone)]
struct OnePort;

#[tonic::async_trait]
impl InboundServerPolicies for OnePort {
    type WatchPortStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<api::Server, tonic::Status>> + Send>>;

    async fn get_port(&self, _: tonic::Request<api::PortSpec>) -> Result<tonic::Response<api::Server>, tonic::Status> {
        Err(tonic::Status::unimplemented("the proxy watches"))
    }

    async fn watch_port(
        &self,
        req: tonic::Request<api::PortSpec>,
    ) -> Result<tonic::Response<Self::WatchPortStream>, tonic::Status> {
        let first = (req.into_inner().port == 8080).then(|| Ok(web_server()));
        let stream = tokio_stream::StreamExt::chain(tokio_stream::iter(first), tokio_stream::pending());
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

/// A Server `web-http` (HTTP/1) whose one AuthorizationPolicy admits the `client` service account
/// over mTLS, from anywhere.
fn web_server() -> api::Server {
    use linkerd2_proxy_api::meta;
    let labels = |kind: &str, name: &str| {
        [("group", "policy.cnimesh.io"), ("kind", kind), ("name", name)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<std::collections::HashMap<_, _>>()
    };
    let authz = api::Authz {
        networks: vec![api::Network {
            net: Some(linkerd2_proxy_api::net::IpNetwork {
                ip: Some("0.0.0.0".parse::<std::net::IpAddr>().unwrap().into()),
                prefix_len: 0,
            }),
            except: vec![],
        }],
        authentication: Some(api::Authn {
            permit: Some(api::authn::Permit::MeshTls(api::authn::PermitMeshTls {
                clients: Some(api::authn::permit_mesh_tls::Clients::Identities(
                    api::authn::permit_mesh_tls::PermitClientIdentities {
                        identities: vec![api::Identity { name: CLIENT.into() }],
                        suffixes: vec![],
                    },
                )),
            })),
        }),
        labels: labels("authorizationpolicy", "web-from-client"),
        metadata: Some(meta::Metadata {
            kind: Some(meta::metadata::Kind::Resource(meta::Resource {
                group: "policy.cnimesh.io".into(),
                kind: "authorizationpolicy".into(),
                name: "web-from-client".into(),
                ..Default::default()
            })),
        }),
    };
    api::Server {
        protocol: Some(api::ProxyProtocol {
            kind: Some(api::proxy_protocol::Kind::Http1(api::proxy_protocol::Http1 {
                routes: vec![],
                local_rate_limit: None,
            })),
        }),
        server_ips: vec![],
        authorizations: vec![authz],
        labels: labels("server", "web-http"),
    }
}

const CLIENT: &str = "client.shop.serviceaccount.identity.cnimesh.cluster.local";

#[tokio::test]
async fn the_policy_page_shows_each_ports_enforced_policy_its_source_and_freshness() {
    let incoming = tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let control = incoming.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(InboundServerPoliciesServer::new(OnePort))
            .serve_with_incoming(incoming),
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{control}")).unwrap().connect_lazy();
    let policies = Arc::new(Policies::new(
        channel,
        "shop:web-0".into(),
        DefaultPolicy::Deny,
        vec![],
        &[8080, 9090],
        (Duration::from_millis(50), Duration::from_millis(50)),
        &Default::default(),
    ));
    assert!(!policies.declared_answered(Duration::from_millis(500)).await, "9090 is never answered");
    let admin = Arc::new(Admin {
        tap: None,
        metrics: Arc::new(Metrics::default()),
        ready: true.into(),
        log: Box::new(FixedLevel),
        drain: Drain::default(),
        identity: None,
        config: Config::default(),
        env: Vec::new(),
        discovery: None,
        policies: Some(policies),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(admin.serve(listener));

    let page = get_json(addr, "/policy.json").await;
    assert_eq!(page["discovery"], true, "{page}");
    assert_eq!(page["default"]["policy"]["server"]["name"], "deny", "{page}");
    assert_eq!(page["default"]["source"], "as injected", "{page}");
    let ports = page["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 2, "{page}");
    let web = &ports[0];
    assert_eq!(web["port"], 8080);
    assert_eq!(web["source"], "discovered", "{page}");
    assert_eq!(web["protocol"], "http1");
    assert_eq!(web["server"]["name"], "web-http");
    assert_eq!(web["authorizations"][0]["authorization"]["name"], "web-from-client");
    assert_eq!(web["authorizations"][0]["authentication"]["mesh_tls"]["identities"][0], CLIENT, "{page}");
    assert_eq!(web["authorizations"][0]["networks"][0]["net"], "0.0.0.0/0");
    assert!(web["last_answer_age_seconds"].as_u64().unwrap() < 60, "answered moments ago: {page}");
    let other = &ports[1];
    assert_eq!(other["port"], 9090);
    assert_eq!(other["source"], "default", "{page}");
    assert_eq!(other["server"]["name"], "deny");
    assert_eq!(other["authorizations"], serde_json::json!([]), "deny admits no one");
    assert_eq!(other["last_answer_unix"], Value::Null);
}

#[tokio::test]
async fn without_policy_discovery_the_policy_page_says_every_client_is_allowed() {
    let admin = Arc::new(Admin {
        tap: None,
        metrics: Arc::new(Metrics::default()),
        ready: true.into(),
        log: Box::new(FixedLevel),
        drain: Drain::default(),
        identity: None,
        config: Config::default(),
        env: Vec::new(),
        discovery: None,
        policies: None,
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(admin.serve(listener));
    let page = get_json(addr, "/policy.json").await;
    assert_eq!(page["discovery"], false);
    assert!(page["note"].as_str().unwrap().contains("every client is allowed"), "{page}");
}
