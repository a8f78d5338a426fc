//! The control plane's tap relay end to end in-process: pods from the Kubernetes source against
//! a scripted API server, tokens checked by TokenReview against a mocked API server, and fake
//! proxies serving `Tap/Observe` over real mTLS (a test CA; the proxy presents its pod's
//! identity and answers only the control plane's). Read through `cnimesh tap`'s own client
//! (`open_at`, what `--local` uses).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use bytes::Bytes;
use cnimesh_cli::tap::{lines, open_at};
use cnimesh_common::names::TAP_TOKEN_AUDIENCE;
use cnimesh_control::admin::{self, AdminState};
use cnimesh_control::sources::{KubeSource, Source};
use cnimesh_control::tap::Relay;
use cnimesh_identity::tls::{self, ClientAuth, CurrentCert};
use cnimesh_identity::{Name, ca};
use cnimesh_model::destination::Index;
use cnimesh_model::identity::{Issuer, KubeTokens, Policy, own_cert};
use cnimesh_model::metrics::Metrics;
use cnimesh_model::tap::{Body, TapLine};
use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use linkerd2_proxy_api::http_types::HttpMethod;
use linkerd2_proxy_api::net::TcpAddress;
use linkerd2_proxy_api::tap::observe_request::{Match, r#match as mm};
use linkerd2_proxy_api::tap::tap_event::{self, ProxyDirection, http};
use linkerd2_proxy_api::tap::tap_server::{Tap, TapServer};
use linkerd2_proxy_api::tap::{ObserveRequest, TapEvent};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};

/// Only guards against a hung test; nothing here measures time.
const PATIENCE: Duration = Duration::from_secs(30);
const TRUST_DOMAIN: &str = "cluster.local";

fn name(sa: &str, ns: &str) -> Name {
    Name::for_service_account(sa, ns, TRUST_DOMAIN).unwrap()
}

fn pod(name: &str, ip: &str, deployment: &str, meshed: bool) -> Value {
    let mut containers = vec![json!({"name": "app"})];
    if meshed {
        containers.push(json!({"name": "cnimesh-proxy"}));
    }
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "demo", "name": name, "resourceVersion": "3",
            "labels": {"cnimesh.io/proxy-deployment": deployment}},
        "spec": {"serviceAccountName": deployment, "containers": containers},
        "status": {"phase": "Running", "podIP": ip}})
}

/// A fake proxy: answers Observe for the control plane only, streams `requests` requests and
/// then holds the stream open (as a real proxy does while nothing happens), and says when the
/// relay has dropped it.
struct FakeProxy {
    peer: Option<Name>,
    requests: u64,
    observed: Arc<Mutex<Vec<ObserveRequest>>>,
    dropped: Arc<Notify>,
}

/// Notifies when the stream holding it is dropped.
struct DropGuard(Arc<Notify>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

fn event(http: http::Event) -> TapEvent {
    TapEvent {
        source: Some(TcpAddress::from("10.0.0.5:51234".parse::<SocketAddr>().unwrap())),
        source_meta: Some(tap_event::EndpointMeta {
            labels: [("tls".to_string(), "true".to_string())].into_iter().collect(),
        }),
        route_meta: None,
        destination: Some(TcpAddress::from("127.0.0.1:8080".parse::<SocketAddr>().unwrap())),
        destination_meta: None,
        proxy_direction: ProxyDirection::Inbound as i32,
        event: Some(tap_event::Event::Http(tap_event::Http { event: Some(http) })),
    }
}

fn request_events(stream: u64) -> [TapEvent; 3] {
    let id = Some(http::StreamId { base: 7, stream });
    [
        event(http::Event::RequestInit(http::RequestInit {
            id,
            method: Some(HttpMethod::from(::http::Method::GET)),
            authority: "web:8080".into(),
            path: format!("/hello/{stream}"),
            ..Default::default()
        })),
        event(http::Event::ResponseInit(http::ResponseInit { id, http_status: 200, ..Default::default() })),
        event(http::Event::ResponseEnd(http::ResponseEnd { id, response_bytes: 13, ..Default::default() })),
    ]
}

type Events = Pin<Box<dyn Stream<Item = Result<TapEvent, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl Tap for FakeProxy {
    type ObserveStream = Events;

    async fn observe(
        &self,
        request: tonic::Request<ObserveRequest>,
    ) -> Result<tonic::Response<Self::ObserveStream>, tonic::Status> {
        if self.peer != Some(name("cnimesh-control", "cnimesh")) {
            return Err(tonic::Status::permission_denied(format!("{:?} may not tap", self.peer)));
        }
        self.observed.lock().push(request.into_inner());
        let guard = DropGuard(self.dropped.clone());
        let events: Vec<Result<TapEvent, tonic::Status>> =
            (1..=self.requests).flat_map(request_events).map(Ok).collect();
        let held = futures::stream::pending().map(move |e: Result<TapEvent, tonic::Status>| {
            let _ = &guard;
            e
        });
        Ok(tonic::Response::new(Box::pin(futures::stream::iter(events).chain(held))))
    }
}

struct Setup {
    admin: SocketAddr,
    observed: Arc<Mutex<Vec<ObserveRequest>>>,
    dropped: Arc<Notify>,
    metrics: Arc<Metrics>,
    _issuer: watch::Sender<Option<Arc<Issuer>>>,
}

/// A control plane's admin listener with the relay, the pods of `demo` behind a scripted API
/// server, and a fake proxy for `web` at 127.0.0.1 (web-2 at 127.0.0.2 has none).
async fn setup(requests: u64) -> Setup {
    let anchor = ca::new_trust_anchor(TRUST_DOMAIN, Duration::from_secs(3600)).unwrap();
    let issuer_pem = ca::new_issuer(&anchor, TRUST_DOMAIN, Duration::from_secs(3600)).unwrap();
    let issuer = Arc::new(
        Issuer::from_pem(anchor.cert_pem.as_bytes(), issuer_pem.cert_pem.as_bytes(), issuer_pem.key_pem.as_bytes())
            .unwrap(),
    );
    let policy = Policy {
        trust_domain: TRUST_DOMAIN.into(),
        lifetime: Duration::from_secs(3600),
        clock_skew: Duration::from_secs(20),
    };
    let control_cert = Arc::new(CurrentCert::default());
    own_cert::issue(&name("cnimesh-control", "cnimesh"), &issuer, &policy, &control_cert).unwrap();
    let web_cert = Arc::new(CurrentCert::default());
    own_cert::issue(&name("web", "demo"), &issuer, &policy, &web_cert).unwrap();

    // The fake proxy: mTLS, client certificate required.
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = proxy.local_addr().unwrap().port();
    let server_tls = tls::server_config(issuer.roots.clone(), web_cert, ClientAuth::Required, &[b"h2"]).unwrap();
    let (observed, dropped) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Notify::new()));
    let (o, d) = (observed.clone(), dropped.clone());
    tokio::spawn(cnimesh_control::tls_accept::accept_tls(
        proxy,
        server_tls,
        std::future::pending(),
        "fake proxy",
        move |tls, _peer, _watcher| {
            let peer = tls.get_ref().1.peer_certificates().and_then(|c| tls::identity_of(&c[0]));
            let fake = FakeProxy { peer, requests, observed: o.clone(), dropped: d.clone() };
            async move {
                let service = TapServer::new(fake);
                let service = hyper::service::service_fn(move |req| {
                    let mut service = service.clone();
                    async move { tower::Service::call(&mut service, req).await }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            }
        },
    ));

    // Pods from the Kubernetes source.
    let api = cnimesh_apiserver::ClusterApi::new();
    // db's Service and its endpoints: `to` covers the ClusterIP clients address.
    let db_service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "demo", "name": "db"},
        "spec": {"clusterIP": "10.96.0.30", "clusterIPs": ["10.96.0.30"], "ports": [{"port": 5432}]}});
    let db_slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "demo", "name": "db-x",
            "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4", "ports": [{"port": 5432}],
        "endpoints": [{"addresses": ["10.9.9.9"], "targetRef": {"kind": "Pod", "name": "db-0"}}]});
    api.put(db_service);
    api.put(db_slice);
    for pod in [
        pod("web-1", "127.0.0.1", "web", true),
        pod("web-2", "127.0.0.2", "web", true),
        pod("impostor-1", "127.0.0.1", "impostor", true),
        pod("db-0", "10.9.9.9", "db", false),
        // The fake proxies' requests come from this pod's address.
        pod("client-1", "10.0.0.5", "client", true),
    ] {
        api.put(pod);
    }
    let index = Index::new();
    let source = KubeSource::new(api.client()).run(index.clone());
    tokio::spawn(async move { source.await.expect("kube source") });
    tokio::time::timeout(PATIENCE, index.ready()).await.expect("pods listed");

    let (issuer_tx, issuer_rx) = watch::channel(Some(issuer));
    let metrics = Arc::new(Metrics::default());
    let relay = Relay::new(
        Arc::new(token_reviews()),
        metrics.clone(),
        Some(index.clone()),
        issuer_rx.clone(),
        control_cert,
        TRUST_DOMAIN,
    )
    .with_proxy_port(proxy_port);
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_addr = admin.local_addr().unwrap();
    let state = AdminState {
        metrics: metrics.clone(),
        issuer: issuer_rx,
        index: Some(index),
        tap: Some(relay),
        destination: Default::default(),
        webhook_addr: None,
    };
    tokio::spawn(admin::serve(admin, state, std::future::pending()));
    Setup { admin: admin_addr, observed, dropped, metrics, _issuer: issuer_tx }
}

/// TokenReview against a mocked API server: `tap-token` is cnimesh/cnimesh-tap's, `web-token`
/// demo/web's, anything else is not authenticated.
fn token_reviews() -> KubeTokens {
    let service = tower::service_fn(|req: ::http::Request<kube::client::Body>| async move {
        assert_eq!(req.uri().path(), "/apis/authentication.k8s.io/v1/tokenreviews");
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let mut review: Value = serde_json::from_slice(&body).unwrap();
        let user = match review["spec"]["token"].as_str() {
            Some("tap-token") => Some("system:serviceaccount:cnimesh:cnimesh-tap"),
            Some("web-token") => Some("system:serviceaccount:demo:web"),
            _ => None,
        };
        // An identity token (Identity's audience) does not tap, whoever it belongs to.
        let tap_audience = review["spec"]["audiences"] == json!([TAP_TOKEN_AUDIENCE]);
        let user = user.filter(|_| tap_audience);
        review["status"] = match user {
            Some(user) => json!({"authenticated": true, "user": {"username": user}, "audiences": [TAP_TOKEN_AUDIENCE]}),
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        };
        let response = ::http::Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(review.to_string())))
            .unwrap();
        Ok::<_, std::convert::Infallible>(response)
    });
    KubeTokens::new(kube::Client::new(service, "default")).with_audience(TAP_TOKEN_AUDIENCE)
}

async fn tap(setup: &Setup, token: &str, query: &str) -> anyhow::Result<Vec<TapLine>> {
    let reader = open_at(setup.admin, token, query).await?;
    let all = tokio::time::timeout(PATIENCE, lines(Box::pin(reader)).collect::<Vec<_>>()).await.expect("the tap ends");
    all.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_tap_service_accounts_token_may_tap() {
    let setup = setup(1).await;
    let query = "resource=deploy%2Fweb&namespace=demo&limit=1";
    let error = tap(&setup, "", query).await.unwrap_err().to_string();
    assert!(error.contains("401") && error.contains("the tap token is not valid"), "{error}");
    let error = tap(&setup, "garbage", query).await.unwrap_err().to_string();
    assert!(error.contains("401") && error.contains("invalid bearer token"), "{error}");
    let error = tap(&setup, "web-token", query).await.unwrap_err().to_string();
    assert!(error.contains("403") && error.contains("demo/web's; tap needs cnimesh/cnimesh-tap"), "{error}");
    assert!(setup.observed.lock().is_empty(), "no proxy was asked");

    // No header at all, with a raw request.
    let stream = tokio::net::TcpStream::connect(setup.admin).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let request = ::http::Request::get(format!("/tap?{query}"))
        .header("host", "admin")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 401);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("header cnimesh-tap-token"));
    let metrics = setup.metrics.encode();
    assert!(metrics.contains("tap_requests_total{result=\"unauthenticated\"} 3"), "{metrics}");
    assert!(metrics.contains("tap_requests_total{result=\"forbidden\"} 1"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_merges_the_proxies_streams_reports_unreachable_pods_and_ends_at_its_limit() {
    let setup = setup(3).await;
    let got = tap(&setup, "tap-token", "resource=deploy%2Fweb&namespace=demo&method=GET&path=%2Fhello&limit=2")
        .await
        .unwrap();
    // web-2 has no proxy: its error line comes unless the limit is done first.
    let errors: Vec<&TapLine> = got.iter().filter(|l| matches!(l.body, Body::Error { .. })).collect();
    assert!(errors.iter().all(|e| e.pod == "web-2"), "{got:?}");
    let events: Vec<&TapLine> = got.iter().filter(|l| !matches!(l.body, Body::Error { .. })).collect();
    assert_eq!(events.len(), 6, "two whole requests, the third left out: {events:?}");
    assert!(events.iter().all(|l| l.pod == "web-1" && l.namespace == "demo"));
    let Body::RequestInit { path, at, .. } = &events[0].body else { panic!("{events:?}") };
    assert_eq!((path.as_str(), at.id.as_str()), ("/hello/1", "7:1"));
    // The relay names the pod behind a known address (a proxy only knows IPs).
    assert!(
        events.iter().all(|l| l.body.stream().unwrap().source_pod.as_deref() == Some("demo/client-1")),
        "{events:?}"
    );
    let observed = setup.observed.lock().clone();
    assert_eq!(observed.len(), 1);
    assert_eq!(observed[0].limit, 2);
    assert!(observed[0].r#match.is_some());
    tokio::time::timeout(PATIENCE, setup.dropped.notified())
        .await
        .expect("the proxy's stream was dropped at the limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_pod_is_an_error_line_not_a_failed_tap() {
    let setup = setup(1).await;
    let got = tap(&setup, "tap-token", "resource=pod%2Fweb-2&namespace=demo").await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    let Body::Error { message } = &got[0].body else { panic!("{got:?}") };
    assert!(message.contains("127.0.0.2") && message.contains("onnect"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_going_away_drops_the_proxies_streams() {
    let setup = setup(1).await;
    let reader = open_at(setup.admin, "tap-token", "resource=pod%2Fweb-1&namespace=demo").await.unwrap();
    let mut lines = lines(Box::pin(reader));
    let first = tokio::time::timeout(PATIENCE, lines.next()).await.unwrap().unwrap().unwrap();
    assert!(matches!(first.body, Body::RequestInit { .. }));
    drop(lines);
    tokio::time::timeout(PATIENCE, setup.dropped.notified()).await.expect("the proxy's stream was dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_does_not_prove_its_pods_identity_is_not_tapped() {
    let setup = setup(1).await;
    // impostor-1's address answers with web's certificate.
    let got = tap(&setup, "tap-token", "resource=deploy%2Fimpostor&namespace=demo").await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    let Body::Error { message } = &got[0].body else { panic!("{got:?}") };
    assert!(message.contains("TLS handshake") || message.contains("certificate"), "{message}");
    assert!(setup.observed.lock().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queries_and_unknown_resources_are_refused_with_the_reason() {
    let setup = setup(1).await;
    let error = tap(&setup, "tap-token", "resource=deploy%2Fnope&namespace=demo").await.unwrap_err().to_string();
    assert!(error.contains("404") && error.contains("no meshed pod of deployment/nope in namespace demo"), "{error}");
    let error = tap(&setup, "tap-token", "resource=deploy%2Fweb&namespace=demo&to=sts%2Fdb").await.unwrap_err();
    assert!(error.to_string().contains("no pod with an address for statefulset/db"), "{error}");
    let error = tap(&setup, "tap-token", "resource=deploy%2Fweb&limit=x").await.unwrap_err().to_string();
    assert!(error.contains("400") && error.contains("limit=\"x\""), "{error}");

    // --to: the destination pods' addresses go to the proxies as the match.
    let got = tap(&setup, "tap-token", "resource=pod%2Fweb-1&namespace=demo&to=deploy%2Fdb&limit=1").await.unwrap();
    assert_eq!(got.len(), 3, "{got:?}");
    let observed = setup.observed.lock().clone();
    let mut destinations = Vec::new();
    destination_masks(observed[0].r#match.as_ref().unwrap(), &mut destinations);
    let expected: Vec<(std::net::IpAddr, u32)> =
        vec![("10.96.0.30".parse().unwrap(), 32), ("10.9.9.9".parse().unwrap(), 32)];
    assert_eq!(destinations, expected, "the Service's ClusterIP and the pod's address");
}

/// Every destination netmask in a match tree, in order.
fn destination_masks(m: &Match, out: &mut Vec<(std::net::IpAddr, u32)>) {
    match &m.r#match {
        Some(mm::Match::All(seq) | mm::Match::Any(seq)) => seq.matches.iter().for_each(|m| destination_masks(m, out)),
        Some(mm::Match::Not(m)) => destination_masks(m, out),
        Some(mm::Match::Destination(mm::Tcp { r#match: Some(mm::tcp::Match::Netmask(n)) })) => {
            out.push((std::net::IpAddr::try_from(n.ip.unwrap()).unwrap(), n.mask));
        }
        _ => {}
    }
}
