//! `cnimesh dashboard`: the mesh as a web page served on localhost, like `linkerd viz
//! dashboard`, with no Prometheus to install: a background [`sampler`] reads the proxies the way
//! `cnimesh stat` does (or `--prometheus`), and the [`api`] answers with exactly the JSON the
//! CLI's `-o json` prints (stat, edges, top/tap rows, check, diagnostics, authz), each value
//! stamped with when it was observed. The page ([`assets`]: plain HTML, JS and CSS embedded in
//! the binary) draws it.
//!
//! Security: it listens on loopback unless told otherwise (`--address` elsewhere needs
//! `--allow-remote` and warns); every request must carry this run's random token (printed in the
//! URL, then a cookie) and come from the dashboard's own page and address ([`access`]: token,
//! Origin, Host), and only GET is served; the live tap goes through the same relay path as
//! `cnimesh tap`, so the relay's authorization applies unchanged.
//!
//! Inside: [`server`] (HTTP, [`access`] checks, routing) → [`api`] (handlers and the sampler's loop) →
//! [`topology`] (the graph page's nodes and edges) and [`sampler`] (what it keeps: readings, kept
//! readings for time ranges, history) → [`problem`] (errors with hints);
//! [`assets`] is the embedded page.

pub mod access;
pub mod api;
pub mod assets;
pub mod problem;
pub mod sampler;
pub mod server;
pub mod topology;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};

use crate::ClusterArgs;

/// What to do with the URL once the server listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Show {
    /// Print it only (headless use).
    Url,
    /// Print it and open it with the desktop's opener when there is a display.
    Browser,
}

#[derive(Debug, Clone, Args)]
pub struct DashboardArgs {
    /// Local mode's directory (`cnimesh-local up --dir DIR`): its cluster, a shorthand for
    /// `--kubeconfig DIR/kubeconfig`.
    #[arg(long, value_name = "DIR")]
    pub local: Option<PathBuf>,
    /// The address to listen on. Anything but loopback needs --allow-remote: the page can do
    /// what your cluster credentials can (tap, read policies).
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub address: IpAddr,
    /// Listen on a non-loopback --address (printed as a warning).
    #[arg(long)]
    pub allow_remote: bool,
    /// The port to listen on (0: any free port).
    #[arg(long, default_value_t = 50750)]
    pub port: u16,
    /// `url`: only print the URL; `browser`: also open it when a display is there.
    #[arg(long, value_enum, default_value_t = Show::Browser)]
    pub show: Show,
    /// Read the proxies' series from this Prometheus (`http://host:9090`) instead of the proxies.
    #[arg(long, value_name = "URL")]
    pub prometheus: Option<String>,
    /// A PEM CA bundle to verify an `https://` Prometheus with, besides the system's roots.
    #[arg(long, value_name = "FILE", requires = "prometheus")]
    pub prometheus_ca: Option<PathBuf>,
    /// Only this namespace [default: every namespace].
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// How often the proxies are read (the rates' window; data older than two periods is stale).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
}

/// Serves the dashboard until interrupted.
pub async fn main(cluster: &ClusterArgs, args: DashboardArgs, out: &mut impl Write) -> anyhow::Result<()> {
    if !args.address.is_loopback() && !args.allow_remote {
        anyhow::bail!(
            "--address {}: not a loopback address; the page acts with your cluster credentials, so listening \
             elsewhere needs --allow-remote",
            args.address
        );
    }
    anyhow::ensure!(!args.interval.is_zero(), "--interval 0s: the proxies must be read at some interval");
    let state = api::Shared::new(cluster, &args).await?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(args.address, args.port))
        .await
        .with_context(|| format!("listening on {}", SocketAddr::new(args.address, args.port)))?;
    let bound = listener.local_addr().context("the listening address")?;
    if !args.address.is_loopback() {
        eprintln!(
            "warning: the dashboard listens on {bound}, beyond this host: whoever reaches it can tap and read \
             the mesh with your credentials"
        );
    }
    let access = access::Access::generate(bound);
    let url = access.url(bound);
    writeln!(out, "cnimesh dashboard: {url}")?;
    out.flush()?;
    let opener_page = if args.show == Show::Browser { open_browser(&url) } else { None };
    let tasks = tokio::task::LocalSet::new();
    tasks
        .run_until(async move {
            let sampler = tokio::task::spawn_local(api::run_sampler(state.clone()));
            let served = server::serve(listener, access, state);
            tokio::select! {
                result = served => result?,
                _ = tokio::signal::ctrl_c() => {}
            }
            sampler.abort();
            if let Some(page) = opener_page {
                let _ = std::fs::remove_file(page);
            }
            Ok(())
        })
        .await
}

/// The desktop's opener, when there is a desktop: never an error (headless hosts just have the
/// printed URL). The opener gets a private redirect page, not the URL: a command line is readable
/// by every user of the host (`/proc/*/cmdline`), and the URL carries the run's token. Returns the
/// page's path, removed when the dashboard stops.
fn open_browser(url: &str) -> Option<PathBuf> {
    let display = ["DISPLAY", "WAYLAND_DISPLAY"].iter().any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
    if !display {
        return None;
    }
    let page = match redirect_page(url) {
        Ok(page) => page,
        Err(e) => {
            tracing::info!("could not write the page that opens the dashboard ({e}); open the printed URL yourself");
            return None;
        }
    };
    let spawned = std::process::Command::new("xdg-open")
        .arg(&page)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match spawned {
        // Reaped on a thread of its own: the opener may outlive its browser's start.
        Ok(mut child) => {
            std::thread::spawn(move || child.wait());
        }
        Err(e) => tracing::info!("could not open a browser (xdg-open: {e}); open the printed URL yourself"),
    }
    Some(page)
}

/// Writes a page only this user can read (0600, a new file of a random name) that sends the
/// browser on to `url`, as Jupyter does.
fn redirect_page(url: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = std::env::temp_dir().join(format!("cnimesh-dashboard-{}.html", cnimesh_identity::secret::random_hex(8)));
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    // The URL is `http://host:port/?token=<hex>`: nothing in it needs escaping in an attribute.
    writeln!(
        file,
        "<!doctype html><meta charset=\"utf-8\"><meta name=\"referrer\" content=\"no-referrer\">\
         <meta http-equiv=\"refresh\" content=\"0;url={url}\"><a href=\"{url}\">Open the cnimesh dashboard</a>"
    )?;
    Ok(path)
}

#[cfg(test)]
mod tests;
