//! `cnimesh-node`'s command line: the node agent DaemonSet and the node-level debug CLI. Lives in
//! the library so test packages can build the same binary from current sources.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::cluster::SharedCluster;
use crate::debug::{self, Format};
use crate::host::{self, HostConfig, proxy::ProxyCommand};
use crate::kube_cluster::KubeCluster;
use crate::repair::RepairMode;
use crate::run::{self, RunConfig};
use anyhow::Context;
use clap::{Parser, Subcommand};
use cnimesh_cni::spec::{PortRange, RedirectSpec};
use cnimesh_common::names::{
    DEFAULT_SKIP_INBOUND_PORTS, DEFAULT_SKIP_OUTBOUND_PORTS, PROXY_INBOUND_PORT, PROXY_OUTBOUND_PORT, PROXY_UID,
};
use ipnet::IpNet;

/// Loopback only, the agent's health port (docs/architecture.md, "Names and numbers"): the agent runs on the host network, where
/// every address would include the pod network's gateway, so every pod could read the agent's
/// status and metrics. The DaemonSet widens it to the node's own address (`$(HOST_IP):4192`),
/// which the kubelet's probes, `cnimesh check` (API server pod proxy) and Prometheus dial;
/// `--ready-addr 0.0.0.0:4192` opens it everywhere.
fn default_ready_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], cnimesh_common::names::AGENT_HEALTH_PORT))
}

/// `HOST:PORT`, where HOST may also be a bare IPv6 address (`fd00::5:4192`): the DaemonSet
/// builds the value from the downward API's `status.hostIP`, which has no brackets.
fn parse_listen_addr(value: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = value.parse() {
        return Ok(addr);
    }
    let (host, port) = value.rsplit_once(':').ok_or_else(|| format!("{value:?}: expected HOST:PORT"))?;
    let host: std::net::IpAddr =
        host.trim_matches(['[', ']']).parse().map_err(|e| format!("{value:?}: address {host:?}: {e}"))?;
    let port: u16 = port.parse().map_err(|e| format!("{value:?}: port {port:?}: {e}"))?;
    Ok(SocketAddr::new(host, port))
}

#[derive(Parser)]
#[command(name = "cnimesh-node", version, about = "cnimesh node agent and node-level debug CLI")]
struct Cli {
    /// Host CNI binary directory (mounted from the host in the DaemonSet).
    #[arg(long, env = "CNIMESH_CNI_BIN_DIR", default_value = "/opt/cni/bin", global = true)]
    cni_bin_dir: PathBuf,
    /// Host CNI configuration directory.
    #[arg(long, env = "CNIMESH_CNI_CONF_DIR", default_value = "/etc/cni/net.d", global = true)]
    cni_conf_dir: PathBuf,
    /// The decision socket the plugin asks.
    #[arg(long, env = "CNIMESH_SOCKET", default_value = cnimesh_common::names::AGENT_SOCKET, global = true)]
    socket: PathBuf,
    /// Where the plugin keeps its attachment records.
    #[arg(long, env = "CNIMESH_STATE_DIR", default_value = cnimesh_common::names::STATE_DIR, global = true)]
    state_dir: PathBuf,
    /// Output format of the debug commands.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Human, global = true)]
    output: Format,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(clap::Args, Clone)]
struct AgentArgs {
    /// The cnimesh-cni binary to install (shipped in the agent's image).
    #[arg(long, env = "CNIMESH_PLUGIN_BINARY", default_value = "/opt/cnimesh/cnimesh-cni")]
    plugin_binary: PathBuf,
    /// Namespaces whose pods are never captured (and never wait for the agent).
    #[arg(long, env = "CNIMESH_EXCLUDE_NAMESPACES", value_delimiter = ',', default_values = cnimesh_common::names::DEFAULT_EXCLUDED_NAMESPACES)]
    exclude_namespaces: Vec<String>,
}

/// SSH first, then the ports a pod never captures (the control plane's and the proxy's admin
/// ports): an operator keeps a way in whatever the proxy does.
fn host_skip_inbound_ports() -> Vec<PortRange> {
    std::iter::once(22).chain(DEFAULT_SKIP_INBOUND_PORTS.iter().copied()).map(PortRange::single).collect()
}

fn default_skip_outbound_ports() -> Vec<PortRange> {
    DEFAULT_SKIP_OUTBOUND_PORTS.iter().copied().map(PortRange::single).collect()
}

#[derive(clap::Args, Clone)]
struct HostArgs {
    /// The proxy binary the agent starts and supervises. It must be root's and writable by root
    /// only (whoever can replace it runs code as the proxy's UID, whose traffic is not captured).
    #[arg(long, env = "CNIMESH_PROXY_BIN", default_value = "/usr/local/bin/cnimesh-proxy")]
    proxy_bin: PathBuf,
    /// The UID the proxy runs as: the one UID whose outbound traffic is not captured. Use a
    /// dedicated system user; 0 is refused.
    #[arg(long, env = "CNIMESH_PROXY_UID", default_value_t = PROXY_UID)]
    proxy_uid: u32,
    /// The proxy's GID (default: the number of its UID). Not a capture exception.
    #[arg(long, env = "CNIMESH_PROXY_GID")]
    proxy_gid: Option<u32>,
    /// The proxy's inbound port: inbound TCP is redirected there.
    #[arg(long, env = "CNIMESH_INBOUND_PORT", default_value_t = PROXY_INBOUND_PORT)]
    inbound_port: u16,
    /// The proxy's outbound port: outbound TCP is redirected there.
    #[arg(long, env = "CNIMESH_OUTBOUND_PORT", default_value_t = PROXY_OUTBOUND_PORT)]
    outbound_port: u16,
    /// Inbound ports (and `A-B` ranges) never captured. A list replaces the default, which keeps
    /// SSH (22) and the control plane's and proxy's own ports out of capture.
    #[arg(long, env = "CNIMESH_SKIP_INBOUND_PORTS", value_delimiter = ',', default_values_t = host_skip_inbound_ports())]
    skip_inbound_ports: Vec<PortRange>,
    /// Outbound destination ports never captured. A list replaces the default.
    #[arg(long, env = "CNIMESH_SKIP_OUTBOUND_PORTS", value_delimiter = ',', default_values_t = default_skip_outbound_ports())]
    skip_outbound_ports: Vec<PortRange>,
    /// Source subnets whose inbound connections are never captured (e.g. a management network).
    #[arg(long, env = "CNIMESH_SKIP_INBOUND_SUBNETS", value_delimiter = ',')]
    skip_inbound_subnets: Vec<IpNet>,
    /// Destination subnets never captured outbound (e.g. the cloud's metadata service).
    #[arg(long, env = "CNIMESH_SKIP_OUTBOUND_SUBNETS", value_delimiter = ',')]
    skip_outbound_subnets: Vec<IpNet>,
    /// `KEY=VALUE` lines added to the proxy's environment (its control plane, identity and
    /// workload settings). Must be root's and 0600: it may name secrets.
    #[arg(long, env = "CNIMESH_PROXY_ENV_FILE")]
    proxy_env_file: Option<PathBuf>,
    /// The ExternalWorkload's one-time join token (`cnimesh external-workload join`), root's and
    /// 0600; handed to the proxy as a copy in its state directory. Absent once the host joined.
    #[arg(long, env = "CNIMESH_JOIN_TOKEN_FILE")]
    join_token_file: Option<PathBuf>,
    /// One `KEY=VALUE` for the proxy's environment (repeatable); overrides the env file.
    #[arg(long = "proxy-env", value_parser = host::parse_env_pair)]
    proxy_env: Vec<(OsString, OsString)>,
    /// The admin listener: /ready, /live, /status and /metrics.
    #[arg(long, env = "CNIMESH_READY_ADDR", default_value_t = default_ready_addr(), value_parser = parse_listen_addr)]
    ready_addr: SocketAddr,
    /// Remove the rules on SIGTERM: only to take the host out of the mesh. By default they stay,
    /// so during a restart or an upgrade captured traffic fails instead of bypassing the proxy
    /// (`cnimesh-node host uninstall` removes them once the agent is stopped).
    #[arg(long, env = "CNIMESH_REMOVE_RULES_ON_EXIT")]
    remove_rules_on_exit: bool,
    #[command(subcommand)]
    action: Option<HostAction>,
    /// The proxy's own arguments, after `--`.
    #[arg(last = true)]
    proxy_args: Vec<OsString>,
}

impl HostArgs {
    /// The proxy's state directory is `<state-dir>/proxy`.
    fn config(&self, state_dir: &std::path::Path) -> HostConfig {
        let spec = RedirectSpec {
            inbound_proxy_port: self.inbound_port,
            outbound_proxy_port: self.outbound_port,
            proxy_uid: self.proxy_uid,
            proxy_gid: None,
            skip_inbound_ports: self.skip_inbound_ports.clone(),
            skip_outbound_ports: self.skip_outbound_ports.clone(),
            skip_inbound_subnets: self.skip_inbound_subnets.clone(),
            skip_outbound_subnets: self.skip_outbound_subnets.clone(),
        }
        .normalized();
        let proxy_state_dir = state_dir.join("proxy");
        HostConfig {
            spec,
            proxy: ProxyCommand {
                binary: self.proxy_bin.clone(),
                args: self.proxy_args.clone(),
                env: self.proxy_env.clone(),
                uid: self.proxy_uid,
                gid: self.proxy_gid.unwrap_or(self.proxy_uid),
                dir: proxy_state_dir.clone(),
            },
            proxy_env_file: self.proxy_env_file.clone(),
            proxy_state_dir: Some(proxy_state_dir),
            join_token_file: self.join_token_file.clone(),
            ready_addr: self.ready_addr,
            remove_rules_on_exit: self.remove_rules_on_exit,
        }
    }
}

#[derive(Subcommand, Clone)]
enum HostAction {
    /// Remove the capture rules from this host and exit: how a host leaves the mesh, after
    /// stopping the agent (`systemctl disable --now cnimesh-node`), which would put them back.
    Uninstall,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the agent (the DaemonSet's main process).
    Run {
        #[command(flatten)]
        agent: AgentArgs,
        /// This node's name (the downward API's spec.nodeName).
        #[arg(long, env = "NODE_NAME")]
        node_name: Option<String>,
        /// The admin listener: /ready, /live, /status and /metrics. Loopback by default; the
        /// DaemonSet binds the node's address (`$(HOST_IP):4192`); `0.0.0.0:4192` opens it on
        /// every address of the host, the pod network's gateway included.
        #[arg(long, env = "CNIMESH_READY_ADDR", default_value_t = default_ready_addr(), value_parser = parse_listen_addr)]
        ready_addr: SocketAddr,
        /// What to do with meshed pods running without capture.
        #[arg(long, env = "CNIMESH_REPAIR", value_enum, default_value_t = RepairMode::Delete)]
        repair: RepairMode,
        /// Seconds between repair passes.
        #[arg(long, env = "CNIMESH_REPAIR_INTERVAL", default_value_t = 60)]
        repair_interval: u64,
        /// Remove the plugin from the node on exit (final removal). By default it stays chained,
        /// so pods set up while the agent restarts fail closed and are retried.
        #[arg(long, env = "CNIMESH_UNINSTALL_ON_EXIT")]
        uninstall_on_exit: bool,
    },
    /// Host mode, on a Linux host outside Kubernetes (a VM): capture the host's own traffic,
    /// run and supervise the proxy, repair the rules; on SIGTERM stop the proxy and leave the
    /// rules (`host uninstall` removes them).
    Host(Box<HostArgs>),
    /// Install the binary and chain the plugin once, then exit.
    Install {
        #[command(flatten)]
        agent: AgentArgs,
    },
    /// Unchain the plugin and remove the binary, then exit.
    Uninstall,
    /// The DaemonSet's preStop hook: wait, so pod setups in flight finish before the agent is
    /// sent SIGTERM. The image holds no `sleep`; this needs nothing but the agent itself.
    PreStop {
        /// Seconds to wait.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
    /// Meshed pods on this node, with live redirect counters.
    Pods,
    /// The live ruleset inside one pod's netns, with counters.
    Rules {
        /// Pod (namespace/name or name) or container id (prefix).
        target: String,
    },
    /// Desired vs live rules for one or all pods; exits 1 on drift.
    Verify { target: Option<String> },
    /// Installation health: binary, chaining, socket, API, captured pods.
    Status,
}

fn config(cli: &Cli, agent: &AgentArgs) -> RunConfig {
    RunConfig {
        node_name: None,
        cni_bin_dir: cli.cni_bin_dir.clone(),
        cni_conf_dir: cli.cni_conf_dir.clone(),
        plugin_binary: agent.plugin_binary.clone(),
        socket: cli.socket.clone(),
        state_dir: cli.state_dir.clone(),
        netns_dir: run::DEFAULT_NETNS_DIR.into(),
        ready_addr: default_ready_addr(),
        repair: RepairMode::Delete,
        repair_interval: Duration::from_secs(60),
        uninstall_on_exit: false,
        excluded_namespaces: agent.exclude_namespaces.clone(),
        defaults: RedirectSpec::default(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

async fn kube_state() -> String {
    let probe = async {
        let client = kube::Client::try_default().await?;
        let version = client.apiserver_version().await?;
        anyhow::Ok(format!("reachable (v{}.{})", version.major, version.minor))
    };
    match tokio::time::timeout(Duration::from_secs(3), probe).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => format!("unreachable: {e:#}"),
        Err(_) => "unreachable: timed out after 3 s".into(),
    }
}

async fn main_async(cli: Cli) -> anyhow::Result<ExitCode> {
    let out = |text: String| {
        print!("{text}");
        Ok(ExitCode::SUCCESS)
    };
    match &cli.command {
        Cmd::Run { agent, node_name, ready_addr, repair, repair_interval, uninstall_on_exit } => {
            let mut cfg = config(&cli, agent);
            cfg.node_name = node_name.clone();
            cfg.ready_addr = *ready_addr;
            cfg.repair = *repair;
            cfg.repair_interval = Duration::from_secs(*repair_interval);
            cfg.uninstall_on_exit = *uninstall_on_exit;
            let node = node_name.clone().context("--node-name (or NODE_NAME) is required")?;
            let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
            let (cluster, driver) = KubeCluster::start(client, &node);
            tokio::spawn(driver);
            let cluster: SharedCluster = cluster;
            run::run(cfg, cluster, shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Host(args) if matches!(args.action, Some(HostAction::Uninstall)) => {
            host::uninstall()?;
            out("capture rules removed (table inet cnimesh); this host is out of the mesh\n".into())
        }
        Cmd::Host(args) => {
            host::run(args.config(&cli.state_dir), shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Install { agent } => {
            let file = run::install_once(&config(&cli, agent))?;
            out(format!("cnimesh-cni installed in {} and chained in {}\n", cli.cni_bin_dir.display(), file.display()))
        }
        Cmd::Uninstall => {
            let cfg = config(&cli, &AgentArgs { plugin_binary: PathBuf::new(), exclude_namespaces: vec![] });
            let changed = run::uninstall(&cfg)?;
            out(format!("cnimesh-cni removed ({} configuration files changed)\n", changed.len()))
        }
        Cmd::PreStop { seconds } => {
            tokio::time::sleep(Duration::from_secs(*seconds)).await;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Pods => out(debug::render_pods(&debug::pods(&cli.state_dir)?, cli.output)),
        Cmd::Rules { target } => out(debug::render_rules(&debug::rules(&cli.state_dir, target)?, cli.output)),
        Cmd::Verify { target } => {
            let verdicts = debug::verify(&cli.state_dir, target.as_deref())?;
            print!("{}", debug::render_verify(&verdicts, cli.output));
            Ok(if verdicts.iter().all(|v| v.ok) { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Cmd::Status => {
            let s = debug::status(&cli.cni_bin_dir, &cli.cni_conf_dir, &cli.socket, &cli.state_dir, kube_state().await);
            print!("{}", debug::render_status(&s, cli.output));
            Ok(if s.healthy() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("CNIMESH_LOG").unwrap_or_else(|_| "info".into());
    // The format from CNIMESH_LOG_FORMAT (plain or json); an unknown one is refused by name.
    if let Err(error) = cnimesh_common::logging::init(filter) {
        eprintln!("cnimesh-node: {error}");
        return ExitCode::from(2);
    }
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    match runtime.block_on(main_async(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cnimesh-node: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_listener_is_loopback_unless_widened_and_takes_the_downward_apis_bare_ipv6() {
        assert!(default_ready_addr().ip().is_loopback());
        assert_eq!(parse_listen_addr("10.0.0.5:4192"), Ok(SocketAddr::from(([10, 0, 0, 5], 4192))));
        assert_eq!(parse_listen_addr("fd00::5:4192").unwrap().to_string(), "[fd00::5]:4192");
        assert_eq!(parse_listen_addr("[fd00::5]:4192").unwrap().to_string(), "[fd00::5]:4192");
        assert!(parse_listen_addr(":4192").is_err(), "an unexpanded $(HOST_IP) is an error, not every address");
        assert!(parse_listen_addr("10.0.0.5").is_err());
    }

    #[test]
    fn host_mode_skips_ssh_by_default_and_passes_the_proxys_arguments_through() {
        let cli = Cli::try_parse_from([
            "cnimesh-node",
            "--state-dir",
            "/var/lib/x",
            "host",
            "--proxy-env",
            "CNIMESH_PROXY_LOG=debug",
            "--",
            "--some-proxy-flag",
        ])
        .unwrap();
        let Cmd::Host(args) = &cli.command else { panic!("parsed as host") };
        let cfg = args.config(&cli.state_dir);
        assert!(cfg.spec.skip_inbound_ports.contains(&PortRange::single(22)));
        assert!(cfg.spec.skip_inbound_ports.contains(&PortRange::single(4191)));
        assert_eq!(cfg.spec.proxy_uid, PROXY_UID);
        assert_eq!(cfg.proxy.gid, PROXY_UID);
        assert_eq!(cfg.proxy.args, vec![OsString::from("--some-proxy-flag")]);
        assert_eq!(cfg.proxy.env, vec![("CNIMESH_PROXY_LOG".into(), "debug".into())]);
        assert_eq!(cfg.proxy_state_dir.as_deref(), Some(std::path::Path::new("/var/lib/x/proxy")));
        assert!(cfg.spec.validate().is_ok());
    }

    /// deploy/host/cnimesh-node.service: its command line parses, and its capabilities are the
    /// ones host mode needs and no more (no CAP_SYS_ADMIN: the agent never enters a namespace).
    #[test]
    fn the_systemd_unit_runs_host_mode_with_only_the_capabilities_it_needs() {
        let unit = include_str!("../../deploy/host/cnimesh-node.service").replace("\\\n", " ");
        let value = |key: &str| {
            unit.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("{key}= missing from the unit"))
                .to_string()
        };
        let exec = value("ExecStart");
        let mut words: Vec<&str> = exec.split_whitespace().collect();
        assert_eq!(words[0], "/usr/local/bin/cnimesh-node");
        words[0] = "cnimesh-node";
        let cli = Cli::try_parse_from(&words).unwrap_or_else(|e| panic!("{exec}: {e}"));
        let Cmd::Host(args) = &cli.command else { panic!("the unit runs `host`") };
        assert_eq!(args.proxy_uid, PROXY_UID);
        assert_eq!(args.proxy_env_file.as_deref(), Some(std::path::Path::new("/etc/cnimesh/proxy.env")));
        assert_eq!(args.join_token_file.as_deref(), Some(std::path::Path::new("/etc/cnimesh/join-token")));
        let caps: Vec<String> = value("CapabilityBoundingSet").split_whitespace().map(String::from).collect();
        assert_eq!(caps, ["CAP_NET_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_FOWNER", "CAP_KILL"]);
        assert_eq!(value("NoNewPrivileges"), "yes");
        assert_eq!(value("KillMode"), "mixed", "SIGTERM to the agent, which stops the proxy");
        assert!(!unit.contains("PrivateNetwork=yes"), "the rules belong in the host's network namespace");
    }

    #[test]
    fn own_namespaces_are_excluded_by_default() {
        let defaults = cnimesh_common::names::DEFAULT_EXCLUDED_NAMESPACES;
        let cli = Cli::try_parse_from(["cnimesh-node", "install"]).unwrap();
        let Cmd::Install { agent } = &cli.command else { panic!("parsed as install") };
        assert_eq!(agent.exclude_namespaces, defaults);
        // …and the entry the agent chains carries them to the plugin.
        assert_eq!(config(&cli, agent).plugin_entry()["excludeNamespaces"], serde_json::json!(defaults));
    }
}
