//! `cnimesh-local`, local mode: the whole mesh on one Linux host, set up the way a cluster would
//! set it up. Pods are network namespaces wired by the real CNI chain (Debian's `bridge` +
//! `host-local`, then `cnimesh-cni`, which asks the node agent `cnimesh-node run`), the control
//! plane runs in a pod of its own, proxies run as the proxy UID, and the demo's traffic goes
//! through all of it. The cluster's API server is local mode's own (`cnimesh-local apiserver`, the
//! in-process server of crate `cnimesh-apiserver` on the bridge's gateway, state in memory): the
//! node agent, the control plane and the CLI use their Kubernetes code paths against it, and
//! `kubectl --kubeconfig DIR/kubeconfig` works.
//!
//! Its own crate and binary because it is a developer harness, not part of a node: the node agent's
//! DaemonSet image ships `cnimesh-node` without it. It builds on the node agent's library (never the
//! reverse) and runs the other binaries (`cnimesh-node`, `cnimesh-cni`, `cnimesh-proxy`,
//! `cnimesh-control`) from beside its own executable unless told otherwise.
//!
//! Layers: demo_trace → app | host | nginx | record | runtime | traffic | workloads → apiserver | objects → down → up → cli
//!
//! `up` leaves everything running, detached; `down` finds what `up` created by its records and by
//! its naming (netns `<prefix>-*`, bridge `<prefix>0`, processes mentioning the root dir), so it
//! also cleans up after an `up` that crashed.

mod apiserver;
mod app;
pub mod cli;
pub mod demo_trace;
mod down;
mod host;
pub mod nginx;
mod objects;
mod record;
mod runtime;
pub mod traffic;
mod up;
mod workloads;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use cnimesh_node::debug::Format;

/// The demo shipped in the repository, built in so the binary needs no checkout.
pub const DEMO: &str = include_str!("demo.yaml");
pub const DEFAULT_ROOT: &str = "/run/cnimesh-local";
pub const DEFAULT_PREFIX: &str = "cnml";

#[derive(Debug, Args, Clone)]
pub struct Naming {
    /// Everything local mode writes lives here (removed by `down`).
    #[arg(long, default_value = DEFAULT_ROOT)]
    pub dir: PathBuf,
    /// Network namespaces are `<prefix>-<pod>`, the bridge `<prefix>0`.
    #[arg(long, default_value = DEFAULT_PREFIX)]
    pub prefix: String,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    #[command(flatten)]
    pub naming: Naming,
    /// The workloads file [default: the built-in copy of local/src/demo.yaml].
    #[arg(long)]
    pub workloads: Option<PathBuf>,
    /// Pod subnet on the bridge.
    #[arg(long, default_value = "10.247.0.0/24")]
    pub subnet: ipnet::Ipv4Net,
    /// The cnimesh-node binary, the node agent local mode runs [default: `cnimesh-node` beside
    /// this executable].
    #[arg(long)]
    pub node: Option<PathBuf>,
    /// The cnimesh-cni binary [default: `cnimesh-cni` beside this executable].
    #[arg(long)]
    pub cni_plugin: Option<PathBuf>,
    /// The cnimesh-proxy binary [default: `cnimesh-proxy` beside this executable].
    #[arg(long)]
    pub proxy: Option<PathBuf>,
    /// The cnimesh-control binary [default: `cnimesh-control` beside this executable].
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// The cnimesh-mirror binary, the multicluster mirror `--clusters 2` runs for the first
    /// cluster [default: `cnimesh-mirror` beside this executable].
    #[arg(long)]
    pub mirror: Option<PathBuf>,
    /// The operator's `cnimesh` binary, for `ca init` [default: `cnimesh` beside this executable].
    #[arg(long)]
    pub cli: Option<PathBuf>,
    /// Seconds of traffic per client and service.
    #[arg(long, default_value_t = 3.0)]
    pub traffic_seconds: f64,
    /// Concurrent requests per client and service.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// 2 adds a second cluster, `west`: its own root `<dir>/west`, prefix
    /// `<prefix>w`, bridge, subnet (--west-subnet), control plane (trust domain west.local, an
    /// issuer from east's anchor), workloads exported to east, a multicluster gateway pod, routes
    /// between the two pod networks, and the Link `cnimesh multicluster link` makes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub clusters: u8,
    /// West's pod subnet (with --clusters 2).
    #[arg(long, default_value = "10.248.0.0/24")]
    pub west_subnet: ipnet::Ipv4Net,
}

#[derive(Debug, Subcommand)]
pub enum LocalCmd {
    /// Create the pods, start the mesh, send the demo's traffic and print a summary.
    Up(Box<UpArgs>),
    /// Remove everything `up` created (also after a crash); succeeds when nothing is up.
    Down(Naming),
    /// The demo's HTTP app (run inside a pod by `up`).
    #[command(hide = true)]
    App {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        name: String,
    },
    /// Local mode's API server (run on the bridge's gateway by `up`): serves until killed, with a
    /// random administrator token in the kubeconfig it writes (0600); state in memory only.
    #[command(hide = true)]
    Apiserver {
        #[arg(long)]
        listen: SocketAddr,
        /// Where the administrator's kubeconfig is written.
        #[arg(long)]
        kubeconfig: PathBuf,
        /// The kubeconfig context's namespace.
        #[arg(long, default_value = "default")]
        namespace: String,
    },
    /// The collector stand-in (run on the bridge's gateway by `up`): an OTLP/gRPC receiver that
    /// appends every span it gets to a file, one JSON object per line.
    #[command(hide = true)]
    Collector {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        out: PathBuf,
    },
}

pub async fn main(cmd: &LocalCmd, format: Format) -> anyhow::Result<ExitCode> {
    match cmd {
        LocalCmd::App { listen, name } => {
            app::serve(*listen, name.clone()).await?;
            Ok(ExitCode::SUCCESS)
        }
        LocalCmd::Apiserver { listen, kubeconfig, namespace } => {
            apiserver::serve(*listen, kubeconfig, namespace).await?;
            Ok(ExitCode::SUCCESS)
        }
        LocalCmd::Collector { listen, out } => {
            demo_trace::collect(*listen, out).await?;
            Ok(ExitCode::SUCCESS)
        }
        LocalCmd::Up(args) => {
            // Blocking work (processes, netns threads): off the async workers.
            let summary = tokio::task::block_in_place(|| up::up(args))?;
            print!("{}", traffic::render(&summary, format));
            Ok(ExitCode::SUCCESS)
        }
        LocalCmd::Down(naming) => {
            let report = tokio::task::block_in_place(|| down::down(naming))?;
            print!("{report}");
            Ok(ExitCode::SUCCESS)
        }
    }
}
