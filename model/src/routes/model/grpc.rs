//! GRPCRoutes: their rules (no timeouts or retries of their own in the Gateway API: the
//! annotations' defaults).

use super::backends::backends;
use super::crd;
use super::defaults::RouteDefaults;
use super::filters::filters;
use super::kind::RouteKind;
use super::matching::{GrpcMatch, Matches, grpc_match};
use super::retry::Timeouts;
use super::route::Route;
use super::rule::Rule;
use crate::meta::{Invalid, NsName};

impl Route {
    pub fn from_grpc(route: &crd::GrpcRoute) -> Result<Self, Invalid> {
        let spec = &route.spec;
        Self::read(RouteKind::Grpc, &route.metadata, &spec.parent_refs, &spec.hostnames, &spec.rules, grpc_rule)
    }
}

fn grpc_rule(rule: &crd::GrpcRouteRule, route: &NsName, defaults: &RouteDefaults) -> Result<Rule, Invalid> {
    let matches = if rule.matches.is_empty() {
        vec![GrpcMatch::default()]
    } else {
        rule.matches.iter().map(grpc_match).collect::<Result<_, _>>()?
    };
    Ok(Rule {
        matches: Matches::Grpc(matches),
        filters: filters(&rule.filters, RouteKind::Grpc)?,
        backends: backends(&rule.backend_refs, route, RouteKind::Grpc)?,
        timeouts: Timeouts { request: defaults.request_timeout, backend_request: None },
        retry: defaults.retry.clone(),
    })
}
