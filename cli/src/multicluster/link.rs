//! `cnimesh multicluster link` and `unlink`. `link` runs against the cluster linked TO (B) and
//! prints, for cluster A, the Link (how to reach B: trust domain, gateway, identity) and the
//! Secret `cluster-credentials-<B>` holding a kubeconfig limited to the mirror reader's rights,
//! and the Role that lets A's mirror (and nothing else of A's) read that Secret.
//! With `--local DIR` B is local mode's cluster at DIR (its API server, as on a cluster).
//!
//! `unlink` prints the four objects for `kubectl delete -f -` (A's mirror controller removes the
//! mirrors it made).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, bail};
use base64::Engine;
use serde_json::{Value, json};

use super::super::{ClusterArgs, yaml};
use super::target;
use super::{check_cluster_name, credentials_secret_name, gateway_identity};
use cnimesh_common::names::{
    CONTROL_NAMESPACE, LINK_CREDENTIALS_KEY, LINK_CREDENTIALS_SECRET_TYPE, MIRROR_CLUSTER_NAME_LABEL, MIRROR_NAME,
    MIRROR_READER_SERVICE_ACCOUNT,
};
use cnimesh_mirror::crd::{API_VERSION, KIND, LinkSpec, ProbeSpec};
use cnimesh_mirror::kubeconfig;

#[derive(Debug, Clone, clap::Args)]
pub struct LinkArgs {
    /// The name the OTHER cluster gives this one: mirrors there are `<service>-<name>`.
    #[arg(long)]
    pub cluster_name: String,
    /// The gateway's address (IP or DNS name) [default: the gateway Service's LoadBalancer
    /// address].
    #[arg(long)]
    pub gateway_address: Option<String>,
    /// The gateway's mTLS port [default: the gateway Service's `mc-gateway` port, 4143].
    #[arg(long)]
    pub gateway_port: Option<u16>,
    /// The API server URL the other cluster reaches this one at [default: the kubeconfig's].
    #[arg(long, value_name = "URL")]
    pub api_server_address: Option<String>,
    /// This cluster's DNS domain [default: cluster.local].
    #[arg(long)]
    pub cluster_domain: Option<String>,
    /// Local mode's directory of the cluster linked to (`cnimesh-local up --dir DIR`): its
    /// cluster, a shorthand for `--kubeconfig DIR/kubeconfig`.
    #[arg(long, value_name = "DIR")]
    pub local: Option<PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct UnlinkArgs {
    /// The linked cluster's name (the Link's).
    #[arg(long)]
    pub cluster_name: String,
}

/// What a Link says about the target, gathered from the cluster or local mode's records.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub cluster_name: String,
    pub cluster_domain: String,
    pub trust_domain: String,
    pub gateway: Option<(String, u16)>,
    /// The kubeconfig's cluster `server`.
    pub server: String,
    /// The API server's CA (PEM), for `certificate-authority-data`.
    pub ca_pem: Option<Vec<u8>>,
    pub token: Option<String>,
}

pub async fn link_main(cluster: &ClusterArgs, args: &LinkArgs) -> anyhow::Result<String> {
    check_cluster_name(&args.cluster_name).map_err(|e| anyhow::anyhow!("--cluster-name: {e}"))?;
    let config = cluster.or_local(args.local.as_deref()).config().await?;
    let server = args.api_server_address.clone().unwrap_or_else(|| config.cluster_url.to_string());
    let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
    let target = kube_target(&client, args, server).await?;
    Ok(yaml::render(&render(&target)?))
}

/// B as a cluster: its control plane, gateway Service and mirror reader's token.
pub async fn kube_target(client: &kube::Client, args: &LinkArgs, server: String) -> anyhow::Result<Target> {
    let server = server.trim_end_matches('/').to_string();
    if !server.starts_with("https://") {
        bail!(
            "--api-server-address {server:?}: expected an https:// URL the other cluster can reach (a Link's credentials never travel in clear)"
        );
    }
    let trust_domain = target::trust_domain(client).await?;
    let gateway = target::gateway(client, args.gateway_address.as_deref(), args.gateway_port).await?;
    let (token, ca_pem) = target::reader_token(client).await?;
    Ok(Target {
        cluster_name: args.cluster_name.clone(),
        cluster_domain: args
            .cluster_domain
            .clone()
            .unwrap_or_else(|| cnimesh_model::inject::DEFAULT_CLUSTER_DOMAIN.into()),
        trust_domain,
        gateway: Some(gateway),
        server,
        ca_pem,
        token: Some(token),
    })
}

/// The kubeconfig the Secret carries: one cluster, one user (the mirror reader), one context.
pub fn kubeconfig(target: &Target) -> String {
    let name = &target.cluster_name;
    let mut cluster = json!({"server": target.server});
    if let Some(ca) = &target.ca_pem {
        cluster["certificate-authority-data"] = json!(base64::engine::general_purpose::STANDARD.encode(ca));
    }
    let user = match &target.token {
        Some(token) => json!({"token": token}),
        None => json!({}),
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": MIRROR_READER_SERVICE_ACCOUNT, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": MIRROR_READER_SERVICE_ACCOUNT}}],
        "current-context": name,
    });
    yaml::render(&[config])
}

/// The Link and its Secret, for cluster A.
pub fn render(target: &Target) -> anyhow::Result<Vec<Value>> {
    let name = &target.cluster_name;
    let secret = credentials_secret_name(name);
    let spec = LinkSpec {
        target_cluster_name: name.clone(),
        target_cluster_domain: target.cluster_domain.clone(),
        target_trust_domain: target.trust_domain.clone(),
        cluster_credentials_secret: secret.clone(),
        gateway_address: target.gateway.as_ref().map(|(a, _)| a.clone()),
        gateway_port: target.gateway.as_ref().map_or(cnimesh_common::names::PROXY_INBOUND_PORT, |(_, p)| *p),
        gateway_identity: target.gateway.as_ref().map(|_| gateway_identity(&target.trust_domain)),
        probe: ProbeSpec::default(),
    };
    if let Some((address, port)) = &target.gateway {
        anyhow::ensure!(*port != 0, "gateway port 0: pass --gateway-port");
        let ip = address.parse::<std::net::IpAddr>().is_ok();
        let dns = !address.is_empty() && address.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        anyhow::ensure!(ip || dns, "gateway address {address:?}: expected an IP or a DNS name");
    }
    let labels = BTreeMap::from([(MIRROR_CLUSTER_NAME_LABEL.to_string(), name.clone())]);
    let link = json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": CONTROL_NAMESPACE, "labels": labels},
        "spec": serde_json::to_value(&spec)?,
    });
    // Only what the other cluster's control plane accepts: its own reader checks it here.
    let text = kubeconfig(target);
    kubeconfig::parse(&text).map_err(|e| anyhow::anyhow!("the credentials for {name}: {e}"))?;
    let kubeconfig = base64::engine::general_purpose::STANDARD.encode(text);
    let secret_name = secret;
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": LINK_CREDENTIALS_SECRET_TYPE,
        "metadata": {"name": secret_name, "namespace": CONTROL_NAMESPACE, "labels": labels},
        "data": {LINK_CREDENTIALS_KEY: kubeconfig},
    });
    let (role, binding) = credentials_role(&secret_name, &labels);
    // The Secret first: the Link names it, and the mirror controller refuses a Link whose
    // Secret is missing (or unreadable: its Role next).
    Ok(vec![secret, link, role, binding])
}

/// The Role (and its binding) that lets the mirror read this one Secret, by name: the mirror may
/// read no other Secret of the namespace (the issuer's key is one of them), and the control plane
/// none of the Links' credentials. Both are named like the Secret.
fn credentials_role(secret: &str, labels: &BTreeMap<String, String>) -> (Value, Value) {
    let metadata = json!({"name": secret, "namespace": CONTROL_NAMESPACE, "labels": labels});
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata,
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret],
            "verbs": ["get", "list", "watch"]}],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": secret},
        "subjects": [{"kind": "ServiceAccount", "name": MIRROR_NAME, "namespace": CONTROL_NAMESPACE}],
    });
    (role, binding)
}

pub fn unlink_main(args: &UnlinkArgs) -> anyhow::Result<String> {
    check_cluster_name(&args.cluster_name).map_err(|e| anyhow::anyhow!("--cluster-name: {e}"))?;
    let stub = |api_version: &str, kind: &str, name: &str| json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": CONTROL_NAMESPACE}});
    let secret = credentials_secret_name(&args.cluster_name);
    Ok(yaml::render(&[
        stub(API_VERSION, KIND, &args.cluster_name),
        stub("v1", "Secret", &secret),
        stub("rbac.authorization.k8s.io/v1", "Role", &secret),
        stub("rbac.authorization.k8s.io/v1", "RoleBinding", &secret),
    ]))
}
