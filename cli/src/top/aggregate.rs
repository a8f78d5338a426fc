//! `cnimesh top`'s table: tap events folded by (source, destination, method, path), like
//! `linkerd viz top`: how many requests completed, the best, worst and last latency (to the
//! response's headers) and the share that succeeded (an HTTP status below 500 other than a
//! policy's refusals, a gRPC status of OK when there is one, no reset), and how many were
//! refused: denied by policy (403) or rate-limited (429).
//!
//! Layer: model (pure).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use cnimesh_common::table::table;

use crate::tap::render::duration;
use cnimesh_model::tap::{Body, TapLine};

/// What the table is grouped by.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Key {
    pub source: String,
    pub destination: String,
    pub method: String,
    pub path: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Row {
    pub count: u64,
    pub successes: u64,
    /// Answered 403: denied by the destination's policy (not a success).
    pub denied: u64,
    /// Answered 429: refused by the destination's rate limit (not a success).
    pub rate_limited: u64,
    pub best_us: u64,
    pub worst_us: u64,
    pub last_us: u64,
}

/// A request seen starting, not yet ended.
#[derive(Debug)]
struct Pending {
    key: Key,
    latency_us: Option<u64>,
    status: Option<u32>,
}

#[derive(Debug, Default)]
pub struct Top {
    rows: BTreeMap<Key, Row>,
    /// By proxy (namespace, pod) and stream id.
    pending: HashMap<(String, String, String), Pending>,
    /// Pods that could not be tapped, with why (the last word per pod).
    pub problems: BTreeMap<String, String>,
}

/// An address without its port: client ports differ per connection.
fn host(addr: Option<SocketAddr>) -> String {
    addr.map_or_else(|| "-".into(), |a| a.ip().to_string())
}

impl Top {
    pub fn add(&mut self, line: &TapLine) {
        let pod = (line.namespace.clone(), line.pod.clone());
        let stream_key = |id: &str| (pod.0.clone(), pod.1.clone(), id.to_string());
        match &line.body {
            Body::Error { message } => {
                self.problems.insert(format!("{}/{}", line.namespace, line.pod), message.clone());
            }
            Body::RequestInit { at, method, path, .. } => {
                let key = Key {
                    source: at.source_pod.clone().unwrap_or_else(|| host(at.source)),
                    destination: at.destination_pod.clone().unwrap_or_else(|| host(at.destination)),
                    method: method.clone(),
                    path: path.clone(),
                };
                self.pending.insert(stream_key(&at.id), Pending { key, latency_us: None, status: None });
            }
            Body::ResponseInit { at, since_request_init_us, http_status } => {
                if let Some(p) = self.pending.get_mut(&stream_key(&at.id)) {
                    p.latency_us = Some(*since_request_init_us);
                    p.status = Some(*http_status);
                }
            }
            Body::ResponseEnd { at, since_request_init_us, grpc_status, reset_code, .. } => {
                let Some(p) = self.pending.remove(&stream_key(&at.id)) else { return };
                let latency = p.latency_us.unwrap_or(*since_request_init_us);
                let refused = matches!(p.status, Some(403 | 429));
                let ok = p.status.is_some_and(|s| s < 500)
                    && !refused
                    && grpc_status.is_none_or(|g| g == 0)
                    && reset_code.is_none();
                let row = self.rows.entry(p.key).or_insert_with(|| Row { best_us: u64::MAX, ..Row::default() });
                row.count += 1;
                row.successes += u64::from(ok);
                row.denied += u64::from(p.status == Some(403));
                row.rate_limited += u64::from(p.status == Some(429));
                row.best_us = row.best_us.min(latency);
                row.worst_us = row.worst_us.max(latency);
                row.last_us = latency;
            }
        }
    }

    /// Rows busiest first, then by key.
    pub fn rows(&self) -> Vec<(&Key, &Row)> {
        let mut rows: Vec<(&Key, &Row)> = self.rows.iter().collect();
        rows.sort_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(b.0)));
        rows
    }

    /// The table, then a warning per pod that could not be tapped.
    pub fn render(&self) -> String {
        let mut out = if self.rows.is_empty() {
            "No requests seen yet.\n".to_string()
        } else {
            let headers = ["SOURCE", "DESTINATION", "METHOD", "PATH", "COUNT", "BEST", "WORST", "LAST", "SUCCESS_RATE"];
            let lines: Vec<Vec<String>> = self
                .rows()
                .into_iter()
                .map(|(k, r)| {
                    vec![
                        k.source.clone(),
                        k.destination.clone(),
                        k.method.clone(),
                        k.path.clone(),
                        r.count.to_string(),
                        duration(r.best_us),
                        duration(r.worst_us),
                        duration(r.last_us),
                        format!("{:.2}%", r.successes as f64 * 100.0 / r.count as f64),
                    ]
                })
                .collect();
            table(&headers, &lines)
        };
        for (pod, problem) in &self.problems {
            out.push_str(&format!("warning: {pod} not tapped: {problem}\n"));
        }
        out
    }
}
