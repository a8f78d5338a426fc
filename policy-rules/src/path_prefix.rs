//! Gateway API's path-prefix rule, shared by inbound authorization routes and outbound routes.

/// Gateway API's `PathPrefix`: whole path segments (`/a` matches `/a` and `/a/b`, not `/ab`).
pub fn segment_prefix(prefix: &str, path: &str) -> bool {
    let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
    path.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}
