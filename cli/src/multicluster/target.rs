//! What `cnimesh multicluster link` reads of the cluster being linked to (B): its trust domain
//! (the control plane's `--trust-domain`), its gateway's address and port (the gateway Service's
//! LoadBalancer ingress), the mirror reader's token and CA.

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};

use cnimesh_common::names::{CONTROL_NAME, CONTROL_NAMESPACE, GATEWAY_NAME, MULTICLUSTER_NAMESPACE};
use cnimesh_identity::DEFAULT_TRUST_DOMAIN;

/// The mirror reader's long-lived token Secret (daemonset/multicluster/mirror-reader.yaml).
pub const READER_TOKEN_SECRET: &str = "cnimesh-mirror-reader-token";
/// The gateway Service's mTLS port name.
pub const GATEWAY_PORT_NAME: &str = "mc-gateway";

/// The control plane's Deployment, whose flags say the cluster's trust domain and the tracing it
/// gives injected proxies.
pub async fn control_deployment(client: &kube::Client) -> anyhow::Result<Deployment> {
    let api: kube::Api<Deployment> = kube::Api::namespaced(client.clone(), CONTROL_NAMESPACE);
    api.get(CONTROL_NAME)
        .await
        .with_context(|| format!("reading Deployment {CONTROL_NAMESPACE}/{CONTROL_NAME} for the trust domain"))
}

/// The trust domain the control plane's Deployment runs with: `CNIMESH_CONTROL_TRUST_DOMAIN` or
/// `--trust-domain`, else the default.
pub async fn trust_domain(client: &kube::Client) -> anyhow::Result<String> {
    Ok(trust_domain_of(&control_deployment(client).await?))
}

/// Pure: the trust domain a control plane Deployment sets.
pub fn trust_domain_of(deployment: &Deployment) -> String {
    control_setting(deployment, "--trust-domain", "CNIMESH_CONTROL_TRUST_DOMAIN")
        .unwrap_or_else(|| DEFAULT_TRUST_DOMAIN.to_string())
}

/// Pure: the collector the control plane gives injected proxies (`--proxy-trace-collector` or
/// `CNIMESH_CONTROL_PROXY_TRACE_COLLECTOR`), if any.
pub fn proxy_trace_collector_of(deployment: &Deployment) -> Option<String> {
    control_setting(deployment, "--proxy-trace-collector", "CNIMESH_CONTROL_PROXY_TRACE_COLLECTOR")
}

/// Pure: one setting of the control plane's container, its flag (`--flag=v` or `--flag v`)
/// winning over its environment variable, as clap reads them; empty counts as unset.
fn control_setting(deployment: &Deployment, flag: &str, env: &str) -> Option<String> {
    let containers = deployment.spec.as_ref().and_then(|s| s.template.spec.as_ref()).map(|s| s.containers.as_slice());
    let container = containers.unwrap_or_default().iter().find(|c| c.name == CONTROL_NAME)?;
    let from_env = container.env.iter().flatten().find(|e| e.name == env).and_then(|e| e.value.clone());
    let args: Vec<&String> = container.command.iter().flatten().chain(container.args.iter().flatten()).collect();
    let from_args = args.iter().enumerate().find_map(|(i, a)| match a.strip_prefix(flag) {
        Some(rest) if rest.starts_with('=') => Some(rest[1..].to_string()),
        Some("") => args.get(i + 1).map(|v| v.to_string()),
        _ => None,
    });
    from_args.or(from_env).filter(|v| !v.is_empty())
}

/// The gateway's address and port from its Service: the first LoadBalancer ingress (IP, else
/// hostname) unless `given`; the port named `mc-gateway` unless `port`.
pub async fn gateway(client: &kube::Client, given: Option<&str>, port: Option<u16>) -> anyhow::Result<(String, u16)> {
    let api: kube::Api<Service> = kube::Api::namespaced(client.clone(), MULTICLUSTER_NAMESPACE);
    let service = match api.get_opt(GATEWAY_NAME).await {
        Ok(s) => s,
        Err(e) if given.is_some() && port.is_some() => {
            tracing::debug!(error = %e, "the gateway Service is not readable; using the given address");
            None
        }
        Err(e) => {
            return Err(e).with_context(|| format!("reading Service {MULTICLUSTER_NAMESPACE}/{GATEWAY_NAME}"));
        }
    };
    let service_port = service.as_ref().and_then(|s| {
        let ports = s.spec.as_ref()?.ports.as_ref()?;
        let p = ports.iter().find(|p| p.name.as_deref() == Some(GATEWAY_PORT_NAME))?;
        u16::try_from(p.port).ok()
    });
    let ingress = service.as_ref().and_then(|s| {
        let first = s.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?.first()?.clone();
        first.ip.or(first.hostname)
    });
    let address = match (given, ingress, &service) {
        (Some(a), _, _) => a.to_string(),
        (None, Some(a), _) => a,
        (None, None, Some(_)) => bail!(
            "Service {MULTICLUSTER_NAMESPACE}/{GATEWAY_NAME} has no LoadBalancer address (yet): wait for one, or pass --gateway-address (e.g. a node's address with a NodePort Service)"
        ),
        (None, None, None) => bail!(
            "no Service {MULTICLUSTER_NAMESPACE}/{GATEWAY_NAME}: run `cnimesh multicluster install | kubectl apply -f -` on this cluster first, or pass --gateway-address"
        ),
    };
    let port = port.or(service_port).unwrap_or(cnimesh_common::names::PROXY_INBOUND_PORT);
    Ok((address, port))
}

/// The mirror reader's token and the API server's CA (PEM) from its token Secret.
pub async fn reader_token(client: &kube::Client) -> anyhow::Result<(String, Option<Vec<u8>>)> {
    let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), MULTICLUSTER_NAMESPACE);
    let secret = api.get(READER_TOKEN_SECRET).await.with_context(|| {
        format!(
            "reading Secret {MULTICLUSTER_NAMESPACE}/{READER_TOKEN_SECRET} (made by `cnimesh multicluster install`)"
        )
    })?;
    let data = secret.data.unwrap_or_default();
    let token = data.get("token").map(|t| String::from_utf8_lossy(&t.0).into_owned()).filter(|t| !t.is_empty());
    let token = token.with_context(|| {
        format!("Secret {MULTICLUSTER_NAMESPACE}/{READER_TOKEN_SECRET} has no token yet: the token controller fills it in, retry in a moment")
    })?;
    Ok((token, data.get("ca.crt").map(|c| c.0.clone())))
}
