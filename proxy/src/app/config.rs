//! Proxy configuration from `CNIMESH_PROXY_*` environment variables (or the matching flags, for a
//! proxy run by hand), parsed once by clap into [`Args`] and checked into the typed [`Config`].
//! With none set, the proxy runs with docs/architecture.md, "Names and numbers"'s defaults.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use cnimesh_common::names::{
    PROXY_ADMIN_PORT, PROXY_INBOUND_PORT, PROXY_OUTBOUND_PORT, PROXY_SHUTDOWN_DELAY_MS, PROXY_SHUTDOWN_GRACE_MS,
};
use cnimesh_identity::Name;

pub use crate::outbound::static_identities::EndpointMatch;
pub use crate::serve::spans::TraceConfig;
pub use crate::transport::identity::config::{
    IdentityConfig, TRUST_ANCHORS_ENDORSED_BY_VAR, TRUST_ANCHORS_ENDORSED_SINCE_VAR, TRUST_ANCHORS_FILE_VAR,
    TRUST_ANCHORS_PEM_VAR, TrustAnchors,
};
pub use crate::transport::identity::external::ExternalIdentity;

#[derive(Debug, Clone)]
pub struct Config {
    pub inbound: Vec<SocketAddr>,
    pub outbound: Vec<SocketAddr>,
    pub admin: SocketAddr,
    pub detect_timeout: Duration,
    /// HTTP/1: time for a request's headers to arrive, which includes a keep-alive connection's
    /// idle wait for its next request (hyper counts both), so it is far longer than detection.
    pub header_timeout: Duration,
    /// Ports whose traffic is forwarded as opaque TCP without detection (server-speaks-first).
    pub opaque_ports: Vec<u16>,
    /// Opaque connections with no bytes either way for this long are closed.
    pub idle_timeout: Duration,
    /// How long to upstream connect before answering 504 / closing.
    pub connect_timeout: Duration,
    /// After SIGTERM or `/shutdown`, how long the proxy keeps accepting (not ready) before its
    /// listeners stop: clients learn that the endpoint is gone only a moment later.
    pub shutdown_delay: Duration,
    /// Then, how long in-flight work may take before the proxy exits anyway.
    pub shutdown_grace: Duration,
    pub log_level: String,
    /// Runtime worker threads; 1 runs everything on one thread (no cross-thread wake-ups).
    pub workers: usize,
    /// This workload's identity; without it the proxy neither originates nor terminates mTLS.
    pub identity: Option<IdentityConfig>,
    /// Inbound connections that are not mTLS to our identity are refused (default: accepted as
    /// plaintext, so non-meshed clients keep working).
    pub inbound_require_tls: bool,
    /// On an opaque port, how long to wait for a client's ClientHello before treating the
    /// connection as plaintext (a server-speaks-first protocol from a non-meshed client waits
    /// this long for its greeting).
    pub opaque_tls_wait: Duration,
    /// Carry HTTP/1 requests to meshed endpoints over one HTTP/2 connection marked
    /// `l5d-orig-proto` (Linkerd's transport upgrade; the inbound always accepts it).
    pub outbound_h2_upgrade: bool,
    /// Outbound endpoints known to be meshed, with the identity each must prove, for
    /// destinations that discovery does not resolve to a service (a pod IP's profile wins).
    pub outbound_identities: Vec<(EndpointMatch, Name)>,
    /// The Destination service; without it outbound traffic goes to its original destination.
    pub destination: Option<DestinationConfig>,
    /// Inbound policy discovery; without it every client is allowed (as before policies).
    pub policy: Option<PolicyConfig>,
    /// Connections served at once per direction, and inbound per client IP; unset = derived
    /// from the open-file limit ([`crate::app::admission::Limits`]). Beyond them connections are shed.
    pub inbound_max_connections: Option<usize>,
    pub outbound_max_connections: Option<usize>,
    pub inbound_max_connections_per_source: Option<usize>,
    /// Client identities that may tap this proxy ([`crate::http::tap`]); with an identity, default
    /// the control plane's (the one the proxy verifies the control plane with). Without an
    /// identity the proxy serves no tap at all.
    pub tap_identities: Vec<Name>,
    /// Distributed tracing ([`crate::serve::spans`]); `None` (no collector) = off: no spans, no
    /// exporter task, trace headers forwarded untouched.
    pub trace: Option<TraceConfig>,
    /// A sidecar (the default) or a multicluster gateway ([`crate::gateway`]).
    pub mode: Mode,
}

/// What the proxy is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Mode {
    /// A pod's sidecar: captured inbound and outbound traffic.
    #[default]
    Sidecar,
    /// A multicluster gateway: mesh mTLS with a transport header on the inbound listeners,
    /// forwarded to Services of `cluster_domain`; no outbound listener.
    Gateway { cluster_domain: String },
}

/// The cluster domain a gateway serves by default (Kubernetes' own default).
pub const DEFAULT_GATEWAY_CLUSTER_DOMAIN: &str = "cluster.local";

/// Inbound policy from the control plane's InboundServerPolicies, on the Destination channel.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    /// This pod, `namespace:name`, as the control plane knows it.
    pub workload: String,
    /// For ports the control plane has not answered for (within the first-answer wait, or at all).
    pub default: crate::inbound::policy::model::DefaultPolicy,
    /// The networks `cluster-authenticated` admits.
    pub cluster_networks: Vec<ipnet::IpNet>,
    /// TCP ports the pod's containers declare (`CNIMESH_PROXY_INBOUND_PORTS`, set by the
    /// injector): watched from start-up, never evicted, and awaited by `/ready`.
    pub declared_ports: Vec<u16>,
    /// How long `/ready` waits for the declared ports' first answers before reporting ready
    /// anyway (`CNIMESH_PROXY_POLICY_READY_TIMEOUT_MS`).
    pub ready_timeout: Duration,
}

/// `/ready`'s wait for the declared ports' first policy answers. Bounded so that a slow or absent
/// control plane does not keep a pod out of service for ever; safe to pass because unanswered
/// ports use the effective default, never something wider.
pub const DEFAULT_POLICY_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Where discovery comes from. The channel is TLS checked against the identity's trust anchors,
/// so discovery needs an identity configured.
#[derive(Debug, Clone)]
pub struct DestinationConfig {
    /// `host:port` of the Destination service.
    pub addr: String,
    /// The identity the Destination service must prove.
    pub name: Name,
    /// How long a new connection waits for the first answer about its destination.
    pub first_answer: Duration,
    /// Ask the control plane's OutboundPolicies for each destination's protocol (opaque or
    /// HTTP declared: no detection); off = detection decides, as before outbound policy.
    pub outbound_policy: bool,
}

/// Stands in for a PEM value in errors.
fn redacted(pem: &str) -> String {
    format!("<{} bytes of PEM, not shown>", pem.len())
}

pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/tokens/cnimesh-identity-token";
pub use cnimesh_identity::name::DEFAULT_CONTROL_NAME;

/// `ip:port=identity` or `ip=identity`.
fn endpoint_identity(s: &str) -> Result<(EndpointMatch, Name), String> {
    let (addr, name) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected ADDR=IDENTITY"))?;
    Ok((addr.trim().parse()?, name.trim().parse().map_err(|e: cnimesh_identity::NameError| e.to_string())?))
}

pub const DEFAULT_OPAQUE_PORTS: &[u16] = &[25, 587, 3306, 4444, 5432, 6379, 9300, 11211];

impl Default for Config {
    fn default() -> Self {
        let (any4, any6) = (IpAddr::from(Ipv4Addr::UNSPECIFIED), IpAddr::from(Ipv6Addr::UNSPECIFIED));
        let (lo4, lo6) = (IpAddr::from(Ipv4Addr::LOCALHOST), IpAddr::from(Ipv6Addr::LOCALHOST));
        Self {
            inbound: vec![SocketAddr::new(any4, PROXY_INBOUND_PORT), SocketAddr::new(any6, PROXY_INBOUND_PORT)],
            // Loopback only: outbound traffic is redirected from inside the pod.
            outbound: vec![SocketAddr::new(lo4, PROXY_OUTBOUND_PORT), SocketAddr::new(lo6, PROXY_OUTBOUND_PORT)],
            admin: SocketAddr::new(any4, PROXY_ADMIN_PORT),
            detect_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(120),
            opaque_ports: DEFAULT_OPAQUE_PORTS.to_vec(),
            idle_timeout: Duration::from_secs(3600),
            connect_timeout: Duration::from_secs(5),
            shutdown_delay: Duration::from_millis(PROXY_SHUTDOWN_DELAY_MS),
            shutdown_grace: Duration::from_millis(PROXY_SHUTDOWN_GRACE_MS),
            log_level: "info".into(),
            workers: 1,
            identity: None,
            inbound_require_tls: false,
            opaque_tls_wait: Duration::from_millis(1000),
            outbound_h2_upgrade: DEFAULT_H2_UPGRADE,
            outbound_identities: Vec::new(),
            destination: None,
            policy: None,
            inbound_max_connections: None,
            outbound_max_connections: None,
            inbound_max_connections_per_source: None,
            tap_identities: Vec::new(),
            trace: None,
            mode: Mode::Sidecar,
        }
    }
}

/// Whether our outbound upgrades HTTP/1 between meshed proxies: chosen by the proxy benchmark
/// (tests/benches/proxy.rs), which measures both. On: the pair spent 20-25% less CPU per request
/// at 1000 rps and ~33% less at the HTTP/1 maximum, with a lower p50 and the same p99.
const DEFAULT_H2_UPGRADE: bool = true;

/// Identity defaults that apply only once an identity is configured.
const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(30);
const DEFAULT_DISCOVERY_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A setting's value is wrong, alone or together with others; names the variable.
    #[error("{var}={value:?}: {why}")]
    Invalid { var: String, value: String, why: String },
    /// The command line itself is wrong (an unknown flag): clap's own message.
    #[error("{0}")]
    Arguments(String),
}

impl ConfigError {
    fn invalid(var: impl Into<String>, value: impl Into<String>, why: impl Into<String>) -> Self {
        Self::Invalid { var: var.into(), value: value.into(), why: why.into() }
    }

    /// A clap error about a value, restated with the variable's name (clap names the flag,
    /// while the injector and operators set the variable).
    pub fn from_clap(e: &clap::Error) -> Self {
        use clap::error::{ContextKind, ContextValue};
        let context = |kind| match e.get(kind) {
            Some(ContextValue::String(s)) => Some(s.clone()),
            _ => None,
        };
        let var = context(ContextKind::InvalidArg).and_then(|arg| {
            let long = arg.strip_prefix("--")?.split([' ', '=']).next()?.to_string();
            let command = <Args as clap::CommandFactory>::command();
            let env = command.get_arguments().find(|a| a.get_long() == Some(long.as_str()))?.get_env()?;
            Some(env.to_string_lossy().into_owned())
        });
        match (var, context(ContextKind::InvalidValue), std::error::Error::source(e)) {
            (Some(var), Some(value), Some(why)) => Self::Invalid { var, value, why: why.to_string() },
            _ => Self::Arguments(e.render().to_string().trim_end().to_string()),
        }
    }
}

/// A comma-separated list; blanks around items and empty items are ignored.
#[derive(Debug, Clone)]
pub struct List<T>(pub Vec<T>);

fn list<T: std::str::FromStr>(value: &str) -> Result<List<T>, String>
where
    T::Err: std::fmt::Display,
{
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|e: T::Err| e.to_string()))
        .collect::<Result<_, _>>()
        .map(List)
}

fn parsed<T: std::str::FromStr>(value: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    value.trim().parse().map_err(|e: T::Err| e.to_string())
}

fn millis(value: &str) -> Result<Duration, String> {
    value.trim().parse::<u64>().map(Duration::from_millis).map_err(|e| format!("milliseconds expected: {e}"))
}

fn workers(value: &str) -> Result<usize, String> {
    value.trim().parse().ok().filter(|w| *w > 0).ok_or_else(|| "a positive number of threads expected".into())
}

fn connections(value: &str) -> Result<usize, String> {
    value.trim().parse().ok().filter(|n| *n > 0).ok_or_else(|| "a positive number of connections expected".into())
}

/// The default of `CNIMESH_PROXY_TRACE_SPAN_BUDGET`: far above what a sampled share of a
/// sidecar's traffic needs, far below what a flood of forced traces would export.
pub const DEFAULT_SPAN_BUDGET: u32 = 1000;

fn span_budget(value: &str) -> Result<u32, String> {
    value
        .trim()
        .parse()
        .ok()
        .filter(|n| (1..=1_000_000).contains(n))
        .ok_or_else(|| "a number of traced requests per second from 1 to 1000000 expected".into())
}

fn flag(value: &str) -> Result<bool, String> {
    match value.trim() {
        "true" | "1" => Ok(true),
        "false" | "0" | "" => Ok(false),
        _ => Err("true or false expected".into()),
    }
}

fn endpoint_identities(value: &str) -> Result<List<(EndpointMatch, Name)>, String> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(endpoint_identity).collect::<Result<_, _>>().map(List)
}

/// The proxy's settings as given. Unset means [`Config::default`]'s value; [`Config::try_from`]
/// applies the rules that span settings (identity all or nothing, exactly one trust-anchor
/// source, discovery needs an identity).
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "cnimesh-proxy", version, about = "cnimesh sidecar proxy", long_about = None)]
pub struct Args {
    /// Inbound listeners, comma-separated [default: 0.0.0.0:4143,[::]:4143].
    #[arg(long, env = "CNIMESH_PROXY_INBOUND_ADDRS", value_parser = list::<SocketAddr>)]
    pub inbound_addrs: Option<List<SocketAddr>>,
    /// Outbound listeners, comma-separated [default: 127.0.0.1:4140,[::1]:4140].
    #[arg(long, env = "CNIMESH_PROXY_OUTBOUND_ADDRS", value_parser = list::<SocketAddr>)]
    pub outbound_addrs: Option<List<SocketAddr>>,
    /// Admin server [default: 0.0.0.0:4191].
    #[arg(long, env = "CNIMESH_PROXY_ADMIN_ADDR", value_parser = parsed::<SocketAddr>)]
    pub admin_addr: Option<SocketAddr>,
    /// Ports forwarded as opaque TCP without detection [default: 25,587,3306,4444,5432,6379,9300,11211].
    #[arg(long, env = "CNIMESH_PROXY_OPAQUE_PORTS", value_parser = list::<u16>)]
    pub opaque_ports: Option<List<u16>>,
    /// Protocol detection timeout, ms [default: 10000].
    #[arg(long, env = "CNIMESH_PROXY_DETECT_TIMEOUT_MS", value_parser = millis)]
    pub detect_timeout_ms: Option<Duration>,
    /// HTTP/1 request headers, including a keep-alive connection's idle wait, ms [default: 120000].
    #[arg(long, env = "CNIMESH_PROXY_HEADER_TIMEOUT_MS", value_parser = millis)]
    pub header_timeout_ms: Option<Duration>,
    /// Opaque connections idle this long are closed, ms [default: 3600000].
    #[arg(long, env = "CNIMESH_PROXY_IDLE_TIMEOUT_MS", value_parser = millis)]
    pub idle_timeout_ms: Option<Duration>,
    /// Upstream connect timeout, ms [default: 5000].
    #[arg(long, env = "CNIMESH_PROXY_CONNECT_TIMEOUT_MS", value_parser = millis)]
    pub connect_timeout_ms: Option<Duration>,
    /// Time still accepting after SIGTERM or `/shutdown`, not ready, ms [default: 5000].
    #[arg(long, env = "CNIMESH_PROXY_SHUTDOWN_DELAY_MS", value_parser = millis)]
    pub shutdown_delay_ms: Option<Duration>,
    /// Then, drain time for in-flight work, ms [default: 20000].
    #[arg(long, env = "CNIMESH_PROXY_SHUTDOWN_GRACE_MS", value_parser = millis)]
    pub shutdown_grace_ms: Option<Duration>,
    /// Runtime threads [default: 1].
    #[arg(long, env = "CNIMESH_PROXY_WORKERS", value_parser = workers)]
    pub workers: Option<usize>,
    /// Log filter [default: info].
    #[arg(long, env = "CNIMESH_PROXY_LOG")]
    pub log: Option<String>,
    /// Refuse inbound connections that are not mTLS to our identity (true/false, 1/0) [default: false].
    #[arg(long, env = "CNIMESH_PROXY_INBOUND_REQUIRE_TLS", value_parser = flag)]
    pub inbound_require_tls: Option<bool>,
    /// On opaque ports, how long to wait for a ClientHello, ms [default: 1000].
    #[arg(long, env = "CNIMESH_PROXY_OPAQUE_TLS_WAIT_MS", value_parser = millis)]
    pub opaque_tls_wait_ms: Option<Duration>,
    /// HTTP/1 to meshed endpoints over HTTP/2 with `l5d-orig-proto` (true/false, 1/0) [default: true].
    #[arg(long, env = "CNIMESH_PROXY_OUTBOUND_H2_UPGRADE", value_parser = flag)]
    pub outbound_h2_upgrade: Option<bool>,
    /// Static meshed endpoints, `ip[:port]=identity,...`.
    #[arg(long, env = "CNIMESH_PROXY_OUTBOUND_IDENTITIES", value_parser = endpoint_identities)]
    pub outbound_identities: Option<List<(EndpointMatch, Name)>>,
    /// This workload's identity; unset = no mTLS.
    #[arg(long, env = "CNIMESH_PROXY_IDENTITY_NAME", value_parser = parsed::<Name>)]
    pub identity_name: Option<Name>,
    /// PEM file of trust anchors (or the PEM itself in the next).
    #[arg(long, env = TRUST_ANCHORS_FILE_VAR)]
    pub identity_trust_anchors: Option<PathBuf>,
    /// The trust anchors' PEM text.
    #[arg(long, env = TRUST_ANCHORS_PEM_VAR, hide_env_values = true)]
    pub identity_trust_anchors_pem: Option<String>,
    /// With both of the above: start from the PEM, then follow the file only when this identity
    /// (the control plane's) endorses what it holds.
    #[arg(long, env = TRUST_ANCHORS_ENDORSED_BY_VAR, value_parser = parsed::<Name>)]
    pub identity_trust_anchors_endorsed_by: Option<Name>,
    /// With the above: when the injector gave this pod its anchors (Unix seconds); an endorsement
    /// made earlier is passed over, so a replayed older bundle cannot bring back a dropped anchor.
    #[arg(long, env = TRUST_ANCHORS_ENDORSED_SINCE_VAR)]
    pub identity_trust_anchors_endorsed_since: Option<u64>,
    /// Projected service-account token [default: /var/run/secrets/tokens/cnimesh-identity-token].
    #[arg(long, env = "CNIMESH_PROXY_IDENTITY_TOKEN_FILE")]
    pub identity_token_file: Option<PathBuf>,
    /// Run as this ExternalWorkload, `NAMESPACE/NAME` (a host outside Kubernetes): the first
    /// certificate with a join token, renewals with the certificate itself; inbound policy asks
    /// for the ExternalWorkload's Servers.
    #[arg(long, env = "CNIMESH_EXTERNAL_WORKLOAD")]
    pub external_workload: Option<String>,
    /// With --external-workload: the file holding the join token of `cnimesh external-workload
    /// join` (read when there is no certificate to renew).
    #[arg(long, env = "CNIMESH_PROXY_IDENTITY_JOIN_TOKEN_FILE")]
    pub identity_join_token_file: Option<PathBuf>,
    /// With --external-workload: where the key and certificate are kept across restarts
    /// (0700/0600) [default: /var/lib/cnimesh/identity].
    #[arg(long, env = "CNIMESH_PROXY_IDENTITY_STATE_DIR")]
    pub identity_state_dir: Option<PathBuf>,
    /// Identity service `host:port` (required with a name).
    #[arg(long, env = "CNIMESH_PROXY_IDENTITY_ADDR")]
    pub identity_addr: Option<String>,
    /// The identity the control plane must prove [default: the control plane's].
    #[arg(long, env = "CNIMESH_PROXY_IDENTITY_SVC_NAME", value_parser = parsed::<Name>)]
    pub identity_svc_name: Option<Name>,
    /// Cap of the jittered retry backoff, ms [default: 30000].
    #[arg(long, env = "CNIMESH_PROXY_IDENTITY_MAX_BACKOFF_MS", value_parser = millis)]
    pub identity_max_backoff_ms: Option<Duration>,
    /// Destination service `host:port`; unset = no discovery (needs an identity).
    #[arg(long, env = "CNIMESH_PROXY_DESTINATION_ADDR")]
    pub destination_addr: Option<String>,
    /// The identity the Destination service must prove [default: the Identity service's].
    #[arg(long, env = "CNIMESH_PROXY_DESTINATION_SVC_NAME", value_parser = parsed::<Name>)]
    pub destination_svc_name: Option<Name>,
    /// How long a new connection waits for the first answer about its destination, ms [default: 2000].
    #[arg(long, env = "CNIMESH_PROXY_DISCOVERY_WAIT_MS", value_parser = millis)]
    pub discovery_wait_ms: Option<Duration>,
    /// Outbound policy from the control plane decides each destination's protocol (true/false, 1/0) [default: true].
    #[arg(long, env = "CNIMESH_PROXY_OUTBOUND_POLICY", value_parser = flag)]
    pub outbound_policy: Option<bool>,
    /// This pod as `namespace:name`; set = inbound policy from the control plane (needs discovery).
    #[arg(long, env = "CNIMESH_PROXY_POLICY_WORKLOAD")]
    pub policy_workload: Option<String>,
    /// Policy for ports the control plane has not answered for [default: all-unauthenticated].
    #[arg(long, env = "CNIMESH_PROXY_POLICY_DEFAULT", value_parser = parsed::<crate::inbound::policy::model::DefaultPolicy>)]
    pub policy_default: Option<crate::inbound::policy::model::DefaultPolicy>,
    /// Networks of `cluster-authenticated` [default: 10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8].
    #[arg(long, env = "CNIMESH_PROXY_POLICY_CLUSTER_NETWORKS", value_parser = list::<ipnet::IpNet>)]
    pub policy_cluster_networks: Option<List<ipnet::IpNet>>,
    /// TCP ports the pod's containers declare, comma-separated: their policies are watched from
    /// start-up and never evicted [default: none].
    #[arg(long, env = "CNIMESH_PROXY_INBOUND_PORTS", value_parser = list::<u16>)]
    pub inbound_ports: Option<List<u16>>,
    /// How long `/ready` waits for the declared ports' first policy answers, ms [default: 10000].
    #[arg(long, env = "CNIMESH_PROXY_POLICY_READY_TIMEOUT_MS", value_parser = millis)]
    pub policy_ready_timeout_ms: Option<Duration>,
    /// Inbound connections served at once; more are shed [default: from the open-file limit].
    #[arg(long, env = "CNIMESH_PROXY_INBOUND_MAX_CONNECTIONS", value_parser = connections)]
    pub inbound_max_connections: Option<usize>,
    /// Outbound connections served at once; more are shed [default: from the open-file limit].
    #[arg(long, env = "CNIMESH_PROXY_OUTBOUND_MAX_CONNECTIONS", value_parser = connections)]
    pub outbound_max_connections: Option<usize>,
    /// Inbound connections one client IP may hold [default: a quarter of the inbound limit].
    #[arg(long, env = "CNIMESH_PROXY_INBOUND_MAX_CONNECTIONS_PER_SOURCE", value_parser = connections)]
    pub inbound_max_connections_per_source: Option<usize>,
    /// Identities that may tap this proxy, comma-separated [default: the control plane's].
    #[arg(long, env = "CNIMESH_PROXY_TAP_IDENTITIES", value_parser = list::<Name>)]
    pub tap_identities: Option<List<Name>>,
    /// OTLP/gRPC trace collector, `http://host:port`, `https://host:port` or `host:port`; unset or empty = tracing off.
    #[arg(long, env = "CNIMESH_PROXY_TRACE_COLLECTOR")]
    pub trace_collector: Option<String>,
    /// Share of requests without trace context that start a trace, 0.0-1.0 [default: 0].
    #[arg(long, env = "CNIMESH_PROXY_TRACE_SAMPLING")]
    pub trace_sampling: Option<String>,
    /// PEM roots that verify an https trace collector [default: the system's].
    #[arg(long, env = "CNIMESH_PROXY_TRACE_COLLECTOR_CA_FILE")]
    pub trace_collector_ca_file: Option<PathBuf>,
    /// Requests traced per second at most, whatever clients ask for [default: 1000].
    #[arg(long, env = "CNIMESH_PROXY_TRACE_SPAN_BUDGET", value_parser = span_budget)]
    pub trace_span_budget: Option<u32>,
    /// This pod's name (span attribute `k8s.pod.name`; set by the injector).
    #[arg(long, env = "CNIMESH_POD_NAME")]
    pub pod_name: Option<String>,
    /// This pod's namespace (span attribute `k8s.namespace.name`; set by the injector).
    #[arg(long, env = "CNIMESH_POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// `sidecar` or `gateway` (a multicluster gateway: needs an identity and discovery) [default: sidecar].
    #[arg(long, env = "CNIMESH_PROXY_MODE")]
    pub mode: Option<String>,
    /// The cluster domain whose Services a gateway forwards to [default: cluster.local].
    #[arg(long, env = "CNIMESH_PROXY_GATEWAY_CLUSTER_DOMAIN")]
    pub gateway_cluster_domain: Option<String>,
}

/// The mode, checked: a gateway without an identity could not require mTLS, and
/// without discovery could not resolve a Service: both refused rather than run open.
fn mode(args: &Args, identity: bool, destination: bool) -> Result<Mode, ConfigError> {
    let value = args.mode.as_deref().map(str::trim).unwrap_or("");
    match value {
        "" | "sidecar" => Ok(Mode::Sidecar),
        "gateway" if !identity => Err(ConfigError::invalid(
            "CNIMESH_PROXY_MODE",
            value,
            "a gateway needs CNIMESH_PROXY_IDENTITY_* (it accepts mesh mTLS only)",
        )),
        "gateway" if !destination => Err(ConfigError::invalid(
            "CNIMESH_PROXY_MODE",
            value,
            "a gateway needs CNIMESH_PROXY_DESTINATION_ADDR (it resolves the Services it forwards to)",
        )),
        "gateway" => {
            let domain = args.gateway_cluster_domain.as_deref().map(str::trim).unwrap_or("");
            let domain = if domain.is_empty() { DEFAULT_GATEWAY_CLUSTER_DOMAIN } else { domain };
            if domain.split('.').any(|l| l.is_empty() || !l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')) {
                return Err(ConfigError::invalid(
                    "CNIMESH_PROXY_GATEWAY_CLUSTER_DOMAIN",
                    domain,
                    "expected a DNS domain such as cluster.local",
                ));
            }
            Ok(Mode::Gateway { cluster_domain: domain.to_ascii_lowercase() })
        }
        other => Err(ConfigError::invalid("CNIMESH_PROXY_MODE", other, "expected sidecar or gateway")),
    }
}

impl TryFrom<Args> for Config {
    type Error = ConfigError;

    fn try_from(args: Args) -> Result<Self, ConfigError> {
        let d = Self::default();
        let identity = identity(&args)?;
        let destination = destination(&args, identity.as_ref())?;
        let policy = policy(&args, destination.as_ref())?;
        let trace = trace(&args)?;
        let mode = mode(&args, identity.is_some(), destination.is_some())?;
        let outbound_identities = args.outbound_identities.map(|l| l.0).unwrap_or_default();
        if identity.is_none() && !outbound_identities.is_empty() {
            return Err(ConfigError::invalid(
                "CNIMESH_PROXY_OUTBOUND_IDENTITIES",
                "",
                "meshed endpoints need CNIMESH_PROXY_IDENTITY_* (they would be sent plaintext)",
            ));
        }
        let tap_identities = match (&identity, args.tap_identities) {
            (Some(_), Some(list)) => list.0,
            (Some(id), None) => vec![id.control_name.clone()],
            (None, Some(list)) => {
                let value = list.0.iter().map(Name::to_string).collect::<Vec<_>>().join(",");
                return Err(ConfigError::invalid(
                    "CNIMESH_PROXY_TAP_IDENTITIES",
                    value,
                    "tap needs CNIMESH_PROXY_IDENTITY_* (it is served over mTLS only)",
                ));
            }
            (None, None) => Vec::new(),
        };
        let gateway = mode != Mode::Sidecar;
        Ok(Self {
            mode,
            trace,
            tap_identities,
            inbound: args.inbound_addrs.map_or(d.inbound, |l| l.0),
            outbound: args.outbound_addrs.map_or(d.outbound, |l| l.0),
            admin: args.admin_addr.unwrap_or(d.admin),
            detect_timeout: args.detect_timeout_ms.unwrap_or(d.detect_timeout),
            header_timeout: args.header_timeout_ms.unwrap_or(d.header_timeout),
            opaque_ports: args.opaque_ports.map_or(d.opaque_ports, |l| l.0),
            idle_timeout: args.idle_timeout_ms.unwrap_or(d.idle_timeout),
            connect_timeout: args.connect_timeout_ms.unwrap_or(d.connect_timeout),
            shutdown_delay: args.shutdown_delay_ms.unwrap_or(d.shutdown_delay),
            shutdown_grace: args.shutdown_grace_ms.unwrap_or(d.shutdown_grace),
            log_level: args.log.unwrap_or(d.log_level),
            workers: args.workers.unwrap_or(d.workers),
            identity,
            // A gateway accepts mesh mTLS only, whatever else is set.
            inbound_require_tls: gateway || args.inbound_require_tls.unwrap_or(d.inbound_require_tls),
            opaque_tls_wait: args.opaque_tls_wait_ms.unwrap_or(d.opaque_tls_wait),
            outbound_h2_upgrade: args.outbound_h2_upgrade.unwrap_or(d.outbound_h2_upgrade),
            outbound_identities,
            destination,
            policy,
            inbound_max_connections: args.inbound_max_connections,
            outbound_max_connections: args.outbound_max_connections,
            inbound_max_connections_per_source: args.inbound_max_connections_per_source,
        })
    }
}

/// The tracing settings. An empty collector is the same as none (an injector template that
/// renders an unset value); sampling and a CA file without a collector are checked but unused.
/// A CA file for an http collector is an error: it says TLS was meant, and plaintext is not it.
fn trace(args: &Args) -> Result<Option<TraceConfig>, ConfigError> {
    const SAMPLING_VAR: &str = "CNIMESH_PROXY_TRACE_SAMPLING";
    let sampling = match &args.trace_sampling {
        Some(text) if !text.trim().is_empty() => cnimesh_trace::export::parse_sampling(SAMPLING_VAR, text)
            .map_err(|_| ConfigError::invalid(SAMPLING_VAR, text.clone(), cnimesh_trace::export::SAMPLING_EXPECTED))?,
        _ => 0.0,
    };
    let Some(text) = args.trace_collector.as_deref().filter(|t| !t.trim().is_empty()) else { return Ok(None) };
    let collector: cnimesh_trace::Collector = text.parse().map_err(|_| {
        ConfigError::invalid(
            "CNIMESH_PROXY_TRACE_COLLECTOR",
            text,
            "expected http://host:port, https://host:port or host:port (an OTLP/gRPC collector, no path)",
        )
    })?;
    let ca_file = args.trace_collector_ca_file.clone().filter(|p| !p.as_os_str().is_empty());
    if let Some(ca) = &ca_file
        && !collector.tls
    {
        return Err(ConfigError::invalid(
            "CNIMESH_PROXY_TRACE_COLLECTOR_CA_FILE",
            ca.display().to_string(),
            format!("set for the plaintext collector {collector}; use https:// to verify it with this CA"),
        ));
    }
    let non_empty = |v: &Option<String>| v.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_string);
    Ok(Some(TraceConfig {
        collector,
        sampling,
        ca_file,
        span_budget: args.trace_span_budget.unwrap_or(DEFAULT_SPAN_BUDGET),
        pod_name: non_empty(&args.pod_name),
        pod_namespace: non_empty(&args.pod_namespace),
    }))
}

/// Linkerd's default cluster networks (the private ranges).
const DEFAULT_CLUSTER_NETWORKS: &[&str] =
    &["10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16", "fd00::/8"];

fn policy(args: &Args, destination: Option<&DestinationConfig>) -> Result<Option<PolicyConfig>, ConfigError> {
    let var = "CNIMESH_PROXY_POLICY_WORKLOAD";
    // An ExternalWorkload names itself in Linkerd's JSON form; a pod as `namespace:pod`.
    let external = args.external_workload.as_deref().and_then(|w| external_workload(w).ok());
    let (workload, external) = match (&args.policy_workload, external) {
        (Some(workload), _) => (workload.trim().to_string(), false),
        (None, Some((ns, name))) if destination.is_some() => {
            (serde_json::json!({"ns": ns, "kind": "external_workload", "name": name}).to_string(), true)
        }
        (None, _) => return Ok(None),
    };
    let workload = workload.as_str();
    if destination.is_none() {
        return Err(ConfigError::invalid(
            var,
            workload,
            "policy needs CNIMESH_PROXY_DESTINATION_ADDR (its control plane)",
        ));
    }
    match workload.split_once(':') {
        _ if external => {}
        Some((ns, pod)) if !ns.is_empty() && !pod.is_empty() && !pod.contains(':') => {}
        _ => return Err(ConfigError::invalid(var, workload, "expected NAMESPACE:POD")),
    }
    Ok(Some(PolicyConfig {
        workload: workload.to_string(),
        default: args.policy_default.unwrap_or(crate::inbound::policy::model::DefaultPolicy::AllUnauthenticated),
        cluster_networks: args
            .policy_cluster_networks
            .clone()
            .map_or_else(|| DEFAULT_CLUSTER_NETWORKS.iter().map(|n| n.parse().expect("valid")).collect(), |l| l.0),
        declared_ports: {
            let mut ports = args.inbound_ports.clone().map(|l| l.0).unwrap_or_default();
            ports.sort_unstable();
            ports.dedup();
            ports
        },
        ready_timeout: args.policy_ready_timeout_ms.unwrap_or(DEFAULT_POLICY_READY_TIMEOUT),
    }))
}

/// The identity settings: all or nothing. A name without an Identity service to ask is an error,
/// never a silent plaintext proxy.
fn identity(args: &Args) -> Result<Option<IdentityConfig>, ConfigError> {
    let Some(name) = args.identity_name.clone() else {
        let orphan = if let Some(path) = &args.identity_trust_anchors {
            Some((TRUST_ANCHORS_FILE_VAR, path.display().to_string()))
        } else if let Some(pem) = &args.identity_trust_anchors_pem {
            Some((TRUST_ANCHORS_PEM_VAR, redacted(pem)))
        } else {
            args.identity_addr.clone().map(|addr| ("CNIMESH_PROXY_IDENTITY_ADDR", addr))
        };
        return match orphan {
            Some((var, value)) => Err(ConfigError::invalid(var, value, "set without CNIMESH_PROXY_IDENTITY_NAME")),
            None => Ok(None),
        };
    };
    let n = "CNIMESH_PROXY_IDENTITY_NAME";
    let pem_of = |pem: &String| {
        if pem.trim().is_empty() {
            return Err(ConfigError::invalid(TRUST_ANCHORS_PEM_VAR, "", "empty: PEM certificates expected"));
        }
        Ok(pem.clone())
    };
    let trust_anchors = match (
        &args.identity_trust_anchors,
        &args.identity_trust_anchors_pem,
        &args.identity_trust_anchors_endorsed_by,
    ) {
        (Some(file), Some(pem), Some(signer)) => TrustAnchors::Endorsed {
            pem: pem_of(pem)?,
            file: file.clone(),
            signer: signer.clone(),
            since: args.identity_trust_anchors_endorsed_since,
        },
        (Some(_), Some(pem), None) => {
            return Err(ConfigError::invalid(
                TRUST_ANCHORS_PEM_VAR,
                redacted(pem),
                format!(
                    "set together with {TRUST_ANCHORS_FILE_VAR}: set exactly one of the two, or both with {TRUST_ANCHORS_ENDORSED_BY_VAR}"
                ),
            ));
        }
        (_, _, Some(signer)) => {
            return Err(ConfigError::invalid(
                TRUST_ANCHORS_ENDORSED_BY_VAR,
                signer.as_str(),
                format!(
                    "needs both {TRUST_ANCHORS_PEM_VAR} (the anchors at start) and {TRUST_ANCHORS_FILE_VAR} (the file it endorses)"
                ),
            ));
        }
        (Some(path), None, None) => TrustAnchors::File(path.clone()),
        (None, Some(pem), None) => TrustAnchors::Pem(pem_of(pem)?),
        (None, None, None) => {
            return Err(ConfigError::invalid(
                TRUST_ANCHORS_FILE_VAR,
                "",
                format!(
                    "{TRUST_ANCHORS_FILE_VAR} (a file) or {TRUST_ANCHORS_PEM_VAR} (the PEM) is required when {n} is set"
                ),
            ));
        }
    };
    let control_addr = args
        .identity_addr
        .clone()
        .ok_or_else(|| ConfigError::invalid("CNIMESH_PROXY_IDENTITY_ADDR", "", format!("required when {n} is set")))?;
    let external = external_identity(args, &name)?;
    Ok(Some(IdentityConfig {
        name,
        trust_anchors,
        token_file: args.identity_token_file.clone().unwrap_or_else(|| DEFAULT_TOKEN_FILE.into()),
        control_addr,
        control_name: args
            .identity_svc_name
            .clone()
            .unwrap_or_else(|| DEFAULT_CONTROL_NAME.parse().expect("valid default")),
        max_backoff: args.identity_max_backoff_ms.unwrap_or(DEFAULT_MAX_BACKOFF),
        external,
    }))
}

/// Where an ExternalWorkload's state lives unless `--identity-state-dir` says otherwise.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cnimesh/identity";
const EXTERNAL_VAR: &str = "CNIMESH_EXTERNAL_WORKLOAD";

/// `NAMESPACE/NAME`, both DNS names.
fn external_workload(value: &str) -> Result<(String, String), ConfigError> {
    let dns = |s: &str| {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    match value.trim().split_once('/') {
        Some((ns, name)) if dns(ns) && !ns.contains('.') && dns(name) => Ok((ns.into(), name.into())),
        _ => Err(ConfigError::invalid(EXTERNAL_VAR, value, "expected NAMESPACE/NAME of an ExternalWorkload")),
    }
}

/// The ExternalWorkload settings, checked against the identity name: it must be an identity of
/// the ExternalWorkload's namespace (Identity would refuse any other).
fn external_identity(args: &Args, name: &Name) -> Result<Option<ExternalIdentity>, ConfigError> {
    let Some(value) = &args.external_workload else {
        let orphan = match (&args.identity_join_token_file, &args.identity_state_dir) {
            (Some(path), _) => Some(("CNIMESH_PROXY_IDENTITY_JOIN_TOKEN_FILE", path)),
            (None, Some(path)) => Some(("CNIMESH_PROXY_IDENTITY_STATE_DIR", path)),
            (None, None) => None,
        };
        return match orphan {
            Some((var, path)) => {
                Err(ConfigError::invalid(var, path.display().to_string(), format!("set without {EXTERNAL_VAR}")))
            }
            None => Ok(None),
        };
    };
    let (namespace, workload) = external_workload(value)?;
    let same_namespace =
        name.trust_domain().and_then(|td| name.service_account(td).ok()).is_some_and(|(_, ns)| ns == namespace);
    if !same_namespace {
        return Err(ConfigError::invalid(
            EXTERNAL_VAR,
            value,
            format!("CNIMESH_PROXY_IDENTITY_NAME {name} is not a service-account identity of namespace {namespace}"),
        ));
    }
    Ok(Some(ExternalIdentity {
        namespace,
        name: workload,
        join_token_file: args.identity_join_token_file.clone(),
        state_dir: args.identity_state_dir.clone().unwrap_or_else(|| DEFAULT_STATE_DIR.into()),
    }))
}

fn destination(args: &Args, identity: Option<&IdentityConfig>) -> Result<Option<DestinationConfig>, ConfigError> {
    let Some(addr) = &args.destination_addr else { return Ok(None) };
    let Some(identity) = identity else {
        return Err(ConfigError::invalid(
            "CNIMESH_PROXY_DESTINATION_ADDR",
            addr.clone(),
            "discovery needs CNIMESH_PROXY_IDENTITY_* (its channel is verified mTLS)",
        ));
    };
    Ok(Some(DestinationConfig {
        addr: addr.trim().to_string(),
        name: args.destination_svc_name.clone().unwrap_or_else(|| identity.control_name.clone()),
        first_answer: args.discovery_wait_ms.unwrap_or(DEFAULT_DISCOVERY_WAIT),
        outbound_policy: args.outbound_policy.unwrap_or(true),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds each variable as the flag clap reads it into (a test must not change the process
    /// environment), so every variable's name is checked as well.
    fn from_vars(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let command = <Args as clap::CommandFactory>::command();
        let mut argv = vec!["cnimesh-proxy".to_string()];
        for (var, value) in pairs {
            let arg = command
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == *var))
                .unwrap_or_else(|| panic!("no flag reads {var}"));
            argv.push(format!("--{}={value}", arg.get_long().expect("long flag")));
        }
        let args = <Args as clap::Parser>::try_parse_from(argv).map_err(|e| ConfigError::from_clap(&e))?;
        Config::try_from(args)
    }

    #[test]
    fn defaults_without_configuration() {
        let c = from_vars(&[]).unwrap();
        assert_eq!(c.inbound.len(), 2);
        assert_eq!(c.outbound[0].to_string(), "127.0.0.1:4140");
        assert_eq!(c.admin.port(), 4191);
        assert!(c.opaque_ports.contains(&5432));
    }

    #[test]
    fn default_control_name_is_the_control_planes_service_account() {
        let name = Name::for_service_account(
            cnimesh_common::names::CONTROL_NAME,
            cnimesh_common::names::CONTROL_NAMESPACE,
            cnimesh_identity::name::DEFAULT_TRUST_DOMAIN,
        );
        assert_eq!(name.unwrap().as_str(), DEFAULT_CONTROL_NAME);
    }

    #[test]
    fn overrides_and_errors() {
        let c = from_vars(&[
            ("CNIMESH_PROXY_OPAQUE_PORTS", "5432, 7000"),
            ("CNIMESH_PROXY_DETECT_TIMEOUT_MS", "250"),
            ("CNIMESH_PROXY_OUTBOUND_ADDRS", "127.0.0.1:5140"),
        ])
        .unwrap();
        assert_eq!(c.opaque_ports, vec![5432, 7000]);
        assert_eq!(c.detect_timeout, Duration::from_millis(250));
        assert_eq!(c.outbound.len(), 1);
        let e = from_vars(&[("CNIMESH_PROXY_OPAQUE_PORTS", "x")]).unwrap_err();
        assert!(e.to_string().contains("CNIMESH_PROXY_OPAQUE_PORTS"));
        let c = from_vars(&[
            ("CNIMESH_PROXY_INBOUND_MAX_CONNECTIONS", "500"),
            ("CNIMESH_PROXY_INBOUND_MAX_CONNECTIONS_PER_SOURCE", "50"),
        ])
        .unwrap();
        assert_eq!((c.inbound_max_connections, c.inbound_max_connections_per_source), (Some(500), Some(50)));
        assert_eq!(c.outbound_max_connections, None);
        for bad in ["0", "-1", "many"] {
            let e = from_vars(&[("CNIMESH_PROXY_OUTBOUND_MAX_CONNECTIONS", bad)]).unwrap_err();
            assert!(e.to_string().contains("CNIMESH_PROXY_OUTBOUND_MAX_CONNECTIONS"), "{e}");
        }
    }

    #[test]
    fn identity_is_all_or_nothing() {
        assert!(from_vars(&[]).unwrap().identity.is_none());
        let name = ("CNIMESH_PROXY_IDENTITY_NAME", "web.shop.serviceaccount.identity.cnimesh.cluster.local");
        let e = from_vars(&[name]).unwrap_err();
        assert!(e.to_string().contains("IDENTITY_TRUST_ANCHORS"), "{e}");
        let e = from_vars(&[("CNIMESH_PROXY_IDENTITY_ADDR", "x:1")]).unwrap_err();
        assert!(e.to_string().contains("without CNIMESH_PROXY_IDENTITY_NAME"), "{e}");
        let c = from_vars(&[
            name,
            ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS", "/ca.crt"),
            ("CNIMESH_PROXY_IDENTITY_ADDR", "control:4190"),
            ("CNIMESH_PROXY_OUTBOUND_IDENTITIES", "10.0.0.1:80=a.b, 10.0.0.2=c.d"),
        ])
        .unwrap();
        let id = c.identity.unwrap();
        assert_eq!(id.control_name.as_str(), DEFAULT_CONTROL_NAME);
        assert_eq!(id.token_file.to_str(), Some(DEFAULT_TOKEN_FILE));
        assert_eq!(c.outbound_identities.len(), 2);
        assert!(from_vars(&[("CNIMESH_PROXY_OUTBOUND_IDENTITIES", "10.0.0.1:80=Bad_Name")]).is_err());
        assert!(from_vars(&[("CNIMESH_PROXY_INBOUND_REQUIRE_TLS", "yes")]).is_err());
        let e = from_vars(&[("CNIMESH_PROXY_OUTBOUND_IDENTITIES", "10.0.0.1=a.b")]).unwrap_err();
        assert!(e.to_string().contains("would be sent plaintext"), "{e}");
        let e = from_vars(&[("CNIMESH_PROXY_DESTINATION_ADDR", "control:4190")]).unwrap_err();
        assert!(e.to_string().contains("needs CNIMESH_PROXY_IDENTITY"), "{e}");
    }

    #[test]
    fn tap_is_for_the_control_plane_unless_told_otherwise_and_needs_an_identity() {
        let identity = [
            ("CNIMESH_PROXY_IDENTITY_NAME", "web.shop.serviceaccount.identity.cnimesh.cluster.local"),
            ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS", "/ca.crt"),
            ("CNIMESH_PROXY_IDENTITY_ADDR", "control:4190"),
        ];
        let default = from_vars(&identity).unwrap().tap_identities;
        assert_eq!(default.iter().map(Name::as_str).collect::<Vec<_>>(), [DEFAULT_CONTROL_NAME]);
        let tap = ("CNIMESH_PROXY_TAP_IDENTITIES", "a.b.serviceaccount.identity.cnimesh.cluster.local, c.d");
        let listed = from_vars(&[&identity[..], &[tap]].concat()).unwrap().tap_identities;
        assert_eq!(listed.len(), 2);
        assert!(from_vars(&[]).unwrap().tap_identities.is_empty(), "no identity: no tap");
        let e = from_vars(&[tap]).unwrap_err();
        assert!(e.to_string().contains("tap needs CNIMESH_PROXY_IDENTITY"), "{e}");
        let e = from_vars(&[&identity[..], &[("CNIMESH_PROXY_TAP_IDENTITIES", "Bad_Name")]].concat()).unwrap_err();
        assert!(e.to_string().contains("CNIMESH_PROXY_TAP_IDENTITIES"), "{e}");
    }

    #[test]
    fn an_external_workload_joins_with_a_token_file_keeps_state_and_names_itself_to_policy() {
        let identity = [
            ("CNIMESH_PROXY_IDENTITY_NAME", "db.shop.serviceaccount.identity.cnimesh.cluster.local"),
            ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS", "/etc/cnimesh/ca.crt"),
            ("CNIMESH_PROXY_IDENTITY_ADDR", "control.example:4190"),
            ("CNIMESH_PROXY_DESTINATION_ADDR", "control.example:4190"),
        ];
        let external = [
            ("CNIMESH_EXTERNAL_WORKLOAD", "shop/db-vm"),
            ("CNIMESH_PROXY_IDENTITY_JOIN_TOKEN_FILE", "/etc/cnimesh/join-token"),
            ("CNIMESH_PROXY_IDENTITY_STATE_DIR", "/var/lib/cnimesh/db"),
        ];
        let config = from_vars(&[&identity[..], &external[..]].concat()).unwrap();
        let ew = config.identity.unwrap().external.expect("running as an ExternalWorkload");
        assert_eq!((ew.namespace.as_str(), ew.name.as_str()), ("shop", "db-vm"));
        assert_eq!(ew.join_token_file.as_deref(), Some(std::path::Path::new("/etc/cnimesh/join-token")));
        assert_eq!(ew.state_dir, PathBuf::from("/var/lib/cnimesh/db"));
        let workload: serde_json::Value = serde_json::from_str(&config.policy.unwrap().workload).unwrap();
        assert_eq!(workload, serde_json::json!({"ns": "shop", "kind": "external_workload", "name": "db-vm"}));

        let default_state = from_vars(&[&identity[..], &external[..1]].concat()).unwrap();
        assert_eq!(default_state.identity.unwrap().external.unwrap().state_dir, PathBuf::from(DEFAULT_STATE_DIR));

        let e = from_vars(&[&identity[..], &[("CNIMESH_EXTERNAL_WORKLOAD", "db-vm")]].concat()).unwrap_err();
        assert!(e.to_string().contains("NAMESPACE/NAME"), "{e}");
        let e = from_vars(&[&identity[..], &[("CNIMESH_EXTERNAL_WORKLOAD", "bank/db-vm")]].concat()).unwrap_err();
        assert!(e.to_string().contains("not a service-account identity of namespace bank"), "{e}");
        let e = from_vars(&[&identity[..], &external[1..2]].concat()).unwrap_err();
        assert!(e.to_string().contains("set without CNIMESH_EXTERNAL_WORKLOAD"), "{e}");
    }

    #[test]
    fn trust_anchors_come_from_a_file_or_pem_text_or_the_pem_then_a_file_its_signer_endorses() {
        const PEM: &str = "-----BEGIN CERTIFICATE-----\nTUlJQ2FuY2hvcg==\n-----END CERTIFICATE-----\n";
        let name = ("CNIMESH_PROXY_IDENTITY_NAME", "web.shop.serviceaccount.identity.cnimesh.cluster.local");
        let addr = ("CNIMESH_PROXY_IDENTITY_ADDR", "control:4190");
        let file = ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS", "/ca.crt");
        let pem = ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM", PEM);
        let anchors = |pairs: &[(&str, &str)]| from_vars(pairs).map(|c| c.identity.unwrap().trust_anchors);

        assert_eq!(anchors(&[name, addr, file]).unwrap(), TrustAnchors::File("/ca.crt".into()));
        let from_pem = anchors(&[name, addr, pem]).unwrap();
        assert_eq!(from_pem, TrustAnchors::Pem(PEM.into()));
        assert!(!format!("{from_pem:?}").contains("TUlJQ2FuY2hvcg"), "{from_pem:?}");

        let both = anchors(&[name, addr, file, pem]).unwrap_err().to_string();
        assert!(both.contains(TRUST_ANCHORS_FILE_VAR) && both.contains(TRUST_ANCHORS_PEM_VAR), "{both}");
        assert!(both.contains("exactly one"), "{both}");
        let neither = anchors(&[name, addr]).unwrap_err().to_string();
        assert!(neither.contains(TRUST_ANCHORS_FILE_VAR) && neither.contains(TRUST_ANCHORS_PEM_VAR), "{neither}");
        let empty = anchors(&[name, addr, ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM", " \n")]).unwrap_err();
        assert!(empty.to_string().contains("empty"), "{empty}");
        let orphan = anchors(&[pem]).unwrap_err().to_string();
        assert!(orphan.contains("without CNIMESH_PROXY_IDENTITY_NAME"), "{orphan}");

        let control = "cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local";
        let by = ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_ENDORSED_BY", control);
        let endorsed = anchors(&[name, addr, file, pem, by]).unwrap();
        assert_eq!(
            endorsed,
            TrustAnchors::Endorsed {
                pem: PEM.into(),
                file: "/ca.crt".into(),
                signer: Name::parse(control).unwrap(),
                since: None
            }
        );
        let since = ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_ENDORSED_SINCE", "1700000000");
        let TrustAnchors::Endorsed { since, .. } = anchors(&[name, addr, file, pem, by, since]).unwrap() else {
            panic!("endorsed anchors expected")
        };
        assert_eq!(since, Some(1_700_000_000));
        assert!(!format!("{endorsed:?}").contains("TUlJQ2FuY2hvcg"), "{endorsed:?}");
        // An endorsed file needs the anchors to verify its endorsement with at start.
        for lacking in [&[name, addr, file, by][..], &[name, addr, pem, by]] {
            let e = anchors(lacking).unwrap_err().to_string();
            assert!(e.contains(TRUST_ANCHORS_ENDORSED_BY_VAR) && e.contains("needs both"), "{e}");
        }
        let bad = anchors(&[name, addr, file, pem, ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_ENDORSED_BY", "Not A Name")]);
        assert!(bad.unwrap_err().to_string().contains(TRUST_ANCHORS_ENDORSED_BY_VAR));
        for e in [both, orphan] {
            assert!(!e.contains("TUlJQ2FuY2hvcg"), "the PEM itself stays out of errors: {e}");
        }
    }

    #[test]
    fn policy_needs_discovery_and_a_namespaced_pod() {
        use crate::inbound::policy::model::DefaultPolicy;
        let base = [
            ("CNIMESH_PROXY_IDENTITY_NAME", "web.shop.serviceaccount.identity.cnimesh.cluster.local"),
            ("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS", "/ca.crt"),
            ("CNIMESH_PROXY_IDENTITY_ADDR", "control:4190"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| from_vars(&[&base[..], extra].concat());
        assert!(with(&[]).unwrap().policy.is_none(), "no workload: no policy, every client allowed");
        let e = with(&[("CNIMESH_PROXY_POLICY_WORKLOAD", "shop:web-0")]).unwrap_err();
        assert!(e.to_string().contains("needs CNIMESH_PROXY_DESTINATION_ADDR"), "{e}");
        let dst = ("CNIMESH_PROXY_DESTINATION_ADDR", "control:4190");
        let e = with(&[dst, ("CNIMESH_PROXY_POLICY_WORKLOAD", "web-0")]).unwrap_err();
        assert!(e.to_string().contains("NAMESPACE:POD"), "{e}");
        let p = with(&[dst, ("CNIMESH_PROXY_POLICY_WORKLOAD", "shop:web-0")]).unwrap().policy.unwrap();
        assert_eq!((p.workload.as_str(), p.default), ("shop:web-0", DefaultPolicy::AllUnauthenticated));
        assert_eq!(p.cluster_networks.len(), 5);
        let p = with(&[
            dst,
            ("CNIMESH_PROXY_POLICY_WORKLOAD", "shop:web-0"),
            ("CNIMESH_PROXY_POLICY_DEFAULT", "deny"),
            ("CNIMESH_PROXY_POLICY_CLUSTER_NETWORKS", "10.0.0.0/16"),
        ])
        .unwrap()
        .policy
        .unwrap();
        assert_eq!((p.default, p.cluster_networks.len()), (DefaultPolicy::Deny, 1));
        assert!(p.declared_ports.is_empty());
        let p = with(&[
            dst,
            ("CNIMESH_PROXY_POLICY_WORKLOAD", "shop:web-0"),
            ("CNIMESH_PROXY_INBOUND_PORTS", "8080, 9000,8080"),
            ("CNIMESH_PROXY_POLICY_READY_TIMEOUT_MS", "2500"),
        ])
        .unwrap()
        .policy
        .unwrap();
        assert_eq!((p.declared_ports, p.ready_timeout), (vec![8080, 9000], Duration::from_millis(2500)));
        let e = with(&[dst, ("CNIMESH_PROXY_POLICY_WORKLOAD", "shop:web-0"), ("CNIMESH_PROXY_INBOUND_PORTS", "http")])
            .unwrap_err();
        assert!(e.to_string().contains("CNIMESH_PROXY_INBOUND_PORTS"), "{e}");
        assert!(with(&[dst]).unwrap().destination.unwrap().outbound_policy, "on with discovery by default");
        let off = with(&[dst, ("CNIMESH_PROXY_OUTBOUND_POLICY", "false")]).unwrap();
        assert!(!off.destination.unwrap().outbound_policy);
        let e = with(&[dst, ("CNIMESH_PROXY_POLICY_DEFAULT", "allow")]).unwrap_err();
        assert!(e.to_string().contains("CNIMESH_PROXY_POLICY_DEFAULT"), "{e}");
    }

    #[test]
    fn tracing_is_off_without_a_collector_and_bad_values_name_their_variable() {
        assert!(from_vars(&[]).unwrap().trace.is_none());
        assert!(from_vars(&[("CNIMESH_PROXY_TRACE_COLLECTOR", "")]).unwrap().trace.is_none());
        let t = from_vars(&[
            ("CNIMESH_PROXY_TRACE_COLLECTOR", "otel-collector.tracing:4317"),
            ("CNIMESH_PROXY_TRACE_SAMPLING", "0.25"),
            ("CNIMESH_POD_NAME", "web-0"),
            ("CNIMESH_POD_NAMESPACE", "shop"),
        ])
        .unwrap()
        .trace
        .unwrap();
        assert_eq!(t.collector.to_string(), "http://otel-collector.tracing:4317");
        assert_eq!(
            (t.sampling, t.pod_name.as_deref(), t.pod_namespace.as_deref()),
            (0.25, Some("web-0"), Some("shop"))
        );
        let t = from_vars(&[
            ("CNIMESH_PROXY_TRACE_COLLECTOR", "https://collector:4317"),
            ("CNIMESH_PROXY_TRACE_COLLECTOR_CA_FILE", "/ca.pem"),
        ])
        .unwrap()
        .trace
        .unwrap();
        assert_eq!((t.collector.tls, t.sampling), (true, 0.0));
        for (var, value) in [
            ("CNIMESH_PROXY_TRACE_COLLECTOR", "collector"),
            ("CNIMESH_PROXY_TRACE_COLLECTOR", "http://collector:4317/v1/traces"),
            ("CNIMESH_PROXY_TRACE_SAMPLING", "1.5"),
            ("CNIMESH_PROXY_TRACE_SAMPLING", "half"),
        ] {
            let e = from_vars(&[(var, value)]).unwrap_err();
            assert!(e.to_string().contains(var) && e.to_string().contains(value), "{e}");
        }
        let e = from_vars(&[("CNIMESH_PROXY_TRACE_SAMPLING", "10%")]).unwrap_err().to_string();
        assert_eq!(
            e,
            format!("CNIMESH_PROXY_TRACE_SAMPLING=\"10%\": {}", cnimesh_trace::export::SAMPLING_EXPECTED),
            "the variable, the value and what it may be"
        );
        let e = from_vars(&[
            ("CNIMESH_PROXY_TRACE_COLLECTOR", "http://collector:4317"),
            ("CNIMESH_PROXY_TRACE_COLLECTOR_CA_FILE", "/ca.pem"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("CNIMESH_PROXY_TRACE_COLLECTOR_CA_FILE"), "{e}");
    }
}
