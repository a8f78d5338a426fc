//! `GetDestination.path`, as any proxy (or anything reaching the control port) sends it. A
//! service path reads back from its canonical form as the same service; an address from its own
//! text. Input: a path, or `domain\npath`.
#![no_main]

use cnimesh_model::destination::parse_path_for_fuzzing as parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (domain, path) = text.split_once('\n').unwrap_or(("cluster.local", text));
    match parse(path, domain) {
        Ok(Ok((key, port))) => {
            assert_ne!(port, 0);
            assert!(!key.name.is_empty() && !key.namespace.is_empty(), "{key:?}");
            assert!(!key.namespace.contains('.'), "{key:?}");
            assert_eq!(key.name, key.name.to_ascii_lowercase());
            assert_eq!(key.namespace, key.namespace.to_ascii_lowercase());
            let canonical = format!("{}.{}.svc.{}:{port}", key.name, key.namespace, domain.trim_end_matches('.'));
            assert_eq!(parse(&canonical, domain), Ok(Ok((key.clone(), port))), "{canonical:?}");
        }
        Ok(Err(addr)) => {
            assert_eq!(parse(&addr.to_string(), domain), Ok(Err(addr)));
        }
        Err(message) => assert!(message.contains("path"), "{message}"),
    }
});
