//! Command line: `cnimesh-mirror serve`, what the mirror's Deployment runs. Every flag can also
//! come from a `CNIMESH_MIRROR_*` variable. It reaches this cluster's API server as in-cluster
//! config or `KUBECONFIG` says (its own ServiceAccount), and each linked cluster with its Link's
//! credentials.
//!
//! Layer: runtime: flags in, the controller, its writer election and the admin listener out.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use cnimesh_identity::DEFAULT_TRUST_DOMAIN;
use cnimesh_model::inject::DEFAULT_CLUSTER_DOMAIN;
use cnimesh_runtime::leader::{self, ElectionConfig};
use cnimesh_runtime::process::{parse_duration, shutdown_signal};
use tokio::sync::watch;

use crate::controller::{MIRROR_WRITE, MirrorController};
use crate::metrics::Metrics;

#[derive(Debug, Parser)]
#[command(
    name = "cnimesh-mirror",
    version,
    about = "cnimesh multicluster mirror: mirrors linked clusters' exported Services"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Follow the Links and mirror their clusters' exported Services here.
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// The namespace of the Links, their credentials Secrets and the writer Lease (the control
    /// plane's).
    #[arg(long, env = "CNIMESH_MIRROR_NAMESPACE", default_value = cnimesh_common::names::CONTROL_NAMESPACE)]
    namespace: String,
    /// This cluster's trust domain: the identity of its own federated members.
    #[arg(long, env = "CNIMESH_MIRROR_TRUST_DOMAIN", default_value = DEFAULT_TRUST_DOMAIN)]
    trust_domain: String,
    /// This cluster's DNS domain.
    #[arg(long, env = "CNIMESH_MIRROR_CLUSTER_DOMAIN", default_value = DEFAULT_CLUSTER_DOMAIN)]
    cluster_domain: String,
    /// Admin (HTTP: /metrics, /ready, /live) listen address.
    #[arg(long, env = "CNIMESH_MIRROR_ADMIN_ADDR", default_value = "0.0.0.0:9990")]
    admin_addr: SocketAddr,
    /// How long the writer Lease holds without renewal: only its holder writes mirrors, so
    /// replicas never both write.
    #[arg(long, env = "CNIMESH_MIRROR_LEASE_DURATION", default_value = "30s", value_parser = parse_duration)]
    lease_duration: Duration,
    /// How often the leader renews the Lease and followers look at it.
    #[arg(long, env = "CNIMESH_MIRROR_LEASE_RENEW_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    lease_renew_interval: Duration,
    /// This replica's name in the Lease (the Deployment sets the pod name; a random suffix is added).
    #[arg(long, env = "CNIMESH_MIRROR_POD_NAME", default_value = cnimesh_common::names::MIRROR_NAME)]
    pod_name: String,
}

impl ServeArgs {
    fn election(&self) -> anyhow::Result<ElectionConfig> {
        let election = ElectionConfig {
            namespace: self.namespace.clone(),
            identity: ElectionConfig::unique_identity(&self.pod_name),
            lease_duration: self.lease_duration,
            renew_interval: self.lease_renew_interval,
        };
        election.validate()?;
        Ok(election)
    }
}

/// The process entry point.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("CNIMESH_MIRROR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if let Err(error) = cnimesh_common::logging::init(filter) {
        eprintln!("cnimesh-mirror: {error}");
        return ExitCode::from(2);
    }
    let Command::Serve(args) = cli.command;
    let result =
        tokio::runtime::Runtime::new().context("starting the async runtime").and_then(|r| r.block_on(serve(args)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // stderr is also where logs go: one line, not a log record and a copy.
            eprintln!("cnimesh-mirror: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let election = args.election()?;
    let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
    let admin =
        tokio::net::TcpListener::bind(args.admin_addr).await.with_context(|| format!("binding {}", args.admin_addr))?;
    let metrics = Arc::new(Metrics::default());
    let (stop, stopped) = watch::channel(false);
    let (leadership, elector) = leader::spawn(client.clone(), MIRROR_WRITE, election, metrics.clone(), stopped.clone());
    let controller = MirrorController {
        client,
        namespace: args.namespace,
        trust_domain: args.trust_domain,
        cluster_domain: args.cluster_domain,
        metrics: metrics.clone(),
        leadership,
    };
    tracing::info!(admin = %admin.local_addr()?, namespace = %controller.namespace, "following Links");
    let controller = tokio::spawn(controller.run(stopped.clone()));
    let admin = tokio::spawn(crate::admin::serve(admin, metrics, until(stopped)));
    shutdown_signal().await;
    tracing::info!("shutting down");
    stop.send_replace(true);
    // The elector releases its Lease (bounded by a renew interval) so a follower takes over.
    for task in [elector, controller, admin] {
        if tokio::time::timeout(Duration::from_secs(10), task).await.is_err() {
            tracing::warn!("a task did not stop in time");
        }
    }
    Ok(())
}

async fn until(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_is_consistent_and_refuses_a_renewal_slower_than_a_third_of_the_lease() {
        Cli::command().debug_assert();
        let cli =
            Cli::try_parse_from(["cnimesh-mirror", "serve", "--lease-duration", "3s", "--lease-renew-interval", "2s"])
                .unwrap();
        let Command::Serve(args) = cli.command;
        assert!(args.election().is_err());
        let cli = Cli::try_parse_from(["cnimesh-mirror", "serve"]).unwrap();
        let Command::Serve(args) = cli.command;
        assert_eq!((args.namespace.as_str(), args.admin_addr.port()), ("cnimesh", 9990));
        assert!(args.election().is_ok());
    }
}
