//! CSR validation (control/src/identity/csr.rs): the bytes of a Certify call, from any pod that
//! reaches the identity port. Never a panic; accepted CSRs name exactly the identity asked for,
//! self-signed by a key we issue for; DER and its PEM wrapping get the same verdict.
#![no_main]

use std::sync::OnceLock;

use cnimesh_model::identity::csr::{CsrError, validate};
use cnimesh_identity::Name;
use libfuzzer_sys::fuzz_target;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

fn name() -> &'static Name {
    static NAME: OnceLock<Name> = OnceLock::new();
    NAME.get_or_init(|| Name::for_service_account("web", "shop", "cluster.local").unwrap())
}

fuzz_target!(|data: &[u8]| {
    let verdict = validate(data, name());
    if !data.starts_with(b"-----BEGIN") && !data.is_empty() && data.len() <= 6 * 1024 {
        let pem = rustls_pem(data);
        let wrapped = validate(pem.as_bytes(), name());
        assert_eq!(wrapped.is_ok(), verdict.is_ok(), "DER {verdict:?} vs PEM {wrapped:?}");
    }
    let Ok(_valid) = verdict else {
        if let Err(CsrError::TooLarge(n)) = verdict {
            assert_eq!(n, data.len());
        }
        return;
    };
    let der = if data.starts_with(b"-----BEGIN") { return } else { data };
    let (_, csr) = X509CertificationRequest::from_der(der).expect("an accepted CSR parses");
    csr.verify_signature().expect("an accepted CSR is self-signed");
    let mut dns = Vec::new();
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for n in &san.general_names {
                match n {
                    GeneralName::DNSName(d) => dns.push(d.to_string()),
                    other => panic!("an accepted CSR has a non-DNS SAN {other:?}"),
                }
            }
        }
    }
    assert_eq!(dns, [name().as_str()]);
});

/// `data` as a PEM `CERTIFICATE REQUEST`, base64 by hand so the check does not trust the
/// decoder under test.
fn rustls_pem(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::new();
    for chunk in data.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let lines: Vec<&str> = b64.as_bytes().chunks(64).map(|l| std::str::from_utf8(l).unwrap()).collect();
    format!("-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n", lines.join("\n"))
}
