//! The request path, branch by branch, in process: the client is a hyper client on an
//! in-memory pipe served by [`HttpProxy::handle`]; the upstream a hyper server on loopback;
//! policies are fixed (no control plane). What happened is read from the proxy's metrics and
//! the app's own counts, never from timing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioExecutor;
use linkerd2_proxy_api::destination::WeightedAddr;
use linkerd2_proxy_api::http_route as api_http;
use linkerd2_proxy_api::meta;
use linkerd2_proxy_api::outbound::{self as api, backend, http_route, proxy_protocol};
use tokio::net::TcpListener;

use http::header::HOST;
use http::{HeaderValue, Version};
use hyper_util::rt::TokioIo;

use super::*;
use crate::app::config::Config;
use crate::client::discovery::{Endpoint, Endpoints};
use crate::client::target::Route;
use crate::outbound::http::tests::grpc_fault;
use crate::outbound::policy::discover::PolicyWatch;
use crate::outbound::policy::model::OutboundPolicy;
use crate::serve::drain::Drain;
use crate::serve::metrics::{Metrics, TargetCluster};
use crate::transport::identity::Identity;
use crate::transport::labels::{DstKind, TcpLabels};

/// A target carrying `policy`, as the outbound side attaches it.
fn with_policy(route: Route, policy: Option<PolicyWatch>) -> Arc<Target> {
    let mut extensions = http::Extensions::new();
    if let Some(policy) = policy {
        extensions.insert(policy);
    }
    Target::with_extensions(route, extensions)
}

/// An app on loopback (HTTP/1 and h2c): `/ok` answers 200, `/fail` 503, `/slow` after 5 s,
/// `/grpc-unavailable` a trailers-only gRPC UNAVAILABLE, `/upgrade` switches protocols. It
/// counts the requests it got.
async fn app() -> (SocketAddr, Arc<AtomicUsize>) {
    app_taking(Duration::ZERO).await
}

/// [`app`], answering `/ok` after `delay`.
async fn app_taking(delay: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((io, _)) = listener.accept().await else { return };
            let hits = counted.clone();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                hits.fetch_add(1, Ordering::SeqCst);
                async move {
                    let mut res = Response::new(Full::new(Bytes::from_static(b"app")));
                    match req.uri().path() {
                        "/fail" => *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE,
                        "/slow" => tokio::time::sleep(Duration::from_secs(5)).await,
                        "/grpc-unavailable" => {
                            res.headers_mut().insert("content-type", HeaderValue::from_static("application/grpc"));
                            res.headers_mut().insert("grpc-status", HeaderValue::from_static("14"));
                        }
                        "/ok" if !delay.is_zero() => tokio::time::sleep(delay).await,
                        "/upgrade" => {
                            *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                            res.headers_mut().insert("connection", HeaderValue::from_static("upgrade"));
                            res.headers_mut().insert("upgrade", HeaderValue::from_static("echo"));
                        }
                        _ => {}
                    }
                    Ok::<_, Infallible>(res)
                }
            });
            tokio::spawn(async move {
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = builder.serve_connection_with_upgrades(TokioIo::new(io), svc).await;
            });
        }
    });
    (addr, hits)
}

fn shared() -> Arc<Shared> {
    Arc::new(Shared::new(Config::default(), Arc::new(Metrics::default()), Drain::default(), None, None))
}

/// The proxy of one outbound connection to `addr` whose target is `target`.
fn proxy(shared: &Arc<Shared>, addr: SocketAddr, target: Arc<Target>) -> Arc<HttpProxy> {
    let tls = target.tls.clone();
    let labels = TcpLabels {
        direction: Direction::outbound,
        target_addr: addr.to_string(),
        dst_kind: DstKind::Mesh,
        target_cluster: Default::default(),
        tls: tls.clone(),
    };
    let open = OpenConnection::open(shared.metrics.clone(), labels);
    let peer = "10.0.0.9:40000".parse().unwrap();
    Arc::new(HttpProxy::new(Direction::outbound, peer, addr, target, tls, open, shared.clone()))
}

/// A plaintext target straight to `addr`, optionally under `policy`.
fn fixed(addr: SocketAddr, policy: Option<api::OutboundPolicy>) -> Arc<Target> {
    let policy = policy.map(|p| PolicyWatch::fixed(Arc::new(OutboundPolicy::from_api(p).unwrap())));
    with_policy(Route::fixed(addr, None, Duration::from_secs(1)), policy)
}

/// `req` sent through `proxy` on a client connection of its own (HTTP/2 when the request
/// is): the status, headers and body the client got.
async fn send(proxy: Arc<HttpProxy>, req: Request<Full<Bytes>>) -> (StatusCode, http::HeaderMap, Bytes) {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let svc = hyper::service::service_fn(move |req| proxy.clone().handle(req));
    let res = if req.version() == Version::HTTP_2 {
        let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        tokio::spawn(async move { builder.serve_connection(TokioIo::new(server), svc).await });
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(client)).await.unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    } else {
        let builder = hyper::server::conn::http1::Builder::new();
        tokio::spawn(async move { builder.serve_connection(TokioIo::new(server), svc).with_upgrades().await });
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client)).await.unwrap();
        tokio::spawn(conn.with_upgrades());
        sender.send_request(req).await.unwrap()
    };
    let (parts, body) = res.into_parts();
    let body = if parts.status == StatusCode::SWITCHING_PROTOCOLS {
        Bytes::new()
    } else {
        body.collect().await.unwrap().to_bytes()
    };
    (parts.status, parts.headers, body)
}

fn get(path: &str) -> Request<Full<Bytes>> {
    Request::get(path).header(HOST, "web.shop.svc.cluster.local").body(Full::default()).unwrap()
}

/// The sum of the samples of `name` whose labels contain every one of `labels`.
fn metric(shared: &Shared, name: &str, labels: &[&str]) -> u64 {
    let text = shared.metrics.encode();
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn named(name: &str) -> Option<meta::Metadata> {
    Some(meta::Metadata { kind: Some(meta::metadata::Kind::Default(name.into())) })
}

/// The Service `web`'s policy (its parent), with `kind` as its protocol and routes.
fn policy(kind: proxy_protocol::Kind) -> api::OutboundPolicy {
    api::OutboundPolicy { metadata: named("web"), protocol: Some(api::ProxyProtocol { kind: Some(kind) }) }
}

/// A backend: the fixed address `addr`, or (`None`) the parent Service `web` itself.
fn backend(addr: Option<SocketAddr>) -> api::Backend {
    let kind = match addr {
        Some(addr) => backend::Kind::Forward(WeightedAddr { addr: Some(addr.into()), ..Default::default() }),
        None => backend::Kind::Balancer(backend::BalanceP2c {
            discovery: Some(backend::EndpointDiscovery {
                kind: Some(backend::endpoint_discovery::Kind::Dst(backend::endpoint_discovery::DestinationGet {
                    path: "web.shop.svc.cluster.local:80".into(),
                })),
            }),
            load: None,
        }),
    };
    api::Backend { metadata: named("web"), queue: None, kind: Some(kind) }
}

/// An HTTP/1 route of one rule to `to` (see [`backend`]), with a request timeout and
/// retries of 5xx as given.
fn http_route(to: Option<SocketAddr>, timeout: Option<Duration>, retries: Option<u32>) -> api::OutboundPolicy {
    let backends = http_route::Distribution {
        kind: Some(http_route::distribution::Kind::FirstAvailable(http_route::distribution::FirstAvailable {
            backends: vec![http_route::RouteBackend { backend: Some(backend(to)), ..Default::default() }],
        })),
    };
    let retry = retries.map(|max_retries| http_route::Retry {
        max_retries,
        max_request_bytes: 64 * 1024,
        conditions: Some(http_route::retry::Conditions {
            status_ranges: vec![http_route::retry::conditions::StatusRange { start: 500, end: 599 }],
        }),
        timeout: None,
        backoff: None,
    });
    let timeouts = timeout.map(|t| api_http::Timeouts { request: Some(t.try_into().unwrap()), ..Default::default() });
    let rule = http_route::Rule { backends: Some(backends), timeouts, retry, ..Default::default() };
    let route = api::HttpRoute { metadata: named("web-route"), hosts: Vec::new(), rules: vec![rule] };
    policy(proxy_protocol::Kind::Http1(proxy_protocol::Http1 { routes: vec![route], failure_accrual: None }))
}

fn grpc_call() -> Request<Full<Bytes>> {
    Request::post("http://web.shop.svc.cluster.local/pkg.Svc/Call")
        .version(Version::HTTP_2)
        .header("content-type", "application/grpc")
        .body(Full::default())
        .unwrap()
}

#[tokio::test]
async fn a_request_without_routes_goes_to_its_original_destination_and_counts_as_a_success() {
    let (app, hits) = app().await;
    let shared = shared();
    let (status, _, body) = send(proxy(&shared, app, fixed(app, None)), get("/ok")).await;
    assert_eq!((status, &body[..], hits.load(Ordering::SeqCst)), (StatusCode::OK, &b"app"[..], 1));
    assert_eq!(metric(&shared, "response_total", &["classification=\"success\"", "status_code=\"200\""]), 1);
}

#[tokio::test]
async fn an_upstream_5xx_is_passed_through_and_counts_as_a_failure() {
    let (app, _) = app().await;
    let shared = shared();
    let (status, headers, _) = send(proxy(&shared, app, fixed(app, None)), get("/fail")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!headers.contains_key("cnimesh-proxy-error"), "the app's answer, not the proxy's");
    assert_eq!(metric(&shared, "response_total", &["classification=\"failure\"", "status_code=\"503\""]), 1);
}

#[tokio::test]
async fn an_upstream_trailers_only_grpc_error_counts_as_a_failure() {
    let (app, _) = app().await;
    let shared = shared();
    let mut call = grpc_call();
    *call.uri_mut() = "http://web.shop.svc.cluster.local/grpc-unavailable".parse().unwrap();
    let (status, headers, _) = send(proxy(&shared, app, fixed(app, None)), call).await;
    assert_eq!((status, &headers["grpc-status"]), (StatusCode::OK, &HeaderValue::from_static("14")));
    assert_eq!(metric(&shared, "response_total", &["classification=\"failure\"", "status_code=\"200\""]), 1);
}

#[tokio::test]
async fn a_refused_connection_is_answered_502_naming_the_upstream() {
    // A port nobody listens on: bound, then closed.
    let gone = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let shared = shared();
    let (status, headers, _) = send(proxy(&shared, gone, fixed(gone, None)), get("/ok")).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(headers["cnimesh-proxy-error"], format!("upstream {gone} refused the connection"));
    assert_eq!(metric(&shared, "response_total", &["classification=\"failure\"", "status_code=\"502\""]), 1);
}

#[tokio::test]
async fn a_service_without_endpoints_is_answered_503() {
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(Endpoints {
        list: Vec::new(),
        known: true,
        exists: true,
        ..Default::default()
    }));
    let target = Target::new(Route::balanced("web.shop.svc.cluster.local:80".into(), rx, None, Duration::from_secs(1)));
    let addr = "10.96.0.10:80".parse().unwrap();
    let (status, headers, _) = send(proxy(&shared(), addr, target), get("/ok")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["cnimesh-proxy-error"], "service web.shop.svc.cluster.local:80 has no endpoints");
}

#[tokio::test]
async fn a_request_on_a_route_goes_to_the_routes_backend() {
    let (app, hits) = app().await;
    let elsewhere = "10.96.0.10:80".parse().unwrap();
    let shared = shared();
    let target = fixed(elsewhere, Some(http_route(Some(app), None, None)));
    let (status, _, _) = send(proxy(&shared, elsewhere, target), get("/ok")).await;
    assert_eq!((status, hits.load(Ordering::SeqCst)), (StatusCode::OK, 1));
    assert_eq!(metric(&shared, "outbound_http_route_backend_requests_total", &[]), 1);
    assert_eq!(
        metric(
            &shared,
            "outbound_http_route_request_statuses_total",
            &["route_name=\"web-route\"", "http_status=\"200\"", "error=\"\""]
        ),
        1
    );
}

#[tokio::test]
async fn a_route_timeout_is_answered_504_naming_the_route() {
    let (app, _) = app().await;
    let target = fixed(app, Some(http_route(Some(app), Some(Duration::from_millis(100)), None)));
    let (status, headers, _) = send(proxy(&shared(), app, target), get("/slow")).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(headers["cnimesh-proxy-error"], "request timed out after 100 ms on route web-route");
}

/// The proxy's own answer on a route is counted with its status and `error="PROXY"`: the
/// dashboard's per-route success counts it as a failure.
#[tokio::test]
async fn a_routes_statuses_say_which_answers_the_proxy_made() {
    let (app, _) = app().await;
    let shared = shared();
    let target = fixed(app, Some(http_route(Some(app), Some(Duration::from_millis(100)), None)));
    let (status, _, _) = send(proxy(&shared, app, target), get("/slow")).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    let labels = ["route_name=\"web-route\"", "http_status=\"504\"", "error=\"PROXY\""];
    assert_eq!(
        metric(&shared, "outbound_http_route_request_statuses_total", &labels),
        1,
        "{}",
        shared.metrics.encode()
    );
}

#[tokio::test]
async fn a_route_with_retries_sends_a_failed_request_again_up_to_its_limit() {
    let (app, hits) = app().await;
    let shared = shared();
    let target = fixed(app, Some(http_route(Some(app), None, Some(2))));
    let (status, _, _) = send(proxy(&shared, app, target), get("/fail")).await;
    assert_eq!((status, hits.load(Ordering::SeqCst)), (StatusCode::SERVICE_UNAVAILABLE, 3), "1 + 2 retries");
    assert_eq!(metric(&shared, "outbound_http_route_retry_requests_total", &[]), 2);
}

/// On a paused clock (nothing waits but the proxy's timers): each retry waits its backoff, the
/// rule's minimum doubling up to its maximum, and the request waits nothing else.
#[tokio::test(start_paused = true)]
async fn retries_wait_the_rules_backoff_doubling_from_its_minimum_up_to_its_maximum() {
    let (app, hits) = app().await;
    let mut policy = http_route(Some(app), None, Some(3));
    let Some(api::proxy_protocol::Kind::Http1(http1)) = policy.protocol.as_mut().and_then(|p| p.kind.as_mut()) else {
        unreachable!("http_route makes an HTTP/1 policy")
    };
    let retry = http1.routes[0].rules[0].retry.as_mut().unwrap();
    retry.backoff = Some(api::ExponentialBackoff {
        min_backoff: Some(Duration::from_millis(10).try_into().unwrap()),
        max_backoff: Some(Duration::from_millis(30).try_into().unwrap()),
        jitter_ratio: 0.0,
        ..Default::default()
    });
    let target = fixed(app, Some(policy));
    let started = tokio::time::Instant::now();
    let (status, _, _) = send(proxy(&shared(), app, target), get("/fail")).await;
    assert_eq!((status, hits.load(Ordering::SeqCst)), (StatusCode::SERVICE_UNAVAILABLE, 4), "1 + 3 retries");
    assert_eq!(started.elapsed(), Duration::from_millis(10 + 20 + 30), "waits of 10, 20 and 30 (not 40) ms");
}

#[tokio::test]
async fn a_route_without_retries_sends_a_failed_request_once() {
    let (app, hits) = app().await;
    let target = fixed(app, Some(http_route(Some(app), None, None)));
    let (status, _, _) = send(proxy(&shared(), app, target), get("/fail")).await;
    assert_eq!((status, hits.load(Ordering::SeqCst)), (StatusCode::SERVICE_UNAVAILABLE, 1));
}

/// A proxy whose identity has no certificate yet, and a service whose one endpoint is meshed.
fn meshed_service_without_a_certificate(policy: api::OutboundPolicy) -> Arc<Target> {
    let identity = Identity::without_certificate("client.shop.serviceaccount.identity.cnimesh.cluster.local");
    let endpoint = Endpoint {
        addr: "10.0.0.7:80".parse().unwrap(),
        identity: Some("web.shop.serviceaccount.identity.cnimesh.cluster.local".parse().unwrap()),
        gateway: None,
        target_cluster: None,
        opaque: false,
        stats: Arc::default(),
    };
    let endpoints = Endpoints { list: vec![Arc::new(endpoint)], known: true, exists: true, ..Default::default() };
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(endpoints));
    let route =
        Route::balanced("web.shop.svc.cluster.local:80".into(), rx, Some(Arc::new(identity)), Duration::from_secs(1));
    let policy = PolicyWatch::fixed(Arc::new(OutboundPolicy::from_api(policy).unwrap()));
    with_policy(route, Some(policy))
}

#[tokio::test]
async fn the_proxys_own_no_identity_502_is_not_retried_nor_charged_to_the_retry_budget() {
    let shared = shared();
    let addr = "10.96.0.10:80".parse().unwrap();
    // The route's backend is the parent Service itself: the connection's own target.
    let target = meshed_service_without_a_certificate(http_route(None, None, Some(2)));
    let (status, headers, _) = send(proxy(&shared, addr, target), get("/ok")).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "the same answer as before");
    assert_eq!(headers["cnimesh-proxy-error"], "no certificate yet for mTLS to a meshed endpoint");
    let retried = metric(&shared, "outbound_http_route_retry_requests_total", &[]);
    let overflow = metric(&shared, "outbound_http_route_retry_overflow_total", &[]);
    assert_eq!((retried, overflow), (0, 0), "no attempt again, nothing withdrawn from the budget");
}

#[tokio::test]
async fn a_grpc_error_a_grpc_route_injects_in_an_http_200_counts_as_a_failure() {
    let (app, hits) = app().await;
    let shared = shared();
    let target = fixed(app, Some(grpc_fault(app)));
    let (status, headers, _) = send(proxy(&shared, app, target), grpc_call()).await;
    assert_eq!((status, &headers["grpc-status"]), (StatusCode::OK, &HeaderValue::from_static("14")));
    assert_eq!(hits.load(Ordering::SeqCst), 0, "answered by the proxy");
    let failures = metric(&shared, "response_total", &["classification=\"failure\"", "status_code=\"200\""]);
    let successes = metric(&shared, "response_total", &["classification=\"success\""]);
    assert_eq!((failures, successes), (1, 0));
}

#[tokio::test]
async fn an_upgrade_is_spliced_on_a_connection_of_its_own() {
    let (app, hits) = app().await;
    let req = Request::get("/upgrade")
        .header(HOST, "web")
        .header("connection", "upgrade")
        .header("upgrade", "echo")
        .body(Full::default())
        .unwrap();
    let (status, headers, _) = send(proxy(&shared(), app, fixed(app, None)), req).await;
    assert_eq!((status, &headers["upgrade"]), (StatusCode::SWITCHING_PROTOCOLS, &HeaderValue::from_static("echo")));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_invalid_l5d_orig_proto_from_a_peer_proxy_is_answered_400() {
    let (app, hits) = app().await;
    let shared = shared();
    let labels = TcpLabels {
        direction: Direction::inbound,
        target_addr: app.to_string(),
        dst_kind: DstKind::Mesh,
        target_cluster: Default::default(),
        tls: TlsLabel::plaintext(),
    };
    let open = OpenConnection::open(shared.metrics.clone(), labels);
    let peer = "10.0.0.9:40000".parse().unwrap();
    let inbound =
        Arc::new(HttpProxy::new(Direction::inbound, peer, app, fixed(app, None), TlsLabel::plaintext(), open, shared));
    let mut req = grpc_call();
    req.headers_mut().insert("l5d-orig-proto", HeaderValue::from_static("HTTP/9"));
    let (status, headers, _) = send(inbound, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(headers["cnimesh-proxy-error"].to_str().unwrap().contains("l5d-orig-proto"));
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

/// A service's route balancing over `addrs`, each endpoint last heard from a minute ago (as on a
/// node where the service has been known for a while). The endpoints stay as they are: the
/// watch's sender is dropped.
fn known_for_a_minute(addrs: [SocketAddr; 2]) -> Route {
    let endpoint = |addr| {
        let stats = crate::client::discovery::Stats::last_observed(Duration::from_micros(300), Duration::from_secs(60));
        Arc::new(Endpoint {
            addr,
            identity: None,
            gateway: None,
            target_cluster: None,
            opaque: false,
            stats: Arc::new(stats),
        })
    };
    let endpoints = Endpoints { list: addrs.map(endpoint).to_vec(), known: true, exists: true, ..Default::default() };
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(endpoints));
    Route::balanced("web.shop.svc.cluster.local:80".into(), rx, None, Duration::from_secs(1))
}

/// How many of `requests` each of two endpoints of one service got, the requests sent one
/// after another with `pause` between them ([`known_for_a_minute`]).
async fn shares(
    a: (SocketAddr, Arc<AtomicUsize>),
    b: (SocketAddr, Arc<AtomicUsize>),
    requests: usize,
    pause: Duration,
) -> [usize; 2] {
    let target = Target::new(known_for_a_minute([a.0, b.0]));
    let shared = shared();
    let addr: SocketAddr = "10.96.0.10:80".parse().unwrap();
    let mut ticks = tokio::time::interval(pause.max(Duration::from_micros(1)));
    for _ in 0..requests {
        if !pause.is_zero() {
            ticks.tick().await;
        }
        let (status, _, body) = send(proxy(&shared, addr, target.clone()), get("/ok")).await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"app"[..]));
    }
    [a.1.load(Ordering::SeqCst), b.1.load(Ordering::SeqCst)]
}

#[tokio::test]
async fn equal_endpoints_share_back_to_back_requests() {
    let got = shares(app().await, app().await, 200, Duration::ZERO).await;
    println!("two equal endpoints, 200 requests back to back: {got:?}");
    assert!(got.iter().all(|n| (60..=140).contains(n)), "each gets 30-70 %: {got:?}");
}

/// How many of `requests` each of two endpoints of one service gets from the balancer when
/// they answer in `latency` (injected: each pick's load observes its answer after that much time
/// on a paused clock, nothing is sent), the requests `pause` apart ([`known_for_a_minute`]).
async fn shares_answering_in(latency: [Duration; 2], requests: usize, pause: Duration) -> [usize; 2] {
    let addrs: [SocketAddr; 2] = ["10.244.0.11:8080".parse().unwrap(), "10.244.0.12:8080".parse().unwrap()];
    let route = known_for_a_minute(addrs);
    let mut got = [0; 2];
    for _ in 0..requests {
        let picked = route.pick(None).unwrap();
        let i = addrs.iter().position(|a| *a == picked.upstream.addr).unwrap();
        got[i] += 1;
        tokio::time::advance(latency[i]).await;
        picked.load.as_ref().unwrap().observe();
        drop(picked);
        tokio::time::advance(pause).await;
    }
    got
}

#[tokio::test(start_paused = true)]
async fn equal_endpoints_share_requests_at_a_low_rate() {
    let got = shares_answering_in([Duration::from_millis(1); 2], 32, Duration::from_millis(250)).await;
    println!("two endpoints answering in 1 ms, 32 requests at 4 per second: {got:?}");
    assert!(got.iter().all(|n| (7..=25).contains(n)), "each gets over 20 %: {got:?}");
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_50_ms_slower_gets_markedly_less() {
    let latency = [Duration::from_millis(1), Duration::from_millis(51)];
    let got = shares_answering_in(latency, 200, Duration::ZERO).await;
    println!("an endpoint answering in 1 ms and one in 51 ms, 200 requests back to back: {got:?}");
    assert!(got[1] < 200 * 15 / 100, "the slow one gets under 15 %, an equal one 30-70 %: {got:?}");
    assert!(got[1] > 0, "the slow one is still tried now and then: {got:?}");
}

/// A gateway that could not be connected to is "unreachable"; one that took the connection and
/// then closed it without an answer "closed or refused the request": decided on the send error's
/// kind (a failed connect, an HTTP-level failure), never on its text.
#[tokio::test]
async fn a_gateway_is_called_unreachable_only_when_no_connection_to_it_was_made() {
    use crate::client::discovery::GatewayTarget;
    use crate::client::upstream::{SendError, Upstream};
    let mut upstream = Upstream::new("10.0.0.5:4143".parse().unwrap(), None, Duration::from_secs(1));
    upstream.gateway = GatewayTarget::parse("web.shop.svc.cluster.local:80").map(Arc::new);
    let refused = SendError::Connect(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused"));
    let why = super::exchange::gateway_error(&upstream, &refused).to_string();
    assert!(why.contains("multicluster gateway for web.shop.svc.cluster.local:80 unreachable"), "{why}");

    // Connected, then closed before any answer.
    let (client, server) = tokio::io::duplex(1024);
    drop(server);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client)).await.unwrap();
    tokio::spawn(conn);
    let closed = sender.send_request(get("/ok")).await.unwrap_err();
    let why = super::exchange::gateway_error(&upstream, &SendError::Http(closed)).to_string();
    assert!(why.contains("multicluster gateway for web.shop.svc.cluster.local:80 closed or refused"), "{why}");
    assert!(!why.contains("unreachable"), "{why}");

    // Not a gateway: the endpoint's own error, as it is.
    upstream.gateway = None;
    let why = super::exchange::gateway_error(&upstream, &refused).to_string();
    assert_eq!(why, "upstream 10.0.0.5:4143 refused the connection");
}

/// A federated Service's endpoints, one in this cluster (`local`, as Destination
/// labels a federated Service's own members) and one in `west`: each request is counted under
/// the cluster its endpoint is in, this cluster's without the label (as a plain Service's).
#[tokio::test]
async fn a_federated_services_requests_are_counted_under_the_cluster_each_one_went_to() {
    let (east, west) = (app().await, app().await);
    let endpoint = |addr, cluster: &str| {
        Arc::new(Endpoint {
            addr,
            identity: None,
            gateway: None,
            target_cluster: Some(cluster.into()),
            opaque: false,
            stats: Arc::default(),
        })
    };
    let list = vec![endpoint(east.0, "local"), endpoint(west.0, "west")];
    let spans_clusters = crate::client::target::spans_clusters(&list);
    assert!(spans_clusters);
    let endpoints = Endpoints { list, known: true, exists: true, spans_clusters, ..Default::default() };
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(endpoints));
    let route = Route::balanced("api-federated.shop.svc.cluster.local:80".into(), rx, None, Duration::from_secs(1));
    let target = Target::new(route);
    assert_eq!(target.cluster, TargetCluster(None), "a target spanning clusters has no label of its own");
    let shared = shared();
    let addr: SocketAddr = "10.96.0.11:80".parse().unwrap();
    for _ in 0..40 {
        let (status, _, _) = send(proxy(&shared, addr, target.clone()), get("/ok")).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (to_east, to_west) = (east.1.load(Ordering::SeqCst) as u64, west.1.load(Ordering::SeqCst) as u64);
    assert!(to_east > 0 && to_west > 0, "both members answered: east {to_east}, west {to_west}");
    let text = shared.metrics.encode();
    let west_label = "target_cluster_name=\"west\"";
    for family in ["request_total{", "response_total{", "response_latency_ms_count{"] {
        assert_eq!(metric(&shared, family, &[west_label]), to_west, "{family} to west:\n{text}");
        let unlabelled: u64 = text
            .lines()
            .filter(|l| {
                l.starts_with(family) && l.contains("direction=\"outbound\"") && !l.contains("target_cluster_name")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        assert_eq!(unlabelled, to_east, "{family} to this cluster's member carries no cluster:\n{text}");
    }
    assert!(!text.contains("target_cluster_name=\"local\""), "`local` is never a label value:\n{text}");
}
