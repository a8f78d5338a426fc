//! Reading a Prometheus (or OpenMetrics) text exposition: the samples of a `/metrics` page. One
//! home for the readers of our proxies' and agents' metrics: local mode's summary and
//! `cnimesh stat`/`edges`. Lines that are not samples (`# HELP`, `# TYPE`, `# EOF`, blank) are
//! skipped, and so is a malformed line, rather than failing the whole page.

use std::collections::BTreeMap;

/// One sample: a metric name (with its `_total`/`_bucket`/… suffix), its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, or "" when absent.
    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }
}

/// The samples of a text exposition.
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).filter_map(sample).collect()
}

fn sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' ', '\t'])?;
    let name = &line[..name_end];
    let (labels, rest) = if line[name_end..].starts_with('{') {
        labels(&line[name_end + 1..])?
    } else {
        (BTreeMap::new(), &line[name_end..])
    };
    // A timestamp may follow the value.
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample { name: name.to_string(), labels, value })
}

/// `k="v",k2="v2"}` → the labels and what follows the `}`. Values may hold escaped `\\`, `\"`
/// and `\n`, as the exposition format writes them.
fn labels(mut rest: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut out = BTreeMap::new();
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((out, after));
        }
        let (key, after_key) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after_key.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        out.insert(key.trim().to_string(), value);
        rest = &after_key[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_parsed_with_labels_escapes_and_suffixes() {
        let text = "# HELP x\n# TYPE request counter\nrequest_total{direction=\"outbound\",target_addr=\"10.0.0.2:8080\",tls=\"true\",server_id=\"web.demo\"} 7\nup 1\n\
                    weird_total{authority=\"a\\\"b,c\\\\d\",le=\"+Inf\"} 2 1700000000\nbroken{x=\"y 3\n# EOF\n";
        let s = samples(text);
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(s[0].label("target_addr"), "10.0.0.2:8080");
        assert_eq!(s[0].label("server_id"), "web.demo");
        assert_eq!(s[0].value, 7.0);
        assert!(s[1].labels.is_empty());
        assert_eq!(s[2].label("authority"), "a\"b,c\\d");
        assert_eq!(s[2].label("le"), "+Inf");
        assert_eq!(s[2].value, 2.0);
        assert_eq!(s[2].label("missing"), "");
    }
}
