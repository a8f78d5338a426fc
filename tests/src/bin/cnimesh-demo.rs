//! The README's first command until local mode lands: two pods wired by the real CNI chain
//! (Debian's bridge + host-local, cnimesh-cni chained), and captured connections shown with their
//! original destinations.

use std::net::{Ipv4Addr, SocketAddr};

use anyhow::Context;
use cnimesh_e2e::probe::connect;
use cnimesh_e2e::{Bins, Listener, Network, Pod, require_root};
use serde_json::json;

/// The plugin and probe binaries are built beside this one.
fn sibling_bins() -> anyhow::Result<Bins> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("binary has a directory")?;
    let bins = Bins {
        plugin: dir.join("cnimesh-cni"),
        probe: dir.join("cnimesh-probe"),
        proxy: dir.join("cnimesh-proxy"),
        control: dir.join("cnimesh-control"),
    };
    for path in [&bins.plugin, &bins.probe] {
        anyhow::ensure!(path.is_file(), "{} is missing: build with `cargo build --workspace --bins`", path.display());
    }
    Ok(bins)
}

fn main() -> anyhow::Result<()> {
    if !require_root("cnimesh-demo") {
        std::process::exit(1);
    }
    let bins = sibling_bins()?;
    let net = Network::bridge(&bins, json!({}))?;
    println!("CNI network {:?}: bridge + host-local, then cnimesh-cni (chained)\n", net.name());
    let a = Pod::new(&net, "demo")?;
    let b = Pod::new(&net, "demo")?;
    println!("pod a: netns {}  ip {} / {}", a.netns.name(), a.ipv4(), a.ipv6());
    println!("pod b: netns {}  ip {} / {}\n", b.netns.name(), b.ipv4(), b.ipv6());

    // Stand-ins for the proxy in pod a: inbound 4143, outbound 4140.
    let proxy = [SocketAddr::from((Ipv4Addr::UNSPECIFIED, 4143)), SocketAddr::from((Ipv4Addr::LOCALHOST, 4140))];
    let _listeners = Listener::start(&bins.probe, "a-proxy", &a.netns.path(), &proxy)?;

    let show = |title: &str, from: &Pod, to: SocketAddr, uid: Option<u32>| -> anyhow::Result<()> {
        let r = connect(&bins.probe, &from.netns.path(), to, uid)?;
        println!(
            "{title}\n  dialled {to}, accepted by {} on {} (local {}), original destination {}\n",
            r.name,
            r.listener,
            r.local,
            r.orig_dst.as_deref().unwrap_or("-")
        );
        Ok(())
    };
    show("inbound: pod b's proxy (uid 2102) dials a:8080", &b, (a.ipv4(), 8080).into(), Some(2102))?;
    show("outbound: an app in pod a dials b:9090", &a, (b.ipv4(), 9090).into(), None)?;

    println!("rules in pod a (nft list table inet cnimesh):\n{}", a.nft_table().unwrap_or_default());
    println!("cleaning up: CNI DEL for both pods, namespaces and bridge removed");
    Ok(())
}
