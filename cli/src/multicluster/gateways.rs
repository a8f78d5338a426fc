//! `cnimesh multicluster gateways [--local DIR] [-o table|json]`: per Link, the linked cluster's
//! gateway as the mirror controller last probed it (alive, round-trip latency) and how many
//! services are mirrored from there, from the Link's status.

use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;

use super::super::ClusterArgs;
use super::super::check::Output;
use super::source::Source;

#[derive(Debug, Clone, clap::Args)]
pub struct GatewaysArgs {
    /// Local mode's directory of this cluster (`cnimesh-local up --dir DIR`): its cluster, a
    /// shorthand for `--kubeconfig DIR/kubeconfig`.
    #[arg(long, value_name = "DIR")]
    pub local: Option<PathBuf>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// One row: a linked cluster's gateway.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub cluster: String,
    /// `ip:port`, or absent without a gateway.
    pub gateway: Option<String>,
    /// `up`, `lost` or `unknown` (no status yet).
    pub link: String,
    pub alive: Option<bool>,
    pub latency_ms: Option<f64>,
    pub mirrored_services: usize,
    /// Why the gateway is not alive, when the probe said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub async fn main(cluster: &ClusterArgs, args: &GatewaysArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let source = Source::Cluster(cluster.or_local(args.local.as_deref()).client().await?);
    let rows = rows(&source).await?;
    let text = match args.output {
        Output::Table => render_table(&rows),
        Output::Json => format!("{}\n", serde_json::to_string_pretty(&rows)?),
    };
    out.write_all(text.as_bytes())?;
    Ok(())
}

pub async fn rows(source: &Source) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for found in source.links().await? {
        let Ok(link) = &found.link else {
            rows.push(Row {
                cluster: found.name,
                gateway: None,
                link: "invalid".into(),
                alive: None,
                latency_ms: None,
                mirrored_services: 0,
                error: found.link.err(),
            });
            continue;
        };
        let status = source.status(link).map_err(anyhow::Error::msg)?;
        let spec = &link.spec;
        let gateway_status = status.as_ref().and_then(|s| s.gateway.clone());
        rows.push(Row {
            cluster: spec.target_cluster_name.clone(),
            gateway: spec.gateway_address.as_ref().map(|a| format!("{a}:{}", spec.gateway_port)),
            link: match status.as_ref().and_then(|s| s.state) {
                Some(cnimesh_mirror::crd::LinkState::Up) => "up".into(),
                Some(cnimesh_mirror::crd::LinkState::Lost) => "lost".into(),
                None => "unknown".into(),
            },
            alive: gateway_status.as_ref().map(|g| g.alive),
            latency_ms: gateway_status.as_ref().and_then(|g| g.latency_ms),
            mirrored_services: status.as_ref().map_or(0, |s| s.mirrors.len()),
            error: gateway_status.and_then(|g| g.error),
        });
    }
    Ok(rows)
}

/// Aligned columns, `-` for what is unknown.
pub fn render_table(rows: &[Row]) -> String {
    if rows.is_empty() {
        return "no Link in this cluster\n".into();
    }
    let header = ["CLUSTER", "GATEWAY", "LINK", "ALIVE", "LATENCY", "SERVICES"].map(String::from);
    let mut table = vec![header.to_vec()];
    for r in rows {
        let alive = match (r.gateway.is_some(), r.alive) {
            (false, _) => "-".to_string(),
            (true, Some(true)) => "yes".to_string(),
            (true, Some(false)) => "no".to_string(),
            (true, None) => "?".to_string(),
        };
        table.push(vec![
            r.cluster.clone(),
            r.gateway.clone().unwrap_or_else(|| "-".into()),
            r.link.clone(),
            alive,
            r.latency_ms.map_or_else(|| "-".into(), |ms| format!("{ms:.1}ms")),
            r.mirrored_services.to_string(),
        ]);
    }
    let widths: Vec<usize> =
        (0..6).map(|c| table.iter().map(|row| row[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in &table {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    for r in rows.iter().filter(|r| r.error.is_some()) {
        out.push_str(&format!("{}: {}\n", r.cluster, r.error.as_deref().unwrap_or_default()));
    }
    out
}
