//! The authz report as a table: one row per port and authorization (a port with none shows
//! `(none)`), then the client's verdict per port, the routes and the notes.

use super::evaluate::Report;
use crate::diagnostics::render::table as columns;

pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let several_pods = report.ports.iter().any(|p| p.pod != report.ports[0].pod);
    if report.ports.is_empty() {
        out.push_str(&format!("{} in {}: no ports to report.\n", report.resource, report.namespace));
    } else {
        let mut rows = Vec::new();
        for p in &report.ports {
            let port = if several_pods { format!("{}:{}", p.pod, p.port) } else { p.port.to_string() };
            let first = [port, p.server.clone(), p.protocol.clone()];
            if p.authorizations.is_empty() {
                rows.push([first.to_vec(), vec!["(none)".into(), "nobody".into(), "-".into()]].concat());
            }
            for (i, a) in p.authorizations.iter().enumerate() {
                let lead = if i == 0 { first.to_vec() } else { vec![String::new(); 3] };
                let mut name = a.name.clone();
                if !a.requires.is_empty() {
                    name.push_str(&format!(" ({})", a.requires.join(", ")));
                }
                rows.push([lead, vec![name, a.clients.clone(), a.networks.join(", ")]].concat());
            }
        }
        out.push_str(&columns(&["PORT", "SERVER", "PROTOCOL", "AUTHORIZATION", "CLIENTS", "NETWORKS"], &rows));
        for p in report.ports.iter().filter(|p| !p.probe_paths.is_empty()) {
            out.push_str(&format!(
                "port {}: kubelet probes {} are allowed to anyone\n",
                p.port,
                p.probe_paths.join(", ")
            ));
        }
    }
    if let Some(client) = &report.client {
        let who = match &client.identity {
            Some(identity) if identity != &client.name => format!("{} ({identity})", client.name),
            Some(identity) => identity.clone(),
            None => format!("{} (not meshed: no identity)", client.name),
        };
        out.push_str(&format!("\nFrom {who}:\n"));
        let rows: Vec<Vec<String>> = report
            .ports
            .iter()
            .filter_map(|p| {
                let v = p.verdict.as_ref()?;
                let port = if several_pods { format!("{}:{}", p.pod, p.port) } else { p.port.to_string() };
                Some(vec![port, if v.allowed { "yes".into() } else { "no".into() }, v.why.clone()])
            })
            .collect();
        out.push_str(&columns(&["PORT", "ALLOWED", "WHY"], &rows));
    }
    let audited: Vec<String> = report.ports.iter().filter(|p| p.audit).map(|p| p.port.to_string()).collect();
    if !audited.is_empty() {
        out.push_str(&format!(
            "\nAudit mode on port {}: what no authorization admits is let through and counted.\n",
            audited.join(", ")
        ));
        if report.would_be_denials.is_empty() {
            out.push_str("No would-be denials so far.\n");
        } else {
            out.push_str("Would-be denials (let through only by audit; denied under deny):\n");
            let rows: Vec<Vec<String>> = report
                .would_be_denials
                .iter()
                .map(|d| {
                    vec![d.pod.clone(), d.server.clone(), d.client.clone(), d.protocol.clone(), d.count.to_string()]
                })
                .collect();
            out.push_str(&columns(&["POD", "SERVER", "CLIENT", "PROTOCOL", "COUNT"], &rows));
        }
    }
    if !report.routes.is_empty() {
        out.push_str("\nRoutes:\n");
        for r in &report.routes {
            out.push_str(&format!("  {} → {}\n", r.route, r.parents.join(", ")));
        }
    }
    for note in &report.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}
