//! Multi-document YAML as `serde_json::Value`s: what `install` renders and `inject` rewrites.
//! Values, not typed objects, so that fields k8s-openapi does not know survive a round trip.
//!
//! Layer: runtime (operator CLI), pure helpers.

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
#[error("{origin}: {source}")]
pub struct YamlError {
    pub origin: String,
    #[source]
    pub source: Box<serde_saphyr::Error>,
}

/// Every non-empty document of `text` (empty documents and bare `---` separators are dropped).
pub fn documents(text: &str, origin: &str) -> Result<Vec<Value>, YamlError> {
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(text)
        .map_err(|source| YamlError { origin: origin.to_string(), source: Box::new(source) })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The documents as one YAML stream, each introduced by `---`.
pub fn render(docs: &[Value]) -> String {
    let mut out = String::new();
    for doc in docs {
        out.push_str("---\n");
        let text = serde_saphyr::to_string(doc).expect("JSON values serialise as YAML");
        out.push_str(&text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// `kind/namespace/name` of a Kubernetes object, for messages.
pub fn describe(doc: &Value) -> String {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("?");
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("?");
    match doc.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_round_trips_with_awkward_scalars() {
        let text =
            "---\n# a comment\na: \"true\"\nb: \"0440\"\nc: |\n  line one\n  line two\n---\n---\nd: [1, \"2\"]\n";
        let docs = documents(text, "test").unwrap();
        assert_eq!(docs.len(), 2);
        let again = documents(&render(&docs), "again").unwrap();
        assert_eq!(docs, again);
        assert_eq!(again[0]["a"], "true");
        assert_eq!(again[0]["b"], "0440");
        assert_eq!(again[0]["c"], "line one\nline two\n");
        assert!(documents("a: [", "bad.yaml").unwrap_err().to_string().starts_with("bad.yaml: "));
    }
}
