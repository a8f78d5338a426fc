//! The inbound's ClientHello peeker, on bytes from anyone who can connect. Never a panic; "need
//! more" always asks for more than it has; a verdict never changes as more bytes arrive; the SNI
//! comes from the input; and wherever rustls itself reads a server name, the peeker reads the
//! same one (or a meshed client would be refused mTLS).
#![no_main]

use cnimesh_proxy::transport::tls::client_hello::{Peek, peek};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let verdict = peek(data);
    match &verdict {
        Peek::NeedMore(n) => assert!(*n > data.len(), "asks for {n} with {} bytes", data.len()),
        Peek::ClientHello(Some(sni)) => {
            assert!(sni.len() <= data.len());
            assert_eq!(*sni, sni.to_ascii_lowercase());
            let lower = data.to_ascii_lowercase();
            assert!(lower.windows(sni.len().max(1)).any(|w| w == sni.as_bytes()) || sni.is_empty());
        }
        _ => {}
    }
    // A verdict reached on a prefix is final.
    for cut in [1, 5, data.len() / 2, data.len().saturating_sub(1)] {
        if cut == 0 || cut >= data.len() {
            continue;
        }
        match peek(&data[..cut]) {
            Peek::NeedMore(_) => {}
            early => assert_eq!(early, verdict, "verdict on {cut} bytes differs from on {}", data.len()),
        }
    }
    let mut acceptor = rustls::server::Acceptor::default();
    let mut input = data;
    while !input.is_empty() {
        match acceptor.read_tls(&mut input) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    if let Ok(Some(accepted)) = acceptor.accept() {
        match accepted.client_hello().server_name() {
            Some(name) => assert_eq!(verdict, Peek::ClientHello(Some(name.to_ascii_lowercase())), "rustls read {name}"),
            // rustls also drops names it does not accept as DNS names (IP literals, say).
            None => assert!(matches!(verdict, Peek::ClientHello(_)), "rustls accepts a ClientHello: {verdict:?}"),
        }
    }
});
