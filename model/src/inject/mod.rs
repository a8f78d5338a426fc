//! The injection webhook's pure part: what the `cnimesh-proxy` sidecar a pod gets looks like, and
//! the patch that adds it (review in, patch out), for the control plane's webhook server and for
//! `cnimesh inject` alike, so the offline command cannot inject differently from the webhook.
//!
//! It adds the proxy and what the proxy needs (identity token, trust anchors, environment) and
//! nothing else: capture is the CNI plugin's job, so no iptables init container and no
//! NET_ADMIN, ever. The node agent captures a pod because it carries `cnimesh-proxy`.
//!
//! [`mutate`] / [`plan`] are pure; [`generate_webhook_cert`] / [`load_webhook_tls`] provide the
//! webhook's certificate; [`WebhookArgs`] are the `serve` flags. The HTTPS endpoint is
//! `cnimesh_control::inject`. Deployment and failure policy: `daemonset/README.md`.

mod cert;
mod config;
mod mutate;
mod policy_env;
mod shutdown_env;
mod trace_env;
mod validate;

pub use cert::{
    WEBHOOK_CA_FILE, WEBHOOK_CERT_FILE, WEBHOOK_ISSUER_CERT, WEBHOOK_ISSUER_KEY, WEBHOOK_KEY_FILE, WEBHOOK_SECRET,
    WEBHOOK_SERVICE, WebhookCertError, WebhookCertPem, generate_webhook_cert, load_webhook_tls, new_webhook_cert,
    webhook_dns_names, webhook_tls_from,
};
pub use config::{
    CONTROL_NAME, CONTROL_PORT, DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_NAMESPACE, DEFAULT_PROXY_IMAGE,
    DEFAULT_PROXY_UID, InjectConfig, InjectConfigError, ProxyResources, ServerVersion, SidecarMode, WebhookArgs,
};
pub use mutate::{
    INJECT_ANNOTATION, INJECTED_ANNOTATION, Injection, LOG_LEVEL_ANNOTATION, NEVER_INJECTED, NamespaceInjection,
    OPAQUE_PORTS_ANNOTATION, PROXY_ADMIN_PORT, PROXY_CONTAINER, PodProxySettings, Skip, TOKEN_FILE, TOKEN_VOLUME,
    TRUST_ANCHORS_ENDORSED_BY_ENV, TRUST_ANCHORS_ENDORSED_SINCE_ENV, TRUST_ANCHORS_ENV, TRUST_ANCHORS_FILE_ENV,
    TRUST_BUNDLE_CONFIG_MAP, TRUST_BUNDLE_DIR, TRUST_BUNDLE_KEY, mutate, plan, proxy_container, proxy_volumes,
};
pub use policy_env::{
    CLUSTER_NETWORKS_ENV, INBOUND_PORTS_ENV, NamespaceDefault, POLICY_DEFAULT_ENV, effective_default, inbound_ports,
    skipped_port_warnings,
};
pub use trace_env::{
    TRACE_COLLECTOR_ANNOTATION, TRACE_COLLECTOR_ENV, TRACE_OFF, TRACE_SAMPLING_ANNOTATION, TRACE_SAMPLING_ENV,
    TraceSettings, TraceValue,
};
pub use validate::{check_log_level, check_ports, check_trace_collector, check_trace_sampling};
