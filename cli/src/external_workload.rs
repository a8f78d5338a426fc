//! `cnimesh external-workload join|list`: workloads outside Kubernetes.
//!
//! `join NAME` makes a one-time, short-lived join token bound to ExternalWorkload NAME (its uid
//! and service account) and prints it once; only the token's SHA-256 is stored, in the control
//! plane's namespace (`cnimesh_model::identity::join`). The host's proxy presents it once to
//! Identity (`--identity-join-token-file`) and renews with its own certificate from then on. A
//! new `join` replaces the workload's pending token. `list` shows the ExternalWorkloads and
//! whether a token is pending for each.
//!
//! Layer: commands (reads and writes the cluster through kube-rs).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use crate::ClusterArgs;
use cnimesh_common::names::CONTROL_NAMESPACE;
use cnimesh_model::external::join_store::JoinStore;
use cnimesh_model::external::{ExternalRecord, ExternalWorkload};
use cnimesh_model::identity::join::{self, JoinToken, Pending};

#[derive(Debug, Subcommand)]
pub enum ExternalWorkloadCommand {
    /// Print a one-time, short-lived join token for ExternalWorkload NAME: its host's proxy
    /// presents it once to get its first certificate, then renews with that certificate.
    Join(JoinArgs),
    /// List the ExternalWorkloads, their identity, and whether a join token is pending.
    List(ListArgs),
}

#[derive(Debug, Args)]
pub struct JoinArgs {
    /// The ExternalWorkload's name.
    pub name: String,
    /// Its namespace.
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// How long the token may be used (at most 24h), e.g. 10m, 1h.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// Write the token to this file (mode 0600) instead of printing it.
    #[arg(long)]
    pub output_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this namespace [default: every namespace].
    #[arg(short, long)]
    pub namespace: Option<String>,
}

pub async fn main(cluster: &ClusterArgs, command: ExternalWorkloadCommand, out: &mut impl Write) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    match command {
        ExternalWorkloadCommand::Join(args) => join(client, args, out).await,
        ExternalWorkloadCommand::List(args) => list(client, args, out).await,
    }
}

/// Makes, stores (its hash) and hands out one join token.
pub async fn join(client: kube::Client, args: JoinArgs, out: &mut impl Write) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.ttl.is_zero() && args.ttl <= join::MAX_TTL,
        "--ttl {}: a join token lives more than 0s and at most {}",
        humantime::format_duration(args.ttl),
        humantime::format_duration(join::MAX_TTL)
    );
    let store = JoinStore::new(client, CONTROL_NAMESPACE);
    let (workload, record) = store.workload(&args.namespace, &args.name).await?;
    let uid = workload.metadata.uid.as_deref().context("the ExternalWorkload has no uid")?;
    let token = JoinToken::generate(&args.namespace, &args.name)?;
    store.put(&token, &Pending::new(&token, uid, &record.service_account, args.ttl)).await?;
    let what = format!(
        "join token for ExternalWorkload {}/{} (identity of service account {:?}; usable once, expires in {}; a new join replaces it)",
        args.namespace,
        args.name,
        record.service_account,
        humantime::format_duration(args.ttl)
    );
    match &args.output_file {
        Some(path) => {
            cnimesh_common::fs::write_atomic(path, format!("{}\n", token.reveal()).as_bytes(), Some(0o600))
                .with_context(|| format!("writing {}", path.display()))?;
            writeln!(out, "{what} written to {}", path.display())?;
        }
        None => {
            eprintln!("{what}:");
            writeln!(out, "{}", token.reveal())?;
        }
    }
    Ok(())
}

async fn list(client: kube::Client, args: ListArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let workloads: Api<ExternalWorkload> = match &args.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let workloads = workloads.list(&Default::default()).await.context("listing ExternalWorkloads")?;
    // Who may not read the Secret sees "-" for every pending column.
    let secret = Api::<Secret>::namespaced(client, CONTROL_NAMESPACE).get_opt(join::SECRET_NAME).await.ok().flatten();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let rows: Vec<Vec<String>> = workloads
        .items
        .iter()
        .map(|w| {
            let (ns, name) =
                (w.metadata.namespace.clone().unwrap_or_default(), w.metadata.name.clone().unwrap_or_default());
            let pending = match &secret {
                None => "-".to_string(),
                Some(s) => s
                    .data
                    .as_ref()
                    .and_then(|d| d.get(&join::key(&ns, &name)))
                    .and_then(|v| serde_json::from_slice::<Pending>(&v.0).ok())
                    .map(|p| if p.expires > now { "yes".into() } else { "expired".into() })
                    .unwrap_or_else(|| "no".into()),
            };
            let (ips, state) = match ExternalRecord::from_crd(w) {
                Ok(r) => (
                    r.ips.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                    if r.revoked { "revoked".to_string() } else { "active".to_string() },
                ),
                Err(e) => (w.spec.workload_ips.join(","), format!("invalid: {e}")),
            };
            vec![ns, name, ips, w.spec.service_account_name.clone(), state, pending]
        })
        .collect();
    let headers = ["NAMESPACE", "NAME", "IPS", "SERVICE ACCOUNT", "STATE", "JOIN PENDING"];
    out.write_all(cnimesh_common::table::table(&headers, &rows).as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn args(name: &str, ttl: Duration, output_file: Option<PathBuf>) -> JoinArgs {
        JoinArgs { name: name.into(), namespace: "shop".into(), ttl, output_file }
    }

    #[tokio::test]
    async fn join_stores_only_the_hash_prints_the_token_once_and_writes_files_0600() {
        let api = cnimesh_apiserver::ClusterApi::new();
        api.put(serde_json::json!({"apiVersion": "workload.cnimesh.io/v1alpha1", "kind": "ExternalWorkload",
            "metadata": {"namespace": "shop", "name": "db-vm"},
            "spec": {"workloadIPs": ["192.0.2.10"], "serviceAccountName": "db"}}));
        let mut out = Vec::new();
        join(api.client(), args("db-vm", Duration::from_secs(600), None), &mut out).await.unwrap();
        let printed = String::from_utf8(out).unwrap();
        let token = JoinToken::parse(printed.trim().as_bytes()).expect("a join token is printed");
        let secret = api.get("v1", "Secret", CONTROL_NAMESPACE, join::SECRET_NAME).expect("the Secret");
        assert_eq!(secret["type"], join::SECRET_TYPE);
        let stored = secret.to_string();
        let secret_part = printed.trim().rsplit_once('.').unwrap().1;
        assert!(!stored.contains(secret_part), "only the hash is stored");

        // A second join replaces the first; to a file, 0600, nothing printed but where it went.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        let mut out = Vec::new();
        join(api.client(), args("db-vm", Duration::from_secs(60), Some(file.clone())), &mut out).await.unwrap();
        assert!(String::from_utf8(out).unwrap().contains("written to"));
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        let second = JoinToken::parse(std::fs::read(&file).unwrap().as_slice()).unwrap();
        assert_ne!(second.hash(), token.hash());
        let secret = api.get("v1", "Secret", CONTROL_NAMESPACE, join::SECRET_NAME).unwrap();
        let data = secret["data"].as_object().unwrap();
        assert_eq!(data.len(), 1, "one pending token per workload: {data:?}");

        let mut listed = Vec::new();
        list(api.client(), ListArgs { namespace: None }, &mut listed).await.unwrap();
        let listed = String::from_utf8(listed).unwrap();
        assert!(listed.contains("db-vm") && listed.contains("active") && listed.contains("yes"), "{listed}");
    }

    #[tokio::test]
    async fn join_refuses_a_missing_workload_and_a_ttl_out_of_range_naming_them() {
        let api = cnimesh_apiserver::ClusterApi::new();
        let e = join(api.client(), args("nope", Duration::from_secs(60), None), &mut Vec::new()).await.unwrap_err();
        assert!(format!("{e:#}").contains("ExternalWorkload shop/nope does not exist"), "{e:#}");
        let e =
            join(api.client(), args("nope", Duration::from_secs(2 * 86400), None), &mut Vec::new()).await.unwrap_err();
        assert!(format!("{e:#}").contains("--ttl 2days"), "{e:#}");
        assert!(api.get("v1", "Secret", CONTROL_NAMESPACE, join::SECRET_NAME).is_none(), "nothing stored");
    }
}
