//! `cnimesh`, the operator's command line: install, check, inject/uninject, uninstall, stat,
//! edges, tap, top, diagnostics, authz, dashboard, ca, tracing, multicluster, external-workload,
//! version, completion. It renders the manifests under `daemonset/` (the single source of truth: what
//! `install` prints is those files plus generated certificates), applies the webhook's pure
//! mutation to YAML offline, and reads the cluster with kube-rs, never with a shell on a node.
//!
//! Built on the control plane's models (cnimesh-model: the webhook's mutation, the manifests'
//! names, the policy index, the tap relay's query and lines), never on its servers
//! (cnimesh-control), and never the other way round.
//!
//! Layers: yaml | query_error → pod_proxy → manifests → install → ca | check | inject | uninstall | upgrade | prune | stat | tracing_addon → tap | identity_rotate | external_workload | diagnostics | policy | multicluster → authz | top → dashboard | diagnostics_role

pub mod authz;
pub mod ca;
pub mod check;
pub mod dashboard;
pub mod diagnostics;
#[cfg(test)]
mod diagnostics_role;
pub mod external_workload;
pub mod identity_rotate;
pub mod inject;
pub mod install;
pub mod manifests;
pub mod multicluster;
pub mod pod_proxy;
pub mod policy;
pub mod prune;
pub mod query_error;
pub mod stat;
pub mod tap;
pub mod top;
pub mod tracing_addon;
pub mod uninstall;
pub mod upgrade;
pub mod yaml;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, CommandFactory, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cnimesh", version, about = "cnimesh service mesh: install, check and mesh workloads")]
pub struct Cli {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// How to reach the cluster (the commands that need it).
#[derive(Debug, Clone, Default, Args)]
pub struct ClusterArgs {
    /// Kubeconfig file [default: $KUBECONFIG, then ~/.kube/config, then in-cluster].
    #[arg(long, global = true, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use [default: the current context].
    #[arg(long, global = true)]
    pub context: Option<String>,
}

/// The kubeconfig `cnimesh-local up --dir DIR` writes in DIR: its API server's administrator's.
pub const LOCAL_KUBECONFIG: &str = "kubeconfig";

impl ClusterArgs {
    /// With `--local DIR`, local mode's cluster: `--kubeconfig DIR/kubeconfig` (its current
    /// context); otherwise these arguments. Local mode runs a real API server, so every command
    /// reads it as it reads a cluster's.
    pub fn or_local(&self, local: Option<&std::path::Path>) -> Self {
        match local {
            Some(dir) => Self { kubeconfig: Some(dir.join(LOCAL_KUBECONFIG)), context: None },
            None => self.clone(),
        }
    }

    /// A kube client from the kubeconfig (or the in-cluster service account).
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        kube::Client::try_from(self.config().await?).context("building the Kubernetes client")
    }

    /// The client's configuration (`multicluster link` prints its API server's URL).
    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        let options = kube::config::KubeConfigOptions { context: self.context.clone(), ..Default::default() };
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options).await.context("the kubeconfig")?
            }
            None if self.context.is_some() => {
                kube::Config::from_kubeconfig(&options).await.context("the kubeconfig")?
            }
            None => kube::Config::infer().await.context("no usable kubeconfig or in-cluster configuration")?,
        };
        Ok(config)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print every manifest of the mesh, for `kubectl apply -f -`.
    Install(install::InstallArgs),
    /// Print this version's manifests for a cluster that runs the mesh, reusing its trust
    /// anchors, issuer, webhook CA and install values, for `kubectl apply -f -`.
    Upgrade(upgrade::UpgradeArgs),
    /// Print the mesh objects in the cluster that this version no longer ships, for `kubectl delete -f -`.
    Prune(prune::PruneArgs),
    /// Check the mesh's health in the cluster (or, with --pre, that it can be installed).
    Check(check::CheckArgs),
    /// Add the proxy to workloads in YAML (files, a directory or stdin), as the webhook would.
    Inject(inject::InjectArgs),
    /// Remove the proxy from workloads in YAML.
    Uninject(inject::UninjectArgs),
    /// Print what `kubectl delete -f -` needs to remove the mesh.
    Uninstall(uninstall::UninstallArgs),
    /// Golden metrics per workload (success rate, RPS, latency, TCP connections, mTLS) from the
    /// proxies' own metrics.
    Stat(stat::StatArgs),
    /// Who talks to whom: source and destination workloads with their identities and mTLS.
    Edges(stat::EdgesArgs),
    /// Live requests and responses seen by a resource's proxies (through the control plane).
    Tap(tap::TapArgs),
    /// A resource's live requests aggregated by source, destination, method and path.
    Top(top::TopArgs),
    /// What one proxy knows (metrics, endpoints, identity, policy) and what Destination serves,
    /// without exec.
    Diagnostics(diagnostics::DiagnosticsArgs),
    /// Which Servers, AuthorizationPolicies and routes apply to a workload, and what a client may
    /// reach (`--identity`, `--from`).
    Authz(authz::AuthzArgs),
    /// Least-privilege authorization from observed traffic: `policy generate NAMESPACE` prints
    /// the Servers and authorizations that allow exactly what the namespace's workloads received.
    Policy {
        #[command(subcommand)]
        command: policy::PolicyCommand,
    },
    /// The mesh as a web page on localhost: topology, workloads, routes, authorization, live tap
    /// and check, from the proxies (no Prometheus needed).
    Dashboard(dashboard::DashboardArgs),
    /// Certificate authority helpers: the mesh's trust anchor and issuer, the webhook's certificate.
    Ca {
        #[command(subcommand)]
        command: ca::CaCommand,
    },
    /// The mesh's identity: rotate the trust anchor and the issuer without failed requests.
    Identity {
        #[command(subcommand)]
        command: identity_rotate::IdentityCommand,
    },
    /// Distributed tracing: the OpenTelemetry Collector + Jaeger add-on the mesh's spans go to.
    Tracing {
        #[command(subcommand)]
        command: tracing_addon::TracingCommand,
    },
    /// Multicluster: install the gateway, link clusters, check links and gateways.
    Multicluster {
        #[command(subcommand)]
        command: multicluster::MulticlusterCommand,
    },
    /// Workloads outside Kubernetes: a one-time join token for an ExternalWorkload's host, and
    /// the list of ExternalWorkloads.
    ExternalWorkload {
        #[command(subcommand)]
        command: external_workload::ExternalWorkloadCommand,
    },
    /// Print the client's version and, when reachable, the control plane's.
    Version(VersionArgs),
    /// Print a shell completion script.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Only the client's version: do not contact the cluster.
    #[arg(long)]
    pub client: bool,
}

/// The process entry point.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(error) = init_logging() {
        eprintln!("cnimesh: {error}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("cnimesh: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr and are quiet unless asked for: stdout is for manifests and reports. The
/// format from CNIMESH_LOG_FORMAT (plain or json).
fn init_logging() -> Result<(), cnimesh_common::logging::FormatError> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CNIMESH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    cnimesh_common::logging::init(filter)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // Which command ran, for logs read later (CNIMESH_LOG=debug).
    tracing::debug!(version = env!("CARGO_PKG_VERSION"), "cnimesh {}", command_name(&cli.command));
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Install(args) => {
            let rendered = runtime()?.block_on(install::main(&cli.cluster, args))?;
            out.write_all(rendered.as_bytes())?;
        }
        Command::Upgrade(args) => {
            let text = runtime()?.block_on(upgrade::main(&cli.cluster, args))?;
            out.write_all(text.as_bytes())?;
        }
        Command::Prune(args) => {
            let text = runtime()?.block_on(prune::main(&cli.cluster, args))?;
            out.write_all(text.as_bytes())?;
        }
        Command::Check(args) => return runtime()?.block_on(check::main(&cli.cluster, args)),
        Command::Inject(args) => runtime()?.block_on(inject::inject_main(&cli.cluster, args, &mut out))?,
        Command::Uninject(args) => inject::uninject_main(args, &mut out)?,
        Command::Uninstall(args) => {
            let text = runtime()?.block_on(uninstall::main(&cli.cluster, args))?;
            out.write_all(text.as_bytes())?;
        }
        Command::Stat(args) => runtime()?.block_on(stat::stat_main(&cli.cluster, args, &mut out))?,
        Command::Edges(args) => runtime()?.block_on(stat::edges_main(&cli.cluster, args, &mut out))?,
        Command::Tap(args) => runtime()?.block_on(tap::tap_main(&cli.cluster, args, &mut out))?,
        Command::Top(args) => runtime()?.block_on(top::top_main(&cli.cluster, args, &mut out))?,
        Command::Diagnostics(args) => runtime()?.block_on(diagnostics::main(&cli.cluster, args, &mut out))?,
        Command::Authz(args) => runtime()?.block_on(authz::main(&cli.cluster, args, &mut out))?,
        Command::Policy { command } => runtime()?.block_on(policy::main(&cli.cluster, command, &mut out))?,
        Command::Dashboard(args) => runtime()?.block_on(dashboard::main(&cli.cluster, args, &mut out))?,
        Command::Ca { command } => ca::main(command, &mut out)?,
        Command::Identity { command } => runtime()?.block_on(identity_rotate::main(&cli.cluster, command, &mut out))?,
        Command::Tracing { command } => tracing_addon::main(command, &mut out)?,
        Command::Multicluster { command } => {
            let code = runtime()?.block_on(multicluster::main(&cli.cluster, command, &mut out))?;
            out.flush()?;
            return Ok(code);
        }
        Command::ExternalWorkload { command } => {
            runtime()?.block_on(external_workload::main(&cli.cluster, command, &mut out))?
        }
        Command::Version(args) => {
            writeln!(out, "client: {}", env!("CARGO_PKG_VERSION"))?;
            if !args.client {
                let server = runtime()?.block_on(control_plane_version(&cli.cluster));
                writeln!(out, "control plane: {}", server.unwrap_or_else(|e| format!("unavailable ({e:#})")))?;
            }
        }
        Command::Completion { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "cnimesh", &mut out);
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The subcommand's name as typed.
fn command_name(command: &Command) -> String {
    let debug = format!("{command:?}");
    let name = debug.split(['(', ' ', '{']).next().unwrap_or_default();
    name.to_lowercase()
}

/// The version the control plane's Deployment runs: its image tag.
async fn control_plane_version(cluster: &ClusterArgs) -> anyhow::Result<String> {
    use k8s_openapi::api::apps::v1::Deployment;
    let client = cluster.client().await?;
    let api: kube::Api<Deployment> = kube::Api::namespaced(client, cnimesh_common::names::CONTROL_NAMESPACE);
    let deployment =
        api.get(cnimesh_common::names::CONTROL_NAME).await.context("reading the control plane's Deployment")?;
    let image = deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().find(|c| c.name == cnimesh_common::names::CONTROL_NAME))
        .and_then(|c| c.image)
        .context("the Deployment has no cnimesh-control container image")?;
    let tag = image.rsplit_once(':').map(|(_, tag)| tag).filter(|t| !t.contains('/')).unwrap_or("unknown");
    Ok(format!("{tag} ({image})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn completion_scripts_name_the_subcommands() {
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "cnimesh", &mut script);
            let script = String::from_utf8(script).unwrap();
            for sub in [
                "install",
                "upgrade",
                "prune",
                "check",
                "inject",
                "uninject",
                "uninstall",
                "stat",
                "edges",
                "tap",
                "top",
                "diagnostics",
                "authz",
                "policy",
                "dashboard",
                "ca",
                "identity",
                "tracing",
                "multicluster",
                "external-workload",
                "version",
                "completion",
            ] {
                assert!(script.contains(sub), "{shell:?} completion lacks {sub}");
            }
        }
    }
}
