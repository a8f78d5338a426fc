//! `cnimesh multicluster …`, the operator's side of linking clusters, on Linkerd's
//! model: `install` prints the gateway, the mirror reader and the control plane's extra RBAC;
//! `link` (run against the target cluster B) prints the Link and the credentials Secret to apply
//! to cluster A; `unlink` undoes it; `check` and `gateways` read A's Links and their status.
//!
//! Every command works against a cluster (kubeconfig); `--local DIR` is local mode's (its API
//! server, `--kubeconfig DIR/kubeconfig`). docs/tasks/multicluster.md is the operator's guide.
//!
//! Modules: `install` (manifests), `target` (what `link` reads of cluster B), `link` (Link and
//! Secret, unlink), `source` (A's Links, Secrets, status and anchors), `probe` (TCP + TLS to a
//! gateway), `issuer_constraints` (the linked issuer's name constraint), `check`, `gateways`
//! (reports).
//!
//! Layer: runtime (operator CLI).

pub mod check;
pub mod gateways;
pub mod install;
pub mod issuer_constraints;
pub mod link;
pub mod probe;
pub mod source;
pub mod target;
#[cfg(test)]
mod tests;

use std::io::Write;
use std::process::ExitCode;

use super::ClusterArgs;

#[derive(Debug, clap::Subcommand)]
pub enum MulticlusterCommand {
    /// Print the multicluster objects for `kubectl apply -f -`: the Link CRD, the gateway
    /// (namespace cnimesh-multicluster), the mirror reader linked clusters read this one as,
    /// and the control plane's permissions for mirrors and Links.
    Install(install::InstallArgs),
    /// Run against the cluster to link TO: print the Link and the credentials Secret that the
    /// other cluster applies (`| kubectl --context OTHER apply -f -`).
    Link(link::LinkArgs),
    /// Print the Link and Secret of a linked cluster for `kubectl delete -f -` (the mirror
    /// controller then removes its mirrors).
    Unlink(link::UnlinkArgs),
    /// Check every Link: its credentials, the remote API, the gateway's reachability and
    /// certificate, the trust anchors, and the mirrors' freshness.
    Check(check::CheckArgs),
    /// Each linked cluster's gateway: alive, probe latency, mirrored services.
    Gateways(gateways::GatewaysArgs),
}

/// Runs one subcommand; stdout gets manifests or reports, the exit code says whether checks passed.
pub async fn main(
    cluster: &ClusterArgs,
    command: MulticlusterCommand,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    match command {
        MulticlusterCommand::Install(args) => out.write_all(install::main(cluster, &args).await?.as_bytes())?,
        MulticlusterCommand::Link(args) => out.write_all(link::link_main(cluster, &args).await?.as_bytes())?,
        MulticlusterCommand::Unlink(args) => out.write_all(link::unlink_main(&args)?.as_bytes())?,
        MulticlusterCommand::Check(args) => return check::main(cluster, &args, out).await,
        MulticlusterCommand::Gateways(args) => gateways::main(cluster, &args, out).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `cluster-credentials-<cluster>`: the Secret a Link names.
pub fn credentials_secret_name(cluster: &str) -> String {
    format!("cluster-credentials-{cluster}")
}

/// The gateway's identity in a cluster of `trust_domain` (the contract's).
pub fn gateway_identity(trust_domain: &str) -> String {
    use cnimesh_common::names::{GATEWAY_NAME, MULTICLUSTER_NAMESPACE};
    format!("{GATEWAY_NAME}.{MULTICLUSTER_NAMESPACE}.serviceaccount.identity.cnimesh.{trust_domain}")
}

/// A cluster name is a DNS label (mirrors are `<service>-<cluster>`).
pub fn check_cluster_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok { Ok(()) } else { Err(format!("cluster name {name:?}: expected a DNS label (a-z, 0-9, '-', at most 63)")) }
}
