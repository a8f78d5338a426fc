//! The proxy's own answers when it cannot deliver a request: 502, 503 or 504 (or 400 for a
//! request it cannot forward), naming why in `cnimesh-proxy-error`.

use std::io;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::Body;

/// A failure answered to the client instead of the upstream's response.
#[derive(Debug)]
pub struct ProxyError {
    pub status: StatusCode,
    pub message: String,
}

impl ProxyError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }
}

pub fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).map_err(|never| match never {}).boxed_unsync()
}

pub fn error_response(e: &ProxyError) -> Response<Body> {
    let mut r = Response::new(full(format!("cnimesh-proxy: {}\n", e.message)));
    *r.status_mut() = e.status;
    r.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    if let Ok(v) = HeaderValue::from_str(&e.message) {
        r.headers_mut().insert("cnimesh-proxy-error", v);
    }
    r
}

/// An upstream failure as the client sees it: a timeout is 504, anything else 502.
pub fn upstream_error(target: SocketAddr, e: &(dyn std::error::Error + 'static)) -> ProxyError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return match io.kind() {
                io::ErrorKind::TimedOut => {
                    ProxyError::new(StatusCode::GATEWAY_TIMEOUT, format!("upstream {target} timed out"))
                }
                io::ErrorKind::ConnectionRefused => {
                    ProxyError::new(StatusCode::BAD_GATEWAY, format!("upstream {target} refused the connection"))
                }
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => {
                    ProxyError::new(StatusCode::BAD_GATEWAY, format!("upstream {target} reset the connection"))
                }
                _ => ProxyError::new(StatusCode::BAD_GATEWAY, format!("upstream {target}: {io}")),
            };
        }
        source = err.source();
    }
    ProxyError::new(StatusCode::BAD_GATEWAY, format!("upstream {target}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_failures_map_to_gateway_statuses() {
        let target: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let timed_out = io::Error::new(io::ErrorKind::TimedOut, "slow");
        assert_eq!(upstream_error(target, &timed_out).status, StatusCode::GATEWAY_TIMEOUT);
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "no");
        let e = upstream_error(target, &refused);
        assert_eq!(
            (e.status, e.message.as_str()),
            (StatusCode::BAD_GATEWAY, "upstream 10.0.0.1:80 refused the connection")
        );
        let r = error_response(&e);
        assert_eq!(r.headers()["cnimesh-proxy-error"], "upstream 10.0.0.1:80 refused the connection");
    }
}
