//! How a request's target is written for the hop it takes: HTTP/1 in origin form with a
//! `Host`, and the authority a multicluster gateway's endpoint names instead of the mirror's.

use std::net::SocketAddr;

use http::header::HOST;
use http::{HeaderValue, Request, Uri};

use super::error::ProxyError;

/// A request to a multicluster gateway names the remote Service (the endpoint's
/// authority override) as its `Host` and, when it has one, its URI's authority; the gateway
/// and the remote server see that name, not the mirror's.
pub fn override_authority<B>(req: &mut Request<B>, authority: &HeaderValue) -> Result<(), ProxyError> {
    req.headers_mut().insert(HOST, authority.clone());
    if req.uri().authority().is_some() {
        let mut parts = req.uri().clone().into_parts();
        parts.authority = Some(
            http::uri::Authority::try_from(authority.as_bytes())
                .map_err(|e| ProxyError::BadRequest(format!("invalid authority override: {e}")))?,
        );
        *req.uri_mut() =
            Uri::from_parts(parts).map_err(|e| ProxyError::BadRequest(format!("invalid authority override: {e}")))?;
    }
    Ok(())
}

/// An HTTP/1 request goes upstream in origin form (`GET /path`) with a `Host`: an absolute-form
/// target (a client that thinks we are its proxy) is rewritten, nothing else is touched.
pub fn to_origin_form<B>(req: &mut Request<B>, addr: SocketAddr) -> Result<(), ProxyError> {
    let invalid = |e: &dyn std::fmt::Display| ProxyError::BadRequest(format!("invalid request target: {e}"));
    if let Some(authority) = req.uri().authority() {
        if !req.headers().contains_key(HOST) {
            let host = HeaderValue::from_str(authority.as_str()).map_err(|e| invalid(&e))?;
            req.headers_mut().insert(HOST, host);
        }
        let path = req.uri().path_and_query().cloned();
        let mut parts = http::uri::Parts::default();
        parts.path_and_query = Some(path.unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")));
        *req.uri_mut() = Uri::from_parts(parts).map_err(|e| invalid(&e))?;
    } else if !req.headers().contains_key(HOST) {
        let host = HeaderValue::from_str(&addr.to_string()).map_err(|e| invalid(&e))?;
        req.headers_mut().insert(HOST, host);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http1_targets_go_in_origin_form_with_a_host() {
        let addr: SocketAddr = "10.0.0.1:8080".parse().unwrap();
        let mut absolute = Request::builder().uri("http://web:80/a?b").body(()).unwrap();
        to_origin_form(&mut absolute, addr).unwrap();
        assert_eq!(
            (absolute.uri().to_string().as_str(), &absolute.headers()[HOST]),
            ("/a?b", &HeaderValue::from_static("web:80"))
        );
        let mut bare = Request::builder().uri("/x").body(()).unwrap();
        to_origin_form(&mut bare, addr).unwrap();
        assert_eq!(bare.headers()[HOST], "10.0.0.1:8080");
        let mut kept = Request::builder().uri("/y").header(HOST, "app").body(()).unwrap();
        to_origin_form(&mut kept, addr).unwrap();
        assert_eq!((kept.uri().to_string().as_str(), &kept.headers()[HOST]), ("/y", &HeaderValue::from_static("app")));
    }
}
