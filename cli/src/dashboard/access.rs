//! Who may use the dashboard. The page acts with the operator's cluster credentials (it starts
//! taps and reads policies), so every request must come from the operator's own tab:
//! - its `Host` names the bound address or localhost: a page elsewhere whose DNS name is rebound
//!   to 127.0.0.1 still sends its own name;
//! - no other origin sent it: an `Origin` header must be the dashboard's own, and a
//!   `Sec-Fetch-Site` must be `same-origin` or `none`. A page on another port of 127.0.0.1 is
//!   "same-site" for cookies, yet another origin;
//! - it carries this run's token, a random secret printed in the URL (as Jupyter does). The first
//!   load trades the URL's `?token=` for an `HttpOnly`, `SameSite=Strict` cookie named for this
//!   port and redirects to the same URL without it, so the token leaves the address bar and the
//!   history; scripts may send `Authorization: Bearer <token>` instead. Other local users and
//!   pages that cannot read the operator's terminal do not have it.

use std::net::SocketAddr;

use http::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN};
use http::{HeaderMap, StatusCode, Uri};

use super::problem::ApiError;

/// How many random bytes a run's token has (hex-encoded in the URL).
const TOKEN_BYTES: usize = 32;

/// The checks for one running dashboard: its accepted Host values, its token and cookie name.
#[derive(Debug, Clone)]
pub struct Access {
    hosts: Vec<String>,
    token: String,
    cookie: String,
}

/// What a request that passed the checks gets.
#[derive(Debug, PartialEq, Eq)]
pub enum Admitted {
    /// Served as asked.
    Serve,
    /// The URL carried the right `?token=`: set the cookie and send the browser to `location`,
    /// the same path and query without the token.
    TradeToken { location: String, set_cookie: String },
}

/// Why a request was refused; each names what the caller must do.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("Host {0:?} is not this dashboard's address")]
    ForeignHost(String),
    #[error("a request from the page at {0:?}, not from the dashboard's own")]
    ForeignOrigin(String),
    #[error("a {0} request (Sec-Fetch-Site), not one from the dashboard's own page")]
    CrossSite(String),
    #[error("no token for this run of the dashboard, or a wrong one")]
    NoToken,
}

impl Refused {
    /// The answer: 401 for a missing token (the URL solves it), 403 for the rest.
    pub fn to_api_error(&self) -> ApiError {
        match self {
            Refused::NoToken => ApiError::new(StatusCode::UNAUTHORIZED, self.to_string())
                .hint("open the URL `cnimesh dashboard` printed: it carries this run's token"),
            Refused::ForeignHost(_) => ApiError::new(StatusCode::FORBIDDEN, self.to_string())
                .hint("open the URL `cnimesh dashboard` printed (this check stops DNS rebinding)"),
            Refused::ForeignOrigin(_) | Refused::CrossSite(_) => ApiError::new(StatusCode::FORBIDDEN, self.to_string())
                .hint("only the dashboard's own page may call it; open the URL `cnimesh dashboard` printed"),
        }
    }
}

impl Access {
    /// The checks for a dashboard bound at `bound`, with a fresh random token.
    pub fn generate(bound: SocketAddr) -> Self {
        Self::with_token(bound, cnimesh_identity::secret::random_hex(TOKEN_BYTES))
    }

    /// The checks with a given token (tests).
    pub fn with_token(bound: SocketAddr, token: impl Into<String>) -> Self {
        let port = bound.port();
        let mut hosts: Vec<String> =
            ["localhost", "127.0.0.1", "[::1]"].iter().map(|h| format!("{h}:{port}")).collect();
        if !bound.ip().is_unspecified() {
            hosts.push(bound.to_string());
        }
        if port == 80 {
            hosts.extend(["localhost".into(), "127.0.0.1".into(), "[::1]".into()]);
        }
        hosts.sort();
        hosts.dedup();
        Self { hosts, token: token.into(), cookie: format!("cnimesh-dashboard-{port}") }
    }

    /// The URL to print and open: the page with this run's token.
    pub fn url(&self, bound: SocketAddr) -> String {
        format!("http://{bound}/?token={}", self.token)
    }

    /// The checks, in order: Host, then who sent it, then the token.
    pub fn check(&self, headers: &HeaderMap, uri: &Uri) -> Result<Admitted, Refused> {
        let host = header(headers, HOST);
        if !self.allows_host(host) {
            return Err(Refused::ForeignHost(host.to_string()));
        }
        if let Some(origin) = headers.get(ORIGIN) {
            let origin = origin.to_str().unwrap_or_default();
            let own = origin.strip_prefix("http://").is_some_and(|h| self.allows_host(h));
            if !own {
                return Err(Refused::ForeignOrigin(origin.to_string()));
            }
        }
        if let Some(site) = headers.get("sec-fetch-site") {
            let site = site.to_str().unwrap_or_default();
            if !site.eq_ignore_ascii_case("same-origin") && !site.eq_ignore_ascii_case("none") {
                return Err(Refused::CrossSite(site.to_string()));
            }
        }
        let (from_query, rest) = split_token(uri.query());
        if from_query.is_some_and(|t| self.matches(t)) {
            // One leading slash: `//host/` would send the browser to another host.
            let path = format!("/{}", uri.path().trim_start_matches('/'));
            let location = match rest {
                Some(rest) => format!("{path}?{rest}"),
                None => path,
            };
            let set_cookie = format!("{}={}; Path=/; HttpOnly; SameSite=Strict", self.cookie, self.token);
            return Ok(Admitted::TradeToken { location, set_cookie });
        }
        if self.bearer_matches(headers) || self.cookie_matches(headers) {
            return Ok(Admitted::Serve);
        }
        Err(Refused::NoToken)
    }

    fn allows_host(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }

    fn matches(&self, token: &str) -> bool {
        cnimesh_identity::secret::constant_time_eq(token.as_bytes(), self.token.as_bytes())
    }

    fn bearer_matches(&self, headers: &HeaderMap) -> bool {
        header(headers, AUTHORIZATION).strip_prefix("Bearer ").is_some_and(|t| self.matches(t.trim()))
    }

    fn cookie_matches(&self, headers: &HeaderMap) -> bool {
        headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .any(|(name, value)| name == self.cookie && self.matches(value))
    }
}

fn header(headers: &HeaderMap, name: http::header::HeaderName) -> &str {
    headers.get(name).and_then(|h| h.to_str().ok()).unwrap_or_default()
}

/// The query's `token` value and the rest of the query without it (`None` when nothing is left).
fn split_token(query: Option<&str>) -> (Option<&str>, Option<String>) {
    let Some(query) = query else { return (None, None) };
    let mut token = None;
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.strip_prefix("token=") {
            Some(value) if token.is_none() => token = Some(value),
            _ if pair.is_empty() => {}
            _ => rest.push(pair),
        }
    }
    (token, (!rest.is_empty()).then(|| rest.join("&")))
}
