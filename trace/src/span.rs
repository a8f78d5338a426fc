//! The span model: a small, owned record of one operation (ids, parent, name, kind, times,
//! attributes, events, status) that the exporter turns into OTLP's
//! `opentelemetry.proto.trace.v1.Span` ([`Span::to_proto`]), and the sampling decision
//! ([`Sampler`]) that says whether a request gets spans at all.
//!
//! A span is only ever built for a sampled trace: an unsampled request costs no allocation.

use std::borrow::Cow;
use std::time::{SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1 as proto;

use crate::context::{self, B3Form, Incoming, SpanContext, SpanId, TraceId};

/// OTLP span kinds we emit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    Internal,
    Server,
    Client,
}

/// An attribute or event value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(Cow<'static, str>),
    Int(i64),
    Bool(bool),
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Self {
        Value::Str(Cow::Borrowed(s))
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(Cow::Owned(s))
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}

impl From<u16> for Value {
    fn from(i: u16) -> Self {
        Value::Int(i64::from(i))
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

/// Attribute keys are mostly the semantic conventions' constants, hence `Cow`.
pub type Attributes = Vec<(Cow<'static, str>, Value)>;

/// Something that happened during a span (a retry, a timeout).
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub name: Cow<'static, str>,
    pub time: SystemTime,
    pub attributes: Attributes,
}

/// OTLP status: unset unless the operation is known to have failed (or succeeded explicitly).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Status {
    #[default]
    Unset,
    Ok,
    Error(String),
}

/// One span, owned, until it is handed to the exporter.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent: Option<SpanId>,
    /// W3C `tracestate` of the trace, as received (empty: none).
    pub trace_state: String,
    pub name: Cow<'static, str>,
    pub kind: SpanKind,
    pub start: SystemTime,
    /// `None` until [`Span::end`]; exported spans without one end when they are converted.
    pub end: Option<SystemTime>,
    pub attributes: Attributes,
    pub events: Vec<Event>,
    pub status: Status,
}

/// Where a new span hangs.
#[derive(Clone, Debug, PartialEq)]
pub enum Parent {
    /// A new trace: a fresh trace id, no parent span.
    Root,
    /// A parent in another process (the incoming request's context) and its `tracestate`.
    Remote(SpanContext, Option<String>),
}

impl Span {
    /// Starts a span now under `parent`, with a new span id.
    pub fn start(name: impl Into<Cow<'static, str>>, kind: SpanKind, parent: Parent) -> Span {
        let (trace_id, parent, trace_state) = match parent {
            Parent::Root => (TraceId::random(), None, String::new()),
            Parent::Remote(ctx, state) => (ctx.trace_id, Some(ctx.span_id), state.unwrap_or_default()),
        };
        Span {
            trace_id,
            span_id: SpanId::random(),
            parent,
            trace_state,
            name: name.into(),
            kind,
            start: SystemTime::now(),
            end: None,
            attributes: Vec::new(),
            events: Vec::new(),
            status: Status::Unset,
        }
    }

    /// A child of this span, in the same trace, starting now.
    pub fn child(&self, name: impl Into<Cow<'static, str>>, kind: SpanKind) -> Span {
        let mut child = Span::start(name, kind, Parent::Remote(self.context(), None));
        child.trace_state.clone_from(&self.trace_state);
        child
    }

    /// This span's context, to propagate to the next hop (always sampled: unsampled requests
    /// have no span).
    pub fn context(&self) -> SpanContext {
        SpanContext { trace_id: self.trace_id, span_id: self.span_id, sampled: true }
    }

    /// Sets (appends) an attribute.
    pub fn set(&mut self, key: impl Into<Cow<'static, str>>, value: impl Into<Value>) {
        self.attributes.push((key.into(), value.into()));
    }

    /// Records an event now.
    pub fn event(&mut self, name: impl Into<Cow<'static, str>>, attributes: Attributes) {
        self.events.push(Event { name: name.into(), time: SystemTime::now(), attributes });
    }

    /// Ends the span now (the first call wins).
    pub fn end(&mut self) {
        if self.end.is_none() {
            self.end = Some(SystemTime::now());
        }
    }

    /// The OTLP message.
    pub fn to_proto(&self) -> proto::Span {
        let end = self.end.unwrap_or_else(SystemTime::now);
        proto::Span {
            trace_id: self.trace_id.0.to_vec(),
            span_id: self.span_id.0.to_vec(),
            trace_state: self.trace_state.clone(),
            parent_span_id: self.parent.map(|p| p.0.to_vec()).unwrap_or_default(),
            // SpanFlags: bit 0x100 "has is_remote", 0x200 "parent is remote" (unknown here: not set).
            flags: 0x01,
            name: self.name.to_string(),
            kind: match self.kind {
                SpanKind::Internal => proto::span::SpanKind::Internal,
                SpanKind::Server => proto::span::SpanKind::Server,
                SpanKind::Client => proto::span::SpanKind::Client,
            } as i32,
            start_time_unix_nano: nanos(self.start),
            end_time_unix_nano: nanos(end),
            attributes: key_values(&self.attributes),
            dropped_attributes_count: 0,
            events: self
                .events
                .iter()
                .map(|e| proto::span::Event {
                    time_unix_nano: nanos(e.time),
                    name: e.name.to_string(),
                    attributes: key_values(&e.attributes),
                    dropped_attributes_count: 0,
                })
                .collect(),
            dropped_events_count: 0,
            links: Vec::new(),
            dropped_links_count: 0,
            status: match &self.status {
                Status::Unset => None,
                Status::Ok => {
                    Some(proto::Status { message: String::new(), code: proto::status::StatusCode::Ok as i32 })
                }
                Status::Error(message) => {
                    Some(proto::Status { message: message.clone(), code: proto::status::StatusCode::Error as i32 })
                }
            },
        }
    }
}

/// OTLP key-values of `attributes`.
pub fn key_values(attributes: &[(Cow<'static, str>, Value)]) -> Vec<KeyValue> {
    attributes
        .iter()
        .map(|(k, v)| KeyValue { key: k.to_string(), value: Some(any_value(v)), key_strindex: 0 })
        .collect()
}

fn any_value(v: &Value) -> AnyValue {
    AnyValue {
        value: Some(match v {
            Value::Str(s) => any_value::Value::StringValue(s.to_string()),
            Value::Int(i) => any_value::Value::IntValue(*i),
            Value::Bool(b) => any_value::Value::BoolValue(*b),
        }),
    }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// The sampling rule of the contract: a request with a parent follows the parent's sampled
/// flag; a B3 sampling decision without ids is obeyed; a request with no context is traced
/// with probability `ratio` (0 by default, so untraced requests stay untraced).
///
/// Only a trusted caller's trace context is followed ([`Sampler::decide_for`]): anyone else
/// could make every request it sends exported, under trace ids of its choosing, here or one hop
/// later at the app's tracer. An untrusted caller's trace headers are all removed, whatever they
/// say, and its request is decided like one without context: picked by the ratio, a new trace
/// of our own; not, no spans and no trace header for the app.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    ratio: f64,
}

/// Whose sampling decision a request carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// One the mesh vouches for (a verified mesh identity, or this pod's own app).
    Trusted,
    /// Anyone else (a plaintext client).
    Untrusted,
}

/// What to do with one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Record spans under this parent; forward B3 in this form too.
    Record { parent: Parent, b3: Option<B3Form> },
    /// No spans, headers forwarded as they are now (unsampled parent, or not picked).
    Skip,
}

impl Sampler {
    /// `ratio` is clamped to 0..=1 (callers validate it and report bad values).
    pub fn new(ratio: f64) -> Sampler {
        Sampler { ratio: if ratio.is_nan() { 0.0 } else { ratio.clamp(0.0, 1.0) } }
    }

    /// The ratio applied to requests without context.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// Decides for a request of a trusted caller whose headers said `incoming`.
    pub fn decide(&self, incoming: Incoming) -> Decision {
        match incoming {
            Incoming::Parent { context, b3, tracestate } if context.sampled => {
                Decision::Record { parent: Parent::Remote(context, tracestate), b3 }
            }
            Incoming::Parent { .. } | Incoming::Decision(false) => Decision::Skip,
            Incoming::Decision(true) => Decision::Record { parent: Parent::Root, b3: Some(B3Form::Single) },
            Incoming::None if self.pick() => Decision::Record { parent: Parent::Root, b3: None },
            Incoming::None => Decision::Skip,
        }
    }

    /// Decides for a request of `caller` with `headers`. An untrusted caller's trace headers
    /// are removed first ([`context::strip`]), so only the ratio decides and nothing it said
    /// about tracing goes on; a trusted caller's are read ([`Sampler::decide`]).
    pub fn decide_for(&self, headers: &mut HeaderMap, caller: Caller) -> Decision {
        match caller {
            Caller::Trusted => self.decide(context::extract(headers)),
            Caller::Untrusted => {
                context::strip(headers);
                self.decide(Incoming::None)
            }
        }
    }

    fn pick(&self) -> bool {
        self.ratio >= 1.0 || (self.ratio > 0.0 && rand::random::<f64>() < self.ratio)
    }

    /// A SERVER span for a request with `headers` (e.g. a tonic request's
    /// `request.metadata().as_ref()`), or `None` when the request is not sampled.
    pub fn server_span(&self, headers: &HeaderMap, name: impl Into<Cow<'static, str>>) -> Option<Span> {
        match self.decide(context::extract(headers)) {
            Decision::Record { parent, .. } => Some(Span::start(name, SpanKind::Server, parent)),
            Decision::Skip => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn with_traceparent(tp: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(context::TRACEPARENT, HeaderValue::from_str(tp).unwrap());
        h
    }

    #[test]
    fn a_server_span_continues_the_incoming_trace_under_the_callers_span() {
        let mut headers = with_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        headers.insert(context::TRACESTATE, HeaderValue::from_static("vendor=x"));
        let span = Sampler::new(0.0).server_span(&headers, "GET /").unwrap();
        assert_eq!(span.trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span.parent.unwrap().to_hex(), "00f067aa0ba902b7");
        assert_eq!(span.trace_state, "vendor=x");
        let child = span.child("try", SpanKind::Client);
        assert_eq!((child.trace_id, child.parent), (span.trace_id, Some(span.span_id)));
        assert_eq!(child.trace_state, "vendor=x");
    }

    #[test]
    fn an_unsampled_parent_gets_no_span_even_at_ratio_one() {
        let headers = with_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
        assert_eq!(Sampler::new(1.0).server_span(&headers, "x"), None);
    }

    #[test]
    fn untraced_requests_follow_the_ratio_only() {
        let none = HeaderMap::new();
        assert_eq!(Sampler::new(0.0).server_span(&none, "x"), None);
        let root = Sampler::new(1.0).server_span(&none, "x").unwrap();
        assert_eq!(root.parent, None);
        assert_eq!(Sampler::new(f64::NAN).ratio(), 0.0);
        assert_eq!(Sampler::new(7.0).ratio(), 1.0);
        let mut b3 = HeaderMap::new();
        b3.insert(context::B3, HeaderValue::from_static("1"));
        assert!(Sampler::new(0.0).server_span(&b3, "x").is_some(), "b3: 1 asks for a trace");
    }

    #[test]
    fn an_untrusted_callers_trace_headers_are_removed_and_only_the_ratio_decides() {
        let sampled = with_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let at_zero = Sampler::new(0.0);
        assert!(matches!(at_zero.decide_for(&mut sampled.clone(), Caller::Trusted), Decision::Record { .. }));
        let mut untrusted = sampled.clone();
        untrusted.append(context::X_B3_SAMPLED, HeaderValue::from_static("1"));
        assert_eq!(at_zero.decide_for(&mut untrusted, Caller::Untrusted), Decision::Skip);
        assert!(untrusted.is_empty(), "nothing it said goes on: {untrusted:?}");
        let mut debug = HeaderMap::new();
        debug.insert(context::B3, HeaderValue::from_static("d"));
        assert_eq!(at_zero.decide_for(&mut debug, Caller::Untrusted), Decision::Skip);
        assert!(debug.is_empty());
        // Picked by the ratio: a trace of our own, never the caller's ids, written as W3C only.
        let mut picked = sampled.clone();
        match Sampler::new(1.0).decide_for(&mut picked, Caller::Untrusted) {
            Decision::Record { parent: Parent::Root, b3: None } => {}
            other => panic!("{other:?}"),
        }
        assert!(picked.is_empty());
        // Nothing asked for: the same as for anyone.
        assert_eq!(at_zero.decide_for(&mut HeaderMap::new(), Caller::Untrusted), Decision::Skip);
    }

    #[test]
    fn the_proto_span_carries_ids_kind_times_attributes_events_and_status() {
        let mut span = Span::start("GET /", SpanKind::Client, Parent::Root);
        span.set("http.request.method", "GET");
        span.set("http.response.status_code", 503u16);
        span.set("tls", true);
        span.event("retry", vec![("attempt".into(), Value::Int(2))]);
        span.status = Status::Error("503".into());
        span.end();
        let p = span.to_proto();
        assert_eq!(p.trace_id, span.trace_id.0);
        assert!(p.parent_span_id.is_empty());
        assert_eq!(p.kind, proto::span::SpanKind::Client as i32);
        assert!(p.end_time_unix_nano >= p.start_time_unix_nano && p.start_time_unix_nano > 0);
        assert_eq!(p.attributes.len(), 3);
        assert_eq!(p.attributes[1].value.as_ref().unwrap().value, Some(any_value::Value::IntValue(503)));
        assert_eq!(p.events[0].name, "retry");
        assert_eq!(p.status.unwrap().code, proto::status::StatusCode::Error as i32);
    }
}
