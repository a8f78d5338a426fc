//! `cnimesh multicluster install`: the files under `daemonset/multicluster/`
//! ([`crate::manifests::MULTICLUSTER_FILES`]) with this cluster's trust anchors, trust domain,
//! cluster domain and proxy image put into the gateway (trust and cluster domain into the mirror's
//! Deployment too), and the `app.kubernetes.io/*` labels
//! (`part-of: cnimesh-multicluster`, so `cnimesh prune` never takes them for the mesh's own).
//!
//! The anchors and trust domain come from the cluster (the ConfigMap `install` made, the control
//! plane's `--trust-domain`) unless given: with both flags it renders offline. The gateway's span
//! collector is the one the control plane gives injected proxies unless `--trace-collector` says
//! otherwise, so a traced request that crosses clusters stays one trace through the gateway.

use std::path::PathBuf;

use anyhow::Context;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{Value, json};

use super::super::install::{TRUST_ANCHORS_CONFIG_MAP, TRUST_ANCHORS_KEY, labels};
use super::super::{ClusterArgs, manifests, yaml};
use super::{gateway_identity, target};
use cnimesh_common::names::{CONTROL_NAMESPACE, GATEWAY_NAME, MIRROR_NAME};
use cnimesh_model::inject::{
    DEFAULT_CLUSTER_DOMAIN, DEFAULT_PROXY_IMAGE, TRACE_COLLECTOR_ENV, TRACE_OFF, check_trace_collector,
};

/// `part-of` of every object: an add-on, not the mesh (`cnimesh prune` leaves it alone).
pub const PART_OF: &str = "cnimesh-multicluster";

#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct InstallArgs {
    /// Trust anchors (PEM) the gateway verifies clients against [default: the cluster's
    /// ConfigMap cnimesh/cnimesh-identity-trust-anchors].
    #[arg(long, value_name = "FILE")]
    pub identity_trust_anchors_file: Option<PathBuf>,
    /// This cluster's trust domain [default: the control plane's --trust-domain].
    #[arg(long)]
    pub trust_domain: Option<String>,
    /// This cluster's DNS domain (where the gateway finds the control plane).
    #[arg(long, default_value = DEFAULT_CLUSTER_DOMAIN)]
    pub cluster_domain: String,
    /// The gateway's image (a cnimesh-proxy image).
    #[arg(long, default_value = DEFAULT_PROXY_IMAGE)]
    pub proxy_image: String,
    /// The OTLP/gRPC collector the gateway sends its spans to (`host:port`, `http://host:port`,
    /// `https://host:port`), or `off`, so that a cross-cluster trace has the gateway's hop
    /// [default: the collector the control plane gives injected proxies, its
    /// --proxy-trace-collector, when the trust domain is read from the cluster].
    #[arg(long, value_name = "ADDRESS")]
    pub trace_collector: Option<String>,
}

/// What the command line gives without flags (clap's defaults), so code and tests that build the
/// arguments get the real cluster domain and gateway image rather than empty strings.
impl Default for InstallArgs {
    fn default() -> Self {
        Self {
            identity_trust_anchors_file: None,
            trust_domain: None,
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.into(),
            proxy_image: DEFAULT_PROXY_IMAGE.into(),
            trace_collector: None,
        }
    }
}

pub async fn main(cluster: &ClusterArgs, args: &InstallArgs) -> anyhow::Result<String> {
    let anchors = match &args.identity_trust_anchors_file {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        None => {
            let client =
                cluster.client().await.context("reading the trust anchors (or pass --identity-trust-anchors-file)")?;
            let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, CONTROL_NAMESPACE);
            let map = api.get(TRUST_ANCHORS_CONFIG_MAP).await.with_context(|| {
                format!("reading ConfigMap {CONTROL_NAMESPACE}/{TRUST_ANCHORS_CONFIG_MAP}: is the mesh installed? (or pass --identity-trust-anchors-file)")
            })?;
            map.data.and_then(|d| d.get(TRUST_ANCHORS_KEY).cloned()).with_context(|| {
                format!("ConfigMap {CONTROL_NAMESPACE}/{TRUST_ANCHORS_CONFIG_MAP} has no {TRUST_ANCHORS_KEY}")
            })?
        }
    };
    let mut args = args.clone();
    let trust_domain = match &args.trust_domain {
        Some(domain) => domain.clone(),
        None => {
            let control = target::control_deployment(&cluster.client().await?).await?;
            if args.trace_collector.is_none() {
                args.trace_collector = target::proxy_trace_collector_of(&control);
                if let Some(collector) = args.trace_collector.as_deref().filter(|c| c.trim() != TRACE_OFF) {
                    check_trace_collector(collector)
                        .map_err(|why| anyhow::anyhow!("the control plane's --proxy-trace-collector: {why}"))?;
                }
            }
            target::trust_domain_of(&control)
        }
    };
    Ok(yaml::render(&render(&args, &anchors, &trust_domain)?))
}

/// The documents for these values; bad values are refused by name.
pub fn render(args: &InstallArgs, anchors_pem: &str, trust_domain: &str) -> anyhow::Result<Vec<Value>> {
    let certs = cnimesh_identity::pem::certs(anchors_pem.as_bytes(), "trust anchors").context("the trust anchors")?;
    anyhow::ensure!(!certs.is_empty(), "the trust anchors hold no certificate");
    let identity = gateway_identity(trust_domain);
    cnimesh_identity::Name::parse(&identity).map_err(|e| anyhow::anyhow!("--trust-domain {trust_domain:?}: {e}"))?;
    let domain = &args.cluster_domain;
    anyhow::ensure!(
        !domain.is_empty() && !domain.starts_with('.') && !domain.ends_with('.'),
        "--cluster-domain {domain:?}: expected a DNS domain such as cluster.local"
    );
    let control_addr =
        format!("cnimesh-control.{CONTROL_NAMESPACE}.svc.{domain}:{}", cnimesh_common::names::CONTROL_PORT);
    let control_identity =
        format!("cnimesh-control.{CONTROL_NAMESPACE}.serviceaccount.identity.cnimesh.{trust_domain}");
    let tracing = match args.trace_collector.as_deref().map(str::trim) {
        None | Some(TRACE_OFF) => None,
        Some(collector) => {
            Some(check_trace_collector(collector).map_err(|why| anyhow::anyhow!("--trace-collector: {why}"))?)
        }
    };
    let mut docs = Vec::new();
    for (name, text) in manifests::MULTICLUSTER_FILES {
        docs.extend(yaml::documents(text, name).with_context(|| format!("the shipped {name}"))?);
    }
    for doc in &mut docs {
        if doc["kind"] == "Deployment" && doc["metadata"]["name"] == GATEWAY_NAME {
            let container = doc.pointer_mut("/spec/template/spec/containers/0").context("the gateway's container")?;
            container["image"] = json!(args.proxy_image);
            for var in container["env"].as_array_mut().into_iter().flatten() {
                let value = match var["name"].as_str().unwrap_or_default() {
                    "CNIMESH_PROXY_IDENTITY_NAME" => identity.clone(),
                    "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM" => anchors_pem.to_string(),
                    "CNIMESH_PROXY_IDENTITY_ADDR" | "CNIMESH_PROXY_DESTINATION_ADDR" => control_addr.clone(),
                    "CNIMESH_PROXY_IDENTITY_SVC_NAME" => control_identity.clone(),
                    _ => continue,
                };
                var["value"] = json!(value);
            }
            if let Some(collector) = &tracing {
                let env = container["env"].as_array_mut().context("the gateway's environment")?;
                env.push(json!({"name": TRACE_COLLECTOR_ENV, "value": collector}));
            }
        }
    }
    // The mirror knows this cluster's own federated members by their identities.
    for doc in docs.iter_mut().filter(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == MIRROR_NAME) {
        let container = doc.pointer_mut("/spec/template/spec/containers/0").context("the mirror's container")?;
        for var in container["env"].as_array_mut().into_iter().flatten() {
            let value = match var["name"].as_str().unwrap_or_default() {
                "CNIMESH_MIRROR_TRUST_DOMAIN" => trust_domain,
                "CNIMESH_MIRROR_CLUSTER_DOMAIN" => domain.as_str(),
                _ => continue,
            };
            var["value"] = json!(value);
        }
    }
    labels::apply_as(&mut docs, PART_OF, |doc| {
        if doc["kind"] == "CustomResourceDefinition" { "crds" } else { "multicluster" }
    });
    Ok(docs)
}
