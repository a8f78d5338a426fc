//! What the webhook injects: image, where the control plane is, how the sidecar is run. Every
//! field has a default that matches docs/architecture.md, "Names and numbers", so `InjectConfig::default()` is a working mesh
//! in a `cluster.local` cluster with the control plane in `cnimesh`.
//!
//! Layer: model (pure), plus the `serve` flags that build it.

use std::net::SocketAddr;
use std::path::PathBuf;

use cnimesh_common::names;
use cnimesh_identity::{DEFAULT_TRUST_DOMAIN, Name, NameError};
use ipnet::IpNet;

use super::trace_env::TraceSettings;
use crate::policy::DefaultPolicy;
use crate::policy::index::DEFAULT_CLUSTER_NETWORKS;

/// The proxy image that matches this control plane: both are released together (docs/architecture.md, "Names and numbers").
pub const DEFAULT_PROXY_IMAGE: &str = concat!("ghcr.io/cnimesh/cnimesh-proxy:", env!("CARGO_PKG_VERSION"));
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// docs/architecture.md, "Names and numbers" as Kubernetes types it (`runAsUser` is an i64). The node agent never captures
/// this UID's traffic, so it must be the proxy's.
pub const DEFAULT_PROXY_UID: i64 = names::PROXY_UID as i64;
/// The control plane's namespace, Service and ServiceAccount, and its gRPC port: docs/architecture.md, "Names and numbers",
/// from the one place every crate reads them.
pub use cnimesh_common::names::{CONTROL_NAME, CONTROL_NAMESPACE as DEFAULT_CONTROL_NAMESPACE, CONTROL_PORT};

/// Requests and limits of the sidecar, as Kubernetes quantities (`100m`, `64Mi`). `None` leaves
/// the value unset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyResources {
    pub cpu_request: Option<String>,
    pub memory_request: Option<String>,
    /// Unset by default: a CPU limit throttles the proxy in bursts, and every request of the app
    /// pays that latency.
    pub cpu_limit: Option<String>,
    pub memory_limit: Option<String>,
}

impl Default for ProxyResources {
    fn default() -> Self {
        Self {
            cpu_request: Some("20m".into()),
            memory_request: Some("32Mi".into()),
            cpu_limit: None,
            memory_limit: Some("256Mi".into()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectConfig {
    pub proxy_image: String,
    /// The control plane's namespace: never injected (its pods must start without the mesh
    /// they provide), and part of the control plane's DNS name and identity.
    pub control_namespace: String,
    /// The cluster's DNS domain, for the control plane's Service name.
    pub cluster_domain: String,
    /// The identity trust domain; must equal the control plane's `--trust-domain`.
    pub trust_domain: String,
    /// Inject the proxy as a native sidecar (an init container with `restartPolicy: Always`,
    /// Kubernetes ≥ 1.29): it starts before every other init container, so they have a network,
    /// app containers start only once it is ready, and it does not keep Jobs alive. `false`
    /// adds it as the first regular container, which every version accepts. This is the mode
    /// already resolved for the API server at hand (see [`SidecarMode`]).
    pub native_sidecars: bool,
    /// `CNIMESH_PROXY_LOG` unless a pod's `config.cnimesh.io/proxy-log-level` says otherwise.
    pub log_level: String,
    /// The proxies log JSON lines (`CNIMESH_LOG_FORMAT=json`) instead of plain text.
    pub json_logs: bool,
    pub resources: ProxyResources,
    /// The trust anchors (PEM), handed to every proxy in an environment variable, as Linkerd
    /// does: a volume would need a ConfigMap in every meshed namespace. The webhook fills it
    /// from the issuer it serves with; empty means "not known yet" and injection is refused.
    pub trust_anchors_pem: String,
    pub proxy_uid: i64,
    /// The control plane's `--default-inbound-policy`: what a pod's proxy starts with when
    /// neither the pod nor its namespace is annotated (`CNIMESH_PROXY_POLICY_DEFAULT`).
    pub default_inbound_policy: DefaultPolicy,
    /// The control plane's `--cluster-networks` (`CNIMESH_PROXY_POLICY_CLUSTER_NETWORKS`).
    pub cluster_networks: Vec<IpNet>,
    /// Where proxies send spans unless their namespace or pod says otherwise (`--proxy-trace-*`);
    /// by the time [`super::plan`] sees it, the namespace's annotations are already over it.
    pub tracing: TraceSettings,
}

impl Default for InjectConfig {
    fn default() -> Self {
        Self {
            proxy_image: DEFAULT_PROXY_IMAGE.into(),
            control_namespace: DEFAULT_CONTROL_NAMESPACE.into(),
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.into(),
            trust_domain: DEFAULT_TRUST_DOMAIN.into(),
            native_sidecars: true,
            log_level: "info".into(),
            json_logs: false,
            resources: ProxyResources::default(),
            trust_anchors_pem: String::new(),
            proxy_uid: DEFAULT_PROXY_UID,
            default_inbound_policy: DefaultPolicy::default(),
            cluster_networks: default_cluster_networks(),
            tracing: TraceSettings::default(),
        }
    }
}

/// The control plane's `--cluster-networks` default.
pub fn default_cluster_networks() -> Vec<IpNet> {
    DEFAULT_CLUSTER_NETWORKS.split(',').map(|n| n.parse().expect("valid")).collect()
}

#[derive(Debug, thiserror::Error)]
pub enum InjectConfigError {
    #[error("the control plane's identity: {0}")]
    ControlIdentity(#[from] NameError),
    #[error("the proxy image is empty")]
    NoImage,
    #[error("the proxy UID must not be 0: the node agent leaves that UID's traffic uncaptured")]
    RootProxy,
    #[error("the default proxy log level {0:?}: {1}")]
    LogLevel(String, String),
    #[error("the proxies' tracing default {0}")]
    Tracing(String),
}

impl InjectConfig {
    /// Checks what would otherwise make every injection fail, so that `serve` fails at start.
    pub fn validate(&self) -> Result<(), InjectConfigError> {
        self.control_identity()?;
        if self.proxy_image.trim().is_empty() {
            return Err(InjectConfigError::NoImage);
        }
        if self.proxy_uid <= 0 {
            return Err(InjectConfigError::RootProxy);
        }
        super::validate::check_log_level(&self.log_level)
            .map_err(|why| InjectConfigError::LogLevel(self.log_level.clone(), why))?;
        self.tracing.env().map(drop).map_err(InjectConfigError::Tracing)
    }

    /// The control plane's inbound policy settings, which every injected proxy starts with.
    pub fn with_inbound_policy(mut self, default: DefaultPolicy, cluster_networks: Vec<IpNet>) -> Self {
        self.default_inbound_policy = default;
        self.cluster_networks = cluster_networks;
        self
    }

    /// `cnimesh-control.<ns>.svc.<cluster-domain>:4190`: Identity and Destination share it.
    pub fn control_addr(&self) -> String {
        format!("{CONTROL_NAME}.{}.svc.{}:{CONTROL_PORT}", self.control_namespace, self.cluster_domain)
    }

    /// The identity proxies must see on the control plane's certificate.
    pub fn control_identity(&self) -> Result<Name, NameError> {
        Name::for_service_account(CONTROL_NAME, &self.control_namespace, &self.trust_domain)
    }
}

/// The webhook's `serve` flags, for the lead to `#[command(flatten)]` into `ServeArgs`. Every
/// flag has a `CNIMESH_CONTROL_*` variable, which is how the Deployment sets them.
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// Injection webhook (HTTPS) listen address. Without it no webhook is served.
    #[arg(long, env = "CNIMESH_CONTROL_WEBHOOK_ADDR")]
    pub webhook_addr: Option<SocketAddr>,
    /// Directory with the webhook's tls.crt and tls.key (the mounted `cnimesh-webhook-tls`
    /// Secret; `ca webhook` writes it).
    #[arg(long, env = "CNIMESH_CONTROL_WEBHOOK_TLS_DIR", requires = "webhook_addr")]
    pub webhook_tls_dir: Option<PathBuf>,
    #[arg(long, env = "CNIMESH_CONTROL_PROXY_IMAGE", default_value = DEFAULT_PROXY_IMAGE)]
    pub proxy_image: String,
    /// The control plane's own namespace (the Deployment sets it from the downward API).
    #[arg(long, env = "CNIMESH_CONTROL_NAMESPACE", default_value = DEFAULT_CONTROL_NAMESPACE)]
    pub namespace: String,
    #[arg(long, env = "CNIMESH_CONTROL_CLUSTER_DOMAIN", default_value = DEFAULT_CLUSTER_DOMAIN)]
    pub cluster_domain: String,
    /// `auto`: native sidecars where the API server supports them (≥ 1.29, read from its
    /// `/version`), a regular first container elsewhere; `true` / `false` force either.
    #[arg(long, env = "CNIMESH_CONTROL_NATIVE_SIDECARS", default_value = "auto")]
    pub native_sidecars: SidecarMode,
    #[arg(long, env = "CNIMESH_CONTROL_PROXY_LOG_LEVEL", default_value = "info")]
    pub proxy_log_level: String,
    /// The injected proxies' log format (their CNIMESH_LOG_FORMAT): plain or json.
    #[arg(long, env = "CNIMESH_CONTROL_PROXY_LOG_FORMAT", default_value = "plain", value_parser = ["plain", "json"])]
    pub proxy_log_format: String,
    #[arg(long, env = "CNIMESH_CONTROL_PROXY_UID", default_value_t = DEFAULT_PROXY_UID)]
    pub proxy_uid: i64,
    #[arg(long, env = "CNIMESH_CONTROL_PROXY_CPU_REQUEST", default_value = "20m")]
    pub proxy_cpu_request: String,
    #[arg(long, env = "CNIMESH_CONTROL_PROXY_MEMORY_REQUEST", default_value = "32Mi")]
    pub proxy_memory_request: String,
    /// Unset by default (see `ProxyResources::cpu_limit`).
    #[arg(long, env = "CNIMESH_CONTROL_PROXY_CPU_LIMIT")]
    pub proxy_cpu_limit: Option<String>,
    #[arg(long, env = "CNIMESH_CONTROL_PROXY_MEMORY_LIMIT", default_value = "256Mi")]
    pub proxy_memory_limit: String,
    /// The OTLP/gRPC collector injected proxies send spans to (`host:port`, `http://host:port`,
    /// `https://host:port`) unless a namespace or pod annotation `config.cnimesh.io/trace-collector`
    /// says otherwise. Unset: proxies trace only where annotated.
    #[arg(long, env = "CNIMESH_CONTROL_PROXY_TRACE_COLLECTOR")]
    pub proxy_trace_collector: Option<String>,
    /// The ratio (0 to 1) of requests without trace context the proxies start a trace for, unless
    /// annotated `config.cnimesh.io/trace-sampling`. Unset: the proxy's default, 0.
    #[arg(long, env = "CNIMESH_CONTROL_PROXY_TRACE_SAMPLING")]
    pub proxy_trace_sampling: Option<String>,
}

impl WebhookArgs {
    /// The configuration, with the trust domain `serve --trust-domain` already has; validated.
    pub fn inject_config(&self, trust_domain: &str) -> Result<InjectConfig, InjectConfigError> {
        let non_empty = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
        let config = InjectConfig {
            proxy_image: self.proxy_image.clone(),
            control_namespace: self.namespace.clone(),
            cluster_domain: self.cluster_domain.clone(),
            trust_domain: trust_domain.to_string(),
            native_sidecars: self.native_sidecars.fixed().unwrap_or(false),
            log_level: self.proxy_log_level.clone(),
            json_logs: self.proxy_log_format == "json",
            resources: ProxyResources {
                cpu_request: non_empty(&self.proxy_cpu_request),
                memory_request: non_empty(&self.proxy_memory_request),
                cpu_limit: self.proxy_cpu_limit.as_deref().and_then(non_empty),
                memory_limit: non_empty(&self.proxy_memory_limit),
            },
            trust_anchors_pem: String::new(),
            proxy_uid: self.proxy_uid,
            // `serve`'s own flags; `ServeArgs` sets them with `with_inbound_policy`.
            default_inbound_policy: DefaultPolicy::default(),
            cluster_networks: default_cluster_networks(),
            tracing: TraceSettings::cluster(
                self.proxy_trace_collector.as_deref(),
                self.proxy_trace_sampling.as_deref(),
            )
            .map_err(InjectConfigError::Tracing)?,
        };
        config.validate()?;
        Ok(config)
    }
}

/// How the proxy is added: as a native sidecar or a regular container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SidecarMode {
    /// From the API server's version: native from 1.29 on, where SidecarContainers is on by
    /// default. Older servers drop `restartPolicy: Always` from an init container and then
    /// reject the pod (init containers may not have probes), so guessing wrong breaks pods.
    #[default]
    Auto,
    Native,
    Regular,
}

impl SidecarMode {
    /// The mode when it does not depend on the server.
    pub fn fixed(self) -> Option<bool> {
        match self {
            Self::Auto => None,
            Self::Native => Some(true),
            Self::Regular => Some(false),
        }
    }

    /// Native sidecars for a server of this version (`None`: unknown, so the container form
    /// every version accepts).
    pub fn native_for(self, server: Option<ServerVersion>) -> bool {
        self.fixed().unwrap_or_else(|| server.is_some_and(ServerVersion::has_native_sidecars))
    }
}

impl std::str::FromStr for SidecarMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "true" => Ok(Self::Native),
            "false" => Ok(Self::Regular),
            other => Err(format!("{other:?}: expected auto, true or false")),
        }
    }
}

impl std::fmt::Display for SidecarMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Native => "true",
            Self::Regular => "false",
        })
    }
}

/// A Kubernetes API server's `major.minor`, from its `/version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServerVersion {
    pub major: u32,
    pub minor: u32,
}

impl ServerVersion {
    /// The first version with SidecarContainers on by default.
    pub const NATIVE_SIDECARS: Self = Self { major: 1, minor: 29 };

    /// `major` and `minor` as `/version` gives them; managed clusters write minors like `29+`.
    pub fn parse(major: &str, minor: &str) -> Option<Self> {
        let number = |s: &str| s.trim_end_matches(|c: char| !c.is_ascii_digit()).parse().ok();
        Some(Self { major: number(major)?, minor: number(minor)? })
    }

    pub fn from_info(info: &k8s_openapi::apimachinery::pkg::version::Info) -> Option<Self> {
        Self::parse(&info.major, &info.minor)
    }

    pub fn has_native_sidecars(self) -> bool {
        self >= Self::NATIVE_SIDECARS
    }
}

impl std::fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        webhook: WebhookArgs,
    }

    #[test]
    fn the_flags_default_to_the_default_config() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.webhook.webhook_addr, None);
        // `auto` resolves per server; until one is known the config holds the regular form.
        let expected = InjectConfig { native_sidecars: false, ..Default::default() };
        assert_eq!(cli.webhook.inject_config(DEFAULT_TRUST_DOMAIN).unwrap(), expected);
        assert_eq!(cli.webhook.native_sidecars, SidecarMode::Auto);
        let cli = Cli::try_parse_from(["x", "--native-sidecars", "false", "--namespace", "mesh"]).unwrap();
        let config = cli.webhook.inject_config("example.org").unwrap();
        assert!(!config.native_sidecars);
        assert_eq!(config.control_addr(), "cnimesh-control.mesh.svc.cluster.local:4190");
        assert_eq!(
            config.control_identity().unwrap().as_str(),
            "cnimesh-control.mesh.serviceaccount.identity.cnimesh.example.org"
        );
        assert!(Cli::try_parse_from(["x", "--webhook-tls-dir", "/d"]).is_err(), "a TLS dir without an address");
        assert!(Cli::try_parse_from(["x", "--native-sidecars", "yes"]).is_err());
    }

    #[test]
    fn auto_picks_native_sidecars_from_the_server_version() {
        let v = |major: &str, minor: &str| ServerVersion::parse(major, minor);
        assert_eq!(v("1", "29+"), Some(ServerVersion { major: 1, minor: 29 }));
        assert_eq!(v("1", "x"), None);
        for (version, native) in
            [(v("1", "24"), false), (v("1", "28"), false), (v("1", "29"), true), (v("1", "33+"), true)]
        {
            assert_eq!(SidecarMode::Auto.native_for(version), native, "{version:?}");
        }
        assert!(!SidecarMode::Auto.native_for(None), "unknown: the form every version accepts");
        assert!(SidecarMode::Native.native_for(v("1", "24")), "an explicit true still wins");
        assert!(!SidecarMode::Regular.native_for(v("1", "33")), "an explicit false still wins");
    }

    #[test]
    fn a_config_that_would_fail_every_injection_is_rejected() {
        let bad = [
            InjectConfig { proxy_uid: 0, ..Default::default() },
            InjectConfig { proxy_image: " ".into(), ..Default::default() },
            InjectConfig { control_namespace: "Bad_NS".into(), ..Default::default() },
            InjectConfig { log_level: "info\n".into(), ..Default::default() },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
        InjectConfig::default().validate().unwrap();
    }
}
