//! The page, embedded in the binary (no CDN, works offline): one HTML file, one stylesheet, an
//! SVG icon, and one script bundled at build time (`build.rs`: `dashboard-web/src` with the
//! graph layout libraries pinned in `dashboard-web/package-lock.json`).

const INDEX: &str = include_str!("assets/index.html");
const APP: &str = include_str!(concat!(env!("OUT_DIR"), "/dashboard/app.js"));
const STYLE: &str = include_str!("assets/style.css");
const FAVICON: &str = include_str!("assets/favicon.svg");

/// The content type and bytes of the file at `path`.
pub fn get(path: &str) -> Option<(&'static str, &'static [u8])> {
    match path {
        "/" | "/index.html" => Some(("text/html; charset=utf-8", INDEX.as_bytes())),
        "/app.js" => Some(("text/javascript; charset=utf-8", APP.as_bytes())),
        "/style.css" => Some(("text/css; charset=utf-8", STYLE.as_bytes())),
        "/favicon.svg" | "/favicon.ico" => Some(("image/svg+xml", FAVICON.as_bytes())),
        _ => None,
    }
}
