//! The rule model: the one encoding of cnimesh's capture rules (docs/architecture.md, "Capture rules").
//!
//! A [`RedirectSpec`] becomes a [`Ruleset`]; the nftables backend encodes it as netlink messages and
//! decodes live rules back into it, the iptables backend renders it as `iptables-restore` input,
//! and `Display` renders it in `nft` syntax — exactly what `nft list table inet cnimesh` prints, so
//! the documented ruleset, CHECK's drift messages and the debug CLI all read the same.

use std::fmt;

use ipnet::IpNet;
use serde::Serialize;

use crate::spec::{PortRange, RedirectSpec};

pub const TABLE: &str = "cnimesh";
pub const INBOUND_CHAIN: &str = "inbound";
pub const OUTBOUND_CHAIN: &str = "outbound";
/// The base chain that runs the loopback guard before anything else sees a packet.
pub const GUARD_HOOK_CHAIN: &str = "prerouting_raw";
/// Drops packets from outside the pod that are addressed to its loopback.
pub const GUARD_CHAIN: &str = "guard";
/// The interface whose packets may carry loopback destinations.
pub const LOOPBACK_IFNAME: &str = "lo";

/// A netfilter hook a base chain is attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Hook {
    Prerouting,
    Output,
}

/// The type of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ChainType {
    Nat,
    Filter,
}

/// Base-chain properties: `type <kind> hook <hook> priority <priority>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BaseHook {
    pub kind: ChainType,
    pub hook: Hook,
    pub priority: i32,
}

/// The nat priority `nft` calls `dstnat`.
pub const PRIORITY_DSTNAT: i32 = -100;
/// The filter priority `nft` calls `raw`: before conntrack (-200) and before any nat.
pub const PRIORITY_RAW: i32 = -300;

/// Destinations that lead to the pod's loopback, which no packet from outside the pod may carry:
/// IPv4's 127/8 and IPv6's `::1`; the unspecified addresses `0.0.0.0/8` and `::`, through which a
/// socket dialling them (the proxy, handed one as an original destination) reaches its own
/// loopback; and the IPv4-mapped forms of both IPv4 ranges (`::ffff:127.0.0.0/104`,
/// `::ffff:0.0.0.0/104`), which a dual-stack socket or a proxy turns back into IPv4.
///
/// The pod's own addresses need no rule: a packet to one of them is ordinary inbound traffic,
/// redirected to the proxy, which dials the app on that same address, where a listener bound to
/// loopback is not.
pub fn loopback_destinations() -> [IpNet; 6] {
    [
        "127.0.0.0/8".parse().expect("valid"),
        "0.0.0.0/8".parse().expect("valid"),
        "::1/128".parse().expect("valid"),
        "::/128".parse().expect("valid"),
        "::ffff:127.0.0.0/104".parse().expect("valid"),
        "::ffff:0.0.0.0/104".parse().expect("valid"),
    ]
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Match {
    /// `meta l4proto tcp`
    Tcp,
    /// `tcp dport N` or `tcp dport A-B` (always preceded by [`Match::Tcp`]).
    DPort(PortRange),
    SkUid(u32),
    SkGid(u32),
    OifName(String),
    /// `iifname != "<name>"`
    IifNameNot(String),
    SAddr(IpNet),
    DAddr(IpNet),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Action {
    Return,
    Jump(String),
    Redirect(u16),
    Drop,
}

/// One rule. Every rule carries a counter; the counter values are not part of the rule's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rule {
    pub matches: Vec<Match>,
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseHook>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ruleset {
    pub chains: Vec<Chain>,
}

impl Rule {
    fn new(matches: Vec<Match>, action: Action) -> Self {
        Self { matches, action }
    }

    fn skip_port(range: PortRange) -> Self {
        Self::new(vec![Match::Tcp, Match::DPort(range)], Action::Return)
    }

    /// Short reason used for iptables comments (`cnimesh/<why>`).
    pub fn why(&self) -> &'static str {
        match (&self.action, self.matches.last()) {
            (Action::Jump(target), _) if target == GUARD_CHAIN => "guard",
            (Action::Jump(_), _) => "capture",
            (Action::Drop, _) => "loopback-destination",
            (Action::Redirect(_), _) => "redirect",
            (Action::Return, Some(Match::DPort(_))) => "skip-port",
            (Action::Return, Some(Match::SAddr(_) | Match::DAddr(_))) => "skip-subnet",
            (Action::Return, Some(Match::SkUid(_))) => "proxy-uid",
            (Action::Return, Some(Match::SkGid(_))) => "proxy-gid",
            (Action::Return, Some(Match::OifName(_))) => "loopback",
            (Action::Return, _) => "return",
        }
    }
}

impl Ruleset {
    /// The desired ruleset for a spec, in the order of docs/architecture.md, "Capture rules".
    pub fn from_spec(spec: &RedirectSpec) -> Self {
        let jump = |target: &str| vec![Rule::new(vec![], Action::Jump(target.to_string()))];

        let mut inbound: Vec<Rule> = spec.skip_inbound_ports.iter().copied().map(Rule::skip_port).collect();
        inbound.extend(spec.skip_inbound_subnets.iter().map(|n| Rule::new(vec![Match::SAddr(*n)], Action::Return)));
        inbound.push(Rule::new(vec![Match::Tcp], Action::Redirect(spec.inbound_proxy_port)));

        let mut outbound = vec![Rule::new(vec![Match::SkUid(spec.proxy_uid)], Action::Return)];
        if let Some(gid) = spec.proxy_gid {
            outbound.push(Rule::new(vec![Match::SkGid(gid)], Action::Return));
        }
        outbound.push(Rule::new(vec![Match::OifName("lo".into())], Action::Return));
        outbound.extend(spec.skip_outbound_ports.iter().copied().map(Rule::skip_port));
        outbound.extend(spec.skip_outbound_subnets.iter().map(|n| Rule::new(vec![Match::DAddr(*n)], Action::Return)));
        outbound.push(Rule::new(vec![Match::Tcp], Action::Redirect(spec.outbound_proxy_port)));

        // Before any redirect, and in a filter chain rather than the nat chains: nat chains see
        // only the first packet of a connection (later ones follow conntrack), and nothing at
        // all of packets conntrack does not track, so a drop there would not hold for every
        // packet of a flow. At `raw` priority the guard sees every packet, before conntrack
        // creates state for it. Packets on `lo` are the pod's own loopback traffic.
        let guard = loopback_destinations()
            .into_iter()
            .map(|net| Rule::new(vec![Match::IifNameNot(LOOPBACK_IFNAME.into()), Match::DAddr(net)], Action::Drop))
            .collect();
        let guard_hook = BaseHook { kind: ChainType::Filter, hook: Hook::Prerouting, priority: PRIORITY_RAW };

        let base = |hook| Some(BaseHook { kind: ChainType::Nat, hook, priority: PRIORITY_DSTNAT });
        Self {
            chains: vec![
                Chain { name: GUARD_HOOK_CHAIN.into(), base: Some(guard_hook), rules: jump(GUARD_CHAIN) },
                Chain { name: "prerouting".into(), base: base(Hook::Prerouting), rules: jump(INBOUND_CHAIN) },
                Chain { name: "output".into(), base: base(Hook::Output), rules: jump(OUTBOUND_CHAIN) },
                Chain { name: INBOUND_CHAIN.into(), base: None, rules: inbound },
                Chain { name: OUTBOUND_CHAIN.into(), base: None, rules: outbound },
                Chain { name: GUARD_CHAIN.into(), base: None, rules: guard },
            ],
        }
    }

    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }

    /// Total number of rules, for logs and the debug CLI.
    pub fn rule_count(&self) -> usize {
        self.chains.iter().map(|c| c.rules.len()).sum()
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hook::Prerouting => "prerouting",
            Hook::Output => "output",
        })
    }
}

impl fmt::Display for ChainType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChainType::Nat => "nat",
            ChainType::Filter => "filter",
        })
    }
}

impl fmt::Display for BaseHook {
    /// `nft` names -100 `dstnat` on a nat prerouting chain and -300 `raw` on a filter prerouting
    /// chain, but prints the number on output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let priority = match (self.kind, self.hook, self.priority) {
            (ChainType::Nat, Hook::Prerouting, PRIORITY_DSTNAT) => "dstnat".to_string(),
            (ChainType::Filter, Hook::Prerouting, PRIORITY_RAW) => "raw".to_string(),
            (_, _, p) => p.to_string(),
        };
        write!(f, "type {} hook {} priority {priority}; policy accept;", self.kind, self.hook)
    }
}

fn fmt_net(f: &mut fmt::Formatter<'_>, dir: &str, net: &IpNet) -> fmt::Result {
    let family = match net {
        IpNet::V4(_) => "ip",
        IpNet::V6(_) => "ip6",
    };
    if net.prefix_len() == net.max_prefix_len() {
        write!(f, "{family} {dir} {}", net.addr())
    } else {
        write!(f, "{family} {dir} {net}")
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut words = Vec::new();
        for (i, m) in self.matches.iter().enumerate() {
            // `nft` drops the l4proto dependency it implies itself.
            let implied = matches!(m, Match::Tcp) && matches!(self.matches.get(i + 1), Some(Match::DPort(_)));
            if !implied {
                words.push(m.to_string());
            }
        }
        words.push("counter".into());
        words.push(self.action.to_string());
        f.write_str(&words.join(" "))
    }
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Match::Tcp => f.write_str("meta l4proto tcp"),
            Match::DPort(r) => write!(f, "tcp dport {r}"),
            Match::SkUid(uid) => write!(f, "meta skuid {uid}"),
            Match::SkGid(gid) => write!(f, "meta skgid {gid}"),
            Match::OifName(name) => write!(f, "oifname {name:?}"),
            Match::IifNameNot(name) => write!(f, "iifname != {name:?}"),
            Match::SAddr(net) => fmt_net(f, "saddr", net),
            Match::DAddr(net) => fmt_net(f, "daddr", net),
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Return => f.write_str("return"),
            Action::Jump(chain) => write!(f, "jump {chain}"),
            Action::Redirect(port) => write!(f, "redirect to :{port}"),
            Action::Drop => f.write_str("drop"),
        }
    }
}

impl fmt::Display for Ruleset {
    /// The table as `nft list table inet cnimesh` prints it, with all counters at zero.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "table inet {TABLE} {{")?;
        for (i, chain) in self.chains.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            writeln!(f, "\tchain {} {{", chain.name)?;
            if let Some(base) = chain.base {
                writeln!(f, "\t\t{base}")?;
            }
            for rule in &chain.rules {
                let text = rule.to_string().replace("counter", "counter packets 0 bytes 0");
                writeln!(f, "\t\t{text}")?;
            }
            writeln!(f, "\t}}")?;
        }
        writeln!(f, "}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented ruleset for the default spec (docs/reference/cni-config.md, "Capture rules").
    pub const DEFAULT_RULESET: &str = "\
table inet cnimesh {
\tchain prerouting_raw {
\t\ttype filter hook prerouting priority raw; policy accept;
\t\tcounter packets 0 bytes 0 jump guard
\t}

\tchain prerouting {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tcounter packets 0 bytes 0 jump inbound
\t}

\tchain output {
\t\ttype nat hook output priority -100; policy accept;
\t\tcounter packets 0 bytes 0 jump outbound
\t}

\tchain inbound {
\t\ttcp dport 4190 counter packets 0 bytes 0 return
\t\ttcp dport 4191 counter packets 0 bytes 0 return
\t\ttcp dport 4567 counter packets 0 bytes 0 return
\t\ttcp dport 4568 counter packets 0 bytes 0 return
\t\tmeta l4proto tcp counter packets 0 bytes 0 redirect to :4143
\t}

\tchain outbound {
\t\tmeta skuid 2102 counter packets 0 bytes 0 return
\t\toifname \"lo\" counter packets 0 bytes 0 return
\t\ttcp dport 443 counter packets 0 bytes 0 return
\t\ttcp dport 6443 counter packets 0 bytes 0 return
\t\tmeta l4proto tcp counter packets 0 bytes 0 redirect to :4140
\t}

\tchain guard {
\t\tiifname != \"lo\" ip daddr 127.0.0.0/8 counter packets 0 bytes 0 drop
\t\tiifname != \"lo\" ip daddr 0.0.0.0/8 counter packets 0 bytes 0 drop
\t\tiifname != \"lo\" ip6 daddr ::1 counter packets 0 bytes 0 drop
\t\tiifname != \"lo\" ip6 daddr :: counter packets 0 bytes 0 drop
\t\tiifname != \"lo\" ip6 daddr ::ffff:127.0.0.0/104 counter packets 0 bytes 0 drop
\t\tiifname != \"lo\" ip6 daddr ::ffff:0.0.0.0/104 counter packets 0 bytes 0 drop
\t}
}
";

    #[test]
    fn default_ruleset_matches_documentation() {
        assert_eq!(Ruleset::from_spec(&RedirectSpec::default()).to_string(), DEFAULT_RULESET);
    }

    #[test]
    fn subnets_and_ranges_render_like_nft() {
        let spec = RedirectSpec {
            proxy_gid: Some(2102),
            skip_inbound_ports: vec!["4567-4568".parse().unwrap()],
            skip_inbound_subnets: vec!["10.0.0.0/8".parse().unwrap(), "10.1.2.3/32".parse().unwrap()],
            skip_outbound_subnets: vec!["fd00::/20".parse().unwrap()],
            ..Default::default()
        };
        let text = Ruleset::from_spec(&spec).to_string();
        for line in [
            "tcp dport 4567-4568 counter packets 0 bytes 0 return",
            "ip saddr 10.0.0.0/8 counter packets 0 bytes 0 return",
            "ip saddr 10.1.2.3 counter packets 0 bytes 0 return",
            "meta skgid 2102 counter packets 0 bytes 0 return",
            "ip6 daddr fd00::/20 counter packets 0 bytes 0 return",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
