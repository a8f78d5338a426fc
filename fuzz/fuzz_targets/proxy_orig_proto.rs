//! The inbound's `l5d-orig-proto` downgrade, on headers a peer proxy (or anyone speaking HTTP/2
//! to the inbound) sends. Input: the first line is the URI, the rest `name: value` header lines.
//! Downgraded requests are HTTP/1.x without the marker and with `Host` = `:authority`; refused
//! ones are 400s; requests without the marker are untouched.
#![no_main]

use cnimesh_proxy::http::orig_proto::{L5D_ORIG_PROTO, downgrade_request};
use http::{HeaderName, HeaderValue, Request, StatusCode, Uri, Version};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let mut lines = rest.split(|b| *b == b'\n');
    let Ok(uri) = Uri::try_from(lines.next().unwrap_or_default()) else { return };
    let mut req = Request::new(());
    *req.uri_mut() = uri;
    *req.version_mut() = [Version::HTTP_2, Version::HTTP_11, Version::HTTP_10][flags as usize % 3];
    for line in lines {
        let Some(colon) = line.iter().position(|b| *b == b':') else { continue };
        let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(&line[..colon]), HeaderValue::from_bytes(line[colon + 1..].trim_ascii()))
        else {
            continue;
        };
        req.headers_mut().append(name, value);
    }
    let before = format!("{req:?}");
    let marked = req.version() == Version::HTTP_2 && req.headers().contains_key(&L5D_ORIG_PROTO);
    let authority = req.uri().authority().map(|a| a.as_str().to_owned());
    match downgrade_request(&mut req).map_err(|e| e.status) {
        Ok(true) => {
            assert!(marked);
            assert!(matches!(req.version(), Version::HTTP_11 | Version::HTTP_10));
            assert!(!req.headers().contains_key(&L5D_ORIG_PROTO));
            // The authority the peer sent becomes the app's `Host`.
            if let Some(authority) = authority {
                assert_eq!(req.headers().get_all(http::header::HOST).iter().collect::<Vec<_>>(), [authority.as_str()]);
            }
        }
        Ok(false) => {
            assert!(!marked);
            assert_eq!(format!("{req:?}"), before, "an unmarked request was changed");
        }
        Err(status) => {
            assert!(marked);
            assert_eq!(status, StatusCode::BAD_REQUEST);
        }
    }
});
