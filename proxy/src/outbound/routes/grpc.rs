//! gRPC routes (`outbound.GrpcRoute`, from Gateway API GRPCRoutes) as HTTP/2 routes: a
//! service/method match is a path match (`/pkg.Service/Method`), a failure injector answers
//! with a `grpc-status`, and retries follow gRPC status codes of trailers-only answers.

use linkerd2_proxy_api::grpc_route as api_grpc;
use linkerd2_proxy_api::outbound::{self as api, grpc_route};

use super::model::{
    Filter, HttpRoute, InvalidRoute, PathMatch, RequestMatch, Retry, Rule, WeightedBackend, anchored, backend_of,
    backoff, distribution, distribution_of, duration, header_matches, headers, names, ratio, request_timeout,
};

impl HttpRoute {
    pub fn from_grpc(route: api::GrpcRoute) -> Result<Self, InvalidRoute> {
        Self::checked(route.metadata, route.hosts, route.rules, rule)
    }
}

fn rule(r: grpc_route::Rule) -> Result<Rule, String> {
    let matches = r.matches.into_iter().map(rpc_match).collect::<Result<_, _>>()?;
    let filters = r.filters.into_iter().map(filter).collect::<Result<_, _>>()?;
    let weighted = |b: grpc_route::RouteBackend, weight| -> Result<WeightedBackend, String> {
        let filters = b.filters.into_iter().map(filter).collect::<Result<_, _>>()?;
        Ok(WeightedBackend { backend: backend_of(b.backend)?, weight, filters })
    };
    let backends = distribution(distribution_of!(r.backends, grpc_route), weighted)?;
    #[allow(deprecated)]
    let request_timeout = request_timeout(r.timeouts, duration(r.request_timeout)?)?;
    Ok(Rule { matches, filters, backends, request_timeout, retry: r.retry.map(retry).transpose()? })
}

/// `service` and `method` as the request path `/<service>/<method>`; either may be empty.
fn rpc_match(m: api_grpc::GrpcRouteMatch) -> Result<RequestMatch, String> {
    let path = match m.rpc {
        None => None,
        Some(rpc) => match (rpc.service.as_str(), rpc.method.as_str()) {
            ("", "") => None,
            (service, "") => Some(PathMatch::Prefix(format!("/{service}"))),
            ("", method) => Some(PathMatch::Regex(anchored(&format!("/[^/]+/{}", regex::escape(method)))?)),
            (service, method) => Some(PathMatch::Exact(format!("/{service}/{method}"))),
        },
    };
    Ok(RequestMatch { path, headers: header_matches(m.headers)?, ..RequestMatch::default() })
}

fn filter(f: grpc_route::Filter) -> Result<Filter, String> {
    Ok(match f.kind.ok_or("empty filter")? {
        grpc_route::filter::Kind::RequestHeaderModifier(m) => Filter::RequestHeaders(super::model::HeaderModifier {
            add: headers(m.add)?,
            set: headers(m.set)?,
            remove: names(m.remove)?,
        }),
        grpc_route::filter::Kind::FailureInjector(f) => Filter::FailGrpc {
            code: u16::try_from(f.code).ok().filter(|c| *c <= 16).ok_or_else(|| format!("grpc code {}", f.code))?,
            message: f.message,
            ratio: ratio(f.ratio)?,
        },
    })
}

fn retry(r: grpc_route::Retry) -> Result<Retry, String> {
    // "Must be set, even if there are no internal conditions."
    let c = r.conditions.ok_or("retry without conditions")?;
    let codes =
        [(c.cancelled, 1), (c.deadine_exceeded, 4), (c.resource_exhausted, 8), (c.internal, 13), (c.unavailable, 14)];
    Ok(Retry {
        max_retries: r.max_retries,
        max_request_bytes: usize::try_from(r.max_request_bytes).unwrap_or(usize::MAX),
        statuses: Vec::new(),
        grpc_codes: codes.into_iter().filter(|(on, _)| *on).map(|(_, code)| code).collect(),
        timeout: duration(r.timeout)?,
        backoff: backoff(r.backoff)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::routes::select::RouteTable;

    #[test]
    fn grpc_routes_match_by_service_and_method_and_retry_by_code() {
        let rpc = |service: &str, method: &str| api_grpc::GrpcRouteMatch {
            rpc: Some(api_grpc::GrpcRpcMatch { service: service.into(), method: method.into() }),
            headers: Vec::new(),
        };
        let route = |name: &str, m| api::GrpcRoute {
            metadata: Some(linkerd2_proxy_api::meta::Metadata {
                kind: Some(linkerd2_proxy_api::meta::metadata::Kind::Default(name.into())),
            }),
            hosts: Vec::new(),
            rules: vec![grpc_route::Rule {
                matches: vec![m],
                backends: Some(grpc_route::Distribution {
                    kind: Some(grpc_route::distribution::Kind::Empty(Default::default())),
                }),
                retry: Some(grpc_route::Retry {
                    max_retries: 1,
                    conditions: Some(grpc_route::retry::Conditions { unavailable: true, ..Default::default() }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        };
        let routes: Vec<HttpRoute> = [
            route("service", rpc("shop.Cart", "")),
            route("method", rpc("shop.Cart", "Add")),
            route("any-add", rpc("", "Add")),
        ]
        .into_iter()
        .map(|r| HttpRoute::from_grpc(r).unwrap())
        .collect();
        let table = RouteTable::new(routes.clone().into());
        let picked = |path: &str| {
            let req = http::Request::post(path).body(()).unwrap();
            table.select(&req).map(|s| s.route.meta.name.to_string())
        };
        assert_eq!(picked("/shop.Cart/Add").as_deref(), Some("method"));
        assert_eq!(picked("/shop.Cart/Remove").as_deref(), Some("service"));
        assert_eq!(picked("/shop.Orders/Add").as_deref(), Some("any-add"));
        assert_eq!(picked("/shop.Orders/List"), None);
        let retry = routes[0].rules[0].retry.as_ref().unwrap();
        let trailers_only = |code: &'static str| {
            let mut h = http::HeaderMap::new();
            h.insert(crate::http::headers::GRPC_STATUS, http::HeaderValue::from_static(code));
            h
        };
        assert!(retry.retries(http::StatusCode::OK, &trailers_only("14")), "UNAVAILABLE");
        assert!(!retry.retries(http::StatusCode::OK, &trailers_only("5")), "NOT_FOUND is an answer");
        assert!(!retry.retries(http::StatusCode::OK, &http::HeaderMap::new()));
    }
}
