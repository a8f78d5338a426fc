//! Header rules of a forwarding proxy: hop-by-hop headers go (RFC 9110 §7.6.1), upgrades are
//! recognised.

use http::header::{CONNECTION, HeaderName, TE, UPGRADE};
use http::{HeaderMap, HeaderValue, Method, Request};

/// Removes hop-by-hop headers; `upgrade` keeps `Connection: upgrade` and `Upgrade` for the
/// upgrade handshake itself. `TE: trailers` is end-to-end in practice (gRPC needs it). Headers
/// without hop-by-hop names (nearly every request) are left untouched, without allocating.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    if headers.contains_key(CONNECTION) {
        let listed: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in listed {
            if !(upgrade && name == UPGRADE) && name != TE {
                headers.remove(&name);
            }
        }
    }
    for name in ["keep-alive", "proxy-connection", "transfer-encoding", "proxy-authenticate", "proxy-authorization"] {
        headers.remove(name);
    }
    if !upgrade {
        headers.remove(CONNECTION);
        headers.remove(UPGRADE);
    } else {
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    }
    if headers.contains_key(TE) {
        let te_trailers =
            headers.get_all(TE).iter().any(|v| v.to_str().is_ok_and(|s| s.to_ascii_lowercase().contains("trailers")));
        headers.remove(TE);
        if te_trailers {
            headers.insert(TE, HeaderValue::from_static("trailers"));
        }
    }
}

/// An HTTP/1 `Upgrade` handshake (WebSocket) or a `CONNECT`: spliced, not forwarded.
pub fn wants_upgrade<B>(req: &Request<B>) -> bool {
    req.method() == Method::CONNECT
        || (req.headers().contains_key(UPGRADE)
            && req
                .headers()
                .get_all(CONNECTION)
                .iter()
                .any(|v| v.to_str().is_ok_and(|s| s.to_ascii_lowercase().contains("upgrade"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("keep-alive, x-secret"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert(TE, HeaderValue::from_static("trailers, deflate"));
        h.insert("x-end-to-end", HeaderValue::from_static("kept"));
        strip_hop_by_hop(&mut h, false);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-end-to-end", "te"]);
        assert_eq!(h[TE], "trailers");

        let mut up = HeaderMap::new();
        up.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        up.insert(UPGRADE, HeaderValue::from_static("websocket"));
        strip_hop_by_hop(&mut up, true);
        assert_eq!((up[CONNECTION].to_str().unwrap(), up[UPGRADE].to_str().unwrap()), ("upgrade", "websocket"));
    }
}
