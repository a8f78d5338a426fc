//! Attacks on the capture rules from an ordinary neighbour pod, on a real
//! kernel: Debian's bridge + host-local as the primary CNI, cnimesh-cni chained, real nftables and
//! iptables, real TCP.
//!
//! The attack: an app in the meshed pod listens on 127.0.0.1:9999 because it trusts loopback. A
//! neighbour aims packets for 127.0.0.1 (or IPv4-mapped `::ffff:127.0.0.1`) at the meshed pod's
//! MAC. The inbound REDIRECT rewrites the destination to the pod's own address *before* routing,
//! so the kernel's martian check never sees the loopback destination, and the proxy receives a
//! connection whose original destination is loopback — which it would then dial for the
//! attacker. The listener on 4143 stands in for the proxy and reports SO_ORIGINAL_DST.
//!
//! The same holds for the unspecified addresses (`0.0.0.0`, `::`): a socket that dials them
//! reaches its own loopback, so a proxy handed one as an original destination would reach the
//! loopback-only app just the same.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use cnimesh_cni::backend::Backend;
use cnimesh_e2e::probe::connect;
use cnimesh_e2e::{Bins, Listener, Network, Pod, bins, require_root};
use serde_json::{Value, json};

/// The loopback-only app in the meshed pod.
const APP_PORT: u16 = 9999;
/// The inbound proxy port (docs/architecture.md, "Names and numbers").
const INBOUND_PROXY: u16 = 4143;

/// The IPv4-mapped form of 127.0.0.1: an IPv6 packet to it reaches 127.0.0.1 once a proxy or a
/// dual-stack socket turns it back into IPv4.
fn mapped_loopback() -> Ipv6Addr {
    Ipv4Addr::LOCALHOST.to_ipv6_mapped()
}

/// A meshed victim with its stand-in proxy and loopback app, and an unmeshed attacker beside it
/// (unmeshed so its own outbound capture does not take the attack packets first).
struct Scene<'n> {
    victim: Pod<'n>,
    attacker: Pod<'n>,
    _listeners: Listener,
}

fn scene<'n>(bins: &Bins, net: &'n Network) -> Scene<'n> {
    let victim = Pod::new(net, "default").expect("victim pod");
    let attacker = Pod::unmeshed(net, "default", &cnimesh_e2e::host::unique_name("attacker-")).expect("attacker pod");
    let addrs: [SocketAddr; 4] = [
        (Ipv4Addr::UNSPECIFIED, INBOUND_PROXY).into(),
        (Ipv6Addr::UNSPECIFIED, INBOUND_PROXY).into(),
        (Ipv4Addr::LOCALHOST, APP_PORT).into(),
        (Ipv6Addr::LOCALHOST, APP_PORT).into(),
    ];
    let listeners = Listener::start(&bins.probe, "victim", &victim.netns.path(), &addrs).expect("listeners");
    Scene { victim, attacker, _listeners: listeners }
}

/// Makes the attacker's kernel send packets for 127.0.0.1 out of eth0 to the victim's MAC: the
/// local table's loopback routes go, a host route via the victim comes in, `route_localnet` lets
/// a loopback address leave (and the answer from it come back) on a real interface, and
/// `accept_local` keeps the answer's source (127.0.0.1, still on the attacker's own `lo`) from
/// reading as a martian.
fn aim_at_ipv4_loopback(scene: &Scene<'_>) -> SocketAddr {
    let ns = &scene.attacker.netns;
    for key in ["all", "eth0"] {
        ns.exec("sysctl", &["-qw", &format!("net.ipv4.conf.{key}.route_localnet=1")]).expect("route_localnet");
    }
    ns.exec("sysctl", &["-qw", "net.ipv4.conf.eth0.accept_local=1"]).expect("accept_local");
    ns.exec("ip", &["route", "del", "table", "local", "local", "127.0.0.0/8", "dev", "lo"]).expect("drop lo route");
    ns.exec("ip", &["route", "del", "table", "local", "local", "127.0.0.1", "dev", "lo"]).expect("drop lo route");
    let (victim, me) = (scene.victim.ipv4().to_string(), scene.attacker.ipv4().to_string());
    ns.exec("ip", &["route", "add", "127.0.0.1/32", "via", &victim, "dev", "eth0", "src", &me]).expect("route");
    (Ipv4Addr::LOCALHOST, APP_PORT).into()
}

/// A socket cannot connect to an IPv4-mapped address over IPv6 (the kernel turns it into IPv4),
/// so the attacker dials the victim's real address and its own output hook rewrites the
/// destination to `::ffff:127.0.0.1` on the way out; its conntrack undoes that on the answers, so
/// the attacker's socket completes the handshake when the victim answers.
fn aim_at_mapped_loopback(scene: &Scene<'_>) -> SocketAddr {
    let ns = &scene.attacker.netns;
    let victim = scene.victim.ipv6();
    ns.exec(
        "ip",
        &["-6", "route", "add", &format!("{}/128", mapped_loopback()), "via", &victim.to_string(), "dev", "eth0"],
    )
    .expect("route");
    let rule = format!("ip6 daddr {victim} tcp dport {APP_PORT} dnat ip6 to [{}]:{APP_PORT}", mapped_loopback());
    ns.exec("nft", &["add", "table", "inet", "attack"]).expect("attacker's table");
    ns.exec("nft", &["add", "chain", "inet", "attack", "out", "{ type nat hook output priority -100; }"])
        .expect("chain");
    ns.exec("nft", &["add", "rule", "inet", "attack", "out", &rule]).expect("attacker's dnat");
    (IpAddr::from(victim), APP_PORT).into()
}

/// A socket cannot send to `0.0.0.0` or `::` (the kernel dials its own loopback instead), so the
/// attacker dials the victim's real address and rewrites the destination once the packet is
/// routed (postrouting, out of eth0 to the victim's MAC), and the source of the victim's answers
/// back before its own routing sees them (an unspecified source is a martian): stateless
/// rewrites, so the attacker's socket and conntrack see an ordinary connection to the victim.
fn aim_at_unspecified(scene: &Scene<'_>, v6: bool) -> SocketAddr {
    let ns = &scene.attacker.netns;
    let (family, victim, unspecified): (&str, IpAddr, IpAddr) = if v6 {
        ("ip6", scene.victim.ipv6().into(), Ipv6Addr::UNSPECIFIED.into())
    } else {
        ("ip", scene.victim.ipv4().into(), Ipv4Addr::UNSPECIFIED.into())
    };
    // The next hop is resolved from the packet's destination unless the route names a gateway:
    // name the victim as its own, so the kernel asks for the victim's MAC, not 0.0.0.0's.
    let (ip, host) = if v6 { ("-6", format!("{victim}/128")) } else { ("-4", format!("{victim}/32")) };
    let gateway = victim.to_string();
    ns.exec("ip", &[ip, "route", "add", &host, "via", &gateway, "dev", "eth0", "onlink"])
        .expect("route via the victim");
    ns.exec("nft", &["add", "table", "inet", "attack"]).expect("attacker's table");
    ns.exec("nft", &["add", "chain", "inet", "attack", "out", "{ type filter hook postrouting priority 0; }"])
        .expect("chain");
    ns.exec("nft", &["add", "chain", "inet", "attack", "in", "{ type filter hook prerouting priority -300; }"])
        .expect("chain");
    let out = format!("{family} daddr {victim} tcp dport {APP_PORT} {family} daddr set {unspecified}");
    ns.exec("nft", &["add", "rule", "inet", "attack", "out", &out]).expect("attacker's rewrite");
    let back = format!("{family} saddr {unspecified} tcp sport {APP_PORT} {family} saddr set {victim}");
    ns.exec("nft", &["add", "rule", "inet", "attack", "in", &back]).expect("attacker's rewrite back");
    (victim, APP_PORT).into()
}

/// Where the neighbour aims: a loopback address, or an unspecified one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Aim {
    Ipv4Loopback,
    MappedLoopback,
    Ipv4Unspecified,
    Ipv6Unspecified,
}

impl Aim {
    fn v6(self) -> bool {
        matches!(self, Aim::MappedLoopback | Aim::Ipv6Unspecified)
    }

    /// Whether a live rule (in `nft` or `iptables-save` words) is the guard's rule for this aim.
    fn is_its_rule(self, rule: &str) -> bool {
        let (nft, iptables) = match self {
            Aim::Ipv4Loopback => ("daddr 127.0.0.0/8 ", "-d 127.0.0.0/8 "),
            Aim::MappedLoopback => ("daddr ::ffff:127.0.0.0/104 ", "-d ::ffff:127.0.0.0/104 "),
            Aim::Ipv4Unspecified => ("daddr 0.0.0.0/8 ", "-d 0.0.0.0/8 "),
            Aim::Ipv6Unspecified => ("daddr :: ", "-d ::/128 "),
        };
        rule.contains(nft) || rule.contains(iptables)
    }
}

/// Packets counted by the live drop rule for one aim, read through the same code the node
/// agent's debug CLI uses.
fn guard_drops(backend: Backend, victim: &Pod<'_>, aim: Aim) -> u64 {
    backend
        .live(&victim.netns.path())
        .expect("read live rules")
        .iter()
        .filter(|l| aim.is_its_rule(&l.rule) && (l.rule.contains("drop") || l.rule.contains("DROP")))
        .map(|l| l.packets)
        .sum()
}

/// The whole attack for one aim and backend: the neighbour's connection must not reach the
/// proxy port with a loopback (or unspecified) original destination, the drop must be counted,
/// and ordinary traffic (the neighbour to the pod's address, the pod to its own loopback) must
/// still work.
fn loopback_attack(test: &str, settings: Value, backend: Backend, aim: Aim) {
    if !require_root(test) {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, settings).expect("network");
    let scene = scene(&bins, &net);
    let target = match aim {
        Aim::Ipv4Loopback => aim_at_ipv4_loopback(&scene),
        Aim::MappedLoopback => aim_at_mapped_loopback(&scene),
        Aim::Ipv4Unspecified => aim_at_unspecified(&scene, false),
        Aim::Ipv6Unspecified => aim_at_unspecified(&scene, true),
    };
    let v6 = aim.v6();

    let attempt = connect(&bins.probe, &scene.attacker.netns.path(), target, None);
    assert!(
        attempt.is_err(),
        "{test}: the neighbour's connection to the victim's loopback ({aim:?}, via {target}) was accepted: {attempt:?}"
    );
    assert!(guard_drops(backend, &scene.victim, aim) > 0, "{test}: the guard's drop rule for {aim:?} counted nothing");

    // Capture itself is intact: the neighbour reaching the pod's address still lands on the proxy.
    let pod_addr: IpAddr = if v6 { scene.victim.ipv6().into() } else { scene.victim.ipv4().into() };
    let ordinary = SocketAddr::new(pod_addr, 8080);
    let got = connect(&bins.probe, &scene.attacker.netns.path(), ordinary, None).expect("ordinary inbound");
    assert_eq!(got.orig_dst.as_deref(), Some(ordinary.to_string().as_str()), "{test}: {got:?}");
    // And the pod's own loopback traffic (arriving on `lo`) is untouched.
    let own: SocketAddr =
        if v6 { (Ipv6Addr::LOCALHOST, APP_PORT).into() } else { (Ipv4Addr::LOCALHOST, APP_PORT).into() };
    let got = connect(&bins.probe, &scene.victim.netns.path(), own, None).expect("own loopback");
    assert_eq!(got.listener, own.to_string(), "{test}: {got:?}");
}

#[test]
fn a_neighbour_cannot_reach_a_loopback_only_app_through_nftables_capture_over_ipv4() {
    loopback_attack(
        "a_neighbour_cannot_reach_a_loopback_only_app_through_nftables_capture_over_ipv4",
        json!({}),
        Backend::Nftables,
        Aim::Ipv4Loopback,
    );
}

#[test]
fn a_neighbour_cannot_reach_a_loopback_only_app_through_nftables_capture_over_mapped_ipv6() {
    loopback_attack(
        "a_neighbour_cannot_reach_a_loopback_only_app_through_nftables_capture_over_mapped_ipv6",
        json!({}),
        Backend::Nftables,
        Aim::MappedLoopback,
    );
}

#[test]
fn a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_legacy_capture_over_ipv4() {
    loopback_attack(
        "a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_legacy_capture_over_ipv4",
        json!({"backend": "iptables-legacy"}),
        Backend::IptablesLegacy,
        Aim::Ipv4Loopback,
    );
}

#[test]
fn a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_legacy_capture_over_mapped_ipv6() {
    loopback_attack(
        "a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_legacy_capture_over_mapped_ipv6",
        json!({"backend": "iptables-legacy"}),
        Backend::IptablesLegacy,
        Aim::MappedLoopback,
    );
}

#[test]
fn a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_nft_capture_over_ipv4() {
    loopback_attack(
        "a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_nft_capture_over_ipv4",
        json!({"backend": "iptables-nft"}),
        Backend::IptablesNft,
        Aim::Ipv4Loopback,
    );
}

#[test]
fn a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_nft_capture_over_mapped_ipv6() {
    loopback_attack(
        "a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_nft_capture_over_mapped_ipv6",
        json!({"backend": "iptables-nft"}),
        Backend::IptablesNft,
        Aim::MappedLoopback,
    );
}

#[test]
fn a_neighbour_cannot_reach_a_loopback_only_app_through_nftables_capture_by_addressing_0_0_0_0() {
    loopback_attack(
        "a_neighbour_cannot_reach_a_loopback_only_app_through_nftables_capture_by_addressing_0_0_0_0",
        json!({}),
        Backend::Nftables,
        Aim::Ipv4Unspecified,
    );
}

#[test]
fn a_neighbour_cannot_reach_a_loopback_only_app_through_nftables_capture_by_addressing_the_unspecified_ipv6_address() {
    loopback_attack(
        "a_neighbour_cannot_reach_a_loopback_only_app_through_nftables_capture_by_addressing_the_unspecified_ipv6_address",
        json!({}),
        Backend::Nftables,
        Aim::Ipv6Unspecified,
    );
}

#[test]
fn a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_legacy_capture_by_addressing_0_0_0_0() {
    loopback_attack(
        "a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_legacy_capture_by_addressing_0_0_0_0",
        json!({"backend": "iptables-legacy"}),
        Backend::IptablesLegacy,
        Aim::Ipv4Unspecified,
    );
}

#[test]
fn a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_legacy_capture_by_addressing_the_unspecified_ipv6_address()
 {
    loopback_attack(
        "a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_legacy_capture_by_addressing_the_unspecified_ipv6_address",
        json!({"backend": "iptables-legacy"}),
        Backend::IptablesLegacy,
        Aim::Ipv6Unspecified,
    );
}

#[test]
fn a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_nft_capture_by_addressing_0_0_0_0() {
    loopback_attack(
        "a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_nft_capture_by_addressing_0_0_0_0",
        json!({"backend": "iptables-nft"}),
        Backend::IptablesNft,
        Aim::Ipv4Unspecified,
    );
}

#[test]
fn a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_nft_capture_by_addressing_the_unspecified_ipv6_address()
 {
    loopback_attack(
        "a_neighbour_cannot_reach_a_loopback_only_app_through_iptables_nft_capture_by_addressing_the_unspecified_ipv6_address",
        json!({"backend": "iptables-nft"}),
        Backend::IptablesNft,
        Aim::Ipv6Unspecified,
    );
}
