//! HTTP/1 request heads through the inbound path: detection, then the head as hyper's parser
//! (httparse) reads it, then the `http` types the proxy works with. A head that parses must be
//! detected as HTTP/1 (else a valid request would be forwarded as opaque TCP), and its parts must
//! fit inside the input.
#![no_main]

use cnimesh_proxy::transport::detect::{Protocol, classify};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let Ok(httparse::Status::Complete(len)) = req.parse(data) else {
        let _ = classify(data);
        return;
    };
    assert!(len <= data.len());
    let (method, path, version) = (req.method.unwrap(), req.path.unwrap(), req.version.unwrap());
    assert!(method.len() + path.len() < len && version <= 1);
    // httparse skips empty lines before the request line (RFC 9112 §2.2); detection decides on
    // the first line alone, so a head that starts with an empty line is opaque to it: forwarded
    // as TCP, which the app still reads (a known, accepted divergence). Every other complete
    // head must be HTTP/1.
    if !data.starts_with(b"\r\n") && !data.starts_with(b"\n") {
        assert_eq!(classify(data), Some(Protocol::Http1), "a complete request head is not detected as HTTP/1");
    }
    // What the proxy builds from it (hyper does the same and answers 400 on failure).
    let _ = http::Method::from_bytes(method.as_bytes());
    let _ = http::Uri::try_from(path);
    for h in req.headers.iter() {
        assert!(h.name.len() + h.value.len() <= len);
        let _ = http::HeaderName::from_bytes(h.name.as_bytes());
        let _ = http::HeaderValue::from_bytes(h.value);
    }
});
