//! Outbound policy in-process: a mock `OutboundPolicies` server on loopback answers for the
//! destinations of captured connections driven through [`cnimesh_proxy::serve::accept::connection`],
//! and the protocol it declares decides how the proxy serves them. What decided is read from
//! `connection_protocol_total{decided_by}`, never from timing.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use cnimesh_proxy::app::config::Config;
use cnimesh_proxy::outbound::policy::discover::OutboundPolicies as Discover;
use cnimesh_proxy::serve::accept::connection;
use cnimesh_proxy::serve::drain::Drain;
use cnimesh_proxy::serve::metrics::{Direction, Metrics};
use cnimesh_proxy::serve::shared::Shared;
use linkerd2_proxy_api::meta;
use linkerd2_proxy_api::outbound::outbound_policies_server::{OutboundPolicies, OutboundPoliciesServer};
use linkerd2_proxy_api::outbound::{OutboundPolicy, ProxyProtocol, TrafficSpec, proxy_protocol};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

const BANNER: &[u8] = b"220 db ready\r\n";

/// What the mock control plane says now.
#[derive(Clone)]
enum Says {
    Policy(Box<OutboundPolicy>),
    /// Not a target it knows.
    NotFound,
    /// Gone: open streams fail, new ones are refused.
    Down,
}

struct Mock(watch::Receiver<Says>);

#[tonic::async_trait]
impl OutboundPolicies for Mock {
    type WatchStream = Pin<Box<dyn Stream<Item = Result<OutboundPolicy, Status>> + Send>>;

    async fn get(&self, _: Request<TrafficSpec>) -> Result<Response<OutboundPolicy>, Status> {
        Err(Status::unimplemented("the proxy watches"))
    }

    async fn watch(&self, _: Request<TrafficSpec>) -> Result<Response<Self::WatchStream>, Status> {
        match &*self.0.borrow() {
            Says::NotFound => return Err(Status::not_found("not a Service")),
            Says::Down => return Err(Status::unavailable("down")),
            Says::Policy(_) => {}
        }
        let answers = tokio_stream::wrappers::WatchStream::new(self.0.clone()).filter_map(|says| match says {
            Says::Policy(p) => Some(Ok(*p)),
            Says::Down => Some(Err(Status::unavailable("down"))),
            Says::NotFound => None,
        });
        Ok(Response::new(Box::pin(answers)))
    }
}

/// The mock on loopback, and the proxy's shared state discovering policies from it.
async fn proxy_with_control(says: Says, config: Config) -> (Arc<Shared>, watch::Sender<Says>) {
    let (tx, rx) = watch::channel(says);
    let incoming = tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = incoming.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(OutboundPoliciesServer::new(Mock(rx)))
            .serve_with_incoming(incoming),
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
    let metrics = Arc::new(Metrics::default());
    let streams = &metrics.control_streams;
    let discover =
        Discover::new(channel, "shop:client-0".into(), Duration::from_secs(5), Duration::from_millis(50), streams);
    let mut shared = Shared::new(config, metrics, Drain::default(), None, None);
    shared.outbound.policies = Some(Arc::new(discover));
    (Arc::new(shared), tx)
}

fn policy(kind: proxy_protocol::Kind) -> Says {
    Says::Policy(Box::new(OutboundPolicy {
        protocol: Some(ProxyProtocol { kind: Some(kind) }),
        metadata: Some(meta::Metadata { kind: Some(meta::metadata::Kind::Default("db".into())) }),
    }))
}

fn opaque() -> Says {
    policy(proxy_protocol::Kind::Opaque(proxy_protocol::Opaque::default()))
}

fn detect() -> Says {
    let timeout = Duration::from_secs(10).try_into().unwrap();
    policy(proxy_protocol::Kind::Detect(proxy_protocol::Detect { timeout: Some(timeout), ..Default::default() }))
}

/// A server-speaks-first app: greets every connection, then waits for the client to leave.
async fn banner_app() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                s.write_all(BANNER).await.unwrap();
                let _ = s.read(&mut [0u8; 16]).await;
            });
        }
    });
    addr
}

/// A captured outbound connection to `addr`, served in the background; the client's end.
fn captured(shared: &Arc<Shared>, addr: SocketAddr) -> DuplexStream {
    let (client, proxy_side) = tokio::io::duplex(64 * 1024);
    let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    tokio::spawn(connection(proxy_side, peer, addr, Direction::outbound, shared.clone()));
    client
}

/// A client that only listens: what the app greets it with.
async fn greeting(shared: &Arc<Shared>, addr: SocketAddr) -> Vec<u8> {
    let mut io = captured(shared, addr);
    let mut got = vec![0u8; BANNER.len()];
    io.read_exact(&mut got).await.unwrap();
    got
}

/// A client that speaks first, binary bytes (opaque to detection at once): what the app greets
/// it with.
async fn greeting_after_binary(shared: &Arc<Shared>, addr: SocketAddr) -> Vec<u8> {
    let mut io = captured(shared, addr);
    io.write_all(b"\x00hello").await.unwrap();
    let mut got = vec![0u8; BANNER.len()];
    io.read_exact(&mut got).await.unwrap();
    got
}

/// `connection_protocol_total` of outbound connections served as `protocol`, decided by `by`.
fn decided(shared: &Shared, protocol: &str, by: &str) -> u64 {
    let line =
        format!("connection_protocol_total{{direction=\"outbound\",protocol=\"{protocol}\",decided_by=\"{by}\"}} ");
    let text = shared.metrics.encode();
    text.lines().find_map(|l| l.strip_prefix(&line)).map_or(0, |n| n.parse().unwrap())
}

/// `control_stream_{counted}_total` of the outbound policy streams: `messages` or `failures`.
fn streamed(shared: &Shared, counted: &str) -> u64 {
    let line = format!("control_stream_{counted}_total{{stream=\"outbound_policy\"}} ");
    let text = shared.metrics.encode();
    text.lines().find_map(|l| l.strip_prefix(&line)).map_or(0, |n| n.parse().unwrap())
}

/// Waits until the outbound policy streams' `counted` reaches `n`: the proxy has heard (or
/// lost) its control plane, the signal a test waits on instead of a settling sleep.
async fn streamed_at_least(shared: &Shared, counted: &str, n: u64) {
    for _ in 0..2000 {
        if streamed(shared, counted) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("control_stream_{counted}_total never reached {n}: {}", shared.metrics.encode());
}

#[tokio::test]
async fn a_destination_declared_opaque_greets_a_silent_client_without_detection() {
    let app = banner_app().await;
    let (shared, _control) = proxy_with_control(opaque(), Config::default()).await;
    for _ in 0..2 {
        assert_eq!(greeting(&shared, app).await, BANNER);
    }
    assert_eq!(decided(&shared, "opaque", "policy"), 2, "{}", shared.metrics.encode());
    assert_eq!(decided(&shared, "opaque", "detection"), 0);
}

#[tokio::test]
async fn the_last_policy_stays_when_the_control_plane_goes_away_and_changes_apply_live() {
    let app = banner_app().await;
    let (shared, control) = proxy_with_control(opaque(), Config::default()).await;
    assert_eq!(greeting(&shared, app).await, BANNER);
    assert_eq!(streamed(&shared, "messages"), 1);
    control.send_replace(Says::Down);
    // The stream has failed and the proxy has asked again (and been refused).
    streamed_at_least(&shared, "failures", 2).await;
    assert_eq!(greeting(&shared, app).await, BANNER);
    assert_eq!(decided(&shared, "opaque", "policy"), 2, "{}", shared.metrics.encode());

    // Back with another answer: once it has reached the proxy, the same target's next
    // connection detects (binary first bytes are opaque at once).
    control.send_replace(detect());
    streamed_at_least(&shared, "messages", 2).await;
    assert_eq!(greeting_after_binary(&shared, app).await, BANNER);
    assert_eq!(decided(&shared, "opaque", "detection"), 1, "the new policy applied: {}", shared.metrics.encode());
}

#[tokio::test]
async fn a_destination_declared_http1_skips_detection() {
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = http.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = http.accept().await.unwrap();
        let _ = s.read(&mut [0u8; 1024]).await;
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.unwrap();
    });
    let http1 = policy(proxy_protocol::Kind::Http1(proxy_protocol::Http1::default()));
    let (shared, _control) = proxy_with_control(http1, Config::default()).await;
    let mut io = captured(&shared, addr);
    io.write_all(b"GET / HTTP/1.1\r\nhost: web\r\nconnection: close\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    io.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"), "{answer}");
    assert_eq!(decided(&shared, "http1", "policy"), 1, "{}", shared.metrics.encode());
}

#[tokio::test]
async fn a_destination_the_control_plane_does_not_know_is_detected() {
    let app = banner_app().await;
    let (shared, _control) = proxy_with_control(Says::NotFound, Config::default()).await;
    // Binary first bytes decide opaque at once; the greeting follows.
    assert_eq!(greeting_after_binary(&shared, app).await, BANNER);
    assert_eq!(decided(&shared, "opaque", "detection"), 1, "{}", shared.metrics.encode());
}

#[tokio::test]
async fn a_port_configured_opaque_stays_opaque_whatever_the_policy_says() {
    let app = banner_app().await;
    let config = Config { opaque_ports: vec![app.port()], ..Config::default() };
    let (shared, _control) = proxy_with_control(detect(), config).await;
    assert_eq!(greeting(&shared, app).await, BANNER);
    assert_eq!(decided(&shared, "opaque", "configuration"), 1, "{}", shared.metrics.encode());
}

/// An HTTP/1 app on loopback answering `<name> <path> x-route=<header>`; `…/slow` never answers.
async fn named_app(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| async move {
                    if req.uri().path().ends_with("/slow") {
                        std::future::pending::<()>().await;
                    }
                    let header = req.headers().get("x-route").map(|v| v.to_str().unwrap().to_string());
                    let text = format!("{name} {} x-route={}", req.uri().path(), header.unwrap_or_default());
                    Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                        bytes::Bytes::from(text),
                    )))
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
        }
    });
    addr
}

mod routes {
    //! Builders of the route shapes the control plane sends (linkerd2-proxy-api 0.20).
    use std::net::SocketAddr;
    use std::time::Duration;

    use linkerd2_proxy_api::destination::WeightedAddr;
    use linkerd2_proxy_api::http_route as r;
    use linkerd2_proxy_api::http_types::{Headers, headers::Header};
    use linkerd2_proxy_api::meta;
    use linkerd2_proxy_api::outbound::{Backend, HttpRoute, backend, http_route};

    /// Routes and backends named as defaults (the shape matters less here than the name).
    pub fn meta(name: &str) -> Option<meta::Metadata> {
        Some(meta::Metadata { kind: Some(meta::metadata::Kind::Default(name.into())) })
    }

    pub fn prefix(p: &str) -> r::HttpRouteMatch {
        r::HttpRouteMatch {
            path: Some(r::PathMatch { kind: Some(r::path_match::Kind::Prefix(p.into())) }),
            ..Default::default()
        }
    }

    /// `(name, address, weight)` backends forwarding to fixed addresses.
    pub fn split(backends: &[(&str, SocketAddr, u32)]) -> http_route::Distribution {
        let backends = backends
            .iter()
            .map(|(name, addr, weight)| http_route::WeightedRouteBackend {
                backend: Some(http_route::RouteBackend {
                    backend: Some(Backend {
                        metadata: meta(name),
                        queue: None,
                        kind: Some(backend::Kind::Forward(WeightedAddr {
                            addr: Some((*addr).into()),
                            ..Default::default()
                        })),
                    }),
                    ..Default::default()
                }),
                weight: *weight,
            })
            .collect();
        http_route::Distribution {
            kind: Some(http_route::distribution::Kind::RandomAvailable(http_route::distribution::RandomAvailable {
                backends,
            })),
        }
    }

    pub fn set_header(request: bool, name: &str, value: &str) -> http_route::Filter {
        let set = Some(Headers { headers: vec![Header { name: name.into(), value: value.as_bytes().to_vec() }] });
        let kind = if request {
            http_route::filter::Kind::RequestHeaderModifier(r::RequestHeaderModifier { set, ..Default::default() })
        } else {
            http_route::filter::Kind::ResponseHeaderModifier(r::ResponseHeaderModifier { set, ..Default::default() })
        };
        http_route::Filter { kind: Some(kind) }
    }

    pub fn rule(
        matches: Vec<r::HttpRouteMatch>,
        filters: Vec<http_route::Filter>,
        backends: http_route::Distribution,
        timeout: Option<Duration>,
    ) -> http_route::Rule {
        let timeouts = timeout.map(|t| r::Timeouts { request: Some(t.try_into().unwrap()), ..Default::default() });
        http_route::Rule { matches, filters, backends: Some(backends), timeouts, ..Default::default() }
    }

    /// Retries of 5xx, up to `max` per request.
    pub fn retry_5xx(max: u32) -> http_route::Retry {
        let range = http_route::retry::conditions::StatusRange { start: 500, end: 599 };
        http_route::Retry {
            max_retries: max,
            max_request_bytes: 64 * 1024,
            conditions: Some(http_route::retry::Conditions { status_ranges: vec![range] }),
            timeout: None,
            backoff: None,
        }
    }

    pub fn route(name: &str, rules: Vec<http_route::Rule>) -> HttpRoute {
        HttpRoute { metadata: meta(name), hosts: Vec::new(), rules }
    }
}

/// A Detect policy whose HTTP/1 requests take `routes`.
fn with_routes(routes: Vec<linkerd2_proxy_api::outbound::HttpRoute>) -> Says {
    let timeout = Duration::from_secs(10).try_into().unwrap();
    let http1 = proxy_protocol::Http1 { routes, failure_accrual: None };
    policy(proxy_protocol::Kind::Detect(proxy_protocol::Detect {
        timeout: Some(timeout),
        http1: Some(http1),
        ..Default::default()
    }))
}

/// `n` GETs of `path` on one client connection to `addr`: (status, `x-served` header, body).
async fn gets(shared: &Arc<Shared>, addr: SocketAddr, path: &str, n: usize) -> Vec<(u16, String, String)> {
    let io = captured(shared, addr);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await.unwrap();
    tokio::spawn(conn);
    let mut answers = Vec::new();
    for _ in 0..n {
        let req = http::Request::get(path)
            .header("host", "web.shop.svc.cluster.local")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let res = sender.send_request(req).await.unwrap();
        let status = res.status().as_u16();
        let header = |n: &str| res.headers().get(n).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let served = if status / 100 == 3 { header("location") } else { header("x-served") };
        let error = header("cnimesh-proxy-error");
        let body = http_body_util::BodyExt::collect(res.into_body()).await.unwrap().to_bytes();
        let body = if error.is_empty() { String::from_utf8(body.to_vec()).unwrap() } else { error };
        answers.push((status, served, body));
    }
    answers
}

#[tokio::test]
async fn requests_take_their_route_with_its_filters_weights_and_timeout() {
    let (stable, canary, api) = (named_app("stable").await, named_app("canary").await, named_app("api").await);
    let redirect = linkerd2_proxy_api::outbound::http_route::Filter {
        kind: Some(linkerd2_proxy_api::outbound::http_route::filter::Kind::Redirect(
            linkerd2_proxy_api::http_route::RequestRedirect {
                path: Some(linkerd2_proxy_api::http_route::PathModifier {
                    replace: Some(linkerd2_proxy_api::http_route::path_modifier::Replace::Prefix("/v2".into())),
                }),
                status: 301,
                ..Default::default()
            },
        )),
    };
    let policy = with_routes(vec![
        routes::route(
            "web",
            vec![
                routes::rule(
                    vec![routes::prefix("/")],
                    vec![routes::set_header(false, "x-served", "web-route")],
                    routes::split(&[("stable", stable, 80), ("canary", canary, 20)]),
                    None,
                ),
                routes::rule(
                    vec![routes::prefix("/api")],
                    vec![routes::set_header(true, "x-route", "api-rule")],
                    routes::split(&[("api", api, 1)]),
                    Some(Duration::from_millis(100)),
                ),
                routes::rule(vec![routes::prefix("/v1")], vec![redirect], routes::split(&[]), None),
            ],
        ),
        routes::route(
            "admin-only",
            vec![routes::rule(vec![routes::prefix("/admin")], Vec::new(), routes::split(&[]), None)],
        ),
    ]);
    let (shared, _control) = proxy_with_control(policy, Config::default()).await;
    // The connection's original destination: the Service's address (here, the stable app).
    let answers = gets(&shared, stable, "/home", 500).await;
    let canaries = answers.iter().filter(|(_, _, body)| body.starts_with("canary /home")).count();
    assert!(answers.iter().all(|(status, served, _)| *status == 200 && served == "web-route"), "{answers:?}");
    assert!((55..=145).contains(&canaries), "about 20 % of 500 to the canary: {canaries}");
    let metrics = shared.metrics.encode();
    let labels = "parent_group=\"\",parent_kind=\"default\",parent_namespace=\"\",parent_name=\"db\",parent_port=\"0\",parent_section_name=\"\",route_group=\"\",route_kind=\"default\",route_namespace=\"\",route_name=\"web\"";
    let backend = |name: &str| {
        format!(
            "outbound_http_route_backend_requests_total{{{labels},backend_group=\"\",backend_kind=\"default\",backend_namespace=\"\",backend_name=\"{name}\",backend_port=\"0\",backend_section_name=\"\"}} "
        )
    };
    let count =
        |name: &str| metrics.lines().find_map(|l| l.strip_prefix(&backend(name))).map(|n| n.parse::<usize>().unwrap());
    assert_eq!((count("canary"), count("stable")), (Some(canaries), Some(500 - canaries)), "{metrics}");
    let duration = format!("outbound_http_route_request_duration_seconds_count{{{labels}}} 500");
    assert!(metrics.contains(&duration), "{metrics}");

    let answers = gets(&shared, stable, "/api/orders", 1).await;
    assert_eq!(answers[0], (200, String::new(), "api /api/orders x-route=api-rule".into()), "longer prefix wins");
    let answers = gets(&shared, stable, "/api/slow", 1).await;
    assert_eq!(answers[0], (504, String::new(), "request timed out after 100 ms on route web".into()));
    let answers = gets(&shared, stable, "/v1/a?b=c", 1).await;
    assert_eq!(answers[0].0, 301);
    assert_eq!(answers[0].1, "http://web.shop.svc.cluster.local/v2/a?b=c");
    let answers = gets(&shared, stable, "/admin", 1).await;
    assert_eq!(answers[0], (500, String::new(), "route admin-only has no backend".into()));
}

#[tokio::test]
async fn no_matching_route_is_404_and_an_unknown_service_backend_503_unless_it_is_the_parent() {
    use linkerd2_proxy_api::outbound::{backend, http_route};
    let app = named_app("web").await;
    let service = |name: &str| {
        let dst = backend::endpoint_discovery::DestinationGet { path: format!("{name}.shop.svc.cluster.local:80") };
        let p2c = backend::BalanceP2c {
            discovery: Some(backend::EndpointDiscovery { kind: Some(backend::endpoint_discovery::Kind::Dst(dst)) }),
            load: None,
        };
        let backend = linkerd2_proxy_api::outbound::Backend {
            metadata: routes::meta(name),
            queue: None,
            kind: Some(backend::Kind::Balancer(p2c)),
        };
        let first = http_route::distribution::FirstAvailable {
            backends: vec![http_route::RouteBackend { backend: Some(backend), ..Default::default() }],
        };
        http_route::Distribution { kind: Some(http_route::distribution::Kind::FirstAvailable(first)) }
    };
    let policy = with_routes(vec![routes::route(
        "api",
        vec![
            routes::rule(vec![routes::prefix("/api")], Vec::new(), service("db"), None),
            routes::rule(vec![routes::prefix("/other")], Vec::new(), service("elsewhere"), None),
        ],
    )]);
    let (shared, _control) = proxy_with_control(policy, Config::default()).await;
    // The parent Service (the policy's `db`), not discovered: the connection's own target.
    assert_eq!(gets(&shared, app, "/api", 1).await[0].2, "web /api x-route=");
    assert_eq!(gets(&shared, app, "/other", 1).await[0], (503, String::new(), "backend elsewhere unknown".into()));
    assert_eq!(gets(&shared, app, "/", 1).await[0], (404, String::new(), "no route matches the request".into()));
}

/// An app that answers 503 to every third request it gets (`/down`: to every one) and
/// otherwise `ok <body length>`.
async fn flaky_app() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    async move {
                        let down = req.uri().path() == "/down" || n % 3 == 2;
                        let body = http_body_util::BodyExt::collect(req.into_body()).await.unwrap().to_bytes();
                        let mut res = http::Response::new(http_body_util::Full::new(bytes::Bytes::from(format!(
                            "ok {}",
                            body.len()
                        ))));
                        if down {
                            *res.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                        }
                        Ok::<_, std::convert::Infallible>(res)
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
        }
    });
    addr
}

/// A proxy whose target `app` has one route retrying 5xx twice.
async fn retrying_proxy(app: SocketAddr) -> (Arc<Shared>, watch::Sender<Says>) {
    let mut rule = routes::rule(vec![routes::prefix("/")], Vec::new(), routes::split(&[("app", app, 1)]), None);
    rule.retry = Some(routes::retry_5xx(2));
    proxy_with_control(with_routes(vec![routes::route("flaky", vec![rule])]), Config::default()).await
}

/// `n` POSTs of `size` bytes (with their length declared) on one connection: their statuses.
async fn posts(shared: &Arc<Shared>, addr: SocketAddr, size: usize, n: usize) -> Vec<u16> {
    let io = captured(shared, addr);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await.unwrap();
    tokio::spawn(conn);
    let mut statuses = Vec::new();
    for _ in 0..n {
        let body = http_body_util::Full::new(bytes::Bytes::from(vec![b'x'; size]));
        let req = http::Request::post("/upload").header("content-length", size).body(body).unwrap();
        let res = sender.send_request(req).await.unwrap();
        statuses.push(res.status().as_u16());
        let _ = http_body_util::BodyExt::collect(res.into_body()).await;
    }
    statuses
}

fn metric(shared: &Shared, name: &str) -> u64 {
    let text = shared.metrics.encode();
    text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok()).sum()
}

#[tokio::test]
async fn retries_turn_a_flaky_backend_into_success_but_large_bodies_are_not_retried() {
    let app = flaky_app().await;
    let (shared, _control) = retrying_proxy(app).await;
    let answers = gets(&shared, app, "/flaky", 90).await;
    assert!(answers.iter().all(|(status, _, _)| *status == 200), "{answers:?}");
    let retried = metric(&shared, "outbound_http_route_retry_requests_total");
    assert!((30..=45).contains(&retried), "a third of the requests failed once: {retried}");

    assert!(posts(&shared, app, 1024, 30).await.iter().all(|s| *s == 200), "small bodies are buffered and retried");
    let statuses = posts(&shared, app, 100 * 1024, 30).await;
    assert!(statuses.contains(&503), "a 100 KiB body is streamed, never retried: {statuses:?}");
}

#[tokio::test]
async fn the_retry_budget_caps_retries_when_the_backend_always_fails() {
    let app = flaky_app().await;
    let (shared, _control) = retrying_proxy(app).await;
    let answers = gets(&shared, app, "/down", 100).await;
    assert!(answers.iter().all(|(status, _, _)| *status == 503));
    let retried = metric(&shared, "outbound_http_route_retry_requests_total");
    let overflow = metric(&shared, "outbound_http_route_retry_overflow_total");
    // Without a budget: 200 retries. With Linkerd's: 20 % of 100 requests plus the 10/s reserve
    // of a 10 s window.
    assert!(retried <= 20 + 100 + 1, "{retried}");
    assert!(overflow > 0 && retried + overflow <= 200, "{retried} + {overflow}");
}
