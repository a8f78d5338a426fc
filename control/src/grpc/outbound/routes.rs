//! HTTPRoutes and GRPCRoutes as linkerd2-proxy-api `outbound.HttpRoute` / `outbound.GrpcRoute`,
//! filled as Linkerd's policy controller fills them (linkerd2 `policy-controller/grpc`, outbound
//! http/grpc):
//! - route `metadata`: the route as a resource (group `gateway.networking.k8s.io`, kind
//!   `HTTPRoute`/`GRPCRoute`, namespace, name); `hosts` from `hostnames` (`*.example.com` as a
//!   suffix, reversed labels);
//! - a rule's `backends`: `random_available` with each backendRef's Service as a weighted P2C
//!   backend discovered through Destination; no backendRefs: `first_available` with the parent
//!   Service (Linkerd's default backend); every weight zero: the parent with a failure injector
//!   answering 500 (Gateway API: "If all entries in BackendRefs are ... weight 0, 500"), because
//!   the proxy refuses a distribution whose weights are all zero;
//! - `timeouts.request` ← `timeouts.request` (or `timeout.cnimesh.io/request`),
//!   `timeouts.response` ← `timeouts.backendRequest`, and the deprecated `requestTimeout` set to
//!   `timeouts.response` as the proto asks of servers;
//! - `retry`: `max_retries` from `retry.attempts` / `retry.cnimesh.io/limit`, conditions from
//!   `retry.codes` / `retry.cnimesh.io/http` (status ranges) or `retry.cnimesh.io/grpc`
//!   (gRPC codes), per-try `timeout` from `retry.cnimesh.io/timeout` else
//!   `timeouts.backendRequest`; `max_request_bytes` 64 KiB and backoff 25–250 ms with full
//!   jitter (Linkerd's; a Gateway `retry.backoff` raises the minimum, and the maximum with it);
//! - the parent Service's retry and timeout annotations fill the rules that set neither
//!   ([`cnimesh_model::routes::model::Rule::with_defaults`]).
//!
//! Layer: gRPC (conversion only; what is served is decided in [`super`]).

use std::time::Duration;

use linkerd2_proxy_api::grpc_route::{GrpcRouteMatch, GrpcRpcMatch};
use linkerd2_proxy_api::http_route::{
    self as api, HeaderMatch, HttpRouteMatch, PathMatch, QueryParamMatch, header_match, host_match, path_match,
    path_modifier, query_param_match,
};
use linkerd2_proxy_api::http_types::{self, HttpMethod, Scheme};
use linkerd2_proxy_api::meta::{Metadata, Resource, metadata};
use linkerd2_proxy_api::outbound::{self, Backend, ExponentialBackoff, grpc_route, http_route};

use super::duration;
use cnimesh_model::routes::RouteKind;
use cnimesh_model::routes::model::Backend as RouteBackendRef;
use cnimesh_model::routes::model::{
    Filter, HeaderModifier, HostMatch, MatchValue, Matches, PathModifier, Redirect, Retry, RetryConditions, Route,
    RouteDefaults, Rule, ValueMatch,
};

/// Linkerd's retry defaults: bodies up to 64 KiB are buffered for retries; backoff 25–250 ms.
const RETRY_MAX_REQUEST_BYTES: u32 = 64 * 1024;
const RETRY_MIN_BACKOFF: Duration = Duration::from_millis(25);
const RETRY_MAX_BACKOFF: Duration = Duration::from_millis(250);

/// Builds the backend of one Service port (the same shape as the parent's default backend).
pub(super) type BackendOf<'a> = &'a dyn Fn(&cnimesh_model::meta::NsName, u16) -> Backend;

fn route_meta(route: &Route) -> Metadata {
    Metadata {
        kind: Some(metadata::Kind::Resource(Resource {
            group: cnimesh_model::routes::crd::GROUP.into(),
            kind: route.kind.as_str().into(),
            name: route.key.name.clone(),
            namespace: route.key.namespace.clone(),
            section: String::new(),
            port: 0,
        })),
    }
}

fn hosts(route: &Route) -> Vec<api::HostMatch> {
    route
        .hostnames
        .iter()
        .map(|h| api::HostMatch {
            r#match: Some(match h {
                HostMatch::Exact(name) => host_match::Match::Exact(name.clone()),
                HostMatch::Suffix(suffix) => host_match::Match::Suffix(host_match::Suffix {
                    reverse_labels: suffix.rsplit('.').map(str::to_string).collect(),
                }),
            }),
        })
        .collect()
}

/// The weighted backends of a rule, or `None` when the rule names none (the parent serves it).
fn weighted<T>(
    backends: &[RouteBackendRef],
    backend_of: BackendOf<'_>,
    route_backend: impl Fn(Backend, Vec<Filter>) -> T,
) -> Option<Vec<(u32, T)>> {
    (!backends.is_empty()).then(|| {
        backends.iter().map(|b| (b.weight, route_backend(backend_of(&b.service, b.port), b.filters.clone()))).collect()
    })
}

/// The per-rule pieces both route kinds share.
struct RuleParts {
    timeouts: api::Timeouts,
    response_timeout: Option<prost_types::Duration>,
    retry_timeout: Option<prost_types::Duration>,
    backoff: Option<ExponentialBackoff>,
}

fn rule_parts(rule: &Rule) -> RuleParts {
    let response = rule.timeouts.backend_request.map(duration);
    RuleParts {
        timeouts: api::Timeouts { response, request: rule.timeouts.request.map(duration), idle: None },
        response_timeout: response,
        retry_timeout: rule.retry.as_ref().and_then(|r| r.timeout.or(rule.timeouts.backend_request)).map(duration),
        backoff: rule.retry.as_ref().map(backoff),
    }
}

fn backoff(retry: &Retry) -> ExponentialBackoff {
    let min = retry.backoff.unwrap_or(RETRY_MIN_BACKOFF);
    ExponentialBackoff {
        min_backoff: Some(duration(min)),
        max_backoff: Some(duration(min.max(RETRY_MAX_BACKOFF))),
        jitter_ratio: 1.0,
        respect_retry_after_hint: false,
    }
}

const ZERO_WEIGHTS: &str = "every backendRef of the rule has weight 0";

pub(super) fn http_route(
    route: &Route,
    parent: &Backend,
    backend_of: BackendOf<'_>,
    defaults: &RouteDefaults,
) -> outbound::HttpRoute {
    let rules = route.rules.iter().map(|rule| http_rule(&rule.with_defaults(defaults), parent, backend_of)).collect();
    outbound::HttpRoute { metadata: Some(route_meta(route)), hosts: hosts(route), rules }
}

/// One rule of an HTTPRoute (or of the default route).
pub(super) fn http_rule(rule: &Rule, parent: &Backend, backend_of: BackendOf<'_>) -> http_route::Rule {
    #![allow(deprecated)] // `requestTimeout`: set as the proto asks, for older proxies.
    let Matches::Http(matches) = &rule.matches else { unreachable!("HTTPRoutes hold HTTP matches") };
    let parts = rule_parts(rule);
    let backends = weighted(&rule.backends, backend_of, |backend, filters| http_route::RouteBackend {
        backend: Some(backend),
        filters: filters.iter().map(http_filter).collect(),
        ..Default::default()
    });
    http_route::Rule {
        matches: matches
            .iter()
            .map(|m| HttpRouteMatch {
                path: m.path.as_ref().map(|p| PathMatch {
                    kind: Some(match p {
                        cnimesh_model::routes::model::PathMatch::Exact(v) => path_match::Kind::Exact(v.clone()),
                        cnimesh_model::routes::model::PathMatch::Prefix(v) => path_match::Kind::Prefix(v.clone()),
                        cnimesh_model::routes::model::PathMatch::Regex(v) => path_match::Kind::Regex(v.clone()),
                    }),
                }),
                headers: m.headers.iter().map(header_match).collect(),
                query_params: m
                    .query_params
                    .iter()
                    .map(|q| QueryParamMatch {
                        name: q.name.clone(),
                        value: Some(match &q.value {
                            MatchValue::Exact(v) => query_param_match::Value::Exact(v.clone()),
                            MatchValue::Regex(v) => query_param_match::Value::Regex(v.clone()),
                        }),
                    })
                    .collect(),
                method: m.method.clone().map(HttpMethod::from),
            })
            .collect(),
        filters: rule.filters.iter().map(http_filter).collect(),
        backends: Some(http_distribution(backends, parent)),
        request_timeout: parts.response_timeout,
        timeouts: Some(parts.timeouts),
        retry: rule.retry.as_ref().map(|retry| http_route::Retry {
            max_retries: retry.limit,
            max_request_bytes: RETRY_MAX_REQUEST_BYTES,
            conditions: Some(http_route::retry::Conditions {
                status_ranges: match &retry.conditions {
                    RetryConditions::Http(ranges) => ranges
                        .iter()
                        .map(|r| http_route::retry::conditions::StatusRange {
                            start: u32::from(*r.start()),
                            end: u32::from(*r.end()),
                        })
                        .collect(),
                    RetryConditions::Grpc(_) => Vec::new(),
                },
            }),
            timeout: parts.retry_timeout,
            backoff: parts.backoff,
        }),
        allow_l5d_request_headers: false,
    }
}

/// How a rule's requests are spread (Gateway API): over the parent Service when it names no
/// backend; to the parent answering an error when every weight is zero (the proxy refuses a
/// distribution whose weights are all zero); else by weight.
enum Spread<B> {
    Parent,
    Failing,
    Weighted(Vec<(u32, B)>),
}

fn spread<B>(backends: Option<Vec<(u32, B)>>) -> Spread<B> {
    match backends {
        None => Spread::Parent,
        Some(b) if b.iter().all(|(w, _)| *w == 0) => Spread::Failing,
        Some(b) => Spread::Weighted(b),
    }
}

fn http_distribution(
    backends: Option<Vec<(u32, http_route::RouteBackend)>>,
    parent: &Backend,
) -> http_route::Distribution {
    use http_route::distribution::{FirstAvailable, Kind, RandomAvailable};
    let first = |filters| {
        let backend = http_route::RouteBackend { backend: Some(parent.clone()), filters, ..Default::default() };
        Kind::FirstAvailable(FirstAvailable { backends: vec![backend] })
    };
    let kind = match spread(backends) {
        Spread::Parent => first(Vec::new()),
        Spread::Failing => first(vec![http_route::Filter {
            kind: Some(http_route::filter::Kind::FailureInjector(api::HttpFailureInjector {
                status: 500,
                message: ZERO_WEIGHTS.into(),
                ratio: None,
            })),
        }]),
        Spread::Weighted(backends) => Kind::RandomAvailable(RandomAvailable {
            backends: backends
                .into_iter()
                .map(|(weight, backend)| http_route::WeightedRouteBackend { backend: Some(backend), weight })
                .collect(),
        }),
    };
    http_route::Distribution { kind: Some(kind) }
}

pub(super) fn grpc_route(
    route: &Route,
    parent: &Backend,
    backend_of: BackendOf<'_>,
    defaults: &RouteDefaults,
) -> outbound::GrpcRoute {
    #![allow(deprecated)] // `requestTimeout`: set as the proto asks, for older proxies.
    let rules = route
        .rules
        .iter()
        .map(|rule| {
            let rule = &*rule.with_defaults(defaults);
            let Matches::Grpc(matches) = &rule.matches else { unreachable!("GRPCRoutes hold gRPC matches") };
            let parts = rule_parts(rule);
            let backends = weighted(&rule.backends, backend_of, |backend, filters| grpc_route::RouteBackend {
                backend: Some(backend),
                filters: filters.iter().filter_map(grpc_filter).collect(),
                ..Default::default()
            });
            grpc_route::Rule {
                matches: matches
                    .iter()
                    .map(|m| GrpcRouteMatch {
                        rpc: (m.service.is_some() || m.method.is_some()).then(|| GrpcRpcMatch {
                            service: m.service.clone().unwrap_or_default(),
                            method: m.method.clone().unwrap_or_default(),
                        }),
                        headers: m.headers.iter().map(header_match).collect(),
                    })
                    .collect(),
                filters: rule.filters.iter().filter_map(grpc_filter).collect(),
                backends: Some(grpc_distribution(backends, parent)),
                request_timeout: parts.response_timeout,
                timeouts: Some(parts.timeouts),
                retry: rule.retry.as_ref().map(|retry| {
                    let c = match retry.conditions {
                        RetryConditions::Grpc(c) => c,
                        RetryConditions::Http(_) => Default::default(),
                    };
                    grpc_route::Retry {
                        max_retries: retry.limit,
                        max_request_bytes: RETRY_MAX_REQUEST_BYTES,
                        conditions: Some(grpc_route::retry::Conditions {
                            cancelled: c.cancelled,
                            deadine_exceeded: c.deadline_exceeded,
                            resource_exhausted: c.resource_exhausted,
                            internal: c.internal,
                            unavailable: c.unavailable,
                        }),
                        timeout: parts.retry_timeout,
                        backoff: parts.backoff,
                    }
                }),
                allow_l5d_request_headers: false,
            }
        })
        .collect();
    outbound::GrpcRoute { metadata: Some(route_meta(route)), hosts: hosts(route), rules }
}

fn grpc_distribution(
    backends: Option<Vec<(u32, grpc_route::RouteBackend)>>,
    parent: &Backend,
) -> grpc_route::Distribution {
    use grpc_route::distribution::{FirstAvailable, Kind, RandomAvailable};
    let first = |filters| {
        let backend = grpc_route::RouteBackend { backend: Some(parent.clone()), filters, ..Default::default() };
        Kind::FirstAvailable(FirstAvailable { backends: vec![backend] })
    };
    let kind = match spread(backends) {
        Spread::Parent => first(Vec::new()),
        // gRPC's INTERNAL for the HTTP 500 the Gateway API asks for.
        Spread::Failing => first(vec![grpc_route::Filter {
            kind: Some(grpc_route::filter::Kind::FailureInjector(
                linkerd2_proxy_api::grpc_route::GrpcFailureInjector {
                    code: 13,
                    message: ZERO_WEIGHTS.into(),
                    ratio: None,
                },
            )),
        }]),
        Spread::Weighted(backends) => Kind::RandomAvailable(RandomAvailable {
            backends: backends
                .into_iter()
                .map(|(weight, backend)| grpc_route::WeightedRouteBackend { backend: Some(backend), weight })
                .collect(),
        }),
    };
    grpc_route::Distribution { kind: Some(kind) }
}

fn header_match(m: &ValueMatch) -> HeaderMatch {
    HeaderMatch {
        name: m.name.clone(),
        value: Some(match &m.value {
            MatchValue::Exact(v) => header_match::Value::Exact(v.clone().into_bytes()),
            MatchValue::Regex(v) => header_match::Value::Regex(v.clone()),
        }),
    }
}

fn headers(pairs: &[(String, String)]) -> Option<http_types::Headers> {
    (!pairs.is_empty()).then(|| http_types::Headers {
        headers: pairs
            .iter()
            .map(|(name, value)| http_types::headers::Header { name: name.clone(), value: value.clone().into_bytes() })
            .collect(),
    })
}

fn request_headers(m: &HeaderModifier) -> api::RequestHeaderModifier {
    api::RequestHeaderModifier { add: headers(&m.add), set: headers(&m.set), remove: m.remove.clone() }
}

fn http_filter(filter: &Filter) -> http_route::Filter {
    use http_route::filter::Kind;
    let kind = match filter {
        Filter::RequestHeaders(m) => Kind::RequestHeaderModifier(request_headers(m)),
        Filter::ResponseHeaders(m) => Kind::ResponseHeaderModifier(api::ResponseHeaderModifier {
            add: headers(&m.add),
            set: headers(&m.set),
            remove: m.remove.clone(),
        }),
        Filter::Redirect(r) => Kind::Redirect(redirect(r)),
    };
    http_route::Filter { kind: Some(kind) }
}

/// The model admits only request header modifiers on GRPCRoutes.
fn grpc_filter(filter: &Filter) -> Option<grpc_route::Filter> {
    match filter {
        Filter::RequestHeaders(m) => {
            Some(grpc_route::Filter { kind: Some(grpc_route::filter::Kind::RequestHeaderModifier(request_headers(m))) })
        }
        Filter::ResponseHeaders(_) | Filter::Redirect(_) => None,
    }
}

fn redirect(r: &Redirect) -> api::RequestRedirect {
    api::RequestRedirect {
        scheme: r.scheme.as_deref().map(Scheme::from),
        host: r.hostname.clone().unwrap_or_default(),
        path: r.path.as_ref().map(|p| api::PathModifier {
            replace: Some(match p {
                PathModifier::Full(full) => path_modifier::Replace::Full(full.clone()),
                PathModifier::Prefix(prefix) => path_modifier::Replace::Prefix(prefix.clone()),
            }),
        }),
        port: r.port.map(u32::from).unwrap_or_default(),
        // Gateway API's default redirect status is 302; the proto's default (0) would be 301.
        status: u32::from(r.status.unwrap_or(302)),
    }
}

/// Which kind of routes a Service port is answered with: GRPCRoutes win over HTTPRoutes, as in
/// Linkerd's policy controller (one protocol per port).
pub(super) fn served_kind(routes: &[std::sync::Arc<Route>]) -> Option<RouteKind> {
    if routes.iter().any(|r| r.kind == RouteKind::Grpc) {
        Some(RouteKind::Grpc)
    } else if routes.is_empty() {
        None
    } else {
        Some(RouteKind::Http)
    }
}
