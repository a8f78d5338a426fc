//! Linkerd's transport upgrade: HTTP/1 requests between meshed proxies travel over one HTTP/2
//! connection, marked with `l5d-orig-proto` (Linkerd's header, so a Linkerd proxy and ours can
//! be on either side). The sending proxy upgrades and downgrades the answer; the receiving one
//! downgrades the request for its HTTP/1 app and marks the answer.

use std::net::SocketAddr;

use http::header::{HOST, HeaderName, TRANSFER_ENCODING};
use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Response, Uri, Version};

use super::error::ProxyError;

/// Linkerd's marker of an HTTP/1 request (or response) carried over HTTP/2 between proxies. A
/// Linkerd outbound upgrades HTTP/1 to HTTP/2 towards endpoints the control plane hints as H2
/// (every meshed endpoint), naming the original version here; the receiving proxy must downgrade.
pub const L5D_ORIG_PROTO: HeaderName = HeaderName::from_static("l5d-orig-proto");

/// If `req` is an HTTP/2 request a proxy upgraded from HTTP/1, turns it back into that HTTP/1
/// request: the version the marker names (`HTTP/1.1` or `HTTP/1.0`, optionally followed by
/// `; absolute-form`), the marker removed, `Host` from the `:authority` (where the upgrade put
/// the original `Host`) and the target in origin form. Returns whether it did. An unknown
/// version is the peer's bug or a newer protocol we cannot speak to the app: 400, rather than
/// Linkerd's own fallback of sending HTTP/2 to an app that may not speak it.
pub fn downgrade_request<B>(req: &mut Request<B>) -> Result<bool, ProxyError> {
    if req.version() != Version::HTTP_2 || !req.headers().contains_key(&L5D_ORIG_PROTO) {
        return Ok(false);
    }
    let values: Vec<HeaderValue> = match req.headers_mut().entry(L5D_ORIG_PROTO) {
        http::header::Entry::Occupied(e) => e.remove_entry_mult().1.collect(),
        http::header::Entry::Vacant(_) => Vec::new(),
    };
    let version = match values.as_slice() {
        [value] => {
            let value = value.as_bytes();
            let (version, rest) = value.split_at(value.len().min(8));
            let rest_ok = rest.is_empty() || rest.eq_ignore_ascii_case(b"; absolute-form");
            match version {
                b"HTTP/1.1" if rest_ok => Some(Version::HTTP_11),
                b"HTTP/1.0" if rest_ok => Some(Version::HTTP_10),
                _ => None,
            }
        }
        _ => None,
    };
    let Some(version) = version else {
        return Err(ProxyError::BadRequest(format!(
            "unsupported {L5D_ORIG_PROTO} {values:?}: expected HTTP/1.1 or HTTP/1.0"
        )));
    };
    *req.version_mut() = version;
    if let Some(authority) = req.uri().authority() {
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|e| ProxyError::BadRequest(format!("invalid authority for Host: {e}")))?;
        req.headers_mut().insert(HOST, host);
    }
    Ok(true)
}

/// The answer to a downgraded request goes back over HTTP/2 marked with the version the app
/// answered in, as Linkerd's inbound does: the peer's outbound restores the HTTP/1 response from
/// it. `Transfer-Encoding` has no place in HTTP/2.
pub fn mark_response<B>(res: &mut Response<B>) {
    let original = if res.version() == Version::HTTP_10 { "HTTP/1.0" } else { "HTTP/1.1" };
    res.headers_mut().insert(L5D_ORIG_PROTO, HeaderValue::from_static(original));
    res.headers_mut().remove(TRANSFER_ENCODING);
    *res.version_mut() = Version::HTTP_2;
}

/// Our outbound's side: an HTTP/1 request to a meshed endpoint goes over HTTP/2, marked with its
/// version; HTTP/2 needs the scheme and authority (from `Host`, else `fallback`, the
/// connection's original destination) in the target. The fallback is written out only for a
/// request without `Host`: nearly every request has one, and formatting an address per request
/// is an allocation the hot path does not need.
pub fn upgrade_request<B>(req: &mut Request<B>, fallback: SocketAddr) -> Result<(), ProxyError> {
    let marker = match (req.version(), req.uri().authority().is_some()) {
        (Version::HTTP_10, false) => "HTTP/1.0",
        (Version::HTTP_10, true) => "HTTP/1.0; absolute-form",
        (_, false) => "HTTP/1.1",
        (_, true) => "HTTP/1.1; absolute-form",
    };
    if req.uri().authority().is_none() {
        let authority = match req.headers().get(HOST) {
            Some(host) => Authority::try_from(host.as_bytes()),
            None => Authority::try_from(fallback.to_string()),
        }
        .map_err(|e| ProxyError::BadRequest(format!("invalid Host: {e}")))?;
        let mut parts = std::mem::take(req.uri_mut()).into_parts();
        parts.scheme = Some(Scheme::HTTP);
        parts.authority = Some(authority);
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        }
        *req.uri_mut() =
            Uri::from_parts(parts).map_err(|e| ProxyError::BadRequest(format!("invalid request target: {e}")))?;
    }
    req.headers_mut().remove(HOST);
    req.headers_mut().insert(L5D_ORIG_PROTO, HeaderValue::from_static(marker));
    *req.version_mut() = Version::HTTP_2;
    Ok(())
}

/// Our outbound's side of the answer: the marker goes; the client gets HTTP/1 from hyper.
pub fn downgrade_response<B>(res: &mut Response<B>) {
    res.headers_mut().remove(L5D_ORIG_PROTO);
    *res.version_mut() = Version::HTTP_11;
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    #[test]
    fn orig_proto_requests_become_http1_and_their_responses_are_marked() {
        let upgraded = |value: &'static str| {
            Request::builder()
                .version(Version::HTTP_2)
                .uri("http://web.shop.svc.cluster.local:8080/path?q=1")
                .header(L5D_ORIG_PROTO, value)
                .header("x-app-header", "kept")
                .body(())
                .unwrap()
        };
        let mut req = upgraded("HTTP/1.1");
        assert!(downgrade_request(&mut req).unwrap());
        assert_eq!(req.version(), Version::HTTP_11);
        assert!(!req.headers().contains_key(L5D_ORIG_PROTO));
        assert_eq!(req.headers()[HOST], "web.shop.svc.cluster.local:8080");
        assert_eq!(req.headers()["x-app-header"], "kept");
        assert_eq!(req.uri().path_and_query().unwrap().as_str(), "/path?q=1");

        let mut req = upgraded("HTTP/1.0; absolute-form");
        assert!(downgrade_request(&mut req).unwrap());
        assert_eq!(req.version(), Version::HTTP_10);

        for bad in ["HTTP/2", "HTTP/1.1x", "h2c", ""] {
            let e = downgrade_request(&mut upgraded(bad)).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{bad:?}");
            assert!(e.to_string().contains("l5d-orig-proto"), "{e}");
        }

        // Unmarked HTTP/2, and HTTP/1 (nothing to undo), stay as they are.
        let mut plain = Request::builder().version(Version::HTTP_2).uri("http://a/").body(()).unwrap();
        assert!(!downgrade_request(&mut plain).unwrap());
        assert_eq!(plain.version(), Version::HTTP_2);
        let mut h1 = upgraded("HTTP/1.1");
        *h1.version_mut() = Version::HTTP_11;
        assert!(!downgrade_request(&mut h1).unwrap());

        let mut res = Response::builder()
            .version(Version::HTTP_11)
            .header(TRANSFER_ENCODING, "chunked")
            .header("x-app", "yes")
            .body(())
            .unwrap();
        mark_response(&mut res);
        assert_eq!(res.version(), Version::HTTP_2);
        assert_eq!(res.headers()[L5D_ORIG_PROTO], "HTTP/1.1");
        assert!(!res.headers().contains_key(TRANSFER_ENCODING));
        assert_eq!(res.headers()["x-app"], "yes");
        let mut res = Response::builder().version(Version::HTTP_10).body(()).unwrap();
        mark_response(&mut res);
        assert_eq!(res.headers()[L5D_ORIG_PROTO], "HTTP/1.0");
    }

    #[test]
    fn our_upgrade_is_undone_by_our_downgrade() {
        let mut req = Request::builder()
            .version(Version::HTTP_11)
            .uri("/path?q=1")
            .header(HOST, "web.shop:8080")
            .header("x-app", "kept")
            .body(())
            .unwrap();
        upgrade_request(&mut req, "10.0.0.1:8080".parse().unwrap()).unwrap();
        assert_eq!(req.version(), Version::HTTP_2);
        assert_eq!(req.uri().to_string(), "http://web.shop:8080/path?q=1");
        assert_eq!(req.headers()[L5D_ORIG_PROTO], "HTTP/1.1");
        assert!(!req.headers().contains_key(HOST));
        assert!(downgrade_request(&mut req).unwrap());
        assert_eq!(
            (req.version(), &req.headers()[HOST]),
            (Version::HTTP_11, &HeaderValue::from_static("web.shop:8080"))
        );

        let mut no_host = Request::builder().version(Version::HTTP_10).uri("/").body(()).unwrap();
        upgrade_request(&mut no_host, "10.0.0.1:8080".parse().unwrap()).unwrap();
        assert_eq!(no_host.uri().authority().unwrap().as_str(), "10.0.0.1:8080");
        assert_eq!(no_host.headers()[L5D_ORIG_PROTO], "HTTP/1.0");

        let mut res = Response::builder().version(Version::HTTP_2).header(L5D_ORIG_PROTO, "HTTP/1.1").body(()).unwrap();
        downgrade_response(&mut res);
        assert!(!res.headers().contains_key(L5D_ORIG_PROTO));
        assert_eq!(res.version(), Version::HTTP_11);
    }
}
