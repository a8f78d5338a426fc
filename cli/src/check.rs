//! `cnimesh check [--pre] [-o table|json]`: the mesh's health as an operator needs to see it,
//! like `linkerd check`. Every check runs (a failure does not hide the next problem); checks that
//! cannot run because something they need failed are reported as skipped, saying why. Each
//! warning or failure carries a hint: what to do about it. The exit code is non-zero when any
//! check failed; warnings alone exit 0.
//!
//! The layers keep it testable against a mocked API server: [`run_checks`] reads the cluster
//! (given a client and `now`, never the wall clock) and returns [`Check`]s; [`render_table`] and
//! [`render_json`] are pure. Modules by concern: `kubernetes` (API, version, permissions,
//! `--pre`), `control` (Deployment, sidecar mode), `pki` (webhook registration, certificates),
//! `nodes` (node agents, live capture verification), `meshed` (proxies' readiness and
//! certificates), `trust` (what is served and trusted, not stored: the webhook's certificate,
//! the issuer in use against proxies' anchors, the rotation's step, proxies' versions), `certs`
//! (pure X.509 helpers), `report` (types and renderers).
//!
//! Layer: runtime (operator CLI).

mod certs;
mod control;
mod kubernetes;
mod meshed;
#[cfg(test)]
pub(crate) mod mock;
mod nodes;
mod pki;
mod report;
#[cfg(test)]
mod tests;
mod trust;

use std::io::Write;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;

pub use self::kubernetes::{RBAC_HINT, UNREACHABLE_HINT};
pub use self::meshed::proxy_hint;
pub use self::report::{Category, Check, Report, Status, render_json, render_table, success};
use super::ClusterArgs;
/// Reading pods' endpoints through the API server: shared with `stat` and `edges`.
use super::pod_proxy::{CONCURRENCY, kube_error, pod_proxy_get};
use super::query_error::QueryError;
/// docs/architecture.md, "Names and numbers": the control plane's and the node agents' namespaces and names (the agents'
/// DaemonSet, container and `app.kubernetes.io/name` label).
pub use cnimesh_common::names::{AGENT_NAME, AGENT_NAMESPACE};
use cnimesh_common::names::{CONTROL_NAME, CONTROL_NAMESPACE};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Check what `install` needs instead of an installed mesh.
    #[arg(long)]
    pub pre: bool,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub async fn main(cluster: &ClusterArgs, args: CheckArgs) -> anyhow::Result<ExitCode> {
    let checks = match cluster.client().await {
        Ok(client) => run_checks(client, args.pre, SystemTime::now()).await,
        // Reported as a check, not an error, so `-o json` consumers always get a report.
        Err(e) => vec![Check::fail(
            &Category::KubernetesApi,
            "can build a Kubernetes client",
            cnimesh_common::error::with_causes(e.to_string(), e.as_ref()),
            "pass --kubeconfig / --context, or set KUBECONFIG",
        )],
    };
    let text = render(args.output, &checks);
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(ExitCode::from(exit_code(&checks)))
}

pub fn render(output: Output, checks: &[Check]) -> String {
    match output {
        Output::Table => render_table(checks),
        Output::Json => render_json(checks),
    }
}

/// 1 when any check failed, else 0.
pub fn exit_code(checks: &[Check]) -> u8 {
    if success(checks) { 0 } else { 1 }
}

/// Every check, in report order. `now` is when certificates are judged.
pub async fn run_checks(client: kube::Client, pre: bool, now: SystemTime) -> Vec<Check> {
    let now = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let mut checks = Vec::new();
    let Some(version) = kubernetes::api(&client, pre, &mut checks).await else {
        let rest: &[Category] = if pre {
            &[Category::Permissions, Category::PreInstall]
        } else {
            &[
                Category::Permissions,
                Category::ControlPlane,
                Category::Webhook,
                Category::Certificates,
                Category::NodeAgents,
                Category::MeshedPods,
            ]
        };
        for category in rest {
            checks.push(Check::skip(category, "all checks", "skipped: the Kubernetes API is not reachable"));
        }
        return checks;
    };
    if pre {
        kubernetes::pre_install(&client, &version, &mut checks).await;
        return checks;
    }
    kubernetes::check_permissions(&client, &mut checks).await;
    control::check(&client, &version, &mut checks).await;
    pki::check(&client, now, &mut checks).await;
    nodes::check(&client, &mut checks).await;
    meshed::check(&client, now, &mut checks).await;
    trust::check(&client, &mut checks).await;
    checks
}

/// The hint for a failed read of the cluster, chosen by the error's type (never its text): the
/// grant to add (`refused`) when the API server refused the read, how to reach it when it did not
/// answer, and its own health when it answered with another error.
fn read_hint(error: &kube::Error, refused: &str) -> String {
    match QueryError::from_kube("", error) {
        QueryError::Forbidden { .. } => refused.to_string(),
        QueryError::Unreachable { .. } => UNREACHABLE_HINT.to_string(),
        _ => API_ERROR_HINT.to_string(),
    }
}

/// What to look at when the API server answers a read with an error that is not a refusal.
const API_ERROR_HINT: &str = "the API server failed the read (not a permission problem): see its message and its health (`kubectl get --raw /readyz`)";

/// The pod is being deleted (`deletionTimestamp`): on its way out of a rollout, not a replica to judge.
fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// The pod's Ready condition is True.
fn pod_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
