//! How every long-running cnimesh binary logs (feature `logging`, so the CNI plugin, which links
//! this crate for every pod, stays without tracing-subscriber): to stderr, as plain text or, with
//! `CNIMESH_LOG_FORMAT=json`, one JSON object per line (`timestamp`, `level`, `target`,
//! `message`, the event's other fields, and the names of the spans it happened in) for log
//! pipelines that parse rather than grep. `cnimesh install --set logFormat=json` sets the
//! variable on every component.

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The variable every binary reads its log format from.
pub const FORMAT_ENV: &str = "CNIMESH_LOG_FORMAT";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Plain,
    Json,
}

/// A log format nobody knows, named with the variable it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError(pub String);

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{FORMAT_ENV}={:?}: expected plain or json", self.0)
    }
}

impl std::error::Error for FormatError {}

impl FromStr for Format {
    type Err = FormatError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "" | "plain" => Ok(Format::Plain),
            "json" => Ok(Format::Json),
            other => Err(FormatError(other.to_string())),
        }
    }
}

/// The format `CNIMESH_LOG_FORMAT` asks for (plain when unset).
pub fn format_from_env() -> Result<Format, FormatError> {
    match std::env::var(FORMAT_ENV) {
        Ok(value) => value.parse(),
        Err(std::env::VarError::NotPresent) => Ok(Format::Plain),
        Err(std::env::VarError::NotUnicode(value)) => Err(FormatError(value.to_string_lossy().into_owned())),
    }
}

/// The stderr layer of `format`, to stack under a binary's own filter (and reload handle).
pub fn layer<S>(format: Format) -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let plain = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        Format::Plain => plain.boxed(),
        Format::Json => plain.event_format(JsonLines).boxed(),
    }
}

/// Installs the global subscriber: `filter`, then the format of `CNIMESH_LOG_FORMAT`. A bad
/// format is an error (the caller reports it and exits), not a silent fallback.
pub fn init(filter: tracing_subscriber::EnvFilter) -> Result<(), FormatError> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let format = format_from_env()?;
    tracing_subscriber::registry().with(filter).with(layer(format)).init();
    Ok(())
}

/// One JSON object per event, on one line.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert("timestamp".into(), Value::String(timestamp));
        line.insert("level".into(), Value::String(meta.level().to_string()));
        line.insert("target".into(), Value::String(meta.target().to_string()));
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        let message = fields.0.remove("message").unwrap_or(Value::String(String::new()));
        line.insert("message".into(), message);
        for (key, value) in fields.0 {
            line.entry(key).or_insert(value);
        }
        if let Some(scope) = ctx.event_scope() {
            let spans: Vec<Value> = scope.from_root().map(|span| Value::String(span.name().to_string())).collect();
            if !spans.is_empty() {
                line.insert("spans".into(), Value::Array(spans));
            }
        }
        let text = serde_json::to_string(&Value::Object(line)).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// An event's fields as JSON values, keeping numbers and booleans typed.
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::String(value.into()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use parking_lot::Mutex;

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_json_event_is_one_line_with_level_message_and_typed_fields() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let layer = tracing_subscriber::fmt::layer().with_writer(move || writer.clone()).event_format(JsonLines);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("serve");
            let _entered = span.enter();
            tracing::warn!(port = 4190u64, tls = true, peer = "10.0.0.1", "a \"quoted\"\nmessage");
        });
        let text = String::from_utf8(buffer.0.lock().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let line: Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "a \"quoted\"\nmessage");
        assert_eq!(line["port"], 4190);
        assert_eq!(line["tls"], true);
        assert_eq!(line["peer"], "10.0.0.1");
        assert_eq!(line["spans"], serde_json::json!(["serve"]));
        assert!(line["timestamp"].as_str().is_some_and(|t| t.contains('T')), "{line}");
    }

    #[test]
    fn an_unknown_format_is_refused_by_name() {
        assert_eq!("json".parse::<Format>(), Ok(Format::Json));
        assert_eq!("plain".parse::<Format>(), Ok(Format::Plain));
        let error = "yaml".parse::<Format>().unwrap_err().to_string();
        assert_eq!(error, "CNIMESH_LOG_FORMAT=\"yaml\": expected plain or json");
    }
}
