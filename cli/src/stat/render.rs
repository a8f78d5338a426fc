//! `stat` and `edges` as text tables (`-o table`, `-o wide`) or JSON (`-o json`).
//!
//! Layer: model (pure).

use cnimesh_common::table::table;

use super::compute::{EdgeRow, EgressStatRow, StatRow};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Wide,
    Json,
}

fn percent(share: Option<f64>, decimals: usize) -> String {
    share.map_or_else(|| "-".into(), |s| format!("{:.decimals$}%", s * 100.0))
}

fn millis(ms: f64) -> String {
    if ms < 10.0 { format!("{ms:.2}ms") } else { format!("{ms:.0}ms") }
}

/// Like `linkerd viz stat`: one line per workload; `NAMESPACE` first when several are shown.
pub fn stat(rows: &[StatRow], output: Output, all_namespaces: bool) -> String {
    if output == Output::Json {
        return serde_json::to_string_pretty(rows).expect("serialisable") + "\n";
    }
    if rows.is_empty() {
        return "No resources found.\n".into();
    }
    let mut headers = vec!["NAME", "MESHED", "SUCCESS", "RPS", "LATENCY_P50", "LATENCY_P95", "LATENCY_P99", "TCP_CONN"];
    headers.push("MTLS");
    if all_namespaces {
        headers.insert(0, "NAMESPACE");
    }
    if output == Output::Wide {
        headers.extend(["REQUESTS", "UNREADABLE"]);
    }
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let latency = |pick: fn(&super::compute::Latency) -> f64| {
                r.latency_ms.as_ref().map_or("-".into(), |l| millis(pick(l)))
            };
            let mut line = vec![
                format!("{}/{}", r.kind, r.name),
                format!("{}/{}", r.meshed_pods, r.pods),
                percent(r.success_rate, 2),
                format!("{:.1}rps", r.rps),
                latency(|l| l.p50),
                latency(|l| l.p95),
                latency(|l| l.p99),
                format!("{}", r.tcp_connections.round() as u64),
                percent(r.mtls_share, 0),
            ];
            if all_namespaces {
                line.insert(0, r.namespace.clone());
            }
            if output == Output::Wide {
                line.extend([format!("{}", r.requests.round() as u64), r.unreadable.len().to_string()]);
            }
            line
        })
        .collect();
    let mut out = table(&headers, &lines);
    for problem in rows.iter().flat_map(|r| &r.unreadable) {
        out.push_str(&format!("warning: metrics not read from {problem}\n"));
    }
    out
}

/// `stat egress`: one line per (EgressNetwork, hostname), `NAMESPACE` (the clients')
/// first when several are shown.
pub fn egress_stat(rows: &[EgressStatRow], output: Output, all_namespaces: bool) -> String {
    if output == Output::Json {
        return serde_json::to_string_pretty(rows).expect("serialisable") + "\n";
    }
    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("No egress seen by hostname (is there an EgressNetwork for these clients?).\n");
    } else {
        let mut headers = vec!["NAME", "EGRESS_NETWORK", "SUCCESS", "RPS", "CONNECTIONS", "DENIED"];
        if all_namespaces {
            headers.insert(0, "NAMESPACE");
        }
        if output == Output::Wide {
            headers.extend(["REQUESTS", "UNREADABLE"]);
        }
        let lines: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                let mut line = vec![
                    format!("{}/{}", r.kind, r.name),
                    r.network.clone(),
                    percent(r.success_rate, 2),
                    format!("{:.1}rps", r.rps),
                    format!("{}", r.connections.round() as u64),
                    format!("{}", r.denied.round() as u64),
                ];
                if all_namespaces {
                    line.insert(0, r.namespace.clone());
                }
                if output == Output::Wide {
                    line.extend([format!("{}", r.requests.round() as u64), r.unreadable.len().to_string()]);
                }
                line
            })
            .collect();
        out = table(&headers, &lines);
    }
    let mut problems: Vec<&String> = rows.iter().flat_map(|r| &r.unreadable).collect();
    problems.sort();
    problems.dedup();
    for problem in problems {
        out.push_str(&format!("warning: metrics not read from {problem}\n"));
    }
    out
}

/// Like `linkerd viz edges`: who talks to whom, with the identities each side proved.
pub fn edges(rows: &[EdgeRow], output: Output) -> String {
    if output == Output::Json {
        return serde_json::to_string_pretty(rows).expect("serialisable") + "\n";
    }
    if rows.is_empty() {
        return "No edges found.\n".into();
    }
    let mut headers = vec!["SRC", "DST", "SRC_NS", "DST_NS", "CLIENT_ID", "SERVER_ID", "SECURED"];
    if output == Output::Wide {
        headers.extend(["REQUESTS", "CONNECTIONS"]);
    }
    let or_dash = |ids: &[String]| if ids.is_empty() { "-".to_string() } else { ids.join(",") };
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|e| {
            let mut line = vec![
                e.src.clone(),
                e.dst.clone(),
                e.src_namespace.clone(),
                if e.dst_namespace.is_empty() { "-".into() } else { e.dst_namespace.clone() },
                or_dash(&e.client_ids),
                or_dash(&e.server_ids),
                match (&e.egress, e.mtls) {
                    // The app's own TLS or plaintext, outside the mesh either way.
                    (Some(egress), _) => {
                        format!("egress ({}, {} denied)", egress.network, egress.denied.round() as u64)
                    }
                    (None, true) => "mTLS".into(),
                    (None, false) => "plaintext".into(),
                },
            ];
            if output == Output::Wide {
                line.extend([format!("{}", e.requests.round() as u64), format!("{}", e.connections.round() as u64)]);
            }
            line
        })
        .collect();
    table(&headers, &lines)
}
