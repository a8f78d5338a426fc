//! HTTP routes of an outbound policy (linkerd2-proxy-api 0.20's `outbound.HttpRoute`), checked
//! into plain structures when the policy arrives: regexes compiled, header names and values
//! parsed, durations converted. A route the proxy cannot apply is refused with the policy
//! (the last good policy stays), as linkerd2-proxy's `client-policy` refuses it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use linkerd2_proxy_api::http_route as api_route;
use linkerd2_proxy_api::http_types;
use linkerd2_proxy_api::meta;
use linkerd2_proxy_api::outbound::{self as api, backend, http_route};

/// A resource as the control plane names it (a parent Service, a route, a backend): the
/// `parent_*`, `route_*` and `backend_*` labels of route metrics. A default the control plane
/// names (`Metadata.default`) has kind `default`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceRef {
    pub group: Arc<str>,
    pub kind: Arc<str>,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub port: u16,
    pub section: Arc<str>,
}

impl ResourceRef {
    pub fn default_named(name: &str) -> Self {
        Self {
            group: "".into(),
            kind: "default".into(),
            namespace: "".into(),
            name: name.into(),
            port: 0,
            section: "".into(),
        }
    }
}

/// The resource `m` names; an error when it names none.
pub fn resource_ref(m: Option<meta::Metadata>) -> Result<ResourceRef, String> {
    match m.and_then(|m| m.kind).ok_or("no metadata")? {
        meta::metadata::Kind::Default(name) => Ok(ResourceRef::default_named(&name)),
        meta::metadata::Kind::Resource(r) => Ok(ResourceRef {
            port: u16::try_from(r.port).map_err(|_| format!("port {} out of range", r.port))?,
            group: r.group.into(),
            kind: r.kind.into(),
            namespace: r.namespace.into(),
            name: r.name.into(),
            section: r.section.into(),
        }),
    }
}

#[derive(Debug, Clone)]
pub struct HttpRoute {
    pub meta: ResourceRef,
    /// Empty: any host.
    pub hosts: Vec<HostMatch>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    Exact(String),
    /// `*.example.com` as `.example.com`.
    Suffix(String),
}

#[derive(Debug, Clone)]
pub struct Rule {
    /// Empty: every request.
    pub matches: Vec<RequestMatch>,
    pub filters: Vec<Filter>,
    pub backends: Vec<WeightedBackend>,
    /// Answered 504 when the whole exchange (with retries) takes longer.
    pub request_timeout: Option<Duration>,
    pub retry: Option<Retry>,
}

/// When a request of the rule is sent again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    pub max_retries: u32,
    /// A request body larger than this (or than the proxy's own 64 KiB cap) is not buffered,
    /// so that request is not retried.
    pub max_request_bytes: usize,
    /// Response statuses that are retried, inclusive ranges.
    pub statuses: Vec<(u16, u16)>,
    /// gRPC status codes that are retried (from a trailers-only answer's headers).
    pub grpc_codes: Vec<u16>,
    /// Each attempt's own time limit: an attempt that runs out is retried.
    pub timeout: Option<Duration>,
    /// Waits between attempts: `min` doubling up to `max`.
    pub backoff: Option<(Duration, Duration)>,
}

impl Retry {
    /// Whether a response with these status and headers is retried.
    pub fn retries(&self, status: http::StatusCode, headers: &http::HeaderMap) -> bool {
        let code = status.as_u16();
        let grpc = headers.get(&crate::http::headers::GRPC_STATUS).and_then(|v| v.to_str().ok()?.parse::<u16>().ok());
        self.statuses.iter().any(|(start, end)| (*start..=*end).contains(&code))
            || grpc.is_some_and(|g| self.grpc_codes.contains(&g))
    }
}

#[derive(Debug, Clone, Default)]
pub struct RequestMatch {
    pub path: Option<PathMatch>,
    pub headers: Vec<(HeaderName, ValueMatch)>,
    pub query: Vec<(String, ValueMatch)>,
    pub method: Option<http::Method>,
}

#[derive(Debug, Clone)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
    Regex(regex::Regex),
}

#[derive(Debug, Clone)]
pub enum ValueMatch {
    Exact(Vec<u8>),
    Regex(regex::Regex),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderModifier {
    pub add: Vec<(HeaderName, HeaderValue)>,
    pub set: Vec<(HeaderName, HeaderValue)>,
    pub remove: Vec<HeaderName>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    pub scheme: Option<http::uri::Scheme>,
    pub host: Option<String>,
    pub path: Option<PathModifier>,
    pub port: Option<u16>,
    pub status: http::StatusCode,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathModifier {
    Full(String),
    /// The matched prefix is replaced by this.
    Prefix(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    RequestHeaders(HeaderModifier),
    ResponseHeaders(HeaderModifier),
    Redirect(Redirect),
    /// Answer a `ratio` of requests with this status (and message) instead of forwarding.
    Fail {
        status: http::StatusCode,
        message: String,
        ratio: Ratio,
    },
    /// The same for gRPC: a trailers-only answer with this `grpc-status`.
    FailGrpc {
        code: u16,
        message: String,
        ratio: Ratio,
    },
}

/// `numerator / denominator` of requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ratio {
    pub numerator: u32,
    pub denominator: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightedBackend {
    pub backend: Backend,
    pub weight: u32,
    pub filters: Vec<Filter>,
}

/// Where a backend's requests go.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Backend {
    /// A service's endpoints from Destination `Get` of this path (`name.ns.svc.domain:port`).
    Service { meta: ResourceRef, path: Arc<str> },
    /// One address.
    Forward { meta: ResourceRef, addr: SocketAddr },
}

impl Backend {
    /// The backend as metrics name it.
    pub fn meta(&self) -> &ResourceRef {
        match self {
            Self::Service { meta, .. } | Self::Forward { meta, .. } => meta,
        }
    }
}

/// Why a route was refused.
#[derive(Debug, thiserror::Error)]
#[error("route {route}: {why}")]
pub struct InvalidRoute {
    pub route: String,
    pub why: String,
}

pub(super) fn duration<D>(d: Option<D>) -> Result<Option<Duration>, String>
where
    Duration: TryFrom<D>,
{
    d.map(|d| Duration::try_from(d).map_err(|_| "negative duration".to_string())).transpose()
}

impl HttpRoute {
    pub fn from_api(route: api::HttpRoute) -> Result<Self, InvalidRoute> {
        Self::checked(route.metadata, route.hosts, route.rules, rule)
    }

    /// A route of either kind from its parts, its rules read by `rule`; refused with its name.
    pub(super) fn checked<R>(
        metadata: Option<meta::Metadata>,
        hosts: Vec<api_route::HostMatch>,
        rules: Vec<R>,
        rule: impl Fn(R) -> Result<Rule, String>,
    ) -> Result<Self, InvalidRoute> {
        let label = resource_ref(metadata.clone()).map(|r| r.name.to_string()).unwrap_or_default();
        let invalid = |why: String| InvalidRoute { route: label.clone(), why };
        let meta = resource_ref(metadata).map_err(invalid)?;
        if rules.is_empty() {
            return Err(invalid("no rules".into()));
        }
        let hosts = hosts.into_iter().map(host_match).collect::<Result<_, _>>().map_err(invalid)?;
        let rules = rules.into_iter().map(rule).collect::<Result<_, _>>().map_err(invalid)?;
        Ok(Self { meta, hosts, rules })
    }
}

fn host_match(h: api_route::HostMatch) -> Result<HostMatch, String> {
    match h.r#match.ok_or("empty host match")? {
        api_route::host_match::Match::Exact(host) => Ok(HostMatch::Exact(host.to_ascii_lowercase())),
        api_route::host_match::Match::Suffix(s) => {
            let labels: Vec<&str> = s.reverse_labels.iter().rev().map(String::as_str).collect();
            Ok(HostMatch::Suffix(format!(".{}", labels.join(".")).to_ascii_lowercase()))
        }
    }
}

fn rule(r: http_route::Rule) -> Result<Rule, String> {
    let matches = r.matches.into_iter().map(request_match).collect::<Result<_, _>>()?;
    let filters = r.filters.into_iter().map(filter).collect::<Result<_, _>>()?;
    let backends = distribution(distribution_of!(r.backends, http_route), route_backend)?;
    #[allow(deprecated)]
    let request_timeout = request_timeout(r.timeouts, duration(r.request_timeout)?)?;
    Ok(Rule { matches, filters, backends, request_timeout, retry: r.retry.map(retry).transpose()? })
}

fn retry(r: http_route::Retry) -> Result<Retry, String> {
    // "Must be set, even if there are no internal conditions."
    let conditions = r.conditions.ok_or("retry without conditions")?;
    let statuses = conditions
        .status_ranges
        .iter()
        .map(|range| {
            let (start, end) = (u16::try_from(range.start), u16::try_from(range.end));
            match (start, end) {
                (Ok(start), Ok(0)) if (100..600).contains(&start) => Ok((start, start)),
                (Ok(start), Ok(end)) if (100..600).contains(&start) && start <= end && end < 600 => Ok((start, end)),
                _ => Err(format!("retry status range {}-{}", range.start, range.end)),
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Retry {
        max_retries: r.max_retries,
        max_request_bytes: usize::try_from(r.max_request_bytes).unwrap_or(usize::MAX),
        statuses,
        grpc_codes: Vec::new(),
        timeout: duration(r.timeout)?,
        backoff: backoff(r.backoff)?,
    })
}

/// `timeouts.request`, else `timeouts.response`, else the deprecated `requestTimeout` (which
/// servers still set to `timeouts.response`).
pub(super) fn request_timeout(
    t: Option<api_route::Timeouts>,
    legacy: Option<Duration>,
) -> Result<Option<Duration>, String> {
    let t = t.unwrap_or_default();
    Ok(duration(t.request.or(t.response))?.or(legacy))
}

/// A rule's `Distribution` as [`Distribution`], for either route kind (`http_route` or
/// `grpc_route`: generated types of one shape).
macro_rules! distribution_of {
    ($d:expr, $kind:ident) => {
        match $d.and_then(|d| d.kind).ok_or("no backends")? {
            $kind::distribution::Kind::Empty(_) => $crate::outbound::routes::model::Distribution::Empty,
            $kind::distribution::Kind::FirstAvailable(f) => {
                $crate::outbound::routes::model::Distribution::First(f.backends)
            }
            $kind::distribution::Kind::RandomAvailable(r) => $crate::outbound::routes::model::Distribution::Random(
                r.backends.into_iter().map(|w| (w.backend, w.weight)).collect(),
            ),
        }
    };
}
pub(super) use distribution_of;

/// A rule's backends as the proto's `Distribution` gives them, whatever the route kind.
pub(super) enum Distribution<B> {
    Empty,
    /// Only the first is used.
    First(Vec<B>),
    Random(Vec<(Option<B>, u32)>),
}

pub(super) fn distribution<B>(
    d: Distribution<B>,
    convert: impl Fn(B, u32) -> Result<WeightedBackend, String>,
) -> Result<Vec<WeightedBackend>, String> {
    match d {
        Distribution::Empty => Ok(Vec::new()),
        Distribution::First(backends) => backends.into_iter().take(1).map(|b| convert(b, 1)).collect(),
        Distribution::Random(backends) => backends
            .into_iter()
            .map(|(b, weight)| convert(b.ok_or("weighted backend without a backend")?, weight))
            .collect(),
    }
}

fn route_backend(b: http_route::RouteBackend, weight: u32) -> Result<WeightedBackend, String> {
    let backend = backend_of(b.backend)?;
    let filters = b.filters.into_iter().map(filter).collect::<Result<_, _>>()?;
    Ok(WeightedBackend { backend, weight, filters })
}

pub(super) fn backend_of(backend: Option<api::Backend>) -> Result<Backend, String> {
    let backend = backend.ok_or("route backend without a backend")?;
    let meta = resource_ref(backend.metadata).unwrap_or_else(|_| ResourceRef::default_named("unknown"));
    Ok(match backend.kind.ok_or("backend without a kind")? {
        backend::Kind::Forward(w) => {
            let addr = w.addr.ok_or("forward backend without an address")?;
            let addr = SocketAddr::try_from(addr).map_err(|e| format!("forward backend: {e}"))?;
            Backend::Forward { meta, addr }
        }
        backend::Kind::Balancer(p2c) => {
            let discovery = p2c.discovery.and_then(|d| d.kind).ok_or("balancer without discovery")?;
            let backend::endpoint_discovery::Kind::Dst(dst) = discovery;
            Backend::Service { meta, path: dst.path.into() }
        }
    })
}

fn request_match(m: api_route::HttpRouteMatch) -> Result<RequestMatch, String> {
    let path = m
        .path
        .and_then(|p| p.kind)
        .map(|k| match k {
            api_route::path_match::Kind::Exact(p) => Ok(PathMatch::Exact(p)),
            api_route::path_match::Kind::Prefix(p) => Ok(PathMatch::Prefix(p)),
            api_route::path_match::Kind::Regex(r) => anchored(&r).map(PathMatch::Regex),
        })
        .transpose()?;
    let headers = header_matches(m.headers)?;
    let query = m
        .query_params
        .into_iter()
        .map(|q| {
            let value = match q.value.ok_or("query match without a value")? {
                api_route::query_param_match::Value::Exact(v) => ValueMatch::Exact(v.into_bytes()),
                api_route::query_param_match::Value::Regex(r) => ValueMatch::Regex(anchored(&r)?),
            };
            Ok((q.name, value))
        })
        .collect::<Result<_, String>>()?;
    let method = m.method.map(|m| http::Method::try_from(m).map_err(|e| format!("method: {e}"))).transpose()?;
    Ok(RequestMatch { path, headers, query, method })
}

pub(super) fn header_matches(h: Vec<api_route::HeaderMatch>) -> Result<Vec<(HeaderName, ValueMatch)>, String> {
    h.into_iter()
        .map(|h| {
            let name = HeaderName::try_from(h.name.as_str()).map_err(|e| format!("header {:?}: {e}", h.name))?;
            let value = match h.value.ok_or("header match without a value")? {
                api_route::header_match::Value::Exact(v) => ValueMatch::Exact(v),
                api_route::header_match::Value::Regex(r) => ValueMatch::Regex(anchored(&r)?),
            };
            Ok((name, value))
        })
        .collect()
}

/// Gateway API regexes match the whole value.
pub(super) fn anchored(r: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(&format!("^(?:{r})$")).map_err(|e| format!("regex {r:?}: {e}"))
}

pub(super) fn headers(h: Option<http_types::Headers>) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    h.map(|h| h.headers)
        .unwrap_or_default()
        .into_iter()
        .map(|h| {
            let name = HeaderName::try_from(h.name.as_str()).map_err(|e| format!("header {:?}: {e}", h.name))?;
            let value = HeaderValue::from_bytes(&h.value).map_err(|e| format!("header {:?} value: {e}", h.name))?;
            Ok((name, value))
        })
        .collect()
}

pub(super) fn names(names: Vec<String>) -> Result<Vec<HeaderName>, String> {
    names.iter().map(|n| HeaderName::try_from(n.as_str()).map_err(|e| format!("header {n:?}: {e}"))).collect()
}

fn filter(f: http_route::Filter) -> Result<Filter, String> {
    Ok(match f.kind.ok_or("empty filter")? {
        http_route::filter::Kind::RequestHeaderModifier(m) => Filter::RequestHeaders(HeaderModifier {
            add: headers(m.add)?,
            set: headers(m.set)?,
            remove: names(m.remove)?,
        }),
        http_route::filter::Kind::ResponseHeaderModifier(m) => Filter::ResponseHeaders(HeaderModifier {
            add: headers(m.add)?,
            set: headers(m.set)?,
            remove: names(m.remove)?,
        }),
        http_route::filter::Kind::Redirect(r) => Filter::Redirect(Redirect {
            scheme: r.scheme.map(|s| http::uri::Scheme::try_from(s).map_err(|e| format!("scheme: {e}"))).transpose()?,
            host: Some(r.host).filter(|h| !h.is_empty()),
            path: r.path.and_then(|p| p.replace).map(|p| match p {
                api_route::path_modifier::Replace::Full(f) => PathModifier::Full(f),
                api_route::path_modifier::Replace::Prefix(p) => PathModifier::Prefix(p),
            }),
            port: match r.port {
                0 => None,
                p => Some(u16::try_from(p).map_err(|_| format!("redirect port {p}"))?),
            },
            status: match r.status {
                0 => http::StatusCode::FOUND,
                s => http::StatusCode::from_u16(u16::try_from(s).unwrap_or(0))
                    .ok()
                    .filter(http::StatusCode::is_redirection)
                    .ok_or_else(|| format!("redirect status {s}"))?,
            },
        }),
        http_route::filter::Kind::FailureInjector(f) => Filter::Fail {
            status: http::StatusCode::from_u16(u16::try_from(f.status).unwrap_or(0))
                .map_err(|_| format!("failure status {}", f.status))?,
            message: f.message,
            ratio: ratio(f.ratio)?,
        },
    })
}

/// A failure injector's share of requests: all of them when unset.
pub(super) fn ratio(r: Option<api_route::Ratio>) -> Result<Ratio, String> {
    match r {
        None => Ok(Ratio { numerator: 1, denominator: 1 }),
        Some(r) if r.denominator > 0 && r.numerator <= r.denominator => {
            Ok(Ratio { numerator: r.numerator, denominator: r.denominator })
        }
        Some(r) => Err(format!("failure ratio {}/{}", r.numerator, r.denominator)),
    }
}

pub(super) fn backoff(b: Option<api::ExponentialBackoff>) -> Result<Option<(Duration, Duration)>, String> {
    let Some(b) = b else { return Ok(None) };
    let min = duration(b.min_backoff)?.unwrap_or_default();
    Ok(Some((min, duration(b.max_backoff)?.unwrap_or(min).max(min))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use linkerd2_proxy_api::destination::WeightedAddr;

    fn meta(name: &str) -> Option<meta::Metadata> {
        Some(meta::Metadata {
            kind: Some(meta::metadata::Kind::Resource(meta::Resource {
                group: "gateway.networking.k8s.io".into(),
                kind: "HTTPRoute".into(),
                name: name.into(),
                ..Default::default()
            })),
        })
    }

    fn backend(name: &str, kind: backend::Kind) -> http_route::RouteBackend {
        let backend = api::Backend { metadata: meta(name), queue: None, kind: Some(kind) };
        http_route::RouteBackend { backend: Some(backend), ..Default::default() }
    }

    /// A canary route as the control plane would send it: a regex path, a header, 90/10.
    fn canary(path_regex: &str) -> api::HttpRoute {
        let dst = backend::BalanceP2c {
            discovery: Some(backend::EndpointDiscovery {
                kind: Some(backend::endpoint_discovery::Kind::Dst(backend::endpoint_discovery::DestinationGet {
                    path: "web.shop.svc.cluster.local:80".into(),
                })),
            }),
            load: None,
        };
        let forward =
            WeightedAddr { addr: Some("10.0.0.9:8080".parse::<SocketAddr>().unwrap().into()), ..Default::default() };
        let weighted = |b, weight| http_route::WeightedRouteBackend { backend: Some(b), weight };
        api::HttpRoute {
            metadata: meta("canary"),
            hosts: Vec::new(),
            rules: vec![http_route::Rule {
                matches: vec![api_route::HttpRouteMatch {
                    path: Some(api_route::PathMatch {
                        kind: Some(api_route::path_match::Kind::Regex(path_regex.into())),
                    }),
                    headers: vec![api_route::HeaderMatch {
                        name: "x-canary".into(),
                        value: Some(api_route::header_match::Value::Exact(b"1".to_vec())),
                    }],
                    ..Default::default()
                }],
                backends: Some(http_route::Distribution {
                    kind: Some(http_route::distribution::Kind::RandomAvailable(
                        http_route::distribution::RandomAvailable {
                            backends: vec![
                                weighted(backend("web", backend::Kind::Balancer(dst)), 90),
                                weighted(backend("web-canary", backend::Kind::Forward(forward)), 10),
                            ],
                        },
                    )),
                }),
                timeouts: Some(api_route::Timeouts {
                    request: Some(Duration::from_millis(100).try_into().unwrap()),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn a_route_is_checked_into_what_the_proxy_applies() {
        let route = HttpRoute::from_api(canary("/api/.*")).unwrap();
        assert_eq!(&*route.meta.name, "canary");
        let rule = &route.rules[0];
        assert_eq!(rule.request_timeout, Some(Duration::from_millis(100)));
        let Some(PathMatch::Regex(r)) = &rule.matches[0].path else { panic!("regex path") };
        assert!(r.is_match("/api/x") && !r.is_match("/v1/api/x"), "anchored: the whole path");
        let backends: Vec<_> = rule.backends.iter().map(|b| (b.backend.clone(), b.weight)).collect();
        let meta = |name: &str| ResourceRef {
            group: "gateway.networking.k8s.io".into(),
            kind: "HTTPRoute".into(),
            ..ResourceRef::default_named(name)
        };
        assert_eq!(
            backends,
            vec![
                (Backend::Service { meta: meta("web"), path: "web.shop.svc.cluster.local:80".into() }, 90),
                (Backend::Forward { meta: meta("web-canary"), addr: "10.0.0.9:8080".parse().unwrap() }, 10),
            ]
        );
    }

    #[test]
    fn a_route_the_proxy_cannot_apply_is_refused_with_its_name() {
        let e = HttpRoute::from_api(canary("/api/(")).unwrap_err();
        assert_eq!(e.route, "canary");
        assert!(e.why.contains("regex"), "{e}");
        let mut no_rules = canary("/");
        no_rules.rules.clear();
        assert!(HttpRoute::from_api(no_rules).unwrap_err().why.contains("no rules"));
    }
}
