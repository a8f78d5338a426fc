//! One request as the server saw it ([`Call`]), recorded so a test can assert what was asked,
//! with which credentials and in which order, and the query string read as the API server reads it.

use http::Method;
use serde_json::Value;

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    pub path: String,
    /// Percent-decoded `key=value` pairs of the query, in order.
    pub query: Vec<(String, String)>,
    pub content_type: String,
    pub body: Value,
    /// The `Authorization` header, as sent.
    pub authorization: Option<String>,
}

pub(crate) const APPLY_PATCH: &str = "application/apply-patch+yaml";
pub(crate) const MERGE_PATCH: &str = "application/merge-patch+json";
pub(crate) const STRATEGIC_PATCH: &str = "application/strategic-merge-patch+json";
pub(crate) const JSON_PATCH: &str = "application/json-patch+json";

impl Call {
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn is_watch(&self) -> bool {
        self.param("watch") == Some("true")
    }

    /// A server-side apply.
    pub fn is_apply(&self) -> bool {
        self.method == Method::PATCH && self.content_type.starts_with(APPLY_PATCH)
    }
}

pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(crate) fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(kv), String::new()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_decoded_as_the_api_server_decodes_them() {
        let query = parse_query("labelSelector=a%2Fb%3Dtrue%2Cc%21%3Dx%2Cd&watch=true");
        assert_eq!(query[0], ("labelSelector".to_string(), "a/b=true,c!=x,d".to_string()));
        assert_eq!(percent_decode("100%"), "100%");
    }
}
