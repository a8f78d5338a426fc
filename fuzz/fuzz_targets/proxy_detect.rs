//! Protocol detection on a connection's first bytes (anyone who can connect chooses them). The
//! verdict must not depend on how the bytes were split into reads, HTTP/2 only for the preface.
#![no_main]

use cnimesh_proxy::transport::detect::{H2_PREFACE, Protocol, classify};
use libfuzzer_sys::fuzz_target;

/// detect.rs's MAX_REQUEST_LINE: past it a line-less prefix is opaque by design.
const MAX_REQUEST_LINE: usize = 8 * 1024;

fuzz_target!(|data: &[u8]| {
    let full = classify(data);
    if data.starts_with(H2_PREFACE) {
        assert_eq!(full, Some(Protocol::Http2));
    } else {
        assert_ne!(full, Some(Protocol::Http2));
    }
    // The first prefix that decides is what `detect` acts on; the whole input must agree.
    let decided = (1..=data.len().min(MAX_REQUEST_LINE - 1)).find_map(|k| classify(&data[..k]).map(|p| (k, p)));
    if let Some((k, p)) = decided {
        assert_eq!(full, Some(p), "decided {p:?} after {k} bytes, but {full:?} on all {} bytes", data.len());
    }
});
