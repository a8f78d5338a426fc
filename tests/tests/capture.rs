//! Traffic capture on a real kernel: two pods on Debian's bridge + host-local with cnimesh-cni
//! chained, real TCP connections, and SO_ORIGINAL_DST read by the accepting listener.
//!
//! In each pod, listeners stand in for the proxy (inbound 4143, outbound 4140) and for apps on
//! their real ports; every connection reports which listener accepted it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use cnimesh_e2e::probe::connect;
use cnimesh_e2e::{Bins, Listener, Network, Pod, Report, bins, require_root};
use serde_json::{Value, json};

const PROXY_UID: u32 = 2102;

fn any(v6: bool, port: u16) -> SocketAddr {
    if v6 { (Ipv6Addr::UNSPECIFIED, port).into() } else { (Ipv4Addr::UNSPECIFIED, port).into() }
}

fn lo(v6: bool, port: u16) -> SocketAddr {
    if v6 { (Ipv6Addr::LOCALHOST, port).into() } else { (Ipv4Addr::LOCALHOST, port).into() }
}

fn ip(pod: &Pod<'_>, v6: bool) -> IpAddr {
    if v6 { pod.ipv6().into() } else { pod.ipv4().into() }
}

/// Listeners for a pod: the proxy's ports on both families, loopback app on 8080, and apps on
/// the pod IP for skipped inbound ports and 8080.
fn listeners(bins: &Bins, name: &str, pod: &Pod<'_>, v6: bool) -> Listener {
    let addr = |port| SocketAddr::new(ip(pod, v6), port);
    let addrs = [
        any(false, 4143),
        any(true, 4143),
        lo(false, 4140),
        lo(true, 4140),
        lo(v6, 8080),
        addr(4190),
        addr(4191),
        addr(8080),
    ];
    Listener::start(&bins.probe, name, &pod.netns.path(), &addrs).expect("listeners start")
}

struct Expect<'a> {
    pod: &'a str,
    listener: SocketAddr,
    orig_dst: Option<SocketAddr>,
}

#[track_caller]
fn check(bins: &Bins, from: &Pod<'_>, to: SocketAddr, uid: Option<u32>, want: Expect<'_>) -> Report {
    let got = connect(&bins.probe, &from.netns.path(), to, uid).unwrap_or_else(|e| panic!("connect to {to}: {e}"));
    let ctx = format!("connection to {to} (uid {uid:?}) got {got:?}");
    assert_eq!(got.name, want.pod, "{ctx}");
    assert_eq!(got.listener, want.listener.to_string(), "{ctx}");
    if let Some(dst) = want.orig_dst {
        assert_eq!(got.orig_dst.as_deref(), Some(dst.to_string().as_str()), "{ctx}");
    }
    got
}

/// The capture contract of docs/architecture.md, "Capture rules", for one address family.
fn traffic_checks(bins: &Bins, net: &Network, v6: bool) {
    let a = Pod::new(net, "default").expect("pod a");
    let b = Pod::new(net, "default").expect("pod b");
    let _la = listeners(bins, "a", &a, v6);
    let _lb = listeners(bins, "b", &b, v6);
    let at = |pod: &Pod<'_>, port| SocketAddr::new(ip(pod, v6), port);

    // Inbound: B's proxy (running as the proxy UID) dials A:8080; A's capture sends it to 4143.
    check(
        bins,
        &b,
        at(&a, 8080),
        Some(PROXY_UID),
        Expect { pod: "a", listener: any(v6, 4143), orig_dst: Some(at(&a, 8080)) },
    );
    // Outbound: an app in A dials B:9090; A's capture sends it to A's 4140.
    check(bins, &a, at(&b, 9090), None, Expect { pod: "a", listener: lo(v6, 4140), orig_dst: Some(at(&b, 9090)) });
    // The proxy's own connections bypass outbound capture (and are captured inbound at B).
    check(
        bins,
        &a,
        at(&b, 9090),
        Some(PROXY_UID),
        Expect { pod: "b", listener: any(v6, 4143), orig_dst: Some(at(&b, 9090)) },
    );
    // Loopback is never captured.
    check(bins, &a, lo(v6, 8080), None, Expect { pod: "a", listener: lo(v6, 8080), orig_dst: None });
    // Skipped outbound ports leave A uncaptured (B's inbound capture still applies).
    for port in [443, 6443] {
        check(bins, &a, at(&b, port), None, Expect { pod: "b", listener: any(v6, 4143), orig_dst: Some(at(&b, port)) });
    }
    // Skipped inbound ports reach the app directly.
    for port in [4190, 4191] {
        check(bins, &b, at(&a, port), Some(PROXY_UID), Expect { pod: "a", listener: at(&a, port), orig_dst: None });
    }
}

fn network(bins: &Bins, settings: Value) -> Network {
    Network::bridge(bins, settings).expect("network")
}

/// Runs the capture contract on a fresh network with `settings`, for each family listed.
fn capture_contract(test: &str, settings: Value, families: &[bool]) {
    if !require_root(test) {
        return;
    }
    let bins = bins!();
    let net = network(&bins, settings);
    for &v6 in families {
        traffic_checks(&bins, &net, v6);
    }
}

#[test]
fn nftables_ipv4() {
    capture_contract("nftables_ipv4", json!({}), &[false]);
}

#[test]
fn nftables_ipv6() {
    capture_contract("nftables_ipv6", json!({}), &[true]);
}

#[test]
fn iptables_legacy_both_families() {
    capture_contract("iptables_legacy_both_families", json!({"backend": "iptables-legacy"}), &[false, true]);
}

#[test]
fn iptables_nft_both_families() {
    capture_contract("iptables_nft_both_families", json!({"backend": "iptables-nft"}), &[false, true]);
}

#[test]
fn skipped_subnets_are_not_captured() {
    if !require_root("skipped_subnets_are_not_captured") {
        return;
    }
    let bins = bins!();
    let net = network(
        &bins,
        json!({"skipOutboundSubnets": [cnimesh_e2e::cni::POD_SUBNET_V4], "skipInboundSubnets": [cnimesh_e2e::cni::POD_SUBNET_V6]}),
    );
    let a = Pod::new(&net, "default").unwrap();
    let b = Pod::new(&net, "default").unwrap();
    let _la = listeners(&bins, "a", &a, true);
    let _la4 = Listener::start(&bins.probe, "a", &a.netns.path(), &[SocketAddr::new(a.ipv4().into(), 8080)]).unwrap();
    let _lb = listeners(&bins, "b", &b, false);
    let (a4, a6, b4, b6) = (a.ipv4(), a.ipv6(), b.ipv4(), b.ipv6());

    // Outbound to the skipped v4 subnet is not captured at A; v6 (not skipped) is.
    let dst = SocketAddr::new(b4.into(), 9090);
    check(&bins, &a, dst, None, Expect { pod: "b", listener: any(false, 4143), orig_dst: Some(dst) });
    let dst = SocketAddr::new(b6.into(), 9090);
    check(&bins, &a, dst, None, Expect { pod: "a", listener: lo(true, 4140), orig_dst: Some(dst) });
    // Inbound from the skipped v6 subnet reaches the app; v4 (not skipped) goes to the proxy.
    let dst = SocketAddr::new(a6.into(), 8080);
    check(&bins, &b, dst, Some(PROXY_UID), Expect { pod: "a", listener: dst, orig_dst: None });
    let dst = SocketAddr::new(a4.into(), 8080);
    check(&bins, &b, dst, Some(PROXY_UID), Expect { pod: "a", listener: any(false, 4143), orig_dst: Some(dst) });
}

#[test]
fn excluded_namespace_is_not_captured() {
    if !require_root("excluded_namespace_is_not_captured") {
        return;
    }
    let bins = bins!();
    let net = network(&bins, json!({}));
    let a = Pod::new(&net, "kube-system").unwrap();
    let b = Pod::new(&net, "kube-system").unwrap();
    let _la = listeners(&bins, "a", &a, false);
    let dst = SocketAddr::new(a.ipv4().into(), 8080);
    check(&bins, &b, dst, None, Expect { pod: "a", listener: dst, orig_dst: None });
    assert!(a.nft_table().is_none(), "no table in an excluded pod");
    assert!(std::fs::read_dir(net.state_dir().join("attachments")).map_or(true, |d| d.count() == 0));
}
