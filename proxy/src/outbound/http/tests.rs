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
    match conn.decide(&mut req, outbound).await {
        Decision::Forward(None) => Outcome::Forward(None),
        Decision::Forward(Some(routed)) => {
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
