//! `cnimesh-local down`: stops local mode's processes, DELs every recorded attachment through
//! the CNI chain, then deletes the namespaces, the bridge and the root dir. It trusts its records
//! where they exist and its naming where they do not, so it also finishes what a crashed `up` left.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use super::Naming;
use super::host::{self, find_processes, link_exists, netns_with_prefix, stop_processes};
use super::record::State;
use super::runtime::Runtime;

pub fn down(naming: &Naming) -> anyhow::Result<String> {
    let root = naming.dir.as_path();
    host::check_root(root)?;
    let recorded = State::read(root);
    // `up --clusters 2`: the second cluster first (its own namespaces, bridge and attachments),
    // then the forwarding rules between the two.
    let mut west_report = String::new();
    let west = root.join("west");
    if west.join(super::record::FILE).exists() || west.exists() {
        let west_prefix = State::read(&west).map_or_else(|| format!("{}w", naming.prefix), |s| s.prefix);
        west_report = down(&Naming { dir: west, prefix: west_prefix })?;
    }
    if let Some(table) = recorded.as_ref().and_then(|s| s.forward_table.clone())
        && host::run("nft", &["list", "table", "inet", &table]).is_ok()
    {
        host::run("nft", &["delete", "table", "inet", &table])?;
        west_report.push_str(&format!("nftables table inet {table} deleted\n"));
    }
    if let Some(table) = recorded.as_ref().and_then(|s| s.egress_table.clone())
        && host::run("nft", &["list", "table", "ip", &table]).is_ok()
    {
        host::run("nft", &["delete", "table", "ip", &table])?;
        west_report.push_str(&format!("nftables table ip {table} deleted\n"));
    }
    // The prefix `up` recorded wins over the flag's default.
    let prefix = recorded.map_or_else(|| naming.prefix.clone(), |s| s.prefix);
    let bridge = format!("{prefix}0");
    let netns = netns_with_prefix(&prefix);
    let pids = find_processes(root, &netns);
    if !root.exists() && netns.is_empty() && pids.is_empty() && !link_exists(&bridge) {
        return Ok(format!(
            "local mode is not up (no {}, no {prefix}-* namespaces, no {bridge}): nothing to do\n",
            root.display()
        ));
    }
    let mut problems = Vec::new();
    let stopped = stop_processes(&pids, Duration::from_secs(5));
    let runtime = Runtime { cni_path: root.join("cni-bin"), records: root.join("attachments") };
    let mut released = 0;
    for a in runtime.recorded() {
        match runtime.del(&a) {
            Ok(()) => released += 1,
            Err(e) => problems.push(format!("{e:#}")),
        }
    }
    // Namespaces whose attachment was never recorded as well as those just released.
    let netns = netns_with_prefix(&prefix);
    for name in &netns {
        if let Err(e) = host::run("ip", &["netns", "del", name]) {
            problems.push(format!("{e:#}"));
        }
    }
    if link_exists(&bridge)
        && let Err(e) = host::run("ip", &["link", "del", &bridge])
    {
        problems.push(format!("{e:#}"));
    }
    remove_root(root)?;
    let mut report = format!(
        "local mode is down: {stopped} processes stopped, {released} attachments released through the CNI chain, {} namespaces and bridge {bridge} deleted, {} removed\n",
        netns.len(),
        root.display()
    );
    for p in &problems {
        report.push_str(&format!("  warning: {p}\n"));
    }
    Ok(west_report + &report)
}

fn remove_root(root: &Path) -> anyhow::Result<()> {
    match std::fs::remove_dir_all(root) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", root.display()))
        }
        _ => Ok(()),
    }
}
