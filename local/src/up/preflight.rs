//! What `local up` checks before it creates anything: the workloads file, the flags, the host's
//! prerequisites, the binaries, and that nothing of an earlier run (root dir, namespaces, bridge)
//! or of the host (routes overlapping the subnet) stands in the way.

use std::path::{Path, PathBuf};

use anyhow::bail;
use ipnet::Ipv4Net;

use crate::host::{self, check_prerequisites, link_exists};
use crate::nginx::NGINX;
use crate::record;
use crate::workloads::Workloads;
use crate::{DEMO, UpArgs};

/// The binaries local mode runs, resolved and checked.
pub(super) struct Binaries {
    /// This executable, which the pods run for the demo's app.
    pub(super) local: PathBuf,
    pub(super) node: PathBuf,
    pub(super) plugin: PathBuf,
    pub(super) proxy: PathBuf,
    pub(super) control: PathBuf,
    /// With `--clusters 2` only: the first cluster's mirror.
    pub(super) mirror: Option<PathBuf>,
    pub(super) cli: PathBuf,
}

fn resolve_binary(flag: &Option<PathBuf>, name: &str, option: &str) -> anyhow::Result<PathBuf> {
    let path = match flag {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name(name),
    };
    if !path.is_file() {
        bail!(
            "{name} not found at {} (build it with `cargo build --release -p {name}`, or pass {option})",
            path.display()
        );
    }
    Ok(std::fs::canonicalize(&path)?)
}

/// nginx at `nginx` when the workloads have an ingress (and nothing otherwise).
fn check_nginx(workloads: &Workloads, nginx: &Path) -> anyhow::Result<()> {
    if workloads.ingress.is_some() && !nginx.is_file() {
        bail!(
            "the workloads file's `ingress:` runs nginx, and {} is missing: apt install nginx-light",
            nginx.display()
        );
    }
    Ok(())
}

/// Everything checked before anything is created.
pub(super) fn preflight(args: &UpArgs) -> anyhow::Result<(Workloads, Binaries)> {
    let workloads = match &args.workloads {
        Some(path) => Workloads::load(path)?,
        None => Workloads::parse(DEMO, "built-in demo.yaml")?,
    };
    let prefix = &args.naming.prefix;
    if prefix.is_empty()
        || prefix.len() > 12
        || !prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        || (prefix.starts_with("cnm") && prefix[3..].starts_with(|c: char| c.is_ascii_digit()))
    {
        bail!("--prefix {prefix:?}: 1 to 12 of a-z0-9, and not `cnm<digit>…` (the tests' names)");
    }
    if args.clusters == 2 {
        if prefix.len() > 11 {
            bail!("--prefix {prefix:?}: at most 11 characters with --clusters 2 (west's is `{prefix}w`)");
        }
        if args.west_subnet.contains(&args.subnet.network()) || args.subnet.contains(&args.west_subnet.network()) {
            bail!("--west-subnet {} overlaps --subnet {}", args.west_subnet, args.subnet);
        }
        if args.west_subnet.prefix_len() > 26 {
            bail!("--west-subnet {}: too small; use a /26 or larger", args.west_subnet);
        }
        let west_leftovers = host::netns_with_prefix(&format!("{prefix}w"));
        if !west_leftovers.is_empty() || link_exists(&format!("{prefix}w0")) {
            bail!(
                "namespaces {west_leftovers:?} or bridge {prefix}w0 already exist: run `cnimesh-local down --dir {} --prefix {prefix}` first",
                args.naming.dir.display()
            );
        }
    }
    if args.subnet.prefix_len() > 26 {
        bail!("--subnet {}: too small; use a /26 or larger", args.subnet);
    }
    let hosts = args.subnet.hosts().count().saturating_sub(1);
    let pods = workloads.pods().len() + 1;
    if pods > hosts {
        bail!("--subnet {} has room for {hosts} pods; the workloads need {pods}", args.subnet);
    }
    if !(args.traffic_seconds > 0.0 && args.traffic_seconds <= 600.0) || args.concurrency == 0 {
        bail!("--traffic-seconds must be in (0, 600] and --concurrency at least 1");
    }
    check_prerequisites()?;
    check_nginx(&workloads, Path::new(NGINX))?;
    let bins = Binaries {
        local: std::fs::canonicalize(std::env::current_exe()?)?,
        node: resolve_binary(&args.node, "cnimesh-node", "--node")?,
        plugin: resolve_binary(&args.cni_plugin, "cnimesh-cni", "--cni-plugin")?,
        proxy: resolve_binary(&args.proxy, "cnimesh-proxy", "--proxy")?,
        control: resolve_binary(&args.control, "cnimesh-control", "--control")?,
        mirror: match args.clusters {
            2 => Some(resolve_binary(&args.mirror, "cnimesh-mirror", "--mirror")?),
            _ => None,
        },
        cli: resolve_binary(&args.cli, "cnimesh", "--cli")?,
    };
    let root = &args.naming.dir;
    host::check_root(root)?;
    let down_hint = format!("cnimesh-local down --dir {} --prefix {prefix}", root.display());
    if root.join(record::FILE).exists() {
        bail!("local mode is already up in {}: run `{down_hint}` first", root.display());
    }
    if std::fs::read_dir(root).is_ok_and(|mut d| d.next().is_some()) {
        bail!("{} is not empty (left over from a crashed `up`?): run `{down_hint}` first", root.display());
    }
    let leftovers = host::netns_with_prefix(prefix);
    if !leftovers.is_empty() || link_exists(&format!("{prefix}0")) {
        bail!("namespaces {leftovers:?} or bridge {prefix}0 already exist: run `{down_hint}` first");
    }
    let routes = host::run("ip", &["-4", "route", "show"])?;
    if let Some(clash) = routes.lines().find(|l| {
        l.split_whitespace().next().and_then(|n| n.parse::<Ipv4Net>().ok()).is_some_and(|n| {
            n.prefix_len() > 0 && (n.contains(&args.subnet.network()) || args.subnet.contains(&n.network()))
        })
    }) {
        bail!("--subnet {} overlaps a route of this host ({clash}); pick another", args.subnet);
    }
    Ok((workloads, bins))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_is_needed_only_by_an_ingress() {
        let missing = Path::new("/nonexistent/nginx");
        let plain = Workloads::parse(crate::DEMO, "demo.yaml").unwrap();
        check_nginx(&plain, missing).unwrap();
        let with_ingress = Workloads::parse(
            "namespace: shop\nservices: [{name: web, clusterIP: 10.96.0.10, meshed: true}]\n\
             ingress: {routes: [{host: web.shop, service: web}]}\n",
            "test.yaml",
        )
        .unwrap();
        let e = check_nginx(&with_ingress, missing).unwrap_err().to_string();
        assert!(e.contains("`ingress:` runs nginx, and /nonexistent/nginx is missing"), "{e}");
    }
}
