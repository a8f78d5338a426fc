//! Retries of a rule: which requests can be sent again (bodies buffered only when known to fit
//! in 64 KiB and in the rule's own limit, so a large or streaming upload is never held back),
//! the request rebuilt for each attempt, and the wait between attempts. The budget that bounds
//! retries overall (Linkerd's default: 20 % of requests plus 10 per second, over 10 s) lives
//! on the target ([`crate::client::targets::Target::retry_budget`]).

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http::request::Parts;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;

use super::model::Retry;
use crate::client::upstream::RequestBody;
use crate::http::error::ProxyError;

/// The proxy's own cap on a body it holds for retries.
pub const MAX_BUFFERED: usize = 64 * 1024;

/// Whether the request's body may be buffered: none, or a declared length within both caps.
pub fn bufferable<B: hyper::body::Body>(req: &Request<B>, retry: &Retry) -> bool {
    if req.body().is_end_stream() {
        return true;
    }
    let limit = MAX_BUFFERED.min(retry.max_request_bytes);
    req.headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .is_some_and(|len| len <= limit)
}

/// The whole body, at most the caps (a client sending more than it declared is refused).
pub async fn buffer(body: Incoming, retry: &Retry) -> Result<Bytes, ProxyError> {
    let limit = MAX_BUFFERED.min(retry.max_request_bytes);
    Limited::new(body, limit)
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(|e| ProxyError::BadRequest(format!("request body: {e}")))
}

/// One attempt's request: the client's head and the buffered body.
pub fn request(parts: &Parts, body: Bytes) -> Request<RequestBody> {
    let mut req = Request::new(Either::Right(Full::new(body)));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    req
}

/// The wait before retry number `attempt` (1 for the first): the rule's minimum, doubling, up to
/// its maximum; none without a backoff.
pub fn backoff(retry: &Retry, attempt: u32) -> Option<Duration> {
    let (min, max) = retry.backoff?;
    let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(16));
    Some(min.saturating_mul(factor).min(max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn retry(max_request_bytes: usize) -> Retry {
        Retry {
            max_retries: 2,
            max_request_bytes,
            statuses: vec![(500, 599)],
            grpc_codes: Vec::new(),
            timeout: None,
            backoff: Some((Duration::from_millis(10), Duration::from_millis(50))),
        }
    }

    #[test]
    fn only_small_declared_bodies_are_buffered() {
        let r = retry(usize::MAX);
        let empty = Request::get("/").body(http_body_util::Empty::<Bytes>::new()).unwrap();
        assert!(bufferable(&empty, &r));
        let sized = |len: usize| {
            Request::post("/").header("content-length", len).body(Full::new(Bytes::from(vec![0; len]))).unwrap()
        };
        assert!(bufferable(&sized(MAX_BUFFERED), &r));
        assert!(!bufferable(&sized(MAX_BUFFERED + 1), &r), "over the proxy's cap");
        assert!(!bufferable(&sized(100), &retry(99)), "over the rule's cap");
        let streamed = Request::post("/").body(Full::new(Bytes::from_static(b"x"))).unwrap();
        assert!(!bufferable(&streamed, &r), "no declared length: streamed, never held");
    }

    #[test]
    fn statuses_and_backoff() {
        let r = retry(1);
        let none = http::HeaderMap::new();
        assert!(r.retries(StatusCode::SERVICE_UNAVAILABLE, &none) && !r.retries(StatusCode::NOT_FOUND, &none));
        let waits: Vec<_> = (1..=4).map(|a| backoff(&r, a).unwrap().as_millis()).collect();
        assert_eq!(waits, [10, 20, 40, 50]);
        assert_eq!(backoff(&Retry { backoff: None, ..r }, 1), None);
    }
}
