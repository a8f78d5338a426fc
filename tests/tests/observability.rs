//! `daemonset/observability/`: every Grafana dashboard is JSON, every PromQL expression in it
//! (panel queries and variable queries) parses with a real PromQL parser, and every metric it
//! names is one the code exports: the names come from the proxy's and the node agent's own
//! registries, not from a list kept by hand. The scrape config and the PodMonitors select the
//! admin ports by the names the injector and the DaemonSet give them, and turn every owner label
//! kind the injector writes into a metric label.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use cnimesh_common::names::{OWNER_KINDS, OWNER_LABEL_PREFIX};
use cnimesh_e2e::manifest_check::{daemonset_dir, documents};
use cnimesh_model::inject::{InjectConfig, PodProxySettings, proxy_container};
use promql_parser::parser::{self, Expr};
use serde_json::Value;

fn observability_dir() -> PathBuf {
    daemonset_dir().join("observability")
}

/// The metric families registered in the proxy's and the node agent's registries, with their
/// prefix: prometheus-client writes nothing for a family without samples, so the names are read
/// from the registries themselves (their `Debug` form lists every descriptor).
fn registered() -> BTreeSet<String> {
    let proxy = cnimesh_proxy::serve::metrics::Metrics::default();
    let agent = cnimesh_node::metrics::AgentMetrics::default();
    let mut names = BTreeSet::new();
    for registry in [format!("{:?}", proxy.registry), format!("{:?}", agent.registry())] {
        let prefix = registry
            .split_once("prefix: Some(Prefix(\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map_or(String::new(), |(p, _)| format!("{p}_"));
        for rest in registry.split("Descriptor { name: \"").skip(1) {
            let name = rest.split_once('"').expect("a quoted name").0;
            names.insert(format!("{prefix}{name}"));
        }
    }
    names
}

/// Whether a series name is one of `registered` families' (OpenMetrics suffixes: `_total` for
/// counters, `_bucket`/`_sum`/`_count` for histograms, none for gauges).
fn exported(registered: &BTreeSet<String>, series: &str) -> bool {
    ["", "_total", "_bucket", "_sum", "_count"]
        .iter()
        .any(|suffix| series.strip_suffix(suffix).is_some_and(|family| registered.contains(family)))
}

/// Grafana's variables replaced by values PromQL accepts.
fn substitute(expr: &str) -> String {
    let mut out = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h");
    while let Some(start) = out.find('$') {
        let end = out[start + 1..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '{' || c == '}'))
            .map_or(out.len(), |i| start + 1 + i);
        out.replace_range(start..end, "x");
    }
    out
}

/// The metric names an expression selects.
fn selected(expr: &Expr, names: &mut BTreeSet<String>) {
    match expr {
        Expr::Aggregate(a) => {
            selected(&a.expr, names);
            if let Some(p) = &a.param {
                selected(p, names);
            }
        }
        Expr::Unary(u) => selected(&u.expr, names),
        Expr::Binary(b) => {
            selected(&b.lhs, names);
            selected(&b.rhs, names);
        }
        Expr::Paren(p) => selected(&p.expr, names),
        Expr::Subquery(s) => selected(&s.expr, names),
        Expr::VectorSelector(v) => names.extend(v.name.clone()),
        Expr::MatrixSelector(m) => names.extend(m.vs.name.clone()),
        Expr::Call(c) => c.args.args.iter().for_each(|a| selected(a, names)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

/// Every PromQL text of a dashboard: panel targets' `expr`, and the selector inside each
/// variable's `label_values(selector, label)`.
fn expressions(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    ("query" | "definition", Value::String(q)) if q.starts_with("label_values(") => {
                        let inner = q.trim_start_matches("label_values(").trim_end_matches(')');
                        out.push(inner.rsplit_once(',').map_or(inner, |(selector, _)| selector).trim().to_string());
                    }
                    _ => expressions(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| expressions(v, out)),
        _ => {}
    }
}

fn dashboards() -> Vec<PathBuf> {
    let dir = observability_dir().join("dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_dashboard_query_parses_and_names_only_exported_metrics() {
    let registered = registered();
    for family in ["request", "response_latency_ms", "inbound_http_authz_deny", "cnimesh_node_decisions"] {
        assert!(registered.contains(family), "{family} in {registered:?}");
    }
    let files = dashboards();
    let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for kind in ["mesh", "namespace", "workload", "route", "node-agents"] {
        assert!(names.contains(&format!("cnimesh-{kind}.json")), "a {kind} dashboard: {names:?}");
    }
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy();
        let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap())
            .unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
        assert!(dashboard["uid"].is_string() && dashboard["title"].is_string(), "{name}: uid and title");
        let mut exprs = Vec::new();
        expressions(&dashboard, &mut exprs);
        assert!(exprs.len() >= 4, "{name}: {} expressions", exprs.len());
        for expr in exprs {
            match parser::parse(&substitute(&expr)) {
                Err(e) => problems.push(format!("{name}: {expr}: {e}")),
                Ok(ast) => {
                    let mut names = BTreeSet::new();
                    selected(&ast, &mut names);
                    for metric in names {
                        if !exported(&registered, &metric) {
                            problems.push(format!("{name}: {expr}: {metric} is not exported"));
                        }
                        used.insert(metric);
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The checker itself: a typo and a broken expression are caught.
    assert!(parser::parse(&substitute("sum(rate(request_total{namespace=\"$namespace\"}[$__rate_interval]))")).is_ok());
    assert!(parser::parse("sum(rate(request_total[5m])").is_err());
    let mut names = BTreeSet::new();
    selected(&parser::parse("rate(requests_total[5m]) / on() group_left scalar(up)").unwrap(), &mut names);
    assert!(names.contains("requests_total") && !exported(&registered, "requests_total"));
    assert!(used.len() >= 15, "the dashboards cover the exports: {used:?}");
}

/// The relabelling keys a scrape configuration reads, flattened.
fn source_labels(relabelings: &Value) -> BTreeSet<String> {
    relabelings
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r.get("source_labels").or_else(|| r.get("sourceLabels")).and_then(Value::as_array).cloned())
        .flatten()
        .filter_map(|l| l.as_str().map(str::to_string))
        .collect()
}

fn owner_meta_labels() -> BTreeSet<String> {
    let prefix = OWNER_LABEL_PREFIX.replace(['.', '/', '-'], "_");
    OWNER_KINDS.iter().map(|k| format!("__meta_kubernetes_pod_label_{prefix}{k}")).collect()
}

#[test]
fn scrape_config_and_pod_monitors_select_the_admin_ports_by_name_and_map_owner_labels() {
    let anchors = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let config = InjectConfig { trust_anchors_pem: anchors.into(), ..InjectConfig::default() };
    let settings = PodProxySettings {
        identity: "web.shop.serviceaccount.identity.cnimesh.cluster.local".parse().unwrap(),
        opaque_ports: None,
        log_level: "info".into(),
    };
    let proxy = proxy_container(&config, &settings).unwrap();
    let proxy_port = proxy.ports.unwrap()[0].name.clone().unwrap();
    let agent = documents(&daemonset_dir().join("cnimesh-node.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("the agent's DaemonSet");
    let agent_port =
        agent["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"].as_str().unwrap().to_string();

    let scrape = documents(&observability_dir().join("prometheus-scrape.yaml")).remove(0);
    let jobs = scrape["scrape_configs"].as_array().unwrap();
    let job = |name: &str| jobs.iter().find(|j| j["job_name"] == name).unwrap_or_else(|| panic!("job {name}"));
    let keep = |job: &Value| -> String {
        let keep = job["relabel_configs"].as_array().unwrap().iter().find(|r| r["action"] == "keep").unwrap();
        keep["regex"].as_str().unwrap().to_string()
    };
    assert_eq!(keep(job("cnimesh-proxy")), proxy_port, "proxies are found by the injector's port name");
    assert!(keep(job("cnimesh-node")).ends_with(&format!(";{agent_port}")), "agents by the DaemonSet's port name");
    let read = source_labels(&job("cnimesh-proxy")["relabel_configs"]);
    assert!(read.is_superset(&owner_meta_labels()), "every owner kind becomes a label: {read:?}");

    let monitors = documents(&observability_dir().join("podmonitor.yaml"));
    let endpoint = |name: &str| {
        let m = monitors.iter().find(|m| m["metadata"]["name"] == name).unwrap_or_else(|| panic!("{name}"));
        m["spec"]["podMetricsEndpoints"][0].clone()
    };
    assert_eq!(endpoint("cnimesh-proxy")["port"], proxy_port.as_str());
    assert_eq!(endpoint("cnimesh-node")["port"], agent_port.as_str());
    assert!(source_labels(&endpoint("cnimesh-proxy")["relabelings"]).is_superset(&owner_meta_labels()));
    assert!(Path::new(&observability_dir().join("README.md")).is_file());
}
