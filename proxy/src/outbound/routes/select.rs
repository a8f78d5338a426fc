//! Which rule of which route a request takes: among every (route, rule, match) that matches,
//! the most specific by Gateway API precedence, as linkerd2-proxy's `http-route` crate ranks
//! them: host (exact over wildcard, longer over shorter, any host last), then path (exact, then
//! the longest prefix, then regex), method, the number of header matches, the number of query
//! parameter matches. Ties go to the earlier route and rule (the control plane orders routes
//! oldest first, Gateway API's tie-break).
//!
//! Everything but the host rank depends only on the routes, so a [`RouteTable`] ranks every
//! match once, when the policy arrives: a request walks the matches most specific first and
//! (unless routes name hosts) stops at the first that matches, comparing borrowed strings and
//! allocating nothing. The table also holds each (rule, backend)'s metric handles, resolved on
//! first use and then shared by every request of the policy.

use std::sync::{Arc, OnceLock};

use http::Request;

use super::metrics::{RouteBackendLabels, RouteHandles, RouteLabels, RouteMetrics};
use super::model::{HostMatch, HttpRoute, PathMatch, RequestMatch, Rule, ValueMatch};
use crate::http::path_prefix::segment_prefix;
use crate::outbound::routes::model::ResourceRef;

/// The rule a request takes, with the prefix its path matched (for a redirect's prefix rewrite).
#[derive(Debug, Clone, Copy)]
pub struct Selected<'r> {
    pub route: &'r HttpRoute,
    pub rule: &'r Rule,
    pub prefix: Option<&'r str>,
    /// Which route of the list and which rule of the route.
    pub index: (usize, usize),
    /// The table's slot of the rule's first backend.
    slots: usize,
}

/// How specific a match is apart from the host: compared field by field, greater is more
/// specific. Path (kind, length), method, header matches, query matches.
type MatchRank = ((u8, usize), bool, usize, usize);

/// How specific a route's host match is for a request: (exact 2 / wildcard 1 / any 0, length).
type HostRank = (u8, usize);

/// One match of one rule, ranked.
#[derive(Debug)]
struct Candidate {
    route: usize,
    rule: usize,
    /// `None`: a rule without matches (every request).
    matched: Option<usize>,
    rank: MatchRank,
    slots: usize,
}

/// A list of routes compiled for selection: their matches most specific first, and a slot of
/// metric handles per (rule, backend).
#[derive(Debug)]
pub struct RouteTable {
    routes: Arc<[HttpRoute]>,
    candidates: Box<[Candidate]>,
    /// Whether any route names hosts; when none does, every host ranks alike and the first
    /// candidate that matches wins.
    hosts: bool,
    handles: Box<[HandleSlot]>,
}

/// A (rule, backend)'s metric handles, made on the first request that takes it.
#[derive(Default)]
struct HandleSlot(OnceLock<RouteHandles>);

impl std::fmt::Debug for HandleSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "HandleSlot(resolved)" } else { "HandleSlot(unused)" })
    }
}

impl RouteTable {
    pub fn new(routes: Arc<[HttpRoute]>) -> Self {
        let mut candidates = Vec::new();
        let mut slots = 0;
        for (r, route) in routes.iter().enumerate() {
            for (i, rule) in route.rules.iter().enumerate() {
                if rule.matches.is_empty() {
                    candidates.push(Candidate { route: r, rule: i, matched: None, rank: rank(None), slots });
                }
                for (m, request_match) in rule.matches.iter().enumerate() {
                    let rank = rank(Some(request_match));
                    candidates.push(Candidate { route: r, rule: i, matched: Some(m), rank, slots });
                }
                slots += rule.backends.len();
            }
        }
        // Stable: among equals, the control plane's order stays.
        candidates.sort_by_key(|c| std::cmp::Reverse(c.rank));
        let hosts = routes.iter().any(|r| !r.hosts.is_empty());
        let handles = std::iter::repeat_with(HandleSlot::default).take(slots).collect();
        Self { routes, candidates: candidates.into(), hosts, handles }
    }

    pub fn routes(&self) -> &[HttpRoute] {
        &self.routes
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The rule `req` takes, if any.
    pub fn select<B>(&self, req: &Request<B>) -> Option<Selected<'_>> {
        let host = if self.hosts { host_of(req) } else { None };
        let mut best: Option<(HostRank, &Candidate, Option<&str>)> = None;
        for c in self.candidates.iter() {
            let route = &self.routes[c.route];
            let host_rank = if self.hosts { host_rank(&route.hosts, host) } else { Some((0, 0)) };
            // An earlier candidate of the same host rank is at least as specific.
            let Some(host_rank) = host_rank.filter(|h| best.is_none_or(|(b, _, _)| h > &b)) else { continue };
            let rule = &route.rules[c.rule];
            let Some(prefix) = matches(c.matched.map(|m| &rule.matches[m]), req) else { continue };
            best = Some((host_rank, c, prefix));
            if !self.hosts {
                break;
            }
        }
        best.map(|(_, c, prefix)| {
            let route = &self.routes[c.route];
            Selected { route, rule: &route.rules[c.rule], prefix, index: (c.route, c.rule), slots: c.slots }
        })
    }

    /// The metric handles of `backend` (an index into the selected rule's backends) under
    /// `parent`: made once per policy and (rule, backend), then shared.
    pub fn handles(
        &self,
        parent: &ResourceRef,
        selected: &Selected<'_>,
        backend: usize,
        metrics: &RouteMetrics,
    ) -> &RouteHandles {
        self.handles[selected.slots + backend].0.get_or_init(|| {
            metrics.route_handles(RouteBackendLabels {
                route: RouteLabels { parent: parent.clone(), route: selected.route.meta.clone() },
                backend: selected.rule.backends[backend].backend.meta().clone(),
            })
        })
    }
}

/// The rank of a match (`None`: a rule without matches, as a match of every path).
fn rank(m: Option<&RequestMatch>) -> MatchRank {
    let Some(m) = m else { return ((2, 1), false, 0, 0) };
    let path = match &m.path {
        None => (2, 1),
        Some(PathMatch::Exact(p)) => (3, p.len()),
        Some(PathMatch::Prefix(p)) => (2, p.len()),
        Some(PathMatch::Regex(r)) => (1, r.as_str().len()),
    };
    (path, m.method.is_some(), m.headers.len(), m.query.len())
}

/// The request's host without its port, as written (hosts compare without regard to case).
fn host_of<B>(req: &Request<B>) -> Option<&str> {
    if let Some(a) = req.uri().authority() {
        return Some(a.host());
    }
    let host = req.headers().get(http::header::HOST)?.to_str().ok()?;
    if host.starts_with('[') {
        // An IPv6 literal keeps its brackets, as `Authority::host` gives it.
        return host.find(']').map(|end| &host[..=end]);
    }
    Some(match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    })
}

fn host_rank(hosts: &[HostMatch], host: Option<&str>) -> Option<HostRank> {
    if hosts.is_empty() {
        return Some((0, 0));
    }
    let host = host?.as_bytes();
    hosts
        .iter()
        .filter_map(|h| match h {
            HostMatch::Exact(e) => e.as_bytes().eq_ignore_ascii_case(host).then_some((2, e.len())),
            HostMatch::Suffix(s) => (host.len() >= s.len()
                && host[host.len() - s.len()..].eq_ignore_ascii_case(s.as_bytes()))
            .then_some((1, s.len())),
        })
        .max()
}

/// `Some(matched prefix)` when the request matches (`None` match: every request).
fn matches<'m, B>(m: Option<&'m RequestMatch>, req: &Request<B>) -> Option<Option<&'m str>> {
    let Some(m) = m else { return Some(Some("/")) };
    if m.method.as_ref().is_some_and(|method| method != req.method()) {
        return None;
    }
    let path = req.uri().path();
    let prefix = match &m.path {
        None => Some("/"),
        Some(PathMatch::Exact(p)) => (p == path).then_some(None)?,
        Some(PathMatch::Prefix(p)) => segment_prefix(p, path).then_some(Some(p.as_str()))?,
        Some(PathMatch::Regex(r)) => r.is_match(path).then_some(None)?,
    };
    let headers_match = m
        .headers
        .iter()
        .all(|(name, value)| req.headers().get_all(name).iter().any(|v| value_matches(value, v.as_bytes())));
    let query_match = m.query.iter().all(|(name, value)| {
        query_pairs(req.uri().query().unwrap_or("")).any(|(n, v)| n == name && value_matches(value, v.as_bytes()))
    });
    (headers_match && query_match).then_some(prefix)
}
fn value_matches(m: &ValueMatch, value: &[u8]) -> bool {
    match m {
        ValueMatch::Exact(e) => e == value,
        ValueMatch::Regex(r) => std::str::from_utf8(value).is_ok_and(|v| r.is_match(v)),
    }
}

/// `a=1&b=2` as pairs, as written (no percent-decoding: Gateway API matches the raw value).
fn query_pairs(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query.split('&').filter(|p| !p.is_empty()).map(|p| p.split_once('=').unwrap_or((p, "")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::routes::model::{Backend, WeightedBackend};
    use crate::serve::metrics::Metrics;

    fn route(name: &str, hosts: Vec<HostMatch>, matches: Vec<RequestMatch>) -> HttpRoute {
        HttpRoute {
            meta: ResourceRef::default_named(name),
            hosts,
            rules: vec![Rule {
                matches,
                filters: Vec::new(),
                backends: Vec::new(),
                request_timeout: None,
                retry: None,
            }],
        }
    }

    fn path(p: PathMatch) -> RequestMatch {
        RequestMatch { path: Some(p), ..RequestMatch::default() }
    }

    fn picked(routes: &[HttpRoute], req: Request<()>) -> Option<String> {
        RouteTable::new(routes.into()).select(&req).map(|s| s.route.meta.name.to_string())
    }

    #[test]
    fn the_most_specific_match_wins_and_ties_go_to_the_first() {
        let regex = regex::Regex::new("^(?:/api/v[0-9]+/.*)$").unwrap();
        let routes = vec![
            route("all", Vec::new(), Vec::new()),
            route("regex", Vec::new(), vec![path(PathMatch::Regex(regex))]),
            route("api", Vec::new(), vec![path(PathMatch::Prefix("/api".into()))]),
            route("api-v1", Vec::new(), vec![path(PathMatch::Prefix("/api/v1".into()))]),
            route("exact", Vec::new(), vec![path(PathMatch::Exact("/api/v1/x".into()))]),
            route("api-again", Vec::new(), vec![path(PathMatch::Prefix("/api".into()))]),
            route(
                "api-post",
                Vec::new(),
                vec![RequestMatch { method: Some(http::Method::POST), ..path(PathMatch::Prefix("/api".into())) }],
            ),
        ];
        let get = |p: &str| Request::get(p).body(()).unwrap();
        assert_eq!(picked(&routes, get("/api/v1/x")).as_deref(), Some("exact"));
        assert_eq!(picked(&routes, get("/api/v1/y")).as_deref(), Some("api-v1"), "longest prefix");
        assert_eq!(picked(&routes, get("/api/v2/y")).as_deref(), Some("api"), "prefix over regex; first of equals");
        assert_eq!(picked(&routes, get("/apix")).as_deref(), Some("all"), "whole segments");
        let post = Request::post("/api/z").body(()).unwrap();
        assert_eq!(picked(&routes, post).as_deref(), Some("api-post"), "method is more specific");
        assert_eq!(picked(&routes[1..3], get("/other")), None, "no rule matches");
    }

    #[test]
    fn hosts_headers_and_query_parameters() {
        let header = |name: &str, v: &str| (http::HeaderName::try_from(name).unwrap(), ValueMatch::Exact(v.into()));
        let routes = vec![
            route("any-host", Vec::new(), Vec::new()),
            route("wildcard", vec![HostMatch::Suffix(".example.com".into())], Vec::new()),
            route("exact-host", vec![HostMatch::Exact("web.example.com".into())], Vec::new()),
            route(
                "canary",
                vec![HostMatch::Exact("web.example.com".into())],
                vec![RequestMatch { headers: vec![header("x-canary", "1")], ..RequestMatch::default() }],
            ),
            route(
                "debug",
                vec![HostMatch::Exact("web.example.com".into())],
                vec![RequestMatch {
                    headers: vec![header("x-canary", "1")],
                    query: vec![("debug".into(), ValueMatch::Regex(regex::Regex::new("^(?:yes|1)$").unwrap()))],
                    ..RequestMatch::default()
                }],
            ),
        ];
        let req = |host: &str, canary: bool, query: &str| {
            let mut r = Request::get(format!("/x{query}")).header("host", host);
            if canary {
                r = r.header("x-canary", "1");
            }
            r.body(()).unwrap()
        };
        assert_eq!(picked(&routes, req("other:80", false, "")).as_deref(), Some("any-host"));
        assert_eq!(picked(&routes, req("api.example.com", false, "")).as_deref(), Some("wildcard"));
        assert_eq!(picked(&routes, req("Web.Example.com:8080", false, "")).as_deref(), Some("exact-host"));
        assert_eq!(picked(&routes, req("web.example.com", true, "")).as_deref(), Some("canary"));
        assert_eq!(picked(&routes, req("web.example.com", true, "?a=b&debug=yes")).as_deref(), Some("debug"));
        assert_eq!(picked(&routes, req("web.example.com", true, "?debug=no")).as_deref(), Some("canary"));
    }

    /// The ranking every match by request, as the proxy did before routes were compiled: the
    /// reference the table must agree with.
    fn reference(routes: &[HttpRoute], req: &Request<()>) -> Option<(usize, usize)> {
        let host = host_of(req).map(str::to_ascii_lowercase);
        let mut best: Option<((HostRank, MatchRank), (usize, usize))> = None;
        for (r, route) in routes.iter().enumerate() {
            let Some(host_rank) = host_rank(&route.hosts, host.as_deref()) else { continue };
            for (i, rule) in route.rules.iter().enumerate() {
                let all: Vec<Option<&RequestMatch>> =
                    if rule.matches.is_empty() { vec![None] } else { rule.matches.iter().map(Some).collect() };
                for m in all {
                    if matches(m, req).is_some() && best.is_none_or(|(b, _)| (host_rank, rank(m)) > b) {
                        best = Some(((host_rank, rank(m)), (r, i)));
                    }
                }
            }
        }
        best.map(|(_, index)| index)
    }

    #[test]
    fn the_compiled_table_picks_what_ranking_every_match_picks() {
        let header = |v: &str| (http::HeaderName::from_static("x-tenant"), ValueMatch::Exact(v.into()));
        let m = |path: Option<PathMatch>, method: Option<http::Method>, headers: Vec<_>| RequestMatch {
            path,
            method,
            headers,
            query: Vec::new(),
        };
        let hosts = [
            Vec::new(),
            vec![HostMatch::Exact("web.example.com".into())],
            vec![HostMatch::Suffix(".example.com".into())],
        ];
        let matches = [
            vec![m(Some(PathMatch::Prefix("/api".into())), None, Vec::new())],
            vec![m(Some(PathMatch::Prefix("/api".into())), Some(http::Method::GET), vec![header("a")])],
            vec![m(Some(PathMatch::Exact("/api/v1".into())), None, Vec::new())],
            vec![m(Some(PathMatch::Regex(regex::Regex::new("^(?:/api/.*)$").unwrap())), None, Vec::new())],
            vec![m(None, Some(http::Method::POST), Vec::new()), m(None, None, vec![header("b")])],
            Vec::new(),
        ];
        // Every route list of up to three routes drawn from (hosts, matches), as rules of one
        // route and as separate routes.
        let mut lists: Vec<Vec<HttpRoute>> = Vec::new();
        let (nh, nm) = (hosts.len(), matches.len());
        for a in 0..nh * nm {
            for b in 0..nh * nm {
                for c in [a, b, (a + b) % (nh * nm)] {
                    let route = |k: usize, name: &str| route(name, hosts[k / nm].clone(), matches[k % nm].clone());
                    lists.push(vec![route(a, "a"), route(b, "b"), route(c, "c")]);
                    let mut merged = route(a, "merged");
                    merged.rules.extend(route(b, "b").rules);
                    lists.push(vec![merged, route(c, "c")]);
                }
            }
        }
        let requests = [
            ("GET", "/api/v1", "web.example.com"),
            ("GET", "/api/v2", "Web.Example.com:8080"),
            ("POST", "/api", "api.example.com"),
            ("GET", "/other", "other"),
            ("PUT", "/api/x", "[::1]:80"),
        ];
        let mut checked = 0;
        for routes in &lists {
            let table = RouteTable::new(routes.clone().into());
            for (method, path, host) in requests {
                for tenant in ["a", "b", "c"] {
                    let req = Request::builder()
                        .method(method)
                        .uri(path)
                        .header("host", host)
                        .header("x-tenant", tenant)
                        .body(())
                        .unwrap();
                    assert_eq!(table.select(&req).map(|s| s.index), reference(routes, &req), "{routes:?} {req:?}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
    }

    #[test]
    fn hosts_are_read_from_the_authority_or_the_host_header_without_the_port() {
        let with_host = |h: &str| Request::get("/").header("host", h).body(()).unwrap();
        assert_eq!(host_of(&with_host("Web.Shop:8080")), Some("Web.Shop"));
        assert_eq!(host_of(&with_host("web.shop")), Some("web.shop"));
        assert_eq!(host_of(&with_host("[fd00::1]:80")), Some("[fd00::1]"));
        assert_eq!(host_of(&Request::get("http://api.shop:81/x").body(()).unwrap()), Some("api.shop"));
        assert_eq!(host_of(&Request::get("/").body(()).unwrap()), None);
        let exact = [HostMatch::Exact("web.shop".into())];
        assert_eq!(host_rank(&exact, Some("WEB.shop")), Some((2, 8)));
        assert_eq!(host_rank(&[HostMatch::Suffix(".shop".into())], Some("a.SHOP")), Some((1, 5)));
        assert_eq!(host_rank(&[HostMatch::Suffix(".shop".into())], Some("op")), None, "shorter than the suffix");
        assert_eq!(host_rank(&exact, None), None);
    }

    #[test]
    fn metric_handles_are_made_once_per_rule_and_backend() {
        let backend = |name: &str| WeightedBackend {
            backend: Backend::Forward { meta: ResourceRef::default_named(name), addr: "10.0.0.1:80".parse().unwrap() },
            weight: 1,
            filters: Vec::new(),
        };
        let mut r = route("split", Vec::new(), vec![path(PathMatch::Prefix("/a".into()))]);
        r.rules[0].backends = vec![backend("stable"), backend("canary")];
        let mut other = route("other", Vec::new(), Vec::new());
        other.rules[0].backends = vec![backend("stable")];
        let table = RouteTable::new(vec![r, other].into());
        let metrics = Metrics::default();
        let parent = ResourceRef::default_named("web");
        let (a, b) = (Request::get("/a").body(()).unwrap(), Request::get("/b").body(()).unwrap());
        let (split, rest) = (table.select(&a).unwrap(), table.select(&b).unwrap());
        let canary = table.handles(&parent, &split, 1, &metrics.routes);
        assert!(std::ptr::eq(canary, table.handles(&parent, &split, 1, &metrics.routes)), "one slot");
        canary.backend_requests.inc();
        table.handles(&parent, &split, 0, &metrics.routes).backend_requests.inc();
        table.handles(&parent, &split, 0, &metrics.routes).backend_requests.inc();
        table.handles(&parent, &rest, 0, &metrics.routes).backend_requests.inc();
        let text = metrics.encode();
        let count = |route: &str, backend: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("outbound_http_route_backend_requests_total")
                        && l.contains(&format!("route_name=\"{route}\""))
                        && l.contains(&format!("backend_name=\"{backend}\""))
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        };
        assert_eq!(
            (count("split", "canary"), count("split", "stable"), count("other", "stable")),
            (Some(1), Some(2), Some(1))
        );
    }
}
