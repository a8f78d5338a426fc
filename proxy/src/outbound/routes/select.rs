//! Which rule of which route a request takes: among every (route, rule, match) that matches,
//! the most specific by Gateway API precedence, as linkerd2-proxy's `http-route` crate ranks
//! them: host (exact over wildcard, longer over shorter, any host last), then path (exact, then
//! the longest prefix, then regex), method, the number of header matches, the number of query
//! parameter matches. Ties go to the earlier route and rule (the control plane orders routes
//! oldest first, Gateway API's tie-break).

use http::Request;

use super::model::{HostMatch, HttpRoute, PathMatch, RequestMatch, Rule, ValueMatch};
use crate::policy::authorize::segment_prefix;

/// The rule a request takes, with the prefix its path matched (for a redirect's prefix rewrite).
#[derive(Debug, Clone, Copy)]
pub struct Selected<'r> {
    pub route: &'r HttpRoute,
    pub rule: &'r Rule,
    pub prefix: Option<&'r str>,
    /// Which route of the list and which rule of the route.
    pub index: (usize, usize),
}

/// Ranks a match: compared field by field, greater is more specific.
type Rank = ((u8, usize), (u8, usize), bool, usize, usize);

pub fn select<'r, B>(routes: &'r [HttpRoute], req: &Request<B>) -> Option<Selected<'r>> {
    let host = host_of(req);
    let mut best: Option<(Rank, Selected<'r>)> = None;
    for (r, route) in routes.iter().enumerate() {
        let Some(host_rank) = host_rank(&route.hosts, host.as_deref()) else { continue };
        for (i, rule) in route.rules.iter().enumerate() {
            let candidates: Box<dyn Iterator<Item = Option<&RequestMatch>>> = if rule.matches.is_empty() {
                Box::new(std::iter::once(None))
            } else {
                Box::new(rule.matches.iter().map(Some))
            };
            for m in candidates {
                let Some((path_rank, prefix)) = matches(m, req) else { continue };
                let rank = match m {
                    Some(m) => (host_rank, path_rank, m.method.is_some(), m.headers.len(), m.query.len()),
                    None => (host_rank, path_rank, false, 0, 0),
                };
                if best.as_ref().is_none_or(|(b, _)| rank > *b) {
                    best = Some((rank, Selected { route, rule, prefix, index: (r, i) }));
                }
            }
        }
    }
    best.map(|(_, s)| s)
}

/// The request's host, lower case, without its port.
fn host_of<B>(req: &Request<B>) -> Option<String> {
    super::apply::authority(req).map(|a| a.host().to_ascii_lowercase())
}

fn host_rank(hosts: &[HostMatch], host: Option<&str>) -> Option<(u8, usize)> {
    if hosts.is_empty() {
        return Some((0, 0));
    }
    let host = host?;
    hosts
        .iter()
        .filter_map(|h| match h {
            HostMatch::Exact(e) => (e == host).then_some((2, e.len())),
            HostMatch::Suffix(s) => host.ends_with(s.as_str()).then_some((1, s.len())),
        })
        .max()
}

/// `Some((path rank, matched prefix))` when the request matches (`None` match: every request).
fn matches<'m, B>(m: Option<&'m RequestMatch>, req: &Request<B>) -> Option<((u8, usize), Option<&'m str>)> {
    let path = req.uri().path();
    let Some(m) = m else { return Some(((2, 1), Some("/"))) };
    if m.method.as_ref().is_some_and(|method| method != req.method()) {
        return None;
    }
    let (rank, prefix) = match &m.path {
        None => ((2, 1), Some("/")),
        Some(PathMatch::Exact(p)) => (p == path).then_some(((3, p.len()), None))?,
        Some(PathMatch::Prefix(p)) => segment_prefix(p, path).then_some(((2, p.len()), Some(p.as_str())))?,
        Some(PathMatch::Regex(r)) => r.is_match(path).then_some(((1, r.as_str().len()), None))?,
    };
    let headers_match = m
        .headers
        .iter()
        .all(|(name, value)| req.headers().get_all(name).iter().any(|v| value_matches(value, v.as_bytes())));
    let query_match = m.query.iter().all(|(name, value)| {
        query_pairs(req.uri().query().unwrap_or("")).any(|(n, v)| n == name && value_matches(value, v.as_bytes()))
    });
    (headers_match && query_match).then_some((rank, prefix))
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
    use crate::outbound::routes::model::ResourceRef;

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
        select(routes, &req).map(|s| s.route.meta.name.to_string())
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
}
