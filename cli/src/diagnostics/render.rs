//! The pages as people read them: short tables and summaries from the JSON the proxy or the
//! control plane served (pure: text in, text out). Missing fields print as `-`, so a proxy of
//! another version still gets a report.

use serde_json::Value;

/// Columns padded to their widest cell, two spaces apart.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        text.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `kind/name` (`group` left out: the kinds are unambiguous to an operator).
fn resource(v: &Value) -> String {
    format!("{}/{}", text(&v["kind"]), text(&v["name"]))
}

fn seconds(s: u64) -> String {
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// `/metrics`: the samples without the `# HELP`/`# TYPE` lines.
pub fn metrics(page: &str) -> String {
    let mut out: String =
        page.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).map(|l| format!("{l}\n")).collect();
    if out.is_empty() {
        out = "No metrics.\n".into();
    }
    out
}

/// `/metrics` as JSON: one `{name, labels, value}` per sample.
pub fn metrics_value(page: &str) -> Value {
    let samples: Vec<Value> = cnimesh_common::prom_text::samples(page)
        .into_iter()
        .map(|s| serde_json::json!({ "name": s.name, "labels": s.labels, "value": s.value }))
        .collect();
    Value::Array(samples)
}

/// A value as `-o json` prints it.
pub fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).expect("JSON values serialise") + "\n"
}

fn endpoint_row(target: &str, e: &Value) -> Vec<String> {
    vec![
        target.to_string(),
        text(&e["addr"]),
        text(&e["identity"]),
        text(&e["pending"]),
        e["ewma_ms"].as_f64().map_or("-".into(), |ms| format!("{ms:.1}ms")),
    ]
}

/// `/endpoints.json`: every service and address the proxy looked up, and each endpoint.
pub fn endpoints(page: &Value) -> String {
    if page["discovery"] == Value::Bool(false) {
        return "This proxy has no discovery (no control plane configured): it connects to the addresses the app dials.\n".into();
    }
    let mut rows = Vec::new();
    for service in page["services"].as_array().into_iter().flatten() {
        let authority = text(&service["authority"]);
        let list = service["endpoints"].as_array().cloned().unwrap_or_default();
        if list.is_empty() {
            let why = match (&service["known"], &service["exists"]) {
                (Value::Bool(false), _) => "(not answered yet)",
                (_, Value::Bool(false)) => "(no such service)",
                _ => "(no ready endpoints)",
            };
            rows.push(vec![authority.clone(), why.into(), "-".into(), "-".into(), "-".into()]);
        }
        rows.extend(list.iter().map(|e| endpoint_row(&authority, e)));
    }
    for profile in page["profiles"].as_array().into_iter().flatten() {
        let addr = text(&profile["addr"]);
        match (&profile["service"], &profile["endpoint"]) {
            (Value::String(service), _) => {
                rows.push(vec![addr, format!("(service {service})"), "-".into(), "-".into(), "-".into()]);
            }
            (_, endpoint @ Value::Object(_)) => rows.push(endpoint_row(&addr, endpoint)),
            _ if profile["answered"] == Value::Bool(false) => {
                rows.push(vec![addr, "(not answered yet)".into(), "-".into(), "-".into(), "-".into()]);
            }
            _ => rows.push(vec![addr, "(passthrough)".into(), "-".into(), "-".into(), "-".into()]),
        }
    }
    if rows.is_empty() {
        return "No lookups yet: the app has not connected anywhere through the proxy.\n".into();
    }
    table(&["TARGET", "ENDPOINT", "IDENTITY", "PENDING", "EWMA"], &rows)
}

/// `/identity.json`: who the proxy is, its certificate and the anchors it trusts.
pub fn identity(page: &Value) -> String {
    if page["configured"] == Value::Bool(false) {
        return "No identity: this proxy does no mTLS.\n".into();
    }
    let mut out = format!("name:          {}\n", text(&page["name"]));
    let cert = &page["certificate"];
    if cert.is_null() {
        out.push_str("certificate:   none yet (the proxy is not ready until the control plane issues one)\n");
    } else {
        out.push_str(&format!("certificate:   {} ({})\n", text(&cert["subject"]), text(&cert["identity"])));
        out.push_str(&format!(
            "issuer:        {} (serial {})\n",
            text(&cert["issuer"]["subject"]),
            text(&cert["issuer"]["serial"])
        ));
        let expires = cert["expires_in_seconds"].as_u64().map_or("-".into(), seconds);
        out.push_str(&format!("expires in:    {expires} (unix {})\n", text(&cert["not_after_unix"])));
        out.push_str(&format!("chain:         {} certificates\n", text(&cert["chain_length"])));
    }
    let anchors = page["anchors"].as_array().cloned().unwrap_or_default();
    out.push_str(&format!("trust anchors: {}\n", text(&page["trust_anchors"])));
    for anchor in anchors {
        out.push_str(&format!("  sha256 (public key) {}\n", text(&anchor["spki_sha256"])));
    }
    out
}

fn authz_line(a: &Value) -> String {
    let who = match &a["authentication"] {
        v if v["unauthenticated"] == Value::Bool(true) => "any client".to_string(),
        v => {
            let tls = &v["mesh_tls"];
            let names: Vec<String> = tls["identities"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(tls["suffixes"].as_array().into_iter().flatten())
                .map(text)
                .collect();
            if names.is_empty() { "mTLS: nobody".into() } else { format!("mTLS: {}", names.join(", ")) }
        }
    };
    let nets: Vec<String> = a["networks"].as_array().into_iter().flatten().map(|n| text(&n["net"])).collect();
    format!("{} — {who} from {}", resource(&a["authorization"]), nets.join(", "))
}

fn authz_lines(out: &mut String, indent: &str, list: &Value) {
    let list = list.as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        out.push_str(&format!("{indent}allow: nobody (denied)\n"));
    }
    for a in list {
        out.push_str(&format!("{indent}allow: {}\n", authz_line(&a)));
    }
}

fn port_policy(out: &mut String, p: &Value) {
    out.push_str(&format!("  server {}, protocol {}\n", resource(&p["server"]), text(&p["protocol"])));
    authz_lines(out, "    ", &p["authorizations"]);
    for route in p["routes"].as_array().into_iter().flatten() {
        let matches: Vec<String> = route["matches"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                let path = match &m["path"] {
                    Value::Object(p) => p.iter().map(|(k, v)| format!("{k} {}", text(v))).collect::<Vec<_>>().join(""),
                    _ => "any path".into(),
                };
                match &m["method"] {
                    Value::String(method) => format!("{method} {path}"),
                    _ => path,
                }
            })
            .collect();
        out.push_str(&format!("    route {} ({})\n", resource(&route["route"]), matches.join("; ")));
        if route["authorizations"].as_array().is_some_and(|a| !a.is_empty()) {
            authz_lines(out, "      ", &route["authorizations"]);
        }
    }
}

/// `/policy.json`: port by port, the policy enforced, its source and freshness.
pub fn policy(page: &Value) -> String {
    if page["discovery"] == Value::Bool(false) {
        return "No inbound policy discovery: this proxy allows every client on every port.\n".into();
    }
    let mut out = String::new();
    for port in page["ports"].as_array().into_iter().flatten() {
        let declared = if port["declared"] == Value::Bool(true) { "declared" } else { "seen" };
        let fresh = match (text(&port["source"]).as_str(), port["last_answer_age_seconds"].as_u64()) {
            ("discovered", Some(age)) => format!("from the control plane, answered {} ago", seconds(age)),
            _ => "the default: the control plane has not answered for this port".into(),
        };
        out.push_str(&format!("port {} ({declared}): {fresh}\n", text(&port["port"])));
        port_policy(&mut out, port);
    }
    let default = &page["default"];
    out.push_str(&format!(
        "other ports: default {} ({})\n",
        text(&default["policy"]["server"]["name"]),
        text(&default["source"])
    ));
    out
}

/// The control plane's `/destination.json`: what `Get` serves for the authority.
pub fn served(page: &Value) -> String {
    let mut out = format!("{}:{}", text(&page["service"]), text(&page["port"]));
    if page["exists"] == Value::Bool(false) {
        out.push_str(": no such service (proxies get no_endpoints{exists: false} and fall back to the address)\n");
        return out;
    }
    if page["ready"] == Value::Bool(false) {
        out.push_str(" (the control plane has not loaded the cluster yet: proxies are kept waiting)");
    }
    out.push('\n');
    let endpoints = page["endpoints"].as_array().cloned().unwrap_or_default();
    if endpoints.is_empty() {
        out.push_str("No ready endpoints on this port.\n");
        return out;
    }
    let rows: Vec<Vec<String>> = endpoints
        .iter()
        .map(|e| {
            vec![
                text(&e["addr"]),
                text(&e["labels"]["pod"]),
                text(&e["identity"]),
                text(&e["protocol_hint"]),
                text(&e["weight"]),
            ]
        })
        .collect();
    out.push_str(&table(&["ENDPOINT", "POD", "IDENTITY", "HINT", "WEIGHT"], &rows));
    out
}
