//! The outbound decision as a table: a target's outbound policy (fixed, no control plane), a
//! request, and what the decision is (forwarded, by which route, or the proxy's own answer).
//! Backends are fixed addresses: nothing is resolved and nothing is sent.

use std::net::SocketAddr;
use std::time::Duration;

use http::{StatusCode, Version};
use linkerd2_proxy_api::meta;
use linkerd2_proxy_api::outbound::{self as api, backend, grpc_route, http_route, proxy_protocol};
use linkerd2_proxy_api::{destination::WeightedAddr, grpc_route as api_grpc, http_route as api_http};

use super::*;
use crate::app::config::Config;
use crate::http::decision::AnswerKind;
use crate::outbound::policy::discover::PolicyWatch;
use crate::outbound::policy::model::OutboundPolicy;
use crate::serve::drain::Drain;
use crate::serve::metrics::Metrics;
use crate::serve::shared::Shared;

const ADDR: &str = "10.0.0.1:80";
const BACKEND: &str = "10.0.0.2:8080";

fn named(name: &str) -> Option<meta::Metadata> {
    Some(meta::Metadata { kind: Some(meta::metadata::Kind::Default(name.into())) })
}

fn backend(addr: SocketAddr) -> api::Backend {
    let kind = backend::Kind::Forward(WeightedAddr { addr: Some(addr.into()), ..Default::default() });
    api::Backend { metadata: named("web"), queue: None, kind: Some(kind) }
}

fn policy(kind: proxy_protocol::Kind) -> api::OutboundPolicy {
    api::OutboundPolicy { metadata: named("web"), protocol: Some(api::ProxyProtocol { kind: Some(kind) }) }
}

/// The target `ADDR` under an HTTP/1 route `web-route` of one rule to `BACKEND`, for `hosts`
/// (any when empty), with `filters`.
fn http_route(hosts: &[&str], filters: Vec<http_route::Filter>) -> api::OutboundPolicy {
    let backends = http_route::Distribution {
        kind: Some(http_route::distribution::Kind::FirstAvailable(http_route::distribution::FirstAvailable {
            backends: vec![http_route::RouteBackend {
                backend: Some(backend(BACKEND.parse().unwrap())),
                ..Default::default()
            }],
        })),
    };
    let hosts = hosts
        .iter()
        .map(|h| api_http::HostMatch { r#match: Some(api_http::host_match::Match::Exact(h.to_string())) })
        .collect();
    let rule = http_route::Rule { backends: Some(backends), filters, ..Default::default() };
    let route = api::HttpRoute { metadata: named("web-route"), hosts, rules: vec![rule] };
    policy(proxy_protocol::Kind::Http1(proxy_protocol::Http1 { routes: vec![route], failure_accrual: None }))
}

fn http_fault(status: u32) -> Vec<http_route::Filter> {
    let injector = api_http::HttpFailureInjector { status, message: "injected".into(), ratio: None };
    vec![http_route::Filter { kind: Some(http_route::filter::Kind::FailureInjector(injector)) }]
}

/// A GRPCRoute `rpc-route` to `to` whose rule injects gRPC UNAVAILABLE into every call.
pub(crate) fn grpc_fault(to: SocketAddr) -> api::OutboundPolicy {
    let injector = api_grpc::GrpcFailureInjector { code: 14, message: "injected".into(), ratio: None };
    let backends = grpc_route::Distribution {
        kind: Some(grpc_route::distribution::Kind::FirstAvailable(grpc_route::distribution::FirstAvailable {
            backends: vec![grpc_route::RouteBackend { backend: Some(backend(to)), ..Default::default() }],
        })),
    };
    let rule = grpc_route::Rule {
        filters: vec![grpc_route::Filter { kind: Some(grpc_route::filter::Kind::FailureInjector(injector)) }],
        backends: Some(backends),
        ..Default::default()
    };
    let route = api::GrpcRoute { metadata: named("rpc-route"), hosts: Vec::new(), rules: vec![rule] };
    policy(proxy_protocol::Kind::Grpc(proxy_protocol::Grpc { routes: vec![route], failure_accrual: None }))
}

fn target(policy: Option<api::OutboundPolicy>) -> Arc<Target> {
    let mut extensions = http::Extensions::new();
    if let Some(p) = policy {
        extensions.insert(PolicyWatch::fixed(Arc::new(OutboundPolicy::from_api(p).unwrap())));
    }
    Target::with_extensions(Route::fixed(ADDR.parse().unwrap(), None, Duration::from_secs(1)), extensions)
}

/// What a decision came to, comparable in a table.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Forwarded: the route that took it and the address its target sends to (`None`: no
    /// route, the connection's target).
    Forward(Option<(String, String)>),
    Answer(AnswerKind, StatusCode, Option<String>),
}

async fn outcome(conn: &OutboundHttp, mut req: Request<()>, outbound: &Outbound) -> Outcome {
    outcome_of(conn.decide(&mut req, outbound).await)
}

fn outcome_of(decision: Decision<Decided>) -> Outcome {
    match decision {
        Decision::Forward(Decided { routed: None, .. }) => Outcome::Forward(None),
        Decision::Forward(Decided { routed: Some(routed), .. }) => {
            let to = routed.target.route.pick(None).map(|p| p.upstream.addr.to_string()).unwrap_or_default();
            Outcome::Forward(Some((routed.route.to_string(), to)))
        }
        Decision::Answer(answer) => {
            let grpc = answer.response.headers().get("grpc-status").map(|v| v.to_str().unwrap().to_string());
            Outcome::Answer(answer.kind, answer.status(), grpc)
        }
    }
}

#[tokio::test]
async fn each_outbound_request_is_forwarded_or_answered_as_the_table_says() {
    let shared = Shared::new(Config::default(), Arc::new(Metrics::default()), Drain::default(), None, None);
    let get = |host: &str| Request::get("/a").header(http::header::HOST, host).body(()).unwrap();
    let grpc = || {
        Request::post("http://web.shop.svc.cluster.local/pkg.Svc/Call")
            .version(Version::HTTP_2)
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
    };
    let routed = |route: &str| Outcome::Forward(Some((route.into(), BACKEND.into())));
    use AnswerKind::Route as ByRoute;
    let table: Vec<(&str, Option<api::OutboundPolicy>, Request<()>, Outcome)> = vec![
        ("without a policy, the request goes to the connection's target", None, get("web"), Outcome::Forward(None)),
        ("a route takes the request to its backend", Some(http_route(&[], vec![])), get("web"), routed("web-route")),
        ("a route for its host takes the request", Some(http_route(&["web"], vec![])), get("web"), routed("web-route")),
        (
            "a request no route matches is answered 404",
            Some(http_route(&["other.example"], vec![])),
            get("web"),
            Outcome::Answer(ByRoute, StatusCode::NOT_FOUND, None),
        ),
        (
            "a route's injected failure is the proxy's answer",
            Some(http_route(&[], http_fault(503))),
            get("web"),
            Outcome::Answer(ByRoute, StatusCode::SERVICE_UNAVAILABLE, None),
        ),
        (
            "a GRPCRoute's injected error is an HTTP 200 with its grpc-status",
            Some(grpc_fault(BACKEND.parse().unwrap())),
            grpc(),
            Outcome::Answer(ByRoute, StatusCode::OK, Some("14".into())),
        ),
    ];
    for (case, policy, req, expected) in table {
        let conn = OutboundHttp::new(target(policy), ADDR.parse().unwrap());
        assert_eq!(outcome(&conn, req, &shared.outbound).await, expected, "{case}");
    }
}

const WEB: &str = "web.shop.svc.cluster.local:80";

/// A proxy in ingress mode (or not) that knows the Service port [`WEB`] by name, under an
/// HTTP/1 route `web-route` to `BACKEND`; egress hostnames are never bound (no resolver).
fn named_web(ingress: bool) -> Shared {
    let mode = match ingress {
        true => crate::app::config::Mode::Ingress {
            cluster_domain: "cluster.local".into(),
            namespaces: crate::outbound::ingress::Namespaces::All,
        },
        false => crate::app::config::Mode::Sidecar,
    };
    let mut shared =
        Shared::new(Config { mode, ..Config::default() }, Arc::new(Metrics::default()), Drain::default(), None, None);
    shared.outbound.egress_names =
        Arc::new(crate::outbound::egress::names::Names::new("/nonexistent/resolv.conf".into()));
    let mut extensions = http::Extensions::new();
    let policy = OutboundPolicy::from_api(http_route(&[], vec![])).unwrap();
    extensions.insert(PolicyWatch::fixed(Arc::new(policy)));
    let web = Target::with_extensions(
        Route::fixed("10.96.0.10:80".parse().unwrap(), None, Duration::from_secs(1)),
        extensions,
    );
    shared.outbound.by_service.insert(WEB.into(), web, None);
    shared
}

/// A request's headers, as (name, value).
type Headers = Vec<(&'static str, &'static str)>;

fn request(headers: &[(&str, &str)]) -> Request<()> {
    let mut req = Request::get("/").body(()).unwrap();
    for (k, v) in headers {
        req.headers_mut().append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
    }
    req
}

#[tokio::test]
async fn in_ingress_mode_the_service_a_request_names_decides_and_anything_else_keeps_its_destination() {
    let routed = Outcome::Forward(Some(("web-route".into(), BACKEND.into())));
    let table: Vec<(&str, Headers, Outcome)> = vec![
        (
            "the Host names the Service: its route takes the request",
            vec![("host", "web.shop.svc.cluster.local")],
            routed,
        ),
        (
            "Linkerd's override names it, whatever the Host",
            vec![("host", "shop.example.com"), ("l5d-dst-override", "web.shop.svc.cluster.local:80")],
            Outcome::Forward(Some(("web-route".into(), BACKEND.into()))),
        ),
        (
            "ours, in a short form",
            vec![("host", "shop.example.com"), ("cnimesh-dst-override", "web.shop:80")],
            Outcome::Forward(Some(("web-route".into(), BACKEND.into()))),
        ),
        (
            "a Service nobody defined: the original destination",
            vec![("host", "nope.shop.svc.cluster.local")],
            Outcome::Forward(None),
        ),
        (
            "a port the Service does not have: the original destination",
            vec![("host", "web.shop:8080")],
            Outcome::Forward(None),
        ),
        ("an external host: the original destination", vec![("host", "shop.example.com")], Outcome::Forward(None)),
        (
            "overrides that disagree: 400, never a guess",
            vec![("l5d-dst-override", "web.shop:80"), ("cnimesh-dst-override", "nope.shop:80")],
            Outcome::Answer(AnswerKind::Malformed, StatusCode::BAD_REQUEST, None),
        ),
    ];
    let shared = named_web(true);
    for (case, headers, expected) in table {
        let conn = OutboundHttp::new(target(None), ADDR.parse().unwrap());
        let mut req = request(&headers);
        let decision = conn.decide(&mut req, &shared.outbound).await;
        for header in ["l5d-dst-override", "cnimesh-dst-override"] {
            assert!(!req.headers().contains_key(header), "{case}: {header} goes no further");
        }
        if let Decision::Forward(decided) = &decision {
            assert_eq!(decided.service.is_some(), decided.routed.is_some(), "{case}: routed by the named Service");
        }
        assert_eq!(outcome_of(decision), expected, "{case}");
    }
    // An ingress that connected to a pod's target port, naming the Service without a port:
    // 8080 is no port of web, HTTP's default 80 is.
    let conn = OutboundHttp::new(target(None), "10.0.0.3:8080".parse().unwrap());
    let to_pod = outcome(&conn, request(&[("host", "web.shop")]), &shared.outbound).await;
    assert_eq!(to_pod, Outcome::Forward(Some(("web-route".into(), BACKEND.into()))));
}

/// A default (sidecar) proxy does not route by the Host or an override: the connection's target
/// decides, as before ingress mode. It still takes an override off: an unmeshed upstream, or one
/// on a skipped port, has no inbound proxy to strip it.
#[tokio::test]
async fn outside_ingress_mode_neither_the_host_nor_an_override_changes_the_decision() {
    let shared = named_web(false);
    for headers in [vec![("host", "web.shop.svc.cluster.local")], vec![("l5d-dst-override", WEB)]] {
        let conn = OutboundHttp::new(target(None), ADDR.parse().unwrap());
        let mut req = request(&headers);
        let Decision::Forward(decided) = conn.decide(&mut req, &shared.outbound).await else { panic!("{headers:?}") };
        assert!(decided.routed.is_none() && decided.service.is_none(), "{headers:?}");
        assert!(!req.headers().contains_key("l5d-dst-override"), "the override goes no further: {headers:?}");
        assert!(req.headers().contains_key("host") == (headers[0].0 == "host"), "the Host stays: {headers:?}");
    }
}

/// The EgressNetwork `egress/internet` in front of `ADDR`: `api.allowed.example` may be called,
/// anything else is refused (403).
fn egress_allowing_one_host() -> api::OutboundPolicy {
    let mut allowed = http_route(&["api.allowed.example"], vec![]);
    let mut denied = http_route(&[], http_fault(403));
    let Some(proxy_protocol::Kind::Http1(http1)) = denied.protocol.as_mut().and_then(|p| p.kind.as_mut()) else {
        unreachable!()
    };
    let deny_rest = http1.routes.remove(0);
    let Some(proxy_protocol::Kind::Http1(http1)) = allowed.protocol.as_mut().and_then(|p| p.kind.as_mut()) else {
        unreachable!()
    };
    http1.routes.push(deny_rest);
    let resource = meta::Resource {
        group: "policy.linkerd.io".into(),
        kind: crate::outbound::egress::EGRESS_NETWORK_KIND.into(),
        name: "internet".into(),
        namespace: "egress".into(),
        port: 80,
        ..Default::default()
    };
    allowed.metadata = Some(meta::Metadata { kind: Some(meta::metadata::Kind::Resource(resource)) });
    allowed
}

/// The pod's app naming an allowed host, or a Service-like name nobody defined, in an override
/// to a destination its EgressNetwork refuses: the override changes nothing, the refusal holds
/// (only a Service port the control plane knows redirects, and then to that Service).
#[tokio::test]
async fn an_override_naming_an_allowed_host_does_not_walk_around_an_egress_refusal() {
    let shared = named_web(true);
    let attacks = [
        vec![("host", "10.0.0.99"), ("l5d-dst-override", "api.allowed.example:80")],
        vec![("host", "10.0.0.99"), ("cnimesh-dst-override", "api.allowed:80")],
        vec![("host", "api.allowed:80")],
    ];
    for headers in attacks {
        let conn = OutboundHttp::new(target(Some(egress_allowing_one_host())), ADDR.parse().unwrap());
        let outcome = outcome(&conn, request(&headers), &shared.outbound).await;
        assert_eq!(outcome, Outcome::Answer(AnswerKind::Route, StatusCode::FORBIDDEN, None), "{headers:?}");
    }
}
