//! The proxy's own answers when it cannot deliver a request: one error enum for everything the
//! request path decides on. Each kind knows the status it is answered with (named, as before,
//! in `cnimesh-proxy-error`) and whether a route's retry may send the request again: only
//! failures of the upstream are retried, never the proxy's own (no identity yet, no endpoints,
//! a request it refuses).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::Body;

/// A failure answered to the client instead of the upstream's response. The messages are the
/// `cnimesh-proxy-error` values the proxy has always sent; keep them byte for byte.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The request cannot be forwarded as sent (bad target, bad `Host`, a body over the cap).
    #[error("{0}")]
    BadRequest(String),
    /// Refused by the inbound policy (or a route it does not know): 403 or 404.
    #[error("{why}")]
    Refused { status: StatusCode, why: String },
    /// A route matched nothing.
    #[error("no route matches the request")]
    NoRoute,
    /// A route that cannot be served as the control plane sent it.
    #[error("{0}")]
    Misconfigured(String),
    /// A route's fault injection: the status and message the rule names.
    #[error("{message}")]
    Injected { status: StatusCode, message: String },
    /// A discovered service with no endpoints.
    #[error("service {0} has no endpoints")]
    NoEndpoints(String),
    /// A backend the proxy cannot reach at all (unknown to discovery).
    #[error("{0}")]
    Unavailable(String),
    /// The proxy cannot secure a connection to a meshed endpoint yet (no certificate of its own).
    #[error("{0}")]
    NoIdentity(&'static str),
    /// A route's backend could not be resolved.
    #[error("backend {backend}: {why}")]
    Backend { backend: String, why: String },
    /// Connecting (or an I/O step) to the endpoint timed out.
    #[error("upstream {0} timed out")]
    ConnectTimeout(SocketAddr),
    #[error("upstream {0} refused the connection")]
    ConnectRefused(SocketAddr),
    #[error("upstream {0} reset the connection")]
    Reset(SocketAddr),
    /// Any other failure of the endpoint or its connection.
    #[error("upstream {addr}: {why}")]
    Upstream { addr: SocketAddr, why: String },
    /// One attempt (a retry's per-try timeout) got no response in time.
    #[error("upstream {addr} timed out after {} ms", after.as_millis())]
    ResponseTimeout { addr: SocketAddr, after: Duration },
    /// The route's request timeout, over every attempt.
    #[error("request timed out after {} ms on route {route}", after.as_millis())]
    RouteTimeout { route: String, after: Duration },
    /// Egress refused by an EgressNetwork's policy (`<ns>/<name>`): 403.
    #[error("egress denied by EgressNetwork {network}")]
    EgressDenied { network: String },
    /// Over the Server's rate limit (HTTPLocalRateLimitPolicy): 429.
    #[error("rate limited")]
    RateLimited,
}

impl ProxyError {
    /// The status the client gets.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ProxyError::Refused { status, .. } | ProxyError::Injected { status, .. } => *status,
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::EgressDenied { .. } => StatusCode::FORBIDDEN,
            ProxyError::Misconfigured(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ProxyError::NoEndpoints(_) | ProxyError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::NoIdentity(_)
            | ProxyError::Backend { .. }
            | ProxyError::ConnectRefused(_)
            | ProxyError::Reset(_)
            | ProxyError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::ConnectTimeout(_) | ProxyError::ResponseTimeout { .. } | ProxyError::RouteTimeout { .. } => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ProxyError::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// Whether a route's retry may send the request again: the endpoint failed or was too slow.
    /// The proxy's own refusals and missing prerequisites (identity, endpoints) would fail the
    /// same way again, and must not spend the retry budget.
    pub fn retryable(&self) -> bool {
        match self {
            ProxyError::ConnectTimeout(_)
            | ProxyError::ConnectRefused(_)
            | ProxyError::Reset(_)
            | ProxyError::Upstream { .. }
            | ProxyError::ResponseTimeout { .. } => true,
            ProxyError::BadRequest(_)
            | ProxyError::Refused { .. }
            | ProxyError::NoRoute
            | ProxyError::Misconfigured(_)
            | ProxyError::Injected { .. }
            | ProxyError::NoEndpoints(_)
            | ProxyError::Unavailable(_)
            | ProxyError::NoIdentity(_)
            | ProxyError::Backend { .. }
            | ProxyError::RouteTimeout { .. }
            | ProxyError::EgressDenied { .. }
            | ProxyError::RateLimited => false,
        }
    }
}

pub fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).map_err(|never| match never {}).boxed_unsync()
}

pub fn error_response(e: &ProxyError) -> Response<Body> {
    let message = e.to_string();
    let mut r = Response::new(full(format!("cnimesh-proxy: {message}\n")));
    *r.status_mut() = e.status();
    r.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    if let Ok(v) = HeaderValue::from_str(&message) {
        r.headers_mut().insert(crate::http::headers::PROXY_ERROR, v);
    }
    r
}

/// An upstream failure as the client sees it: a timeout is 504, anything else 502.
pub fn upstream_error(target: SocketAddr, e: &(dyn std::error::Error + 'static)) -> ProxyError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return match io.kind() {
                io::ErrorKind::TimedOut => ProxyError::ConnectTimeout(target),
                io::ErrorKind::ConnectionRefused => ProxyError::ConnectRefused(target),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => ProxyError::Reset(target),
                _ => ProxyError::Upstream { addr: target, why: io.to_string() },
            };
        }
        source = err.source();
    }
    ProxyError::Upstream { addr: target, why: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_failures_map_to_gateway_statuses() {
        let target: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let timed_out = io::Error::new(io::ErrorKind::TimedOut, "slow");
        assert_eq!(upstream_error(target, &timed_out).status(), StatusCode::GATEWAY_TIMEOUT);
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "no");
        let e = upstream_error(target, &refused);
        assert_eq!(
            (e.status(), e.to_string().as_str()),
            (StatusCode::BAD_GATEWAY, "upstream 10.0.0.1:80 refused the connection")
        );
        let r = error_response(&e);
        assert_eq!(r.headers()["cnimesh-proxy-error"], "upstream 10.0.0.1:80 refused the connection");
    }

    #[test]
    fn only_failures_of_the_upstream_are_retryable() {
        let addr: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let upstream = [
            ProxyError::ConnectTimeout(addr),
            ProxyError::ConnectRefused(addr),
            ProxyError::Reset(addr),
            ProxyError::Upstream { addr, why: "eof".into() },
            ProxyError::ResponseTimeout { addr, after: Duration::from_millis(5) },
        ];
        assert!(upstream.iter().all(ProxyError::retryable));
        let own = [
            ProxyError::NoIdentity("no certificate yet for mTLS to a meshed endpoint"),
            ProxyError::NoEndpoints("web.shop.svc.cluster.local:80".into()),
            ProxyError::BadRequest("invalid Host".into()),
            ProxyError::RouteTimeout { route: "r".into(), after: Duration::from_millis(5) },
        ];
        assert!(own.iter().all(|e| !e.retryable()), "the proxy's own failures are not retried");
        assert_eq!(own[0].status(), StatusCode::BAD_GATEWAY, "the same 502 as before, only not retried");
    }

    #[test]
    fn messages_stay_what_the_proxy_always_answered() {
        let addr: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let cases = [
            (
                ProxyError::ResponseTimeout { addr, after: Duration::from_millis(250) },
                504,
                "upstream 10.0.0.1:80 timed out after 250 ms",
            ),
            (
                ProxyError::RouteTimeout { route: "web".into(), after: Duration::from_millis(100) },
                504,
                "request timed out after 100 ms on route web",
            ),
            (
                ProxyError::NoEndpoints("web.shop.svc.cluster.local:80".into()),
                503,
                "service web.shop.svc.cluster.local:80 has no endpoints",
            ),
            (ProxyError::Backend { backend: "b".into(), why: "x".into() }, 502, "backend b: x"),
            (ProxyError::NoRoute, 404, "no route matches the request"),
            (
                ProxyError::EgressDenied { network: "shop/world".into() },
                403,
                "egress denied by EgressNetwork shop/world",
            ),
            (ProxyError::Upstream { addr, why: "eof".into() }, 502, "upstream 10.0.0.1:80: eof"),
        ];
        for (e, status, message) in cases {
            let r = error_response(&e);
            assert_eq!((r.status().as_u16(), r.headers()["cnimesh-proxy-error"].to_str().unwrap()), (status, message));
        }
    }
}
