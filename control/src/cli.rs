//! Command line: `cnimesh-control serve`, the one thing the control plane's processes run (the
//! operator's `ca init` and `ca webhook` are `cnimesh ca …`). Every `serve` flag can also come
//! from a `CNIMESH_CONTROL_*` variable, which is how the Deployment configures it.
//!
//! Layer: runtime: flags in, the other layers wired by [`crate::serve`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use cnimesh_identity::{DEFAULT_TRUST_DOMAIN, Name};

use cnimesh_runtime::process::{parse_duration, shutdown_signal};

use crate::grpc::limits::Limits;
use crate::grpc::spans::TraceConfig;
use crate::inject::{Namespaces, Webhook, watch_server_version};
use crate::serve::{ClusterConfig, Config, Listener, Listeners, WebhookConfig};
use cnimesh_model::identity::Policy;
use cnimesh_model::inject::{SidecarMode, WebhookArgs, webhook_dns_names, webhook_tls_from};
use cnimesh_model::policy::DefaultPolicy;
use cnimesh_model::policy::index::DEFAULT_CLUSTER_NETWORKS;

#[derive(Debug, Parser)]
#[command(name = "cnimesh-control", version, about = "cnimesh control plane: Identity (and Destination) over gRPC")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the control plane.
    Serve(Box<ServeArgs>),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// gRPC (TLS) listen address.
    #[arg(long, env = "CNIMESH_CONTROL_ADDR", default_value = "0.0.0.0:4190")]
    addr: SocketAddr,
    /// Admin (HTTP: /metrics, /ready, /live) listen address.
    #[arg(long, env = "CNIMESH_CONTROL_ADMIN_ADDR", default_value = "0.0.0.0:9990")]
    admin_addr: SocketAddr,
    /// Directory with ca.crt (trust anchors), tls.crt and tls.key (issuer), as a mounted
    /// kubernetes.io/tls Secret lays them out. Reloaded on change.
    #[arg(long, env = "CNIMESH_CONTROL_ISSUER_DIR")]
    issuer_dir: PathBuf,
    #[arg(long, env = "CNIMESH_CONTROL_TRUST_DOMAIN", default_value = DEFAULT_TRUST_DOMAIN)]
    trust_domain: String,
    /// Lifetime of issued certificates, e.g. 24h or 10s.
    #[arg(long, env = "CNIMESH_CONTROL_CERT_LIFETIME", default_value = "24h", value_parser = parse_duration)]
    cert_lifetime: Duration,
    /// How far in the past issued certificates start.
    #[arg(long, env = "CNIMESH_CONTROL_CLOCK_SKEW", default_value = "20s", value_parser = parse_duration)]
    clock_skew: Duration,
    /// The control plane's own identity [default:
    /// cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.<trust-domain>].
    #[arg(long, env = "CNIMESH_CONTROL_IDENTITY_NAME")]
    identity_name: Option<Name>,
    /// Use the Kubernetes API (required): cluster state is watched there, tokens are checked with
    /// TokenReview. The API server is the one of the in-cluster configuration or of KUBECONFIG
    /// (local mode's).
    #[arg(long, env = "CNIMESH_CONTROL_KUBE")]
    kube: bool,
    /// Inbound policy of ports no Server names, where no namespace or pod annotation
    /// (config.cnimesh.io/default-inbound-policy) says otherwise: all-unauthenticated,
    /// all-authenticated, cluster-authenticated, deny or audit (let through what no policy admits,
    /// logged and counted as would-be denials).
    #[arg(long, env = "CNIMESH_CONTROL_DEFAULT_INBOUND_POLICY", default_value = "all-unauthenticated")]
    default_inbound_policy: DefaultPolicy,
    /// The networks `cluster-authenticated` admits, comma-separated CIDRs.
    #[arg(long, env = "CNIMESH_CONTROL_CLUSTER_NETWORKS", default_value = DEFAULT_CLUSTER_NETWORKS,
        value_delimiter = ',')]
    cluster_networks: Vec<ipnet::IpNet>,
    #[command(flatten)]
    webhook: WebhookArgs,
    #[command(flatten)]
    ha: HaArgs,
    /// Bind the listeners with SO_REUSEPORT: several replicas on one host share one address
    /// (local mode's HA, and the rolling-restart test); the kernel spreads connections.
    #[arg(long, env = "CNIMESH_CONTROL_REUSE_PORT")]
    reuse_port: bool,
    #[command(flatten)]
    grpc_limits: GrpcLimitArgs,
    #[command(flatten)]
    trace: TraceArgs,
    /// ServiceAccounts Identity certifies although their namespace is reserved, as
    /// namespace/name, comma-separated. Reserved are the control plane's namespace and the node
    /// agent's (cnimesh-system): none of their pods runs a proxy, and some of their tokens are
    /// easy to mint (the tap Role can request cnimesh-tap's), so Certify refuses them with
    /// PERMISSION_DENIED unless they are named here.
    #[arg(long = "identity-allow-service-account", env = "CNIMESH_CONTROL_IDENTITY_ALLOW_SERVICE_ACCOUNTS",
        value_delimiter = ',', value_parser = cnimesh_model::identity::reserved::parse_account)]
    identity_allowed: Vec<(String, String)>,
    /// Keep the trust bundle ConfigMap `cnimesh-trust-bundle` in every namespace: the anchors,
    /// endorsed by this control plane, which injected proxies follow so that a rotation needs no
    /// restart. One replica writes at a time (Lease `cnimesh-control-trust-bundle`).
    #[arg(long, env = "CNIMESH_CONTROL_TRUST_BUNDLE", default_value_t = true, action = clap::ArgAction::Set)]
    trust_bundle: bool,
}

/// Bounds on what one client may hold on the gRPC port (every pod can reach it). Over a bound a
/// connection is closed at accept, a call is answered RESOURCE_EXHAUSTED; each refusal is counted
/// in `grpc_refused_total{reason}`. The defaults leave a proxy (about four connections, a stream
/// per inbound port and two or three per destination) plenty of room.
#[derive(Debug, Args)]
struct GrpcLimitArgs {
    /// HTTP/2 concurrent streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long, env = "CNIMESH_CONTROL_MAX_STREAMS_PER_CONNECTION", default_value_t = Limits::default().streams_per_connection)]
    max_streams_per_connection: u32,
    /// Open connections from one IP address (a pod).
    #[arg(long, env = "CNIMESH_CONTROL_MAX_CONNECTIONS_PER_PEER", default_value_t = Limits::default().connections_per_peer)]
    max_connections_per_peer: usize,
    /// Open streams from one IP address, across its connections.
    #[arg(long, env = "CNIMESH_CONTROL_MAX_STREAMS_PER_PEER", default_value_t = Limits::default().streams_per_peer)]
    max_streams_per_peer: usize,
    /// Open streams of one mesh identity (a ServiceAccount: all replicas of a workload together).
    #[arg(long, env = "CNIMESH_CONTROL_MAX_STREAMS_PER_IDENTITY", default_value_t = Limits::default().streams_per_identity)]
    max_streams_per_identity: usize,
    /// Open streams in all. Each costs about 8 KiB while open: raise it with the memory limit.
    #[arg(long, env = "CNIMESH_CONTROL_MAX_STREAMS", default_value_t = Limits::default().streams)]
    max_streams: usize,
}

/// The control plane's own spans: one SERVER span per gRPC call, exported over OTLP.
#[derive(Debug, Args)]
struct TraceArgs {
    /// The OTLP/gRPC collector the control plane sends spans of its gRPC handling to
    /// (`host:port`, `http://host:port` or `https://host:port`). Unset or empty: no spans.
    #[arg(long = "trace-collector", env = "CNIMESH_CONTROL_TRACE_COLLECTOR")]
    collector: Option<String>,
    /// The ratio (0 to 1) of calls without trace context that start a trace; calls with context
    /// follow their caller's decision.
    #[arg(long = "trace-sampling", env = "CNIMESH_CONTROL_TRACE_SAMPLING", default_value = "0")]
    sampling: String,
    /// PEM roots to verify an https collector with [default: the system's roots].
    #[arg(long = "trace-collector-ca-file", env = "CNIMESH_CONTROL_TRACE_COLLECTOR_CA_FILE")]
    ca_file: Option<PathBuf>,
}

impl GrpcLimitArgs {
    fn limits(&self) -> anyhow::Result<Limits> {
        let limits = Limits {
            streams_per_connection: self.max_streams_per_connection,
            connections_per_peer: self.max_connections_per_peer,
            streams_per_peer: self.max_streams_per_peer,
            streams_per_identity: self.max_streams_per_identity,
            streams: self.max_streams,
        };
        anyhow::ensure!(
            limits.streams_per_connection > 0
                && limits.connections_per_peer > 0
                && limits.streams_per_peer > 0
                && limits.streams_per_identity > 0
                && limits.streams > 0,
            "the gRPC limits must be positive: {limits:?}"
        );
        Ok(limits)
    }
}

/// Where the webhook's certificate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum WebhookCerts {
    /// `--webhook-tls-dir` (local mode, or a mounted Secret), reloaded when its files change.
    Files,
    /// The Secret `--webhook-secret`, watched; made by the operator (`cnimesh ca webhook`): only read.
    Secret,
    /// The Secret, watched, and kept by the leader of the `webhook-write` Lease: created,
    /// renewed at 2/3 of its life, its CA rotated, the caBundle patched (`crate::webhook_certs`).
    Managed,
}

/// High availability: leader election for the writers and the webhook's certificates.
#[derive(Debug, Args)]
struct HaArgs {
    #[arg(long, env = "CNIMESH_CONTROL_WEBHOOK_CERTS", value_enum, default_value = "files")]
    webhook_certs: WebhookCerts,
    #[arg(long, env = "CNIMESH_CONTROL_WEBHOOK_SECRET", default_value = cnimesh_model::inject::WEBHOOK_SECRET)]
    webhook_secret: String,
    /// Lifetime of the managed serving certificate (renewed at 2/3 of it).
    #[arg(long, env = "CNIMESH_CONTROL_WEBHOOK_CERT_LIFETIME", default_value = "30d", value_parser = parse_duration)]
    webhook_cert_lifetime: Duration,
    /// Lifetime of the managed webhook CA (rotated at 2/3 of it).
    #[arg(long, env = "CNIMESH_CONTROL_WEBHOOK_CA_LIFETIME", default_value = "365d", value_parser = parse_duration)]
    webhook_ca_lifetime: Duration,
    /// How long a writer Lease holds without renewal.
    #[arg(long, env = "CNIMESH_CONTROL_LEASE_DURATION", default_value = "30s", value_parser = parse_duration)]
    lease_duration: Duration,
    /// How often the leader renews its Lease and followers look at it.
    #[arg(long, env = "CNIMESH_CONTROL_LEASE_RENEW_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    lease_renew_interval: Duration,
    /// This replica's name in Leases (the Deployment sets the pod name; a random suffix is added).
    #[arg(long, env = "CNIMESH_CONTROL_POD_NAME", default_value = "cnimesh-control")]
    pod_name: String,
}

impl HaArgs {
    /// The Secret source for `--webhook-certs secret|managed`; `None` for files.
    fn secret_source(
        &self,
        client: &kube::Client,
        webhook: &WebhookArgs,
    ) -> anyhow::Result<Option<crate::webhook_certs::SecretSource>> {
        if self.webhook_certs == WebhookCerts::Files {
            return Ok(None);
        }
        let manage = if self.webhook_certs == WebhookCerts::Managed {
            let election = cnimesh_runtime::leader::ElectionConfig {
                namespace: webhook.namespace.clone(),
                identity: cnimesh_runtime::leader::ElectionConfig::unique_identity(&self.pod_name),
                lease_duration: self.lease_duration,
                renew_interval: self.lease_renew_interval,
            };
            election.validate()?;
            let policy = crate::webhook_certs::CertPolicy {
                dns_names: webhook_dns_names(&webhook.namespace, &webhook.cluster_domain),
                serving_lifetime: self.webhook_cert_lifetime,
                ca_lifetime: self.webhook_ca_lifetime,
                check_interval: Duration::from_secs(60),
                rotation_grace: Duration::from_secs(300),
            };
            Some((election, policy))
        } else {
            None
        };
        Ok(Some(crate::webhook_certs::SecretSource {
            client: client.clone(),
            namespace: webhook.namespace.clone(),
            secret: self.webhook_secret.clone(),
            current: Default::default(),
            manage,
        }))
    }
}

impl ServeArgs {
    async fn config(self) -> anyhow::Result<Config> {
        anyhow::ensure!(
            self.kube,
            "cnimesh-control serve needs --kube: its cluster and tokens are the Kubernetes API's"
        );
        let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
        self.config_with(client)
    }

    /// [`ServeArgs::config`] with the API server's client made; stops on SIGTERM or SIGINT.
    fn config_with(self, client: kube::Client) -> anyhow::Result<Config> {
        let destination = cnimesh_model::destination::Config {
            cluster_domain: self.webhook.cluster_domain.clone(),
            trust_domain: self.trust_domain.clone(),
        };
        // Every injected proxy starts with these, before the control plane answers.
        let proxy_policy = (self.default_inbound_policy, self.cluster_networks.clone());
        let inbound_policy = cnimesh_model::policy::Config {
            default_policy: self.default_inbound_policy,
            cluster_networks: self.cluster_networks,
            trust_domain: self.trust_domain.clone(),
        };
        let identity_name = match self.identity_name {
            Some(name) => name,
            None => Name::for_service_account(
                cnimesh_common::names::CONTROL_NAME,
                &self.webhook.namespace,
                &self.trust_domain,
            )
            .with_context(|| format!("trust domain {:?}", self.trust_domain))?,
        };
        let webhook_certs = self.ha.secret_source(&client, &self.webhook)?;
        let reuse_port = self.reuse_port;
        let listener = |addr| Listener::Addr { addr, reuse_port };
        let webhook = match (&self.webhook.webhook_addr, &self.webhook.webhook_tls_dir) {
            (Some(addr), dir) if dir.is_some() || webhook_certs.is_some() => {
                let mode = self.webhook.native_sidecars;
                let versions = match mode {
                    SidecarMode::Auto => watch_server_version(client.clone()),
                    _ => tokio::sync::watch::channel(None).1,
                };
                let config =
                    self.webhook.inject_config(&self.trust_domain)?.with_inbound_policy(proxy_policy.0, proxy_policy.1);
                // The namespace's default-inbound-policy annotation, read where the cluster is.
                let webhook = Webhook::new(config)?
                    .with_sidecar_mode(mode, versions)
                    .with_namespaces(Namespaces::Kube(client.clone()));
                let tls = match (&webhook_certs, dir) {
                    (Some(source), _) => webhook_tls_from(source.current.clone())?,
                    (None, Some(dir)) => webhook_tls_from(
                        crate::webhook_certs::files::watch_dir(dir.clone())
                            .with_context(|| format!("webhook TLS from {}", dir.display()))?,
                    )?,
                    (None, None) => anyhow::bail!("--webhook-addr needs --webhook-tls-dir or --webhook-certs"),
                };
                Some(WebhookConfig { webhook, tls, listener: listener(*addr) })
            }
            (Some(_), _) => anyhow::bail!("--webhook-addr needs --webhook-tls-dir or --webhook-certs secret|managed"),
            _ => None,
        };
        // Injected proxies follow the endorsed bundle of their namespace, written by one replica
        // at a time.
        let trust_bundle = if self.trust_bundle {
            let election = cnimesh_runtime::leader::ElectionConfig {
                namespace: self.webhook.namespace.clone(),
                identity: cnimesh_runtime::leader::ElectionConfig::unique_identity(&self.ha.pod_name),
                lease_duration: self.ha.lease_duration,
                renew_interval: self.ha.lease_renew_interval,
            };
            election.validate()?;
            Some(election)
        } else {
            None
        };
        anyhow::ensure!(!self.cert_lifetime.is_zero(), "--cert-lifetime must be positive");
        let limits = self.grpc_limits.limits()?;
        let mut reserved = cnimesh_model::identity::Reserved::for_namespaces([
            self.webhook.namespace.as_str(),
            cnimesh_common::names::AGENT_NAMESPACE,
        ]);
        for (namespace, name) in &self.identity_allowed {
            reserved = reserved.allow(namespace, name);
        }
        let policy =
            Policy { trust_domain: self.trust_domain, lifetime: self.cert_lifetime, clock_skew: self.clock_skew };
        let trace = self.trace.collector.filter(|c| !c.trim().is_empty()).map(|collector| TraceConfig {
            collector,
            sampling: self.trace.sampling,
            ca_file: self.trace.ca_file,
            pod: self.ha.pod_name.clone(),
            namespace: self.webhook.namespace.clone(),
            identity: identity_name.to_string(),
        });
        Ok(Config {
            issuer_dir: self.issuer_dir,
            identity_name,
            policy,
            tokens: client.clone(),
            reserved,
            // The control plane's namespace (the webhook's): the join tokens' Secret is there.
            join_namespace: self.webhook.namespace.clone(),
            limits,
            listeners: Listeners { grpc: listener(self.addr), admin: listener(self.admin_addr) },
            shutdown: Box::pin(shutdown_signal()),
            destination,
            cluster: Some(ClusterConfig { client, inbound_policy }),
            webhook,
            webhook_certs,
            trust_bundle,
            tap: true,
            trace,
        })
    }
}

/// The process entry point.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(error) = init_logging() {
        eprintln!("cnimesh-control: {error}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // stderr is also where logs go: one line, not a log record and a copy.
            eprintln!("cnimesh-control: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The level from CNIMESH_CONTROL_LOG, the format from CNIMESH_LOG_FORMAT (plain or json).
fn init_logging() -> Result<(), cnimesh_common::logging::FormatError> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CNIMESH_CONTROL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    cnimesh_common::logging::init(filter)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(serve(*args))
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    crate::serve::run(args.config().await?).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[tokio::test]
    async fn the_cli_is_consistent_and_needs_the_kubernetes_api() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["cnimesh-control", "serve", "--issuer-dir", "/x"]).unwrap();
        let Command::Serve(args) = cli.command;
        let Err(error) = args.config().await else { panic!("served without --kube") };
        let error = format!("{error:#}");
        assert!(error.contains("--kube"), "{error}");
        let cli = Cli::try_parse_from([
            "cnimesh-control",
            "serve",
            "--issuer-dir",
            "/x",
            "--kube",
            "--cert-lifetime",
            "10s",
            "--trust-domain",
            "example.org",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command;
        let config = args.config_with(cnimesh_apiserver::ClusterApi::new().client()).unwrap();
        assert_eq!(config.policy.lifetime, Duration::from_secs(10));
        assert_eq!(
            config.identity_name.as_str(),
            "cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.example.org"
        );
        let port = |listener: &Listener| match listener {
            Listener::Addr { addr, reuse_port: false } => addr.port(),
            _ => panic!("an address to bind, without SO_REUSEPORT"),
        };
        assert_eq!((port(&config.listeners.grpc), port(&config.listeners.admin)), (4190, 9990));
        assert!(config.webhook.is_none() && config.cluster.is_some() && config.tap);
        for gone in ["--tokens-dir", "--cluster-dir"] {
            assert!(
                Cli::try_parse_from(["cnimesh-control", "serve", "--issuer-dir", "/x", "--kube", gone, "/t"]).is_err()
            );
        }
    }
}
