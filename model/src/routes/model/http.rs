//! HTTPRoutes: their rules, with GEP-1731 retries and GEP-2257 timeouts.

use std::ops::RangeInclusive;
use std::time::Duration;

use super::backends::backends;
use super::checks::invalid;
use super::crd;
use super::defaults::RouteDefaults;
use super::filters::{Filter, PathModifier, filters};
use super::kind::RouteKind;
use super::matching::{HttpMatch, Matches, PathMatch, http_match};
use super::retry::{DEFAULT_RETRY_LIMIT, Retry, RetryConditions, Timeouts, duration};
use super::route::Route;
use super::rule::Rule;
use crate::meta::{Invalid, NsName};

impl Route {
    pub fn from_http(route: &crd::HttpRoute) -> Result<Self, Invalid> {
        let spec = &route.spec;
        Self::read(RouteKind::Http, &route.metadata, &spec.parent_refs, &spec.hostnames, &spec.rules, http_rule)
    }
}

fn http_rule(rule: &crd::HttpRouteRule, route: &NsName, defaults: &RouteDefaults) -> Result<Rule, Invalid> {
    let matches = match rule.matches.as_deref() {
        None | Some([]) => vec![HttpMatch { path: Some(PathMatch::Prefix("/".into())), ..HttpMatch::default() }],
        Some(matches) => matches.iter().map(http_match).collect::<Result<_, _>>()?,
    };
    let filters = filters(&rule.filters, RouteKind::Http)?;
    if filters.iter().any(|f| matches!(f, Filter::Redirect(r) if matches!(r.path, Some(PathModifier::Prefix(_)))))
        && !matches.iter().all(|m| matches!(m.path, Some(PathMatch::Prefix(_))))
    {
        return invalid("ReplacePrefixMatch needs every match of the rule to be a PathPrefix match");
    }
    let timeouts = rule.timeouts.as_ref();
    let gateway_duration = |value: Option<&String>, what: &str| {
        value.map(|v| duration(v).map_err(|e| Invalid(format!("{what}: {}", e.0)))).transpose().map(Option::flatten)
    };
    let timeouts = Timeouts {
        request: gateway_duration(timeouts.and_then(|t| t.request.as_ref()), "timeouts.request")?
            .or(defaults.request_timeout),
        backend_request: gateway_duration(
            timeouts.and_then(|t| t.backend_request.as_ref()),
            "timeouts.backendRequest",
        )?,
    };
    if let (Some(request), Some(backend)) = (timeouts.request, timeouts.backend_request)
        && backend > request
    {
        return invalid("timeouts.backendRequest is longer than timeouts.request");
    }
    let retry = match &rule.retry {
        Some(retry) => Some(gateway_retry(retry, gateway_duration(retry.backoff.as_ref(), "retry.backoff")?)?),
        None => defaults.retry.clone(),
    };
    let backends = backends(&rule.backend_refs, route, RouteKind::Http)?;
    Ok(Rule { matches: Matches::Http(matches), filters, backends, timeouts, retry })
}

/// GEP-1731: retry these codes (default: none but connection errors), `attempts` times (default
/// here: Linkerd's one), waiting at least `backoff` between tries.
fn gateway_retry(retry: &crd::HttpRouteRetry, backoff: Option<Duration>) -> Result<Retry, Invalid> {
    let mut ranges: Vec<RangeInclusive<u16>> = Vec::new();
    for &code in &retry.codes {
        let code = u16::try_from(code)
            .ok()
            .filter(|c| (400..=599).contains(c))
            .ok_or_else(|| Invalid(format!("retry.codes: {code} is not 400-599")))?;
        match ranges.last_mut() {
            Some(last) if *last.end() + 1 == code => *last = *last.start()..=code,
            _ => ranges.push(code..=code),
        }
    }
    let limit = match retry.attempts {
        None => DEFAULT_RETRY_LIMIT,
        Some(n) => u32::try_from(n).map_err(|_| Invalid(format!("retry.attempts {n} is negative")))?,
    };
    Ok(Retry { limit, conditions: RetryConditions::Http(ranges), timeout: None, backoff })
}
