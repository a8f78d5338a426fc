//! Label selectors (`a=b,c!=d,e,!f`) and field selectors (`metadata.name=x`), as lists and
//! watches filter by them.

use serde_json::Value;

/// A label selector and a field selector together.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selector {
    labels: Vec<(String, Op)>,
    fields: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
enum Op {
    Is(String),
    IsNot(String),
    Exists,
    Absent,
}

impl Selector {
    pub(crate) fn parse(labels: Option<&str>, fields: Option<&str>) -> Self {
        let terms = |s: Option<&str>| -> Vec<String> {
            s.unwrap_or_default().split(',').map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect()
        };
        let labels = terms(labels)
            .into_iter()
            .map(|term| {
                if let Some((k, v)) = term.split_once("!=") {
                    (k.to_string(), Op::IsNot(v.to_string()))
                } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                    (k.to_string(), Op::Is(v.to_string()))
                } else if let Some(k) = term.strip_prefix('!') {
                    (k.to_string(), Op::Absent)
                } else {
                    (term, Op::Exists)
                }
            })
            .collect();
        let fields = terms(fields)
            .into_iter()
            .filter_map(|t| t.split_once('=').map(|(k, v)| (k.trim_end_matches('=').to_string(), v.to_string())))
            .collect();
        Self { labels, fields }
    }

    pub(crate) fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label_ok = self.labels.iter().all(|(key, op)| {
            let value = labels.get(key).and_then(Value::as_str);
            match op {
                Op::Is(v) => value == Some(v.as_str()),
                Op::IsNot(v) => value != Some(v.as_str()),
                Op::Exists => value.is_some(),
                Op::Absent => value.is_none(),
            }
        });
        label_ok
            && self.fields.iter().all(|(path, want)| {
                let pointer = format!("/{}", path.replace('.', "/"));
                object.pointer(&pointer).and_then(Value::as_str).unwrap_or_default() == want
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_match_as_the_api_server_matches_them() {
        let selector = Selector::parse(Some("a/b=true,c!=x,d"), Some("metadata.name=web"));
        let object = json!({"metadata": {"name": "web", "labels": {"a/b": "true", "d": ""}}});
        assert!(selector.matches(&object));
        let other = json!({"metadata": {"name": "web", "labels": {"a/b": "true", "c": "x", "d": ""}}});
        assert!(!selector.matches(&other));
    }
}
