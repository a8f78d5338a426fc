//! The request path as inbound authorization sees it: normalization, then
//! route matching on the result. Any bytes a client can put in a request target go in, as the
//! raw string and as the path the `http` crate parses out of it. Oracles: nothing panics;
//! normalization is idempotent; a normalized path holds no `//`, `/./` or `/../` (nor ends in a
//! dot segment), so what the policy matched is what the app will read.
#![no_main]

use cnimesh_proxy::inbound::policy::authorize::route_for;
use cnimesh_proxy::inbound::policy::model::{PathMatch, Resource, Route, RouteMatch};
use cnimesh_proxy::inbound::policy::path::normalize;
use libfuzzer_sys::fuzz_target;

fn routes() -> Vec<Route> {
    let route = |name: &str, path: PathMatch, method| Route {
        meta: Resource::new("", "default", name),
        matches: vec![RouteMatch { path, method }],
        authorizations: Vec::new(),
    };
    vec![
        route("probe", PathMatch::Exact("/ready".into()), Some(http::Method::GET)),
        route("admin", PathMatch::Prefix("/admin".into()), None),
        route("api", PathMatch::Prefix("/api/".into()), None),
        route("default", PathMatch::Any, None),
    ]
}

fn check(path: &str) {
    let Ok(normal) = normalize(path) else { return };
    assert_eq!(normal.starts_with('/'), path.starts_with('/'));
    if normal.starts_with('/') {
        for bad in ["//", "/./", "/../"] {
            assert!(!normal.contains(bad), "{path:?} normalized to {normal:?}");
        }
        assert!(!normal.ends_with("/.") && !normal.ends_with("/.."), "{path:?} normalized to {normal:?}");
    }
    let again = normalize(&normal).expect("a normalized path normalizes");
    assert_eq!(again, normal, "not idempotent for {path:?}");
    assert!(matches!(again, std::borrow::Cow::Borrowed(_)), "a normal path is borrowed");
    let routes = routes();
    let chosen = route_for(&routes, &http::Method::GET, &normal);
    assert!(chosen.is_some(), "the catch-all route matches everything");
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        check(text);
    }
    if let Ok(uri) = http::Uri::try_from(data) {
        check(uri.path());
    }
});
