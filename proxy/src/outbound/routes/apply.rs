//! What a selected rule does to a request before it is forwarded, and to its response: filters
//! (header modifiers, redirect, failure injection) and the choice of a backend by weight.
//! Pure functions over `http` types, so each is tested alone.

use http::uri::Authority;
use http::{HeaderMap, HeaderValue, Request, StatusCode, Uri};

use super::model::{Filter, HeaderModifier, PathModifier, Redirect, WeightedBackend};

/// How the proxy answers a request itself instead of forwarding it.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    Redirect {
        status: StatusCode,
        location: HeaderValue,
    },
    Fail {
        status: StatusCode,
        message: String,
    },
    /// A trailers-only gRPC answer.
    FailGrpc {
        code: u16,
        message: String,
    },
}

/// Applies `filters` to the request; `Err` when one answers it instead (a redirect, an injected
/// failure). Response header modifiers are left for [`response_headers`].
pub fn request_filters<'f, B>(
    filters: impl IntoIterator<Item = &'f Filter>,
    req: &mut Request<B>,
    prefix: Option<&str>,
    roll: impl Fn() -> f64,
) -> Result<(), Answer> {
    for filter in filters {
        match filter {
            Filter::RequestHeaders(m) => modify(m, req.headers_mut()),
            Filter::ResponseHeaders(_) => {}
            Filter::Redirect(r) => {
                let authority = authority(req);
                let location = location(r, req.uri(), authority.as_ref(), prefix)
                    .map_err(|message| Answer::Fail { status: StatusCode::INTERNAL_SERVER_ERROR, message })?;
                return Err(Answer::Redirect { status: r.status, location });
            }
            Filter::Fail { status, message, ratio } => {
                if roll() * f64::from(ratio.denominator) < f64::from(ratio.numerator) {
                    return Err(Answer::Fail { status: *status, message: message.clone() });
                }
            }
            Filter::FailGrpc { code, message, ratio } => {
                if roll() * f64::from(ratio.denominator) < f64::from(ratio.numerator) {
                    return Err(Answer::FailGrpc { code: *code, message: message.clone() });
                }
            }
        }
    }
    Ok(())
}

/// The response header modifiers of `filters`, applied in order.
pub fn response_headers<'f>(filters: impl IntoIterator<Item = &'f Filter>, headers: &mut HeaderMap) {
    for filter in filters {
        if let Filter::ResponseHeaders(m) = filter {
            modify(m, headers);
        }
    }
}

/// Gateway API's order: set replaces, add appends, remove last.
fn modify(m: &HeaderModifier, headers: &mut HeaderMap) {
    for (name, value) in &m.set {
        headers.insert(name.clone(), value.clone());
    }
    for (name, value) in &m.add {
        headers.append(name.clone(), value.clone());
    }
    for name in &m.remove {
        headers.remove(name);
    }
}

/// The authority a request names: its URI's (HTTP/2, absolute form) or its `Host` header.
pub fn authority<B>(req: &Request<B>) -> Option<Authority> {
    match req.uri().authority() {
        Some(a) => Some(a.clone()),
        None => req.headers().get(http::header::HOST)?.to_str().ok()?.parse().ok(),
    }
}

/// Where a redirect sends the client: the request's URI with the filter's parts replaced.
fn location(
    r: &Redirect,
    uri: &Uri,
    authority: Option<&Authority>,
    prefix: Option<&str>,
) -> Result<HeaderValue, String> {
    let scheme = r.scheme.as_ref().map_or_else(|| uri.scheme_str().unwrap_or("http"), |s| s.as_str());
    let host =
        r.host.as_deref().or(authority.map(Authority::host)).ok_or("redirect without a host to send the client to")?;
    let port = r.port.or_else(|| authority.and_then(Authority::port_u16));
    let port = port.filter(|p| !matches!((scheme, p), ("http", 80) | ("https", 443)));
    let path = match &r.path {
        None => uri.path().to_string(),
        Some(PathModifier::Full(full)) => full.clone(),
        Some(PathModifier::Prefix(replacement)) => {
            let matched = prefix.unwrap_or("/").trim_end_matches('/');
            let rest = uri.path().strip_prefix(matched).unwrap_or(uri.path());
            let joined = format!("{}/{}", replacement.trim_end_matches('/'), rest.trim_start_matches('/'));
            if joined.len() > 1 { joined.trim_end_matches('/').to_string() } else { joined }
        }
    };
    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let port = port.map(|p| format!(":{p}")).unwrap_or_default();
    HeaderValue::try_from(format!("{scheme}://{host}{port}{path}{query}"))
        .map_err(|e| format!("redirect location: {e}"))
}

/// The index of a backend of the rule, chosen at random in proportion to the weights (`roll`
/// gives a number in [0, 1), asked for only when there is a choice). `None` when the rule has
/// none with a weight.
pub fn pick_backend(backends: &[WeightedBackend], roll: impl FnOnce() -> f64) -> Option<usize> {
    if let [only] = backends {
        return (only.weight > 0).then_some(0);
    }
    let total: u64 = backends.iter().map(|b| u64::from(b.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut point = (roll() * total as f64) as u64;
    for (i, b) in backends.iter().enumerate() {
        if point < u64::from(b.weight) {
            return Some(i);
        }
        point -= u64::from(b.weight);
    }
    backends.iter().rposition(|b| b.weight > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::routes::model::{Backend, Ratio, ResourceRef};

    fn header(name: &'static str, value: &'static str) -> (http::HeaderName, HeaderValue) {
        (http::HeaderName::from_static(name), HeaderValue::from_static(value))
    }

    #[test]
    fn header_modifiers_set_add_then_remove() {
        let m = HeaderModifier {
            set: vec![header("x-env", "canary")],
            add: vec![header("x-via", "mesh")],
            remove: vec![http::HeaderName::from_static("x-secret")],
        };
        let mut req =
            Request::get("/").header("x-env", "prod").header("x-via", "app").header("x-secret", "1").body(()).unwrap();
        request_filters(&[Filter::RequestHeaders(m.clone())], &mut req, None, || 0.0).unwrap();
        let h = req.headers();
        assert_eq!(h["x-env"], "canary");
        assert_eq!(h.get_all("x-via").iter().count(), 2);
        assert!(!h.contains_key("x-secret"));
        let mut response = HeaderMap::new();
        response_headers(
            &[Filter::RequestHeaders(HeaderModifier::default()), Filter::ResponseHeaders(m)],
            &mut response,
        );
        assert_eq!(response["x-env"], "canary");
    }

    #[test]
    fn redirects_replace_what_they_name() {
        let redirect = |path, host: Option<&str>, port| Redirect {
            scheme: None,
            host: host.map(String::from),
            path,
            port,
            status: StatusCode::MOVED_PERMANENTLY,
        };
        let uri: Uri = "http://web.shop:8080/old/a/b?x=1".parse().unwrap();
        let at = |r: &Redirect, prefix| location(r, &uri, uri.authority(), prefix).unwrap();
        assert_eq!(at(&redirect(None, None, None), None), "http://web.shop:8080/old/a/b?x=1");
        assert_eq!(at(&redirect(None, Some("new.shop"), Some(80)), None), "http://new.shop/old/a/b?x=1");
        let full = redirect(Some(PathModifier::Full("/gone".into())), None, None);
        assert_eq!(at(&full, None), "http://web.shop:8080/gone?x=1");
        let prefix = redirect(Some(PathModifier::Prefix("/new".into())), None, None);
        assert_eq!(at(&prefix, Some("/old")), "http://web.shop:8080/new/a/b?x=1");
        let mut req = Request::get(uri).body(()).unwrap();
        let answer = request_filters(&[Filter::Redirect(prefix)], &mut req, Some("/old/"), || 0.0).unwrap_err();
        let location = HeaderValue::from_static("http://web.shop:8080/new/a/b?x=1");
        assert_eq!(answer, Answer::Redirect { status: StatusCode::MOVED_PERMANENTLY, location });
    }

    #[test]
    fn failures_are_injected_in_their_ratio() {
        let fail = Filter::Fail {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "chaos".into(),
            ratio: Ratio { numerator: 1, denominator: 4 },
        };
        let mut req = Request::get("/").body(()).unwrap();
        assert!(request_filters([&fail], &mut req, None, || 0.2).is_err());
        assert!(request_filters([&fail], &mut req, None, || 0.3).is_ok());
    }

    #[test]
    fn backends_are_picked_in_proportion_to_their_weights() {
        let backend = |name: &str, weight| WeightedBackend {
            backend: Backend::Forward { meta: ResourceRef::default_named(name), addr: "10.0.0.1:80".parse().unwrap() },
            weight,
            filters: Vec::new(),
        };
        let backends = [backend("stable", 90), backend("off", 0), backend("canary", 10)];
        let mut counts = std::collections::HashMap::new();
        for i in 0..1000 {
            let b = &backends[pick_backend(&backends, || f64::from(i) / 1000.0).unwrap()];
            *counts.entry(b.backend.meta().name.to_string()).or_insert(0) += 1;
        }
        assert_eq!((counts["stable"], counts["canary"], counts.get("off")), (900, 100, None));
        assert!(pick_backend(&[backend("off", 0)], || 0.5).is_none());
        assert!(pick_backend(&[], || 0.5).is_none());
        let no_roll = || -> f64 { unreachable!("one backend: no choice to make") };
        assert_eq!(pick_backend(&[backend("only", 3)], no_roll), Some(0));
    }
}
