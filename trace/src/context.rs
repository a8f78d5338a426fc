//! Trace context on the wire: W3C Trace Context (`traceparent`, `tracestate`) and B3 (the single
//! `b3` header and the multi `X-B3-*` headers), read from and written to an [`http::HeaderMap`].
//!
//! Reading never fails: a value that does not follow its specification is treated as absent
//! (and so is the whole format when any of its required parts is bad), because a malformed
//! header from an app must neither break its request nor start a trace it did not ask for. When
//! both formats are present and valid, W3C wins (it is the newer standard and the one the proxy
//! writes).
//!
//! Writing ([`inject`]) always writes `traceparent` and, when the request came with B3, B3 too in
//! the form it came in (single or multi), with the same ids: an app that speaks only B3 keeps
//! working, and a W3C-aware hop downstream sees the same trace. `tracestate` is never written: the
//! proxy does not add entries of its own, so the received header is forwarded untouched.

use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue};

/// `traceparent` (W3C Trace Context, level 1).
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate` (W3C Trace Context): vendor entries, forwarded as received.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
/// B3 single header: `{trace}-{span}[-{sampled}[-{parent}]]` or a bare sampling decision.
pub const B3: HeaderName = HeaderName::from_static("b3");
/// B3 multi headers.
pub const X_B3_TRACE_ID: HeaderName = HeaderName::from_static("x-b3-traceid");
/// B3 multi: the caller's span id.
pub const X_B3_SPAN_ID: HeaderName = HeaderName::from_static("x-b3-spanid");
/// B3 multi: the caller's parent span id (informational; rewritten on forward).
pub const X_B3_PARENT_SPAN_ID: HeaderName = HeaderName::from_static("x-b3-parentspanid");
/// B3 multi: `1` sampled, `0` not (legacy `true`/`false` accepted).
pub const X_B3_SAMPLED: HeaderName = HeaderName::from_static("x-b3-sampled");
/// B3 multi: `1` = debug, which implies sampled.
pub const X_B3_FLAGS: HeaderName = HeaderName::from_static("x-b3-flags");

/// A 16-byte trace id; never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte span id; never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    /// A new random trace id (thread-local CSPRNG; never all zeros).
    pub fn random() -> Self {
        loop {
            let id: [u8; 16] = rand::random();
            if id != [0; 16] {
                return Self(id);
            }
        }
    }

    /// Lowercase hex, 32 characters.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl SpanId {
    /// A new random span id (thread-local CSPRNG; never all zeros).
    pub fn random() -> Self {
        loop {
            let id: [u8; 8] = rand::random();
            if id != [0; 8] {
                return Self(id);
            }
        }
    }

    /// Lowercase hex, 16 characters.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpanId({self})")
    }
}

/// The identity of one span as it travels between processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The sampled flag: spans are recorded only for sampled traces.
    pub sampled: bool,
}

/// Which B3 form a request used, so that the forwarded request uses the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum B3Form {
    Single,
    Multi,
}

/// What a request's headers say about tracing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Incoming {
    /// No usable trace context (none, or only malformed ones).
    None,
    /// A sampling decision without ids (B3 `b3: 0|1|d`, or `X-B3-Sampled` alone): `true`
    /// asks for a trace to be started, `false` forbids one.
    Decision(bool),
    /// A remote parent. `b3` is set when the context was read from B3 (W3C absent or invalid);
    /// `tracestate` is the W3C vendor state to carry (only with a W3C parent).
    Parent { context: SpanContext, b3: Option<B3Form>, tracestate: Option<String> },
}

impl Incoming {
    /// The remote parent, if any.
    pub fn parent(&self) -> Option<&SpanContext> {
        match self {
            Incoming::Parent { context, .. } => Some(context),
            _ => None,
        }
    }
}

/// Reads the trace context of a request. Cheap when there is none: a handful of header lookups.
pub fn extract(headers: &HeaderMap) -> Incoming {
    if let Some(context) = single(headers, &TRACEPARENT).and_then(parse_traceparent) {
        let tracestate = tracestate(headers);
        // A request with both formats: W3C is authoritative, but B3 is rewritten too so the two
        // never disagree downstream.
        let b3 = if headers.contains_key(&B3) {
            Some(B3Form::Single)
        } else if headers.contains_key(&X_B3_TRACE_ID) {
            Some(B3Form::Multi)
        } else {
            None
        };
        return Incoming::Parent { context, b3, tracestate };
    }
    if let Some(value) = single(headers, &B3) {
        return match parse_b3_single(value) {
            Some(B3Single::Context(context)) => {
                Incoming::Parent { context, b3: Some(B3Form::Single), tracestate: None }
            }
            Some(B3Single::Decision(sampled)) => Incoming::Decision(sampled),
            None => Incoming::None,
        };
    }
    match parse_b3_multi(headers) {
        Some(B3Single::Context(context)) => Incoming::Parent { context, b3: Some(B3Form::Multi), tracestate: None },
        Some(B3Single::Decision(sampled)) => Incoming::Decision(sampled),
        None => Incoming::None,
    }
}

/// Writes `context` as the parent for the next hop: `traceparent` always, B3 in `b3`'s form
/// when the request came with B3 (its other form removed, and `X-B3-ParentSpanId` dropped: the
/// B3 spec makes it optional, and the old value would be wrong). `tracestate` is left as it is.
pub fn inject(headers: &mut HeaderMap, context: &SpanContext, b3: Option<B3Form>) {
    headers.insert(TRACEPARENT, header(format_traceparent(context)));
    match b3 {
        None => {}
        Some(B3Form::Single) => {
            for name in [X_B3_TRACE_ID, X_B3_SPAN_ID, X_B3_PARENT_SPAN_ID, X_B3_SAMPLED, X_B3_FLAGS] {
                headers.remove(name);
            }
            headers.insert(B3, header(format_b3_single(context)));
        }
        Some(B3Form::Multi) => {
            headers.remove(B3);
            headers.remove(X_B3_PARENT_SPAN_ID);
            headers.remove(X_B3_FLAGS);
            headers.insert(X_B3_TRACE_ID, header(b3_trace_id_hex(&context.trace_id)));
            headers.insert(X_B3_SPAN_ID, header(context.span_id.to_hex()));
            headers.insert(X_B3_SAMPLED, HeaderValue::from_static(if context.sampled { "1" } else { "0" }));
        }
    }
}

/// Every header of the formats above: what a caller can say about tracing in any of them.
pub const TRACE_HEADERS: [HeaderName; 8] =
    [TRACEPARENT, TRACESTATE, B3, X_B3_TRACE_ID, X_B3_SPAN_ID, X_B3_PARENT_SPAN_ID, X_B3_SAMPLED, X_B3_FLAGS];

/// Removes every trace header (every occurrence of each of [`TRACE_HEADERS`]), valid or not;
/// true if there was any. What an untrusted caller's request is cleaned with: a header the
/// proxy does not read (a repeated one, a value only other tracers accept, a second format
/// next to the one read) would otherwise reach the app, whose tracer may continue the trace as
/// sampled on it. A request without trace headers costs one lookup per name and is not touched.
pub fn strip(headers: &mut HeaderMap) -> bool {
    if !TRACE_HEADERS.iter().any(|name| headers.contains_key(name)) {
        return false;
    }
    for name in TRACE_HEADERS {
        headers.remove(name);
    }
    true
}

/// `traceparent` for `context`: version 00, sampled flag only.
pub fn format_traceparent(context: &SpanContext) -> String {
    format!("00-{}-{}-{}", context.trace_id, context.span_id, if context.sampled { "01" } else { "00" })
}

/// The single `b3` header for `context` (no parent field).
pub fn format_b3_single(context: &SpanContext) -> String {
    format!("{}-{}-{}", b3_trace_id_hex(&context.trace_id), context.span_id, if context.sampled { "1" } else { "0" })
}

/// A trace id as B3 writes it: 16 hex digits when its upper half is zero (a 64-bit id, widened
/// when read), else 32. A tracer that speaks 64-bit ids gets back the id it sent, as Zipkin's
/// own libraries write it, and not one it may not match to its trace.
fn b3_trace_id_hex(id: &TraceId) -> String {
    if id.0[..8] == [0; 8] { hex(&id.0[8..]) } else { id.to_hex() }
}

/// Parses a `traceparent` value per W3C Trace Context level 1: lowercase hex only; version
/// `ff` invalid; version `00` exactly 55 characters; a later version at least that long, with
/// anything after the flags separated by `-` (and ignored); all-zero trace or span ids invalid.
pub fn parse_traceparent(value: &[u8]) -> Option<SpanContext> {
    if value.len() < 55 {
        return None;
    }
    let version = hex_byte(&value[0..2])?;
    if version == 0xff || (version == 0 && value.len() != 55) || (version != 0 && value.len() > 55 && value[55] != b'-')
    {
        return None;
    }
    if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let trace_id = TraceId(hex_array(&value[3..35])?);
    let span_id = SpanId(hex_array(&value[36..52])?);
    let flags = hex_byte(&value[53..55])?;
    if trace_id.0 == [0; 16] || span_id.0 == [0; 8] {
        return None;
    }
    Some(SpanContext { trace_id, span_id, sampled: flags & 1 == 1 })
}

/// What a single `b3` header carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum B3Single {
    Context(SpanContext),
    Decision(bool),
}

/// Parses a single `b3` header: `{trace}-{span}`, optionally `-{0|1|d}` and `-{parent}`, or a
/// bare `0`, `1` or `d`. Trace ids of 16 hex characters (64-bit) are widened with leading zeros,
/// as the B3 spec says; hex must be lowercase. Without a sampling field the context counts as
/// sampled: the caller recorded its span, so it defers to us, and we trace.
pub fn parse_b3_single(value: &[u8]) -> Option<B3Single> {
    if let Some(decision) = b3_sampled(value) {
        return Some(B3Single::Decision(decision));
    }
    let mut fields = value.split(|&b| b == b'-');
    let trace_id = b3_trace_id(fields.next()?)?;
    let span_id = span_id(fields.next()?)?;
    let sampled = match fields.next() {
        None => true,
        Some(s) => b3_sampled(s)?,
    };
    if let Some(parent) = fields.next() {
        span_id_any(parent)?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(B3Single::Context(SpanContext { trace_id, span_id, sampled }))
}

/// Parses the multi B3 headers: `X-B3-TraceId` and `X-B3-SpanId` both valid, or neither (then
/// `X-B3-Sampled`/`X-B3-Flags` alone are a decision). `X-B3-Flags: 1` (debug) means sampled.
pub fn parse_b3_multi(headers: &HeaderMap) -> Option<B3Single> {
    let flags_debug = match single(headers, &X_B3_FLAGS) {
        None => false,
        Some(b"1") => true,
        Some(b"0") => false,
        Some(_) => return None,
    };
    let sampled = match single(headers, &X_B3_SAMPLED) {
        None => None,
        Some(b"1" | b"true") => Some(true),
        Some(b"0" | b"false") => Some(false),
        Some(_) => return None,
    };
    let sampled = if flags_debug { Some(true) } else { sampled };
    match (single(headers, &X_B3_TRACE_ID), single(headers, &X_B3_SPAN_ID)) {
        (None, None) => sampled.map(B3Single::Decision),
        (Some(trace), Some(span)) => {
            let trace_id = b3_trace_id(trace)?;
            let span_id = span_id(span)?;
            if let Some(parent) = single(headers, &X_B3_PARENT_SPAN_ID) {
                span_id_any(parent)?;
            }
            Some(B3Single::Context(SpanContext { trace_id, span_id, sampled: sampled.unwrap_or(true) }))
        }
        _ => None,
    }
}

fn b3_sampled(value: &[u8]) -> Option<bool> {
    match value {
        b"1" | b"d" => Some(true),
        b"0" => Some(false),
        _ => None,
    }
}

fn b3_trace_id(value: &[u8]) -> Option<TraceId> {
    let id = match value.len() {
        32 => hex_array::<16>(value)?,
        16 => {
            let low: [u8; 8] = hex_array(value)?;
            let mut id = [0; 16];
            id[8..].copy_from_slice(&low);
            id
        }
        _ => return None,
    };
    (id != [0; 16]).then_some(TraceId(id))
}

fn span_id(value: &[u8]) -> Option<SpanId> {
    span_id_any(value).filter(|id| id.0 != [0; 8])
}

fn span_id_any(value: &[u8]) -> Option<SpanId> {
    (value.len() == 16).then(|| hex_array(value).map(SpanId))?
}

/// The value of `name` when it occurs exactly once (a repeated `traceparent` is ambiguous, so
/// it is invalid, as W3C allows).
fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a [u8]> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    values.next().is_none().then(|| first.as_bytes())
}

/// All `tracestate` values joined by `,` (W3C: multiple headers are one list), if they are
/// visible ASCII and within the 512 characters every vendor must carry; otherwise dropped.
fn tracestate(headers: &HeaderMap) -> Option<String> {
    let mut joined = String::new();
    for value in headers.get_all(&TRACESTATE) {
        let text = value.to_str().ok()?;
        if !joined.is_empty() {
            joined.push(',');
        }
        joined.push_str(text);
    }
    (!joined.is_empty() && joined.len() <= 512).then_some(joined)
}

fn header(text: String) -> HeaderValue {
    HeaderValue::try_from(text).expect("hex and dashes are a valid header value")
}

fn hex_nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    Some(hex_nibble(two[0])? << 4 | hex_nibble(two[1])?)
}

fn hex_array<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = hex_byte(&text[2 * i..2 * i + 2])?;
    }
    Some(out)
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    #[test]
    fn strip_removes_every_occurrence_of_every_trace_header_whatever_it_says() {
        let keep = ("x-request-id", "r1");
        for pairs in [
            vec![("traceparent", format!("00-{TRACE}-{SPAN}-00")), ("x-b3-sampled", "1".into())],
            vec![("traceparent", format!("00-{TRACE}-{SPAN}-00")), ("x-b3-flags", "1".into())],
            vec![("traceparent", format!("00-{TRACE}-{SPAN}-01")), ("x-b3-sampled", "1".into())],
            vec![("traceparent", format!("00-{TRACE}-{SPAN}-01")), ("traceparent", format!("00-{TRACE}-{SPAN}-01"))],
            vec![("x-b3-traceid", TRACE.into()), ("x-b3-spanid", SPAN.into()), ("x-b3-sampled", "TRUE".into())],
            vec![("b3", format!("{TRACE}-{SPAN}-d")), ("tracestate", "a=1".into()), ("tracestate", "b=2".into())],
            vec![("x-b3-parentspanid", SPAN.into()), ("b3", "garbage".into())],
        ] {
            let mut map = headers(&pairs.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>());
            map.append(keep.0, HeaderValue::from_static(keep.1));
            assert!(strip(&mut map), "{pairs:?}");
            assert_eq!(map.len(), 1, "only the other header is left: {map:?}");
            assert_eq!(map[keep.0], keep.1);
            assert_eq!(extract(&map), Incoming::None);
        }
        let mut none = headers(&[keep]);
        assert!(!strip(&mut none));
        assert_eq!(none.len(), 1);
    }

    fn tp(s: &str) -> Option<SpanContext> {
        parse_traceparent(s.as_bytes())
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        map
    }

    #[test]
    fn the_w3c_example_traceparent_parses_and_formats_back_to_itself() {
        let text = format!("00-{TRACE}-{SPAN}-01");
        let ctx = tp(&text).unwrap();
        assert_eq!(ctx.trace_id.to_hex(), TRACE);
        assert_eq!(ctx.span_id.to_hex(), SPAN);
        assert!(ctx.sampled);
        assert_eq!(format_traceparent(&ctx), text);
        assert!(!tp(&format!("00-{TRACE}-{SPAN}-00")).unwrap().sampled);
        // Other flag bits are ignored, the sampled bit is read.
        assert!(tp(&format!("00-{TRACE}-{SPAN}-03")).unwrap().sampled);
    }

    #[test]
    fn all_zero_ids_version_ff_uppercase_and_bad_lengths_are_invalid() {
        assert_eq!(tp(&format!("00-{}-{SPAN}-01", "0".repeat(32))), None);
        assert_eq!(tp(&format!("00-{TRACE}-{}-01", "0".repeat(16))), None);
        assert_eq!(tp(&format!("ff-{TRACE}-{SPAN}-01")), None);
        assert_eq!(tp(&format!("00-{}-{SPAN}-01", TRACE.to_uppercase())), None);
        assert_eq!(tp(&format!("00-{TRACE}-{}-01", SPAN.to_uppercase())), None);
        assert_eq!(tp(&format!("0A-{TRACE}-{SPAN}-01")), None);
        assert_eq!(tp(&format!("00-{TRACE}-{SPAN}-0G")), None);
        assert_eq!(tp(&format!("00-{TRACE}-{SPAN}-01-extra")), None, "version 00 has exactly four fields");
        assert_eq!(tp(&format!("00-{TRACE}-{SPAN}")), None);
        assert_eq!(tp(&format!("00-{TRACE}x{SPAN}-01")), None);
        assert_eq!(tp(&format!("00-{}-{SPAN}-01", &TRACE[..30])), None);
        assert_eq!(tp(""), None);
        assert_eq!(tp("00-"), None);
    }

    #[test]
    fn a_future_version_with_extra_fields_is_read_as_version_00() {
        let ctx = tp(&format!("cc-{TRACE}-{SPAN}-01-what-the-future-holds")).unwrap();
        assert_eq!(ctx.trace_id.to_hex(), TRACE);
        assert!(tp(&format!("cc-{TRACE}-{SPAN}-01")).is_some());
        // …but the extra part must start with a dash.
        assert_eq!(tp(&format!("cc-{TRACE}-{SPAN}-01x")), None);
    }

    #[test]
    fn a_repeated_traceparent_is_ignored_and_tracestate_headers_are_joined() {
        let good = format!("00-{TRACE}-{SPAN}-01");
        assert_eq!(extract(&headers(&[("traceparent", &good), ("traceparent", &good)])), Incoming::None);
        let incoming = extract(&headers(&[("traceparent", &good), ("tracestate", "a=1"), ("tracestate", "b=2")]));
        let Incoming::Parent { tracestate, b3, .. } = incoming else { panic!("{incoming:?}") };
        assert_eq!(tracestate.as_deref(), Some("a=1,b=2"));
        assert_eq!(b3, None);
        let long = "k=".to_string() + &"v".repeat(600);
        let Incoming::Parent { tracestate, .. } = extract(&headers(&[("traceparent", &good), ("tracestate", &long)]))
        else {
            panic!()
        };
        assert_eq!(tracestate, None, "an oversized tracestate is dropped, the parent kept");
    }

    #[test]
    fn b3_single_reads_ids_sampling_parent_and_64_bit_trace_ids() {
        let ctx = |s: &str| match parse_b3_single(s.as_bytes()) {
            Some(B3Single::Context(c)) => Some(c),
            _ => None,
        };
        let c = ctx(&format!("{TRACE}-{SPAN}-1-{SPAN}")).unwrap();
        assert_eq!((c.trace_id.to_hex().as_str(), c.sampled), (TRACE, true));
        assert!(!ctx(&format!("{TRACE}-{SPAN}-0")).unwrap().sampled);
        assert!(ctx(&format!("{TRACE}-{SPAN}-d")).unwrap().sampled);
        assert!(ctx(&format!("{TRACE}-{SPAN}")).unwrap().sampled, "deferred: we decide, and trace");
        let short = ctx(&format!("a3ce929d0e0e4736-{SPAN}-1")).unwrap();
        assert_eq!(short.trace_id.to_hex(), "0000000000000000a3ce929d0e0e4736");
        assert_eq!(parse_b3_single(b"0"), Some(B3Single::Decision(false)));
        assert_eq!(parse_b3_single(b"1"), Some(B3Single::Decision(true)));
        assert_eq!(parse_b3_single(b"d"), Some(B3Single::Decision(true)));
        for bad in [
            format!("{}-{SPAN}-1", TRACE.to_uppercase()),
            format!("{TRACE}-{SPAN}-2"),
            format!("{TRACE}-{SPAN}-1-{SPAN}-more"),
            format!("{TRACE}-{}-1", "0".repeat(16)),
            format!("{}-{SPAN}-1", "0".repeat(32)),
            TRACE.to_string(),
            format!("{TRACE}-{SPAN}-1-xyz"),
            String::new(),
            "-".into(),
        ] {
            assert_eq!(parse_b3_single(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn b3_multi_needs_both_ids_and_debug_means_sampled() {
        let m = |pairs: &[(&str, &str)]| parse_b3_multi(&headers(pairs));
        let Some(B3Single::Context(c)) = m(&[("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN), ("x-b3-sampled", "0")])
        else {
            panic!()
        };
        assert!(!c.sampled);
        let Some(B3Single::Context(c)) =
            m(&[("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN), ("x-b3-sampled", "0"), ("x-b3-flags", "1")])
        else {
            panic!()
        };
        assert!(c.sampled);
        assert_eq!(m(&[("x-b3-traceid", TRACE)]), None);
        assert_eq!(m(&[("x-b3-sampled", "1")]), Some(B3Single::Decision(true)));
        assert_eq!(m(&[("x-b3-sampled", "yes")]), None);
        assert_eq!(m(&[]), None);
        assert_eq!(m(&[("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN), ("x-b3-parentspanid", "zz")]), None);
    }

    #[test]
    fn w3c_wins_over_b3_and_an_invalid_w3c_falls_back_to_b3() {
        let other = "11111111111111111111111111111111";
        let both = headers(&[("traceparent", &format!("00-{TRACE}-{SPAN}-01")), ("b3", &format!("{other}-{SPAN}-1"))]);
        let Incoming::Parent { context, b3, .. } = extract(&both) else { panic!() };
        assert_eq!((context.trace_id.to_hex().as_str(), b3), (TRACE, Some(B3Form::Single)));
        let bad_w3c = headers(&[("traceparent", "garbage"), ("b3", &format!("{other}-{SPAN}-1"))]);
        let Incoming::Parent { context, .. } = extract(&bad_w3c) else { panic!() };
        assert_eq!(context.trace_id.to_hex(), other);
        assert_eq!(extract(&headers(&[("traceparent", "garbage")])), Incoming::None);
        assert_eq!(extract(&headers(&[("b3", "0")])), Incoming::Decision(false));
    }

    #[test]
    fn inject_writes_w3c_and_b3_in_the_received_form_with_the_same_ids() {
        let ctx = SpanContext { trace_id: TraceId::random(), span_id: SpanId::random(), sampled: true };
        let mut single =
            headers(&[("b3", &format!("{TRACE}-{SPAN}-1")), ("tracestate", "a=1"), ("x-b3-parentspanid", SPAN)]);
        inject(&mut single, &ctx, Some(B3Form::Single));
        assert_eq!(single[TRACEPARENT], format_traceparent(&ctx));
        assert_eq!(single[B3], format_b3_single(&ctx));
        assert_eq!(single[TRACESTATE], "a=1");
        assert!(!single.contains_key(X_B3_PARENT_SPAN_ID));
        assert_eq!(extract(&single).parent(), Some(&ctx));

        let mut multi = headers(&[("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN), ("x-b3-parentspanid", SPAN)]);
        inject(&mut multi, &ctx, Some(B3Form::Multi));
        assert_eq!(multi[X_B3_TRACE_ID], ctx.trace_id.to_hex());
        assert_eq!(multi[X_B3_SPAN_ID], ctx.span_id.to_hex());
        assert_eq!(multi[X_B3_SAMPLED], "1");
        assert!(!multi.contains_key(X_B3_PARENT_SPAN_ID));
        assert!(!multi.contains_key(B3));
        assert_eq!(parse_b3_multi(&multi), Some(B3Single::Context(ctx)));

        let mut plain = HeaderMap::new();
        inject(&mut plain, &ctx, None);
        assert_eq!(plain.len(), 1);
    }

    #[test]
    fn a_64_bit_b3_trace_id_is_forwarded_as_16_hex_digits_in_its_form_and_widened_only_in_traceparent() {
        const SHORT: &str = "a3ce929d0e0e4736";
        let mut multi = headers(&[("x-b3-traceid", SHORT), ("x-b3-spanid", SPAN), ("x-b3-sampled", "1")]);
        let Incoming::Parent { context, b3, .. } = extract(&multi) else { panic!("a B3 parent") };
        let next = SpanContext { span_id: SpanId::random(), ..context };
        inject(&mut multi, &next, b3);
        assert_eq!(multi[X_B3_TRACE_ID], SHORT);
        assert_eq!(multi[X_B3_SPAN_ID], next.span_id.to_hex());
        assert_eq!(multi[TRACEPARENT], format!("00-0000000000000000{SHORT}-{}-01", next.span_id));
        assert_eq!(parse_b3_multi(&multi), Some(B3Single::Context(next)), "the same trace when read back");

        let mut single = headers(&[("b3", &format!("{SHORT}-{SPAN}-1"))]);
        let Incoming::Parent { context, b3, .. } = extract(&single) else { panic!("a B3 parent") };
        inject(&mut single, &context, b3);
        assert_eq!(single[B3], format!("{SHORT}-{SPAN}-1"));

        let mut long = headers(&[("b3", &format!("{TRACE}-{SPAN}-1"))]);
        let Incoming::Parent { context, b3, .. } = extract(&long) else { panic!("a B3 parent") };
        inject(&mut long, &context, b3);
        assert_eq!(long[B3], format!("{TRACE}-{SPAN}-1"), "a 128-bit id stays 32 digits");
    }

    #[test]
    fn random_ids_are_never_zero_and_hex_is_lowercase() {
        let id = TraceId::random();
        assert_ne!(id.0, [0; 16]);
        assert_eq!(hex(&[0xab, 0x01]), "ab01");
        assert_eq!(format!("{:?}", SpanId([0xff; 8])), "SpanId(ffffffffffffffff)");
    }
}
