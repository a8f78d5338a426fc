//! `cnimesh authz RESOURCE`: which Servers select a workload's ports, which AuthorizationPolicies
//! (and the MeshTLSAuthentications/NetworkAuthentications they require) apply to each, which
//! routes attach to the Services in front of it, and, for a client (`--identity`, `--from`),
//! whether it may reach each port and why.
//!
//! The answer is the control plane's own: the objects are listed from the API server and fed to
//! the control plane's policy index ([`cnimesh_model::policy::Index`]), the code that answers the
//! proxies' `InboundServerPolicies` (so the same defaults, selectors and precedence), and the
//! decision is made on the authorizations that index returns, as the proxy checks them.
//!
//! Ports in audit mode also get their would-be denials: the selected pods' proxies'
//! `/metrics`, read through the API server's pod proxy, summed per Server and client ([`audit`]).
//!
//! Inside: [`list`] (reading the cluster) and [`evaluate`] (pure: objects to report), [`audit`]
//! (pure: metrics to would-be denials), then [`render`] (pure: report to text). `--local DIR`
//! reads local mode's cluster through its API server.

pub mod audit;
pub mod evaluate;
pub mod list;
pub mod render;

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};

use crate::ClusterArgs;
use crate::query_error::QueryError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct AuthzArgs {
    /// The workload: `deploy/NAME`, `sts/NAME`, `ds/NAME`, `pod/NAME` or `ns/NAME` (every pod of a
    /// namespace).
    pub resource: String,
    /// The workload's namespace.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// A client identity to check: `SA.NS` (a ServiceAccount) or a full identity name.
    #[arg(long, conflicts_with = "from")]
    pub identity: Option<String>,
    /// A client workload to check (`deploy/NAME`, `pod/NAME`, …): its pod's ServiceAccount and
    /// address.
    #[arg(long)]
    pub from: Option<String>,
    /// The namespace of `--from` [default: the workload's].
    #[arg(long)]
    pub from_namespace: Option<String>,
    /// The mesh's trust domain (as given to install).
    #[arg(long, default_value = cnimesh_identity::DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Local mode's directory (`cnimesh-local up --dir DIR`): its cluster, a shorthand for
    /// `--kubeconfig DIR/kubeconfig`.
    #[arg(long, value_name = "DIR")]
    pub local: Option<PathBuf>,
}

/// Lists what the command needs from the cluster (or local mode), evaluates and writes the
/// report.
pub async fn main(cluster: &ClusterArgs, args: AuthzArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let client = cluster.or_local(args.local.as_deref()).client().await?;
    let text = report(&client, &args).await?;
    out.write_all(text.as_bytes()).context("writing the report")?;
    Ok(())
}

/// The report rendered as `args.output` asks (the command's output).
pub async fn report(client: &kube::Client, args: &AuthzArgs) -> Result<String, QueryError> {
    Ok(render(&query(client, args).await?, args.output))
}

/// The report as `output` renders it: the table, or the report itself as JSON.
pub fn render(report: &evaluate::Report, output: Output) -> String {
    match output {
        Output::Json => serde_json::to_string_pretty(report).expect("the report serialises") + "\n",
        Output::Table => render::table(report),
    }
}

/// The command's core on a kube client (the tests' mocked API server, or the cluster): the typed
/// report, which the command renders and the dashboard serves; why it could not be made, typed.
pub async fn query(client: &kube::Client, args: &AuthzArgs) -> Result<evaluate::Report, QueryError> {
    let workload = list::Workload::parse(&args.resource, &args.namespace)?;
    let objects = list::objects(client, &workload.namespace).await?;
    let pods = list::select(client, &workload, &objects.pods).await?;
    let client_spec = match (&args.identity, &args.from) {
        (Some(identity), _) => Some(evaluate::Client::from_identity(identity, &args.trust_domain)?),
        (None, Some(from)) => {
            let ns = args.from_namespace.clone().unwrap_or_else(|| args.namespace.clone());
            let from = list::Workload::parse(from, &ns)?;
            let listed = if from.namespace == workload.namespace {
                objects.pods.clone()
            } else {
                list::pods(client, &from.namespace).await?
            };
            let client_pods = list::select(client, &from, &listed).await?;
            Some(evaluate::Client::from_pod(&from.display(), &client_pods[0], &args.trust_domain)?)
        }
        (None, None) => None,
    };
    let config = cnimesh_model::policy::Config {
        trust_domain: args.trust_domain.clone(),
        ..cnimesh_model::policy::Config::default()
    };
    let mut report =
        evaluate::report(&workload.display(), &workload.namespace, &pods, &objects, config, client_spec.as_ref());
    if report.ports.iter().any(|p| p.audit) {
        let meshed = |pod: &&k8s_openapi::api::core::v1::Pod| {
            pod.spec.iter().flat_map(|s| &s.containers).any(|c| c.name == cnimesh_common::names::PROXY_CONTAINER)
        };
        for pod in pods.iter().filter(meshed) {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let port = cnimesh_common::names::PROXY_ADMIN_PORT;
            match crate::pod_proxy::pod_proxy_get(client, &workload.namespace, &name, port, "metrics").await {
                Ok(text) => report.would_be_denials.extend(audit::from_metrics(&name, &text)),
                Err(e) => report.notes.push(format!("would-be denials of pod {name} unknown: its metrics: {e}")),
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests;
