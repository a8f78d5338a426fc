//! `cnimesh diagnostics`: what one proxy knows, and what Destination serves, read without exec.
//! - `proxy-metrics|endpoints|identity|policy POD`: the proxy's admin pages (`/metrics`,
//!   `/endpoints.json`, `/identity.json`, `/policy.json`) through the API server's pod proxy
//!   (`pods/NAME:4191/proxy/…`, [`crate::pod_proxy`]).
//! - `endpoints svc/NAME [--port P]`: the control plane's `/destination.json` through the API
//!   server's service proxy (`services/cnimesh-control:admin/proxy/…`), which answers from the
//!   Destination index the gRPC service streams from, so the two cannot drift.
//!
//! `--local DIR` reads local mode's cluster (`cnimesh-local up --dir DIR`) the same way, through its
//! API server (`--kubeconfig DIR/kubeconfig`). `--admin-addr HOST:PORT` reads one admin port directly (a
//! `kubectl port-forward`). Human output by default; `-o json` prints the page as the proxy or
//! control plane served it.
//!
//! Inside: [`fetch`] (reading pages: API server or direct) and [`render`] (pure: page to text),
//! neither importing the other.

pub mod fetch;
pub mod render;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

use crate::ClusterArgs;
use crate::query_error::QueryError;
use fetch::{Reach, Target};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For people: tables and summaries.
    Human,
    /// The page as served (metrics: one object per sample).
    Json,
}

#[derive(Debug, Args)]
pub struct DiagnosticsArgs {
    #[command(subcommand)]
    pub command: DiagnosticsCommand,
}

#[derive(Debug, Subcommand)]
pub enum DiagnosticsCommand {
    /// A proxy's own metrics (its `/metrics`).
    ProxyMetrics(PodArgs),
    /// A proxy's discovered endpoints (`POD`, `pod/NAME`), or what Destination serves for a
    /// service (`svc/NAME`, with `--port` when it has several ports).
    Endpoints(EndpointsArgs),
    /// A proxy's identity: its certificate, issuer, expiry and trust anchors.
    Identity(PodArgs),
    /// The inbound policy a proxy enforces on each port, where it came from and how fresh it is.
    Policy(PodArgs),
}

/// Where the proxy is.
#[derive(Debug, Clone, Args)]
pub struct PodArgs {
    /// The meshed pod (`NAME` or `pod/NAME`).
    pub pod: String,
    /// The pod's namespace [default: the kubeconfig context's; with --local, local mode's
    /// workloads' namespace].
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Human)]
    pub output: Output,
    /// Read an admin port directly (a port-forward) instead of through the API server: the
    /// proxy's for a pod, the control plane's for a service.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "local")]
    pub admin_addr: Option<SocketAddr>,
    /// Local mode's directory (`cnimesh-local up --dir DIR`): its cluster, a shorthand for
    /// `--kubeconfig DIR/kubeconfig`.
    #[arg(long, value_name = "DIR")]
    pub local: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct EndpointsArgs {
    #[command(flatten)]
    pub target: PodArgs,
    /// With `svc/NAME`: the service port [default: the service's only port].
    #[arg(long)]
    pub port: Option<u16>,
}

/// Runs one diagnostics command, writing its report to `out`.
pub async fn main(cluster: &ClusterArgs, args: DiagnosticsArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let (page, pod_args, port) = match args.command {
        DiagnosticsCommand::ProxyMetrics(a) => (Page::Metrics, a, None),
        DiagnosticsCommand::Endpoints(a) => (Page::Endpoints, a.target, a.port),
        DiagnosticsCommand::Identity(a) => (Page::Identity, a, None),
        DiagnosticsCommand::Policy(a) => (Page::Policy, a, None),
    };
    let target = Target::parse(&pod_args.pod)?;
    if matches!(target, Target::Service(_)) && page != Page::Endpoints {
        anyhow::bail!("{}: only `endpoints` reads a service; the others read a pod's proxy", pod_args.pod);
    }
    if port.is_some() && !matches!(target, Target::Service(_)) {
        anyhow::bail!("--port applies to a service (svc/NAME), not to the pod {}", pod_args.pod);
    }
    let (reach, namespace) = match pod_args.admin_addr {
        Some(addr) => (Reach::Direct(addr), pod_args.namespace.unwrap_or_else(|| "default".into())),
        None => {
            let client = cluster.or_local(pod_args.local.as_deref()).client().await?;
            let namespace = pod_args.namespace.unwrap_or_else(|| client.default_namespace().to_string());
            (Reach::Cluster(client), namespace)
        }
    };
    let text = report(&reach, page, &target, &namespace, port, pod_args.output).await?;
    out.write_all(text.as_bytes()).context("writing the report")?;
    Ok(())
}

/// Which page a command reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    Metrics,
    Endpoints,
    Identity,
    Policy,
}

impl Page {
    pub fn path(self) -> &'static str {
        match self {
            Self::Metrics => "metrics",
            Self::Endpoints => "endpoints.json",
            Self::Identity => "identity.json",
            Self::Policy => "policy.json",
        }
    }
}

/// The command's core: fetch the page for `target` and render it. Shared by the cluster and the
/// direct (local mode) paths and by the tests.
pub async fn report(
    reach: &Reach,
    page: Page,
    target: &Target,
    namespace: &str,
    port: Option<u16>,
    output: Output,
) -> Result<String, QueryError> {
    let (text, value) = fetch_page(reach, page, target, namespace, port).await?;
    Ok(match (output, target, page) {
        (Output::Json, Target::Pod(_), Page::Metrics) => render::pretty(&value),
        (Output::Json, _, _) => text,
        (Output::Human, Target::Service(_), _) => render::served(&value),
        (Output::Human, _, Page::Metrics) => render::metrics(&text),
        (Output::Human, _, Page::Endpoints) => render::endpoints(&value),
        (Output::Human, _, Page::Identity) => render::identity(&value),
        (Output::Human, _, _) => render::policy(&value),
    })
}

/// The page for `target` as a value, unrendered: the proxy's (or, for a service, the control
/// plane's) JSON document, the metrics page as its samples. What `-o json` prints and the
/// dashboard serves; why it could not be read, typed.
pub async fn query(
    reach: &Reach,
    page: Page,
    target: &Target,
    namespace: &str,
    port: Option<u16>,
) -> Result<serde_json::Value, QueryError> {
    Ok(fetch_page(reach, page, target, namespace, port).await?.1)
}

/// The page as read and as a value.
async fn fetch_page(
    reach: &Reach,
    page: Page,
    target: &Target,
    namespace: &str,
    port: Option<u16>,
) -> Result<(String, serde_json::Value), QueryError> {
    match target {
        Target::Service(name) => {
            let (authority, text) = fetch::destination(reach, namespace, name, port).await?;
            let value = serde_json::from_str(&text).map_err(|e| {
                QueryError::invalid(
                    format!("the control plane's answer for {authority}"),
                    format_args!("not JSON: {e}"),
                )
            })?;
            Ok((text, value))
        }
        Target::Pod(pod) => {
            let text = fetch::proxy_page(reach, namespace, pod, page.path()).await?;
            if page == Page::Metrics {
                let value = render::metrics_value(&text);
                return Ok((text, value));
            }
            let value = serde_json::from_str(&text).map_err(|e| {
                QueryError::invalid(format!("{namespace}/{pod}'s /{}", page.path()), format_args!("not JSON: {e}"))
            })?;
            Ok((text, value))
        }
    }
}

#[cfg(test)]
mod tests;
