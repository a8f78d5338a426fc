//! Routes as the outbound policy serves them: HTTPRoutes and GRPCRoutes read once into validated
//! records ([`Route`]), and ReferenceGrants into [`Grant`]s.
//!
//! What cannot be carried out is refused here with the route's kind, namespace, name and the
//! reason ([`Invalid`]), and the index keeps the route's last good version: a regular
//! expression that does not compile, a filter type this mesh does not apply, a duration that is
//! not a Gateway API duration (GEP-2257), a backend that is not a Service port, an annotation
//! that does not parse. Whether a backend in another namespace is allowed depends on the
//! ReferenceGrants of the moment, so that is checked when answers are computed
//! ([`crate::routes::routes_of`]).
//!
//! GAMMA: a route attaches to a Service through a `parentRef` with group `""` (or `core`) and
//! kind `Service`, optionally one port; other parents (Gateways) are someone else's.
//!
//! Retries and timeouts come from the Gateway API fields (`timeouts.request`,
//! `timeouts.backendRequest`, `retry`) and, with Linkerd's `retry.linkerd.io/*` semantics, from
//! the route's annotations `retry.cnimesh.io/http` (HTTPRoute) or `retry.cnimesh.io/grpc`
//! (GRPCRoute), `retry.cnimesh.io/limit`, `retry.cnimesh.io/timeout` and
//! `timeout.cnimesh.io/request`. A rule's own field wins over the route's annotation. The same
//! annotations on a Service ([`ServiceDefaults`]) apply to its default route and to the rules of
//! its routes that set no retry (or no request timeout) by field or annotation: as in Linkerd,
//! a route's own retry configuration replaces the Service's whole.
//!
//! Layer: model/index (pure).

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::crd;
use crate::meta::{Invalid, NsName, key_of};

pub const RETRY_HTTP_ANNOTATION: &str = "retry.cnimesh.io/http";
pub const RETRY_GRPC_ANNOTATION: &str = "retry.cnimesh.io/grpc";
pub const RETRY_LIMIT_ANNOTATION: &str = "retry.cnimesh.io/limit";
pub const RETRY_TIMEOUT_ANNOTATION: &str = "retry.cnimesh.io/timeout";
pub const REQUEST_TIMEOUT_ANNOTATION: &str = "timeout.cnimesh.io/request";

/// How a route names an EgressNetwork parent or backend (the kind itself is
/// [`crate::egress`]'s, which comes after routes).
pub const EGRESS_NETWORK_GROUP: &str = "policy.cnimesh.io";
pub const EGRESS_NETWORK_KIND: &str = "EgressNetwork";

/// Retries when only the conditions are annotated (Linkerd's default).
const DEFAULT_RETRY_LIMIT: u32 = 1;
/// Gateway API's ceiling for a backendRef weight.
const MAX_WEIGHT: i32 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKind {
    Http,
    Grpc,
}

impl RouteKind {
    /// The Kubernetes kind, as route metadata and ReferenceGrants name it.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
        }
    }
}

/// A validated route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub kind: RouteKind,
    pub key: NsName,
    /// Gateway API precedence among routes: the oldest first, then by namespace/name.
    pub created: Option<Time>,
    /// The Services it attaches to; a route attached to none is kept but serves nothing.
    pub parents: Vec<Parent>,
    /// The EgressNetworks it attaches to: served by [`crate::egress`], not here.
    pub egress_parents: Vec<EgressParent>,
    pub hostnames: Vec<HostMatch>,
    /// Never empty.
    pub rules: Vec<Rule>,
}

/// A Service parent; `port: None` attaches to every port of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    pub service: NsName,
    pub port: Option<u16>,
}

/// An EgressNetwork parent (`group: policy.cnimesh.io`, `kind: EgressNetwork`); `port: None`
/// attaches to every port of the destinations it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressParent {
    pub network: NsName,
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    Exact(String),
    /// `*.example.com`: any name ending in `.example.com`.
    Suffix(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Never empty: a rule without matches gets the Gateway API default (every request).
    pub matches: Matches,
    pub filters: Vec<Filter>,
    /// Empty: the parent Service itself (Gateway API: a rule without backends).
    pub backends: Vec<Backend>,
    pub timeouts: Timeouts,
    pub retry: Option<Retry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matches {
    Http(Vec<HttpMatch>),
    Grpc(Vec<GrpcMatch>),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpMatch {
    pub path: Option<PathMatch>,
    pub headers: Vec<ValueMatch>,
    pub query_params: Vec<ValueMatch>,
    pub method: Option<http::Method>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
    Regex(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueMatch {
    pub name: String,
    pub value: MatchValue,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchValue {
    Exact(String),
    Regex(String),
}

/// An RPC match; both parts empty matches every RPC.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrpcMatch {
    pub service: Option<String>,
    pub method: Option<String>,
    pub headers: Vec<ValueMatch>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    RequestHeaders(HeaderModifier),
    ResponseHeaders(HeaderModifier),
    Redirect(Redirect),
}

/// Applied in the order add, set, remove (linkerd2-proxy-api's order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderModifier {
    pub add: Vec<(String, String)>,
    pub set: Vec<(String, String)>,
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
    pub port: Option<u16>,
    pub status: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathModifier {
    Full(String),
    Prefix(String),
}

/// A Service port receiving a share of a rule's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub service: NsName,
    pub port: u16,
    pub weight: u32,
    pub filters: Vec<Filter>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// The whole request, retries included (`timeouts.request`).
    pub request: Option<Duration>,
    /// One attempt at a backend (`timeouts.backendRequest`).
    pub backend_request: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// Retries after the first attempt.
    pub limit: u32,
    pub conditions: RetryConditions,
    /// Per attempt.
    pub timeout: Option<Duration>,
    /// At least this long between attempts.
    pub backoff: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryConditions {
    /// HTTP status ranges.
    Http(Vec<RangeInclusive<u16>>),
    /// gRPC status codes (Linkerd's five retryable ones).
    Grpc(GrpcConditions),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GrpcConditions {
    pub cancelled: bool,
    pub deadline_exceeded: bool,
    pub resource_exhausted: bool,
    pub internal: bool,
    pub unavailable: bool,
}

fn invalid<T>(reason: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid(reason.into()))
}

impl Route {
    pub fn from_http(route: &crd::HttpRoute) -> Result<Self, Invalid> {
        let spec = &route.spec;
        Self::read(RouteKind::Http, &route.metadata, &spec.parent_refs, &spec.hostnames, &spec.rules, http_rule)
    }

    pub fn from_grpc(route: &crd::GrpcRoute) -> Result<Self, Invalid> {
        let spec = &route.spec;
        Self::read(RouteKind::Grpc, &route.metadata, &spec.parent_refs, &spec.hostnames, &spec.rules, grpc_rule)
    }

    /// What both kinds share; a route without rules gets one default rule (Gateway API).
    fn read<R: Default>(
        kind: RouteKind,
        meta: &ObjectMeta,
        parent_refs: &[crd::ParentReference],
        names: &[String],
        rules: &[R],
        rule: fn(&R, &NsName, &RouteDefaults) -> Result<Rule, Invalid>,
    ) -> Result<Self, Invalid> {
        let key = key_of(meta);
        let defaults = RouteDefaults::from_annotations(meta, kind)?;
        let default_rule = [R::default()];
        let rules = if rules.is_empty() { &default_rule[..] } else { rules };
        let rules = rules
            .iter()
            .enumerate()
            .map(|(i, r)| rule(r, &key, &defaults).map_err(|e| in_rule(i, e)))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            kind,
            created: meta.creation_timestamp.clone(),
            parents: parents(parent_refs, &key)?,
            egress_parents: egress_parents(parent_refs, &key)?,
            hostnames: hostnames(names)?,
            key,
            rules,
        })
    }

    /// Whether the route attaches to this Service port.
    pub fn attaches_to(&self, service: &NsName, port: u16) -> bool {
        self.parents.iter().any(|p| p.service == *service && p.port.is_none_or(|p| p == port))
    }

    /// Backends in another namespace than the route's: each needs a ReferenceGrant.
    pub fn foreign_backends(&self) -> impl Iterator<Item = &Backend> {
        self.rules.iter().flat_map(|r| &r.backends).filter(|b| b.service.namespace != self.key.namespace)
    }
}

fn in_rule(index: usize, error: Invalid) -> Invalid {
    Invalid(format!("rules[{index}]: {}", error.0))
}

/// What a route's (or its parent Service's) annotations say for every rule that does not say
/// otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteDefaults {
    pub retry: Option<Retry>,
    pub request_timeout: Option<Duration>,
}

/// A Service's retry and timeout annotations (the same as a route's), for its default route
/// and for every rule of its routes that neither the rule nor its route configures: a route's
/// own retry or timeout wins over the Service's, as in Linkerd.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceDefaults {
    /// For the default route and HTTPRoutes (`retry.cnimesh.io/http`).
    pub http: RouteDefaults,
    /// For GRPCRoutes (`retry.cnimesh.io/grpc`).
    pub grpc: RouteDefaults,
}

impl ServiceDefaults {
    pub fn from_annotations(meta: &ObjectMeta) -> Result<Self, Invalid> {
        Ok(Self {
            http: RouteDefaults::from_annotations(meta, RouteKind::Http)?,
            grpc: RouteDefaults::from_annotations(meta, RouteKind::Grpc)?,
        })
    }

    /// What applies to routes of `kind`.
    pub fn of(&self, kind: RouteKind) -> &RouteDefaults {
        match kind {
            RouteKind::Http => &self.http,
            RouteKind::Grpc => &self.grpc,
        }
    }
}

impl Rule {
    /// The rule with `defaults` (its Service's) filling the retry and request timeout that
    /// neither the rule nor its route set; borrowed when there is nothing to fill.
    pub fn with_defaults(&self, defaults: &RouteDefaults) -> std::borrow::Cow<'_, Rule> {
        let retry = self.retry.is_none() && defaults.retry.is_some();
        let timeout = self.timeouts.request.is_none() && defaults.request_timeout.is_some();
        if !retry && !timeout {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut rule = self.clone();
        if retry {
            rule.retry.clone_from(&defaults.retry);
        }
        if timeout {
            rule.timeouts.request = defaults.request_timeout;
        }
        std::borrow::Cow::Owned(rule)
    }
}

impl RouteDefaults {
    fn from_annotations(meta: &ObjectMeta, kind: RouteKind) -> Result<Self, Invalid> {
        let empty = BTreeMap::new();
        let annotations = meta.annotations.as_ref().unwrap_or(&empty);
        let get = |name: &str| annotations.get(name).map(|v| v.trim());
        let named = |name: &str, error: Invalid| Invalid(format!("annotation {name}: {}", error.0));
        let conditions_annotation = match kind {
            RouteKind::Http => RETRY_HTTP_ANNOTATION,
            RouteKind::Grpc => RETRY_GRPC_ANNOTATION,
        };
        let conditions = get(conditions_annotation)
            .map(|v| match kind {
                RouteKind::Http => http_conditions(v),
                RouteKind::Grpc => grpc_conditions(v),
            })
            .transpose()
            .map_err(|e| named(conditions_annotation, e))?;
        let limit = get(RETRY_LIMIT_ANNOTATION)
            .map(|v| v.parse::<u32>().map_err(|e| Invalid(format!("{v:?}: {e}"))))
            .transpose()
            .map_err(|e| named(RETRY_LIMIT_ANNOTATION, e))?;
        let timeout = get(RETRY_TIMEOUT_ANNOTATION)
            .map(duration)
            .transpose()
            .map_err(|e| named(RETRY_TIMEOUT_ANNOTATION, e))?
            .flatten();
        let request_timeout = get(REQUEST_TIMEOUT_ANNOTATION)
            .map(duration)
            .transpose()
            .map_err(|e| named(REQUEST_TIMEOUT_ANNOTATION, e))?
            .flatten();
        let retry = (conditions.is_some() || limit.is_some() || timeout.is_some()).then(|| Retry {
            limit: limit.unwrap_or(DEFAULT_RETRY_LIMIT),
            conditions: conditions.unwrap_or_else(|| match kind {
                RouteKind::Http => RetryConditions::Http(vec![500..=599]),
                RouteKind::Grpc => RetryConditions::Grpc(GrpcConditions::default()),
            }),
            timeout,
            backoff: None,
        });
        Ok(Self { retry, request_timeout })
    }
}

/// Linkerd's `retry.linkerd.io/http`: `5xx`, `gateway-error` (502–504), a status or a range
/// `500-504`, comma-separated.
fn http_conditions(value: &str) -> Result<RetryConditions, Invalid> {
    let mut ranges = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let range = match part {
            "5xx" => 500..=599,
            "gateway-error" => 502..=504,
            _ => {
                let (start, end) = part.split_once('-').unwrap_or((part, part));
                let status = |s: &str| {
                    s.trim().parse::<u16>().ok().filter(|s| (100..=599).contains(s)).ok_or_else(|| {
                        Invalid(format!("{part:?} is not 5xx, gateway-error, an HTTP status or a range of them"))
                    })
                };
                let (start, end) = (status(start)?, status(end)?);
                if start > end {
                    return invalid(format!("range {part:?} is empty"));
                }
                start..=end
            }
        };
        ranges.push(range);
    }
    if ranges.is_empty() {
        return invalid("no retry condition");
    }
    Ok(RetryConditions::Http(ranges))
}

/// Linkerd's `retry.linkerd.io/grpc`: `cancelled`, `deadline-exceeded`, `resource-exhausted`,
/// `internal`, `unavailable`, comma-separated.
fn grpc_conditions(value: &str) -> Result<RetryConditions, Invalid> {
    let mut c = GrpcConditions::default();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "cancelled" => c.cancelled = true,
            "deadline-exceeded" => c.deadline_exceeded = true,
            "resource-exhausted" => c.resource_exhausted = true,
            "internal" => c.internal = true,
            "unavailable" => c.unavailable = true,
            other => {
                return invalid(format!(
                    "{other:?} is not cancelled, deadline-exceeded, resource-exhausted, internal or unavailable"
                ));
            }
        }
    }
    Ok(RetryConditions::Grpc(c))
}

/// A Gateway API duration (GEP-2257): one to four `<1–5 digits><h|m|s|ms>` parts, e.g. `1h30m`,
/// `500ms`. Zero means none (no timeout), as the Gateway API says for timeouts.
pub fn duration(text: &str) -> Result<Option<Duration>, Invalid> {
    let bad = || Invalid(format!("{text:?} is not a Gateway API duration (e.g. 10s, 1m30s, 500ms)"));
    let (mut rest, mut total, mut parts) = (text, Duration::ZERO, 0);
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(bad());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else {
            match rest.as_bytes().first() {
                Some(b'h') => (Duration::from_secs(3600), 1),
                Some(b'm') => (Duration::from_secs(60), 1),
                Some(b's') => (Duration::from_secs(1), 1),
                _ => return Err(bad()),
            }
        };
        rest = &rest[len..];
        total += unit * u32::try_from(number).map_err(|_| bad())?;
        parts += 1;
    }
    if parts == 0 || parts > 4 {
        return Err(bad());
    }
    Ok((!total.is_zero()).then_some(total))
}

fn parents(refs: &[crd::ParentReference], route: &NsName) -> Result<Vec<Parent>, Invalid> {
    let mut parents = Vec::new();
    for r in refs {
        let core = matches!(r.group.as_deref(), Some("" | "core"));
        if !(core && r.kind.as_deref() == Some("Service")) {
            continue; // A Gateway or another implementation's parent: not ours to serve.
        }
        if let Some(section) = &r.section_name {
            // A port name would narrow the route; ignoring it would widen it. Refuse instead.
            return invalid(format!(
                "parentRef Service {}: sectionName {section:?} is not supported, use port",
                r.name
            ));
        }
        let port = r.port.map(|p| port(p, "parentRef port")).transpose()?;
        let namespace = r.namespace.clone().unwrap_or_else(|| route.namespace.clone());
        parents.push(Parent { service: NsName::new(namespace, &r.name), port });
    }
    Ok(parents)
}

/// The EgressNetwork parents of a route. An EgressNetwork lives beside its routes:
/// a parentRef to another namespace's is refused, as Linkerd refuses it.
pub fn egress_parents(refs: &[crd::ParentReference], route: &NsName) -> Result<Vec<EgressParent>, Invalid> {
    let mut parents = Vec::new();
    for r in refs.iter().filter(|r| is_egress_network(r.group.as_deref(), r.kind.as_deref())) {
        if let Some(section) = &r.section_name {
            return invalid(format!(
                "parentRef EgressNetwork {}: sectionName {section:?} is not supported, use port",
                r.name
            ));
        }
        if r.namespace.as_deref().is_some_and(|ns| ns != route.namespace) {
            return invalid(format!(
                "parentRef EgressNetwork {}: an EgressNetwork parent must be in the route's namespace {}",
                r.name, route.namespace
            ));
        }
        let port = r.port.map(|p| port(p, "parentRef port")).transpose()?;
        parents.push(EgressParent { network: NsName::new(&route.namespace, &r.name), port });
    }
    Ok(parents)
}

/// Whether a reference's group and kind name an EgressNetwork.
pub fn is_egress_network(group: Option<&str>, kind: Option<&str>) -> bool {
    group == Some(EGRESS_NETWORK_GROUP) && kind == Some(EGRESS_NETWORK_KIND)
}

fn port(value: i32, what: &str) -> Result<u16, Invalid> {
    u16::try_from(value).ok().filter(|p| *p > 0).ok_or_else(|| Invalid(format!("{what} {value} is not 1-65535")))
}

pub fn hostnames(names: &[String]) -> Result<Vec<HostMatch>, Invalid> {
    names
        .iter()
        .map(|name| {
            let (suffix, host) = match name.strip_prefix("*.") {
                Some(rest) => (true, rest),
                None => (false, name.as_str()),
            };
            let valid = !host.is_empty()
                && host.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                });
            if !valid {
                return invalid(format!("hostname {name:?} is not a lowercase DNS name or *.<name>"));
            }
            Ok(if suffix { HostMatch::Suffix(host.to_string()) } else { HostMatch::Exact(host.to_string()) })
        })
        .collect()
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

fn http_match(m: &crd::HttpRouteMatch) -> Result<HttpMatch, Invalid> {
    let path = match &m.path {
        None => None,
        Some(p) => {
            let value = p.value.clone().unwrap_or_else(|| "/".into());
            Some(match p.kind.as_deref().unwrap_or("PathPrefix") {
                "Exact" => PathMatch::Exact(absolute_path(value)?),
                "PathPrefix" => PathMatch::Prefix(absolute_path(value)?),
                "RegularExpression" => PathMatch::Regex(regex(value, "path")?),
                other => {
                    return invalid(format!("path match type {other:?} is not Exact, PathPrefix or RegularExpression"));
                }
            })
        }
    };
    let method = m
        .method
        .as_deref()
        .map(|method| {
            const METHODS: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];
            METHODS
                .contains(&method)
                .then(|| http::Method::from_bytes(method.as_bytes()).ok())
                .flatten()
                .ok_or_else(|| Invalid(format!("method {method:?} is not one of {}", METHODS.join(", "))))
        })
        .transpose()?;
    Ok(HttpMatch {
        path,
        headers: value_matches(&m.headers, "header", header_name)?,
        query_params: value_matches(&m.query_params, "query parameter", |n| Ok(n.to_string()))?,
        method,
    })
}

fn absolute_path(value: String) -> Result<String, Invalid> {
    if value.starts_with('/') { Ok(value) } else { invalid(format!("path {value:?} does not start with /")) }
}

fn regex(value: String, what: &str) -> Result<String, Invalid> {
    match regex::Regex::new(&value) {
        Ok(_) => Ok(value),
        Err(e) => invalid(format!("{what} regular expression {value:?}: {e}")),
    }
}

fn header_name(name: &str) -> Result<String, Invalid> {
    http::HeaderName::from_bytes(name.as_bytes())
        .map(|n| n.as_str().to_string())
        .map_err(|_| Invalid(format!("{name:?} is not an HTTP header name")))
}

fn value_matches(
    matches: &[crd::ValueMatch],
    what: &str,
    name: impl Fn(&str) -> Result<String, Invalid>,
) -> Result<Vec<ValueMatch>, Invalid> {
    matches
        .iter()
        .map(|m| {
            let value = match m.kind.as_deref().unwrap_or("Exact") {
                "Exact" => MatchValue::Exact(m.value.clone()),
                "RegularExpression" => MatchValue::Regex(regex(m.value.clone(), what)?),
                other => return invalid(format!("{what} match type {other:?} is not Exact or RegularExpression")),
            };
            Ok(ValueMatch { name: name(&m.name)?, value })
        })
        .collect()
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

fn grpc_match(m: &crd::GrpcRouteMatch) -> Result<GrpcMatch, Invalid> {
    let (service, method) = match &m.method {
        None => (None, None),
        Some(method) => {
            if method.kind.as_deref().unwrap_or("Exact") != "Exact" {
                // linkerd2-proxy-api's GrpcRpcMatch holds exact names only.
                return invalid(format!(
                    "method match type {:?}: only Exact can be served (linkerd2-proxy-api matches exact service and method names)",
                    method.kind.as_deref().unwrap_or_default()
                ));
            }
            if method.service.is_none() && method.method.is_none() {
                return invalid("a method match needs a service or a method");
            }
            (method.service.clone(), method.method.clone())
        }
    };
    Ok(GrpcMatch { service, method, headers: value_matches(&m.headers, "header", header_name)? })
}

fn filters(filters: &[crd::HttpRouteFilter], kind: RouteKind) -> Result<Vec<Filter>, Invalid> {
    filters.iter().map(|f| filter(f, kind)).collect()
}

fn filter(f: &crd::HttpRouteFilter, kind: RouteKind) -> Result<Filter, Invalid> {
    let missing = || Invalid(format!("filter {} has no {} field", f.kind, field_of(&f.kind)));
    match (f.kind.as_str(), kind) {
        ("RequestHeaderModifier", _) => {
            Ok(Filter::RequestHeaders(header_modifier(f.request_header_modifier.as_ref().ok_or_else(missing)?)?))
        }
        ("ResponseHeaderModifier", RouteKind::Http) => {
            Ok(Filter::ResponseHeaders(header_modifier(f.response_header_modifier.as_ref().ok_or_else(missing)?)?))
        }
        ("RequestRedirect", RouteKind::Http) => {
            Ok(Filter::Redirect(redirect(f.request_redirect.as_ref().ok_or_else(missing)?)?))
        }
        ("URLRewrite", RouteKind::Http) => {
            // linkerd2-proxy-api's outbound filters have no rewrite: a new Host header can be
            // set, a new path cannot.
            let rewrite = f.url_rewrite.as_ref().ok_or_else(missing)?;
            if rewrite.path.is_some() {
                return invalid(
                    "URLRewrite of the path cannot be served (linkerd2-proxy-api's outbound HttpRoute filters have no path rewrite); only hostname can",
                );
            }
            let host = rewrite.hostname.clone().ok_or_else(|| Invalid("URLRewrite with nothing to rewrite".into()))?;
            hostnames(std::slice::from_ref(&host))?;
            Ok(Filter::RequestHeaders(HeaderModifier { set: vec![("host".into(), host)], ..HeaderModifier::default() }))
        }
        (other, RouteKind::Http) => invalid(format!(
            "filter type {other:?} is not supported (RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect, URLRewrite are)"
        )),
        (other, RouteKind::Grpc) => invalid(format!(
            "filter type {other:?} is not supported on a GRPCRoute (linkerd2-proxy-api's gRPC routes take RequestHeaderModifier only)"
        )),
    }
}

fn field_of(kind: &str) -> &'static str {
    match kind {
        "RequestHeaderModifier" => "requestHeaderModifier",
        "ResponseHeaderModifier" => "responseHeaderModifier",
        "RequestRedirect" => "requestRedirect",
        _ => "urlRewrite",
    }
}

fn header_modifier(f: &crd::HttpHeaderFilter) -> Result<HeaderModifier, Invalid> {
    let pairs = |headers: &[crd::HttpHeader]| {
        headers
            .iter()
            .map(|h| {
                http::HeaderValue::from_str(&h.value).map_err(|_| {
                    Invalid(format!("header {:?}: value {:?} is not a valid header value", h.name, h.value))
                })?;
                Ok((header_name(&h.name)?, h.value.clone()))
            })
            .collect::<Result<Vec<_>, Invalid>>()
    };
    Ok(HeaderModifier {
        add: pairs(&f.add)?,
        set: pairs(&f.set)?,
        remove: f.remove.iter().map(|n| header_name(n)).collect::<Result<_, _>>()?,
    })
}

fn redirect(f: &crd::HttpRequestRedirectFilter) -> Result<Redirect, Invalid> {
    if let Some(scheme) = f.scheme.as_deref()
        && !matches!(scheme, "http" | "https")
    {
        return invalid(format!("redirect scheme {scheme:?} is not http or https"));
    }
    if let Some(host) = &f.hostname {
        hostnames(std::slice::from_ref(host))?;
    }
    let path = f
        .path
        .as_ref()
        .map(|p| match (p.kind.as_str(), &p.replace_full_path, &p.replace_prefix_match) {
            ("ReplaceFullPath", Some(full), _) => Ok(PathModifier::Full(full.clone())),
            ("ReplacePrefixMatch", _, Some(prefix)) => Ok(PathModifier::Prefix(prefix.clone())),
            (kind, _, _) => invalid(format!(
                "redirect path type {kind:?} needs ReplaceFullPath with replaceFullPath or ReplacePrefixMatch with replacePrefixMatch"
            )),
        })
        .transpose()?;
    let status = f
        .status_code
        .map(|s| match s {
            301 | 302 | 303 | 307 | 308 => Ok(s as u16),
            other => invalid(format!("redirect statusCode {other} is not 301, 302, 303, 307 or 308")),
        })
        .transpose()?;
    Ok(Redirect {
        scheme: f.scheme.clone(),
        hostname: f.hostname.clone(),
        path,
        port: f.port.map(|p| port(p, "redirect port")).transpose()?,
        status,
    })
}

fn backends(refs: &[crd::HttpBackendRef], route: &NsName, kind: RouteKind) -> Result<Vec<Backend>, Invalid> {
    refs.iter()
        // A backendRef to an EgressNetwork (egress routes) is "the parent itself": the
        // connection's original destination, as a rule without backends.
        .filter(|b| !is_egress_network(b.group.as_deref(), b.kind.as_deref()))
        .map(|b| {
            let core = b.group.as_deref().is_none_or(|g| g.is_empty() || g == "core");
            if !(core && b.kind.as_deref().is_none_or(|k| k == "Service")) {
                return invalid(format!(
                    "backendRef {}: only Services are supported (group {:?}, kind {:?})",
                    b.name,
                    b.group.as_deref().unwrap_or_default(),
                    b.kind.as_deref().unwrap_or("Service")
                ));
            }
            let port =
                port(b.port.ok_or_else(|| Invalid(format!("backendRef {} has no port", b.name)))?, "backendRef port")?;
            let weight = b.weight.unwrap_or(1);
            if !(0..=MAX_WEIGHT).contains(&weight) {
                return invalid(format!("backendRef {} weight {weight} is not 0-{MAX_WEIGHT}", b.name));
            }
            Ok(Backend {
                service: NsName::new(b.namespace.as_deref().unwrap_or(&route.namespace), &b.name),
                port,
                weight: weight as u32,
                filters: filters(&b.filters, kind)?,
            })
        })
        .collect()
}

/// A ReferenceGrant: which routes from which namespaces may send to which Services of the
/// grant's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// (route kind, namespace).
    pub from: Vec<(RouteKind, String)>,
    /// Service names; `None` allows every Service of the namespace.
    pub to: Vec<Option<String>>,
}

impl Grant {
    /// Entries for other kinds (Gateways, Secrets) are someone else's and ignored.
    pub fn from_crd(grant: &crd::ReferenceGrant) -> Self {
        let from = grant
            .spec
            .from
            .iter()
            .filter(|f| f.group == crd::GROUP)
            .filter_map(|f| {
                let kind = match f.kind.as_str() {
                    "HTTPRoute" => RouteKind::Http,
                    "GRPCRoute" => RouteKind::Grpc,
                    _ => return None,
                };
                Some((kind, f.namespace.clone()))
            })
            .collect();
        let to = grant
            .spec
            .to
            .iter()
            .filter(|t| matches!(t.group.as_str(), "" | "core") && t.kind == "Service")
            .map(|t| t.name.clone())
            .collect();
        Self { from, to }
    }

    pub fn permits(&self, kind: RouteKind, from_namespace: &str, service: &str) -> bool {
        self.from.iter().any(|(k, ns)| *k == kind && ns == from_namespace)
            && self.to.iter().any(|name| name.as_deref().is_none_or(|n| n == service))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(text: &str) -> Result<Route, Invalid> {
        Route::from_http(&serde_saphyr::from_str::<crd::HttpRoute>(text).expect("parses"))
    }

    fn grpc(text: &str) -> Result<Route, Invalid> {
        Route::from_grpc(&serde_saphyr::from_str::<crd::GrpcRoute>(text).expect("parses"))
    }

    const HEAD: &str =
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop}\n";

    fn route(spec: &str) -> Result<Route, Invalid> {
        http(&format!("{HEAD}spec:\n  parentRefs: [{{group: '', kind: Service, name: api, port: 80}}]\n{spec}"))
    }

    #[test]
    fn a_full_route_is_read() {
        let r = route(
            r#"  hostnames: [api.shop, "*.example.com"]
  rules:
  - matches:
    - path: {type: Exact, value: /v1/items}
      method: GET
      headers: [{name: X-Canary, value: "1"}, {type: RegularExpression, name: x-user, value: "^a.*"}]
      queryParams: [{name: page, value: "2"}]
    - path: {type: RegularExpression, value: "^/v[0-9]+/"}
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {add: [{name: x-a, value: b}], set: [{name: x-s, value: t}], remove: [x-r]}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {remove: [server]}
    - type: URLRewrite
      urlRewrite: {hostname: api.internal}
    backendRefs:
    - {name: api, port: 80, weight: 90}
    - {name: api-canary, port: 8080, weight: 10, filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-canary, value: "1"}]}}]}
    timeouts: {request: 10s, backendRequest: 1m0s}
  - matches: [{path: {type: PathPrefix, value: /old}}]
    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}, statusCode: 301}}]
"#,
        );
        let error = r.unwrap_err();
        assert!(error.0.contains("rules[0]: timeouts.backendRequest is longer"), "{error}");
        let r = route(
            r#"  hostnames: [api.shop, "*.example.com"]
  rules:
  - matches:
    - path: {type: Exact, value: /v1/items}
      method: GET
      headers: [{name: X-Canary, value: "1"}, {type: RegularExpression, name: x-user, value: "^a.*"}]
      queryParams: [{name: page, value: "2"}]
    filters:
    - type: URLRewrite
      urlRewrite: {hostname: api.internal}
    backendRefs:
    - {name: api, port: 80, weight: 90}
    - {name: api-canary, namespace: canary, port: 8080, weight: 10}
    timeouts: {request: 10s, backendRequest: 500ms}
    retry: {codes: [500, 502, 503, 504], attempts: 3, backoff: 100ms}
"#,
        )
        .unwrap();
        assert_eq!(r.parents, [Parent { service: NsName::new("shop", "api"), port: Some(80) }]);
        assert_eq!(r.hostnames, [HostMatch::Exact("api.shop".into()), HostMatch::Suffix("example.com".into())]);
        let rule = &r.rules[0];
        let Matches::Http(m) = &rule.matches else { panic!() };
        assert_eq!(m[0].path, Some(PathMatch::Exact("/v1/items".into())));
        assert_eq!(m[0].method, Some(http::Method::GET));
        assert_eq!(m[0].headers[0].name, "x-canary", "header names are lowercase");
        assert_eq!(
            rule.filters,
            [Filter::RequestHeaders(HeaderModifier {
                set: vec![("host".into(), "api.internal".into())],
                ..HeaderModifier::default()
            })]
        );
        assert_eq!(rule.backends[1].service, NsName::new("canary", "api-canary"));
        assert_eq!(r.foreign_backends().count(), 1);
        assert_eq!(rule.timeouts.request, Some(Duration::from_secs(10)));
        assert_eq!(rule.timeouts.backend_request, Some(Duration::from_millis(500)));
        let retry = rule.retry.as_ref().unwrap();
        assert_eq!((retry.limit, retry.backoff), (3, Some(Duration::from_millis(100))));
        assert_eq!(retry.conditions, RetryConditions::Http(vec![500..=500, 502..=504]));
        assert!(r.attaches_to(&NsName::new("shop", "api"), 80));
        assert!(!r.attaches_to(&NsName::new("shop", "api"), 81));
    }

    #[test]
    fn defaults_and_annotations() {
        let r = http(&format!(
            "{}spec:\n  parentRefs: [{{group: core, kind: Service, name: api}}, {{name: gw}}]\n",
            HEAD.replace(
                "namespace: shop",
                "namespace: shop, annotations: {retry.cnimesh.io/http: '5xx,429,500-504', retry.cnimesh.io/timeout: 300ms, timeout.cnimesh.io/request: 2s}"
            )
        ))
        .unwrap();
        assert_eq!(r.parents.len(), 1, "the Gateway parent is not ours");
        let rule = &r.rules[0];
        assert_eq!(
            rule.matches,
            Matches::Http(vec![HttpMatch { path: Some(PathMatch::Prefix("/".into())), ..HttpMatch::default() }])
        );
        assert!(rule.backends.is_empty(), "no backendRefs: the parent Service");
        assert_eq!(rule.timeouts.request, Some(Duration::from_secs(2)));
        assert_eq!(
            rule.retry,
            Some(Retry {
                limit: 1,
                conditions: RetryConditions::Http(vec![500..=599, 429..=429, 500..=504]),
                timeout: Some(Duration::from_millis(300)),
                backoff: None,
            })
        );
        let g = grpc(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g, namespace: shop, annotations: {retry.cnimesh.io/grpc: 'unavailable,internal', retry.cnimesh.io/limit: '4'}}\nspec:\n  parentRefs: [{group: '', kind: Service, name: api}]\n  rules:\n  - matches: [{method: {service: shop.Items, method: Get}}]\n    backendRefs: [{name: api, port: 9090}]\n",
        )
        .unwrap();
        let Matches::Grpc(m) = &g.rules[0].matches else { panic!() };
        assert_eq!((m[0].service.as_deref(), m[0].method.as_deref()), (Some("shop.Items"), Some("Get")));
        let retry = g.rules[0].retry.as_ref().unwrap();
        assert_eq!(retry.limit, 4);
        assert_eq!(
            retry.conditions,
            RetryConditions::Grpc(GrpcConditions { internal: true, unavailable: true, ..GrpcConditions::default() })
        );
    }

    #[test]
    fn a_services_annotations_fill_what_its_routes_leave_unset() {
        let meta = |annotations: &[(&str, &str)]| ObjectMeta {
            annotations: Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..ObjectMeta::default()
        };
        let service = ServiceDefaults::from_annotations(&meta(&[
            (RETRY_HTTP_ANNOTATION, "gateway-error"),
            (RETRY_GRPC_ANNOTATION, "unavailable"),
            (RETRY_LIMIT_ANNOTATION, "2"),
            (REQUEST_TIMEOUT_ANNOTATION, "3s"),
        ]))
        .unwrap();
        let http_retry = service.of(RouteKind::Http).retry.clone().unwrap();
        assert_eq!((http_retry.limit, &http_retry.conditions), (2, &RetryConditions::Http(vec![502..=504])));
        let grpc = GrpcConditions { unavailable: true, ..GrpcConditions::default() };
        assert_eq!(service.of(RouteKind::Grpc).retry.as_ref().unwrap().conditions, RetryConditions::Grpc(grpc));
        assert_eq!(service.http.request_timeout, Some(Duration::from_secs(3)));
        assert_eq!(ServiceDefaults::from_annotations(&ObjectMeta::default()).unwrap(), ServiceDefaults::default());
        let bad = ServiceDefaults::from_annotations(&meta(&[(RETRY_LIMIT_ANNOTATION, "lots")])).unwrap_err();
        assert!(bad.0.contains(RETRY_LIMIT_ANNOTATION), "{bad}");

        // A route without retries or timeouts takes the Service's; one with its own keeps them.
        let plain = route("  rules: [{}]\n").unwrap();
        let filled = plain.rules[0].with_defaults(&service.http);
        assert_eq!((filled.retry.as_ref(), filled.timeouts.request), (Some(&http_retry), Some(Duration::from_secs(3))));
        let own = http(&format!(
            "{}spec:\n  parentRefs: [{{group: '', kind: Service, name: api}}]\n",
            HEAD.replace(
                "namespace: shop",
                "namespace: shop, annotations: {retry.cnimesh.io/http: '503', timeout.cnimesh.io/request: 1s}"
            )
        ))
        .unwrap();
        let kept = own.rules[0].with_defaults(&service.http);
        assert!(matches!(kept, std::borrow::Cow::Borrowed(_)), "nothing to fill");
        let retry = kept.retry.as_ref().unwrap();
        assert_eq!(
            (retry.limit, &retry.conditions),
            (1, &RetryConditions::Http(vec![503..=503])),
            "the route's, whole"
        );
        assert_eq!(kept.timeouts.request, Some(Duration::from_secs(1)));
        let timeout_only = route("  rules: [{timeouts: {request: 5s}}]\n").unwrap();
        let mixed = timeout_only.rules[0].with_defaults(&service.http);
        assert_eq!((mixed.retry.as_ref(), mixed.timeouts.request), (Some(&http_retry), Some(Duration::from_secs(5))));
    }

    #[test]
    fn bad_routes_are_refused_with_the_reason() {
        let cases = [
            ("  rules: [{matches: [{path: {type: RegularExpression, value: '(['}}]}]\n", "path regular expression"),
            ("  rules: [{matches: [{path: {type: Exact, value: items}}]}]\n", "does not start with /"),
            ("  rules: [{matches: [{path: {type: Glob, value: /a}}]}]\n", "path match type \"Glob\""),
            ("  rules: [{matches: [{method: FETCH}]}]\n", "method \"FETCH\""),
            ("  rules: [{matches: [{headers: [{name: 'a b', value: x}]}]}]\n", "not an HTTP header name"),
            ("  rules: [{filters: [{type: RequestMirror}]}]\n", "filter type \"RequestMirror\" is not supported"),
            ("  rules: [{filters: [{type: ExtensionRef}]}]\n", "filter type \"ExtensionRef\""),
            ("  rules: [{filters: [{type: RequestHeaderModifier}]}]\n", "has no requestHeaderModifier"),
            (
                "  rules: [{filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /x}}}]}]\n",
                "URLRewrite of the path",
            ),
            (
                "  rules: [{timeouts: {request: 10 seconds}}]\n",
                "timeouts.request: \"10 seconds\" is not a Gateway API duration",
            ),
            ("  rules: [{timeouts: {request: 1.5s}}]\n", "not a Gateway API duration"),
            ("  rules: [{backendRefs: [{name: api}]}]\n", "backendRef api has no port"),
            (
                "  rules: [{backendRefs: [{name: x, kind: ServiceImport, group: multicluster.x-k8s.io, port: 80}]}]\n",
                "only Services",
            ),
            ("  rules: [{backendRefs: [{name: api, port: 80, weight: -1}]}]\n", "weight -1"),
            ("  rules: [{retry: {codes: [200]}}]\n", "retry.codes: 200"),
            (
                "  rules: [{matches: [{path: {type: Exact, value: /a}}], filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]}]\n",
                "ReplacePrefixMatch needs",
            ),
            ("  rules: [{filters: [{type: RequestRedirect, requestRedirect: {statusCode: 200}}]}]\n", "statusCode 200"),
            ("  hostnames: [Not_A_Host]\n", "hostname \"Not_A_Host\""),
            (
                "  rules: [{backendRefs: [{name: api, port: 80, weight: 0}], retry: {attempts: -2}}]\n",
                "retry.attempts -2",
            ),
        ];
        for (spec, reason) in cases {
            let error = route(spec).expect_err(spec);
            assert!(error.0.contains(reason), "{spec}: {error}");
        }
        let annotated = |a: &str| {
            http(&format!(
                "{}spec: {{}}\n",
                HEAD.replace("namespace: shop", &format!("namespace: shop, annotations: {{{a}}}"))
            ))
        };
        assert!(annotated("retry.cnimesh.io/http: 6xx").unwrap_err().0.contains("annotation retry.cnimesh.io/http"));
        assert!(annotated("retry.cnimesh.io/limit: many").unwrap_err().0.contains("retry.cnimesh.io/limit"));
        assert!(annotated("timeout.cnimesh.io/request: 5").unwrap_err().0.contains("timeout.cnimesh.io/request"));
        let section = http(&format!(
            "{HEAD}spec: {{parentRefs: [{{group: '', kind: Service, name: api, sectionName: http}}]}}\n"
        ));
        assert!(section.unwrap_err().0.contains("sectionName \"http\" is not supported"));
        let grpc_error = grpc(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g, namespace: shop}\nspec:\n  rules: [{matches: [{method: {type: RegularExpression, service: 'shop\\..*'}}]}]\n",
        )
        .unwrap_err();
        assert!(grpc_error.0.contains("only Exact"), "{grpc_error}");
        let grpc_error = grpc(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g, namespace: shop}\nspec:\n  rules: [{filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {}}]}]\n",
        )
        .unwrap_err();
        assert!(grpc_error.0.contains("on a GRPCRoute"), "{grpc_error}");
    }

    #[test]
    fn gateway_durations() {
        assert_eq!(duration("1h30m").unwrap(), Some(Duration::from_secs(5400)));
        assert_eq!(duration("500ms").unwrap(), Some(Duration::from_millis(500)));
        assert_eq!(duration("1m1s1ms").unwrap(), Some(Duration::from_millis(61_001)));
        assert_eq!(duration("0s").unwrap(), None, "zero: no timeout");
        for bad in ["", "s", "10", "1.5s", "123456s", "1h1h1h1h1h", "-1s", "1 s", "1d"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reference_grants() {
        let grant: crd::ReferenceGrant = serde_saphyr::from_str(
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: canary}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}, {group: gateway.networking.k8s.io, kind: Gateway, namespace: edge}]\n  to: [{group: '', kind: Service, name: api-canary}]\n",
        )
        .unwrap();
        let grant = Grant::from_crd(&grant);
        assert!(grant.permits(RouteKind::Http, "shop", "api-canary"));
        assert!(!grant.permits(RouteKind::Grpc, "shop", "api-canary"));
        assert!(!grant.permits(RouteKind::Http, "edge", "api-canary"));
        assert!(!grant.permits(RouteKind::Http, "shop", "db"));
    }
}
