//! Tap in-process: a proxy holding a certificate from a test CA serves its admin port on
//! loopback; requests go through [`cnimesh_proxy::serve::accept::connection`] both ways to an app on
//! loopback, and tonic clients with mesh certificates call `Tap/Observe` over mTLS on the admin
//! port. What a session saw is read from its events and the `tap_*` metrics, never from timing.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use cnimesh_identity::Name;
use cnimesh_identity::tls::CurrentCert;
use cnimesh_proxy::app::admin::Admin;
use cnimesh_proxy::app::config::{Config, IdentityConfig, TrustAnchors};
use cnimesh_proxy::serve::accept::connection;
use cnimesh_proxy::serve::drain::Drain;
use cnimesh_proxy::serve::metrics::{Direction, Metrics};
use cnimesh_proxy::serve::shared::Shared;
use cnimesh_proxy::serve::tap::TapListener;
use cnimesh_proxy::transport::identity::Identity;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use linkerd2_proxy_api::tap::observe_request::{self, Extract, r#match as pb};
use linkerd2_proxy_api::tap::tap_client::TapClient;
use linkerd2_proxy_api::tap::tap_event::{self, ProxyDirection, http::Event};
use linkerd2_proxy_api::tap::{ObserveRequest, TapEvent};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use support::FixedLevel;
use tokio::net::{TcpListener, TcpStream};
use tonic::Code;
use tonic::transport::Channel;

const PROXY: &str = "web.shop.serviceaccount.identity.cnimesh.cluster.local";
const CONTROL: &str = "cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local";
const INTRUDER: &str = "intruder.shop.serviceaccount.identity.cnimesh.cluster.local";

/// A test CA: its trust anchor and the issuer that signs mesh leaves.
struct Ca {
    anchor_pem: String,
    signer: cnimesh_identity::ca::Signer,
}

impl Ca {
    fn new() -> Self {
        let anchor = cnimesh_identity::ca::new_trust_anchor("cluster.local", Duration::from_secs(86400)).unwrap();
        let issuer = cnimesh_identity::ca::new_issuer(&anchor, "cluster.local", Duration::from_secs(86400)).unwrap();
        Self { anchor_pem: anchor.cert_pem, signer: cnimesh_identity::ca::Signer::new(&issuer).unwrap() }
    }

    /// A mesh leaf for `name` (server and client auth), as the Identity service issues them.
    fn leaf(&self, name: &str) -> Arc<CurrentCert> {
        let name: Name = name.parse().unwrap();
        let (key, _csr) = cnimesh_identity::ca::new_csr(&name).unwrap();
        let now = SystemTime::now();
        let leaf =
            self.signer.sign(&name, &key, now - Duration::from_secs(300), now + Duration::from_secs(3600)).unwrap();
        let chain = vec![leaf, self.signer.issuer_der.clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let current = Arc::new(CurrentCert::default());
        current.set(cnimesh_identity::tls::certified_key(chain, key).unwrap());
        current
    }

    fn roots(&self) -> Arc<rustls::RootCertStore> {
        cnimesh_identity::tls::roots(&cnimesh_identity::pem::certs(self.anchor_pem.as_bytes(), "anchor").unwrap())
            .unwrap()
    }
}

/// A proxy with an identity, its admin port on loopback (tap included unless `tap` is false),
/// and an HTTP/1 app on loopback.
struct Proxy {
    shared: Arc<Shared>,
    admin: SocketAddr,
    app: SocketAddr,
    /// `app` as the inbound's original destination (a pod address; loopback is refused).
    pod: SocketAddr,
}

async fn proxy(ca: &Ca, tap: bool) -> Proxy {
    let identity_config = IdentityConfig {
        name: PROXY.parse().unwrap(),
        trust_anchors: TrustAnchors::Pem(ca.anchor_pem.clone()),
        token_file: "/nonexistent".into(),
        control_addr: "control:4190".into(),
        control_name: CONTROL.parse().unwrap(),
        max_backoff: Duration::from_secs(30),
        external: None,
    };
    let identity = Arc::new(Identity::new(&identity_config).unwrap());
    identity.cert.set(ca.leaf(PROXY).get().unwrap());
    let config =
        Config { identity: Some(identity_config), tap_identities: vec![CONTROL.parse().unwrap()], ..Config::default() };
    let metrics = Arc::new(Metrics::default());
    let shared = Arc::new(Shared::new(config.clone(), metrics.clone(), Drain::default(), Some(identity.clone()), None));
    let listener = tap.then(|| {
        TapListener::start(&identity, config.tap_identities.clone(), shared.taps.clone(), metrics.clone()).unwrap()
    });
    let admin = Arc::new(Admin {
        tap: listener,
        metrics,
        ready: true.into(),
        log: Box::new(FixedLevel),
        drain: Drain::default(),
        identity: Some(identity),
        config,
        env: Vec::new(),
        discovery: None,
        policies: None,
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(admin.serve(listener));
    let app = app().await;
    let pod = support::pod_addr_for(&shared, app);
    Proxy { shared, admin: addr, app, pod }
}

/// An HTTP/1 app answering `hello <path>`.
async fn app() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!("hello {}", req.uri().path())))))
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

impl Proxy {
    /// `GET path` through the proxy in `direction` (a fresh captured connection each time).
    async fn get(&self, direction: Direction, path: &str) -> u16 {
        let (client, proxy_side) = tokio::io::duplex(64 * 1024);
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let to = match direction {
            Direction::inbound => self.pod,
            Direction::outbound => self.app,
        };
        tokio::spawn(connection(proxy_side, peer, to, direction, self.shared.clone()));
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client)).await.unwrap();
        tokio::spawn(conn);
        let req = Request::get(path).header("host", "web.shop.svc.cluster.local").body(Empty::<Bytes>::new()).unwrap();
        let res = sender.send_request(req).await.unwrap();
        let status = res.status().as_u16();
        res.into_body().collect().await.unwrap();
        status
    }

    fn metric(&self, name: &str) -> f64 {
        let text = self.shared.metrics.encode();
        text.lines().find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok()).unwrap_or(0.0)
    }

    /// A tap client to the admin port presenting a certificate for `identity`.
    async fn tap_client(&self, ca: &Ca, identity: &str) -> Result<TapClient<Channel>, tonic::transport::Error> {
        let config = cnimesh_identity::tls::client_config(ca.roots(), Some(ca.leaf(identity)), &[b"h2"]).unwrap();
        let connector = tokio_rustls::TlsConnector::from(config);
        let addr = self.admin;
        // HTTP/2's smallest windows, so that a client that stops reading is soon felt by the proxy.
        let channel = tonic::transport::Endpoint::from_static("http://proxy")
            .initial_stream_window_size(65_535)
            .initial_connection_window_size(65_535)
            .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                let connector = connector.clone();
                async move {
                    let tcp = TcpStream::connect(addr).await?;
                    let tls = connector.connect(ServerName::try_from(PROXY).unwrap(), tcp).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(tls))
                }
            }))
            .await?;
        Ok(TapClient::new(channel))
    }
}

fn everything() -> Option<observe_request::Match> {
    Some(observe_request::Match { r#match: Some(pb::Match::All(pb::Seq::default())) })
}

fn path_prefix(prefix: &str) -> Option<observe_request::Match> {
    let path = pb::http::StringMatch { r#match: Some(pb::http::string_match::Match::Prefix(prefix.into())) };
    Some(observe_request::Match {
        r#match: Some(pb::Match::Http(pb::Http { r#match: Some(pb::http::Match::Path(path)) })),
    })
}

fn observe(limit: u32, r#match: Option<observe_request::Match>) -> ObserveRequest {
    ObserveRequest { limit, r#match, extract: None }
}

fn http(e: &TapEvent) -> &Event {
    match &e.event {
        Some(tap_event::Event::Http(h)) => h.event.as_ref().unwrap(),
        None => panic!("an event without HTTP: {e:?}"),
    }
}

/// Every event of a stream until it ends.
async fn all_events(stream: &mut tonic::Streaming<TapEvent>) -> Vec<TapEvent> {
    let mut events = Vec::new();
    while let Some(e) = stream.message().await.unwrap() {
        events.push(e);
    }
    events
}

/// Polls until `check` holds (bounded).
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test]
async fn the_control_plane_sees_both_directions_with_status_and_latency() {
    let ca = Ca::new();
    let proxy = proxy(&ca, true).await;
    let mut client = proxy.tap_client(&ca, CONTROL).await.unwrap();
    let mut request = observe(2, everything());
    request.extract = Some(Extract {
        extract: Some(observe_request::extract::Extract::Http(observe_request::extract::Http {
            extract: Some(observe_request::extract::http::Extract::Headers(Default::default())),
        })),
    });
    let mut stream = client.observe(request).await.unwrap().into_inner();
    assert_eq!(proxy.metric("tap_sessions_open"), 1.0);

    assert_eq!(proxy.get(Direction::outbound, "/out").await, 200);
    assert_eq!(proxy.get(Direction::inbound, "/in").await, 200);
    let events = all_events(&mut stream).await;
    assert_eq!(events.len(), 6, "init, response, end for each request: {events:#?}");
    for (request, direction, path) in
        [(&events[..3], ProxyDirection::Outbound, "/out"), (&events[3..], ProxyDirection::Inbound, "/in")]
    {
        assert!(request.iter().all(|e| e.proxy_direction == direction as i32), "{request:#?}");
        let Event::RequestInit(init) = http(&request[0]) else { panic!("{request:#?}") };
        assert_eq!((init.path.as_str(), init.authority.as_str()), (path, "web.shop.svc.cluster.local"));
        assert_eq!(init.method, Some(http::Method::GET.into()));
        let headers = init.headers.as_ref().expect("headers were asked for");
        assert!(headers.headers.iter().any(|h| h.name == "host"), "{headers:?}");
        let Event::ResponseInit(rsp) = http(&request[1]) else { panic!("{request:#?}") };
        assert_eq!(rsp.http_status, 200);
        assert!(rsp.since_request_init.is_some());
        let Event::ResponseEnd(end) = http(&request[2]) else { panic!("{request:#?}") };
        assert!(end.since_request_init.is_some() && end.since_response_init.is_some(), "{end:?}");
        assert_eq!(end.response_bytes, format!("hello {path}").len() as u64);
        assert_eq!(init.id, rsp.id);
        assert_eq!(init.id, end.id);
        let source = request[0].source.unwrap();
        assert_eq!(SocketAddr::try_from(source).unwrap().port(), 40000);
        let destination = SocketAddr::try_from(request[0].destination.unwrap()).unwrap();
        let expected = if direction == ProxyDirection::Inbound { proxy.pod } else { proxy.app };
        assert_eq!(destination, expected);
    }
    let outbound = &events[0];
    assert_eq!(outbound.source_meta.as_ref().unwrap().labels["tls"], "loopback");
    assert_eq!(outbound.destination_meta.as_ref().unwrap().labels["tls"], "not_provided_by_service_discovery");
    let inbound = &events[3];
    assert_eq!(inbound.source_meta.as_ref().unwrap().labels["tls"], "no_tls_from_remote");
    // The session ended at its limit: closed, and further requests record nothing.
    eventually("the session closes", || proxy.metric("tap_sessions_open") == 0.0).await;
    assert_eq!(proxy.get(Direction::outbound, "/after").await, 200);
    assert_eq!(proxy.metric("tap_events_sent_total"), 6.0);
}

#[tokio::test]
async fn another_identity_is_denied_and_plain_http_still_serves_metrics_on_the_same_port() {
    let ca = Ca::new();
    let proxy = proxy(&ca, true).await;
    let mut intruder = proxy.tap_client(&ca, INTRUDER).await.unwrap();
    let denied = intruder.observe(observe(10, everything())).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(denied.message().contains(INTRUDER), "{denied:?}");
    assert_eq!(proxy.metric("tap_denied_total"), 1.0);
    assert_eq!(proxy.metric("tap_sessions_open"), 0.0);
    assert_eq!(proxy.get(Direction::outbound, "/x").await, 200);
    assert_eq!(proxy.metric("tap_events_sent_total"), 0.0, "no event left");

    // Prometheus' scrape on the same port: plain HTTP, as before tap.
    let tcp = TcpStream::connect(proxy.admin).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(conn);
    let req = Request::get("/metrics").header("host", "admin").body(Empty::<Bytes>::new()).unwrap();
    let res = sender.send_request(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let text = String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(text.contains("tap_denied_total 1"), "{text}");
}

#[tokio::test]
async fn a_proxy_without_tap_refuses_tls_on_the_admin_port() {
    let ca = Ca::new();
    let proxy = proxy(&ca, false).await;
    assert!(proxy.tap_client(&ca, CONTROL).await.is_err(), "the handshake cannot complete");
    assert_eq!(proxy.get(Direction::outbound, "/x").await, 200);
}

#[tokio::test]
async fn matches_limits_and_invalid_requests() {
    let ca = Ca::new();
    let proxy = proxy(&ca, true).await;
    let mut client = proxy.tap_client(&ca, CONTROL).await.unwrap();
    for (bad, why) in [
        (observe(0, everything()), "limit must be positive"),
        (observe(1, None), "invalid match"),
        (observe(1, Some(observe_request::Match { r#match: Some(pb::Match::Not(Box::default())) })), "invalid match"),
    ] {
        let e = client.observe(bad).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(why), "{e:?}");
    }
    assert_eq!(proxy.metric("tap_sessions_open"), 0.0);

    // One session matches nothing that is sent; the other takes one request of three.
    let excluded = client.observe(observe(5, path_prefix("/nope"))).await.unwrap().into_inner();
    let mut one = client.observe(observe(1, path_prefix("/a"))).await.unwrap().into_inner();
    for path in ["/a/1", "/a/2", "/b"] {
        assert_eq!(proxy.get(Direction::outbound, path).await, 200);
    }
    let events = all_events(&mut one).await;
    assert_eq!(events.len(), 3, "{events:#?}");
    let Event::RequestInit(init) = http(&events[0]) else { panic!("{events:#?}") };
    assert_eq!(init.path, "/a/1");
    assert_eq!(proxy.metric("tap_events_sent_total"), 3.0, "the excluding session got nothing");
    assert_eq!(proxy.metric("tap_sessions_open"), 1.0);

    // The client goes away: its session closes with it.
    drop(excluded);
    drop(client);
    eventually("the session closes", || proxy.metric("tap_sessions_open") == 0.0).await;
}

#[tokio::test]
async fn a_client_that_does_not_read_loses_events_and_never_slows_requests() {
    let ca = Ca::new();
    let proxy = proxy(&ca, true).await;
    let mut client = proxy.tap_client(&ca, CONTROL).await.unwrap();
    let _unread = client.observe(observe(100_000, everything())).await.unwrap().into_inner();
    let (client_io, proxy_side) = tokio::io::duplex(64 * 1024);
    let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    tokio::spawn(connection(proxy_side, peer, proxy.app, Direction::outbound, proxy.shared.clone()));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client_io)).await.unwrap();
    tokio::spawn(conn);
    let mut n = 0;
    while proxy.metric("tap_events_dropped_total") == 0.0 {
        assert!(n < 5000, "no event was ever dropped");
        let req = Request::get("/load").header("host", "web").body(Empty::<Bytes>::new()).unwrap();
        let res = sender.send_request(req).await.unwrap();
        assert_eq!(res.status(), 200);
        res.into_body().collect().await.unwrap();
        n += 1;
    }
    assert_eq!(proxy.metric("tap_sessions_open"), 1.0);
}
