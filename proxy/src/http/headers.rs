//! Header rules of a forwarding proxy: hop-by-hop headers go (RFC 9110 §7.6.1), upgrades are
//! recognised.

use http::header::{CONNECTION, HeaderName, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderValue, Method, Request};

/// Removes hop-by-hop headers; `upgrade` keeps `Connection: upgrade` and `Upgrade` for the
/// upgrade handshake itself. `TE: trailers` is end-to-end in practice (gRPC needs it). Headers
/// without hop-by-hop names (nearly every request) are left untouched, without allocating.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    // One walk over the few names a message has, comparing standard names as enum values,
    // instead of a parse and hash lookup for each of the nine names below.
    if !upgrade && !headers.keys().any(is_hop_by_hop) {
        return;
    }
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
    for name in &HOP_BY_HOP {
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

/// The hop-by-hop headers removed by name, besides `Connection`, `Upgrade` and `TE`.
static HOP_BY_HOP: [HeaderName; 5] = [
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    TRANSFER_ENCODING,
    PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION,
];

/// Whether `name` is one [`strip_hop_by_hop`] removes or rewrites.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == CONNECTION || name == UPGRADE || name == TE || HOP_BY_HOP.contains(name)
}

/// A client's `Upgrade: h2c` (RFC 7540 §3.2) is never honoured: after the switch, every request
/// on the connection would reach the app without passing the proxy's per-request checks. The
/// offer and its `HTTP2-Settings` go, and the request is served as plain HTTP/1 (which is what
/// a server declining the upgrade does). Returns whether there was one.
pub fn strip_h2c_upgrade(headers: &mut HeaderMap) -> bool {
    let h2c = headers
        .get_all(UPGRADE)
        .iter()
        .any(|v| v.to_str().map_or(true, |s| s.split(',').any(|p| p.trim().eq_ignore_ascii_case("h2c"))));
    if h2c {
        headers.remove(UPGRADE);
        headers.remove("http2-settings");
    }
    h2c
}

/// gRPC's status and message, read from every response head and trailers: parsed once, here,
/// not per request from text.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// The identity a multicluster gateway verified for the client of a request it forwards (the
/// workload in another cluster that called). Set by the gateway on every HTTP request, replacing
/// what the client sent; believed by an inbound proxy only when its peer is its own cluster's
/// gateway, and stripped otherwise.
pub const GATEWAY_CLIENT_ID: HeaderName = HeaderName::from_static("cnimesh-gateway-client-id");

/// Headers through which a client could claim an identity (Linkerd's: apps ported from Linkerd
/// read `l5d-client-id` as the caller's verified identity; the gateway's forwarded identity).
/// Only the inbound proxy sets them for the app; every one a client sent goes.
pub const IDENTITY_HEADERS: [HeaderName; 3] =
    [HeaderName::from_static("l5d-client-id"), HeaderName::from_static("l5d-server-id"), GATEWAY_CLIENT_ID];

/// Headers through which a pod's app names the Service a request is for, overriding its
/// authority: ours, and Linkerd's (ingress controllers set up for Linkerd send it). Read only by
/// an outbound proxy in ingress mode, from its own pod's app; every proxy removes them before a
/// request goes on, so no upstream sees them and no network peer can steer with them.
pub const DST_OVERRIDE_HEADERS: [HeaderName; 2] =
    [HeaderName::from_static("cnimesh-dst-override"), HeaderName::from_static("l5d-dst-override")];

/// Removes every [`DST_OVERRIDE_HEADERS`] value from `headers`; whether there was one.
pub fn strip_dst_override(headers: &mut HeaderMap) -> bool {
    let mut found = false;
    for name in &DST_OVERRIDE_HEADERS {
        found |= headers.remove(name).is_some();
    }
    found
}

/// The proxy's own reason on an answer it made itself (a refusal, an upstream error).
pub const PROXY_ERROR: HeaderName = HeaderName::from_static("cnimesh-proxy-error");

/// The authority a request is for, as the client named it: its URI's, else its `Host`.
pub fn authority_of<B>(req: &Request<B>) -> &str {
    match req.uri().authority() {
        Some(a) => a.as_str(),
        None => req.headers().get(http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or(""),
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

    #[test]
    fn each_hop_by_hop_header_alone_goes_and_a_message_without_any_is_untouched() {
        for name in [
            "connection",
            "upgrade",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
            "proxy-authenticate",
            "proxy-authorization",
        ] {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static("x"));
            h.insert("x-end-to-end", HeaderValue::from_static("kept"));
            strip_hop_by_hop(&mut h, false);
            assert_eq!(h.keys().map(HeaderName::as_str).collect::<Vec<_>>(), ["x-end-to-end"], "{name}");
        }
        let mut te = HeaderMap::new();
        te.insert(TE, HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut te, false);
        assert!(te.is_empty(), "TE without trailers goes");
        let mut plain = HeaderMap::new();
        plain.insert("x-end-to-end", HeaderValue::from_static("kept"));
        plain.append("x-end-to-end", HeaderValue::from_static("twice"));
        let before = plain.clone();
        strip_hop_by_hop(&mut plain, false);
        assert_eq!(plain, before);
    }

    #[test]
    fn an_h2c_upgrade_offer_is_dropped_and_others_are_kept() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("Upgrade, HTTP2-Settings"));
        h.insert(UPGRADE, HeaderValue::from_static("H2C"));
        h.insert("http2-settings", HeaderValue::from_static("AAMAAABkAAQAoAAAAAIAAAAA"));
        assert!(strip_h2c_upgrade(&mut h));
        assert!(!h.contains_key(UPGRADE) && !h.contains_key("http2-settings"));
        let req = Request::get("/").header(CONNECTION, "upgrade").body(()).unwrap();
        assert!(!wants_upgrade(&req), "no Upgrade header left: not an upgrade");
        let mut ws = HeaderMap::new();
        ws.insert(UPGRADE, HeaderValue::from_static("websocket"));
        assert!(!strip_h2c_upgrade(&mut ws));
        assert_eq!(ws[UPGRADE], "websocket");
    }
}
