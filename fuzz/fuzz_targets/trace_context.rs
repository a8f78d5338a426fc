//! The proxy's trace context parsers (cnimesh-trace's `context`), on headers any app or peer
//! sends: W3C `traceparent`/`tracestate`, B3 single and multi. Input: `name: value` header lines.
//! Invariants: nothing panics; whatever is accepted has non-zero ids and survives being written
//! and read back (W3C and B3 alike, in the form it came in); a W3C value that is accepted as
//! version 00 with flags 00/01 is written back byte for byte; the sampler never records under an
//! unsampled parent; an untrusted caller's request keeps no trace header.
#![no_main]

use cnimesh_trace::context::{
    B3Single, Incoming, TRACE_HEADERS, extract, format_b3_single, format_traceparent, inject, parse_b3_single, parse_traceparent,
};
use cnimesh_trace::{Caller, Decision, Parent, Sampler};
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for line in data.split(|b| *b == b'\n') {
        // Each raw value goes through the single-value parsers too, header or not.
        if let Some(ctx) = parse_traceparent(line) {
            assert_ne!(ctx.trace_id.0, [0; 16]);
            assert_ne!(ctx.span_id.0, [0; 8]);
            let written = format_traceparent(&ctx);
            assert_eq!(parse_traceparent(written.as_bytes()), Some(ctx), "{written}");
            if line.starts_with(b"00-") && (line.ends_with(b"-00") || line.ends_with(b"-01")) {
                assert_eq!(written.as_bytes(), line);
            }
        }
        if let Some(B3Single::Context(ctx)) = parse_b3_single(line) {
            assert_ne!(ctx.trace_id.0, [0; 16]);
            let written = format_b3_single(&ctx);
            assert_eq!(parse_b3_single(written.as_bytes()), Some(B3Single::Context(ctx)), "{written}");
        }
        let Some(colon) = line.iter().position(|b| *b == b':') else { continue };
        let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(&line[..colon]), HeaderValue::from_bytes(line[colon + 1..].trim_ascii()))
        else {
            continue;
        };
        headers.append(name, value);
    }
    let incoming = extract(&headers);
    if let Incoming::Parent { context, b3, tracestate } = &incoming {
        assert_ne!(context.trace_id.0, [0; 16]);
        assert_ne!(context.span_id.0, [0; 8]);
        assert!(tracestate.as_ref().is_none_or(|t| t.len() <= 512));
        // Forwarded under the same context, the next hop reads the same context and B3 form.
        let mut forwarded = headers.clone();
        inject(&mut forwarded, context, *b3);
        match extract(&forwarded) {
            Incoming::Parent { context: again, b3: b3_again, .. } => {
                assert_eq!(again, *context);
                assert_eq!(b3_again, *b3);
            }
            other => panic!("{other:?} after forwarding {context:?}"),
        }
    }
    let sampled_parent = incoming.parent().map(|p| p.sampled);
    let refused = incoming == Incoming::Decision(false);
    match Sampler::new(1.0).decide(incoming) {
        Decision::Record { parent: Parent::Remote(ctx, _), .. } => assert!(ctx.sampled),
        Decision::Record { parent: Parent::Root, .. } => assert_eq!(sampled_parent, None),
        // At ratio 1 only an unsampled parent or a B3 "do not sample" skips.
        Decision::Skip => assert!(sampled_parent == Some(false) || refused),
    }
    // An untrusted caller's request keeps no trace header, whatever it sent.
    let mut untrusted = headers.clone();
    Sampler::new(0.0).decide_for(&mut untrusted, Caller::Untrusted);
    assert!(TRACE_HEADERS.iter().all(|name| !untrusted.contains_key(name)), "{untrusted:?}");
});
