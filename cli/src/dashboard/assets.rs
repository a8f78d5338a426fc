//! The page, embedded in the binary (no CDN, works offline): one HTML file, one ES module and
//! one stylesheet written for the dashboard, with no npm dependency.

const INDEX: &str = include_str!("assets/index.html");
const APP: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/style.css");

/// The content type and bytes of the file at `path`.
pub fn get(path: &str) -> Option<(&'static str, &'static [u8])> {
    match path {
        "/" | "/index.html" => Some(("text/html; charset=utf-8", INDEX.as_bytes())),
        "/app.js" => Some(("text/javascript; charset=utf-8", APP.as_bytes())),
        "/style.css" => Some(("text/css; charset=utf-8", STYLE.as_bytes())),
        _ => None,
    }
}
