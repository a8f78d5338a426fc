//! Backend selection and the operations the plugin needs from a backend, all run inside the pod's
//! netns: apply (atomic replace), remove (idempotent), drift (CHECK) and usability (STATUS).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::iptables::{self, Family, IptablesError, Variant};
use crate::netns::{self, NetnsError};
use crate::nft::{LiveTable, NftError, NftSocket};
use crate::rules::Ruleset;

/// The `backend` setting of the plugin configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendChoice {
    #[default]
    Nftables,
    IptablesLegacy,
    IptablesNft,
    /// nftables when the kernel has it, else the iptables flavour the netns already uses.
    Auto,
}

/// A backend ready to use; recorded by name in attachment records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    Nftables,
    IptablesLegacy,
    IptablesNft,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("nftables: {0}")]
    Nft(#[from] NftError),
    #[error(transparent)]
    Iptables(#[from] IptablesError),
}

/// One live rule with its counters, as the debug CLI shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveLine {
    /// `inbound`/`outbound`/… for nftables, `CNIMESH_INBOUND`… (with the family) for iptables.
    pub chain: String,
    pub rule: String,
    /// Whether this is a redirect to a proxy port (what "captured traffic" counts).
    pub redirect: bool,
    pub packets: u64,
    pub bytes: u64,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Nftables => "nftables",
            Backend::IptablesLegacy => Variant::Legacy.name(),
            Backend::IptablesNft => Variant::Nft.name(),
        }
    }

    fn variant(self) -> Option<Variant> {
        match self {
            Backend::Nftables => None,
            Backend::IptablesLegacy => Some(Variant::Legacy),
            Backend::IptablesNft => Some(Variant::Nft),
        }
    }

    /// Applies `ruleset` in the calling thread's own netns (host mode: the host's; the plugin
    /// enters a pod's with [`Backend::apply`]). Needs CAP_NET_ADMIN only, no `setns`.
    pub fn apply_here(self, ruleset: &Ruleset) -> Result<(), BackendError> {
        match self.variant() {
            None => Ok(NftSocket::open()?.replace(ruleset)?),
            Some(v) => Ok(v.apply(ruleset)?),
        }
    }

    /// Removes the rules from the calling thread's own netns; succeeds when there are none.
    pub fn remove_here(self) -> Result<(), BackendError> {
        match self.variant() {
            None => Ok(NftSocket::open()?.delete()?),
            Some(v) => Ok(v.remove()?),
        }
    }

    /// Drift of the calling thread's own netns against `ruleset`; empty when they agree.
    pub fn drift_here(self, ruleset: &Ruleset) -> Result<Vec<String>, BackendError> {
        match self.variant() {
            None => Ok(nft_drift(ruleset, NftSocket::open()?.read()?.as_ref())),
            Some(v) => {
                let live = v.read()?;
                Ok(live
                    .into_iter()
                    .flat_map(|(family, found)| {
                        let scope = match family {
                            Family::V4 => "iptables nat",
                            Family::V6 => "ip6tables nat",
                        };
                        line_drift(scope, &iptables::expected_lines(ruleset, family), &found)
                    })
                    .collect())
            }
        }
    }

    fn live_here(self) -> Result<Vec<LiveLine>, BackendError> {
        match self.variant() {
            None => {
                let table = NftSocket::open()?.read()?;
                Ok(table
                    .into_iter()
                    .flat_map(|t| t.chains)
                    .flat_map(|c| {
                        c.rules.into_iter().map(move |r| LiveLine {
                            chain: c.name.clone(),
                            redirect: matches!(&r.rule, Ok(rule) if matches!(rule.action, crate::rules::Action::Redirect(_))),
                            rule: r.rule.map_or_else(|e| format!("<unrecognised rule: {e}>"), |rule| rule.to_string()),
                            packets: r.packets,
                            bytes: r.bytes,
                        })
                    })
                    .collect())
            }
            Some(v) => Ok(v
                .read_counted()?
                .into_iter()
                .flat_map(|(family, lines)| {
                    lines.into_iter().map(move |(packets, bytes, rule)| {
                        let chain = rule.split_whitespace().nth(1).unwrap_or_default();
                        let prefix = if family == Family::V6 { "ip6:" } else { "ip:" };
                        LiveLine {
                            chain: format!("{prefix}{chain}"),
                            redirect: rule.contains("-j REDIRECT"),
                            rule,
                            packets,
                            bytes,
                        }
                    })
                })
                .collect()),
        }
    }

    /// The live rules with counters; empty when none are installed.
    pub fn live(self, netns: &Path) -> Result<Vec<LiveLine>, BackendError> {
        netns::run_in(netns, || self.live_here())?
    }

    pub fn apply(self, netns: &Path, ruleset: &Ruleset) -> Result<(), BackendError> {
        netns::run_in(netns, || self.apply_here(ruleset))?
    }

    pub fn remove(self, netns: &Path) -> Result<(), BackendError> {
        netns::run_in(netns, || self.remove_here())?
    }

    /// What differs between the live rules and `ruleset`; empty when they agree.
    pub fn drift(self, netns: &Path, ruleset: &Ruleset) -> Result<Vec<String>, BackendError> {
        netns::run_in(netns, || self.drift_here(ruleset))?
    }

    /// Whether this backend can be used here (STATUS, `auto`).
    pub fn usable(self) -> Result<(), BackendError> {
        match self.variant() {
            // A validate-only transaction of a real ruleset: socket, privileges, nf_tables with
            // inet nat and redirect support, all without changing anything.
            None => Ok(NftSocket::open()?.probe()?),
            Some(v) => Ok(v.available()?),
        }
    }
}

impl BackendChoice {
    /// Resolves `auto` by probing inside the netns; other choices resolve to themselves.
    pub fn resolve(self, netns: &Path) -> Result<Backend, BackendError> {
        Ok(match self {
            BackendChoice::Nftables => Backend::Nftables,
            BackendChoice::IptablesLegacy => Backend::IptablesLegacy,
            BackendChoice::IptablesNft => Backend::IptablesNft,
            BackendChoice::Auto => netns::run_in(netns, auto_detect)?,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            other => other.candidates()[0].name(),
        }
    }

    /// The backends to try when removing rules without a record of which one was used.
    pub fn candidates(self) -> Vec<Backend> {
        match self {
            BackendChoice::Nftables => vec![Backend::Nftables],
            BackendChoice::IptablesLegacy => vec![Backend::IptablesLegacy],
            BackendChoice::IptablesNft => vec![Backend::IptablesNft],
            BackendChoice::Auto => vec![Backend::Nftables, Backend::IptablesNft, Backend::IptablesLegacy],
        }
    }

    /// STATUS: whether ADDs can be served with this choice on this node.
    pub fn usable(self) -> Result<(), BackendError> {
        let mut first_error = None;
        for backend in self.candidates() {
            match backend.usable() {
                Ok(()) => return Ok(()),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(first_error.expect("every choice has a candidate"))
    }
}

/// nftables if the kernel accepts our ruleset; otherwise the iptables flavour the netns already
/// uses (mixing legacy and nft iptables in one netns is a classic source of lost rules), else
/// iptables-nft where nf_tables exists, else legacy.
fn auto_detect() -> Backend {
    if Backend::Nftables.usable().is_ok() {
        return Backend::Nftables;
    }
    if Variant::Legacy.has_any_rules() {
        return Backend::IptablesLegacy;
    }
    let nf_tables = NftSocket::open().and_then(|mut s| s.read()).is_ok();
    if nf_tables && Variant::Nft.available().is_ok() { Backend::IptablesNft } else { Backend::IptablesLegacy }
}

/// Compares two rule listings of one scope. A longest-common-subsequence alignment names a
/// deleted or inserted rule as such instead of reporting every rule after it as shifted; a
/// deletion and an insertion at the same place read as one changed rule.
pub fn line_drift(scope: &str, expected: &[String], found: &[String]) -> Vec<String> {
    let (n, m) = (expected.len(), found.len());
    // lcs[i][j]: length of the common subsequence of expected[i..] and found[j..].
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if expected[i] == found[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n || j < m {
        let take_expected = i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]);
        if i < n && j < m && expected[i] == found[j] {
            i += 1;
            j += 1;
        } else if i < n && j < m && lcs[i + 1][j + 1] == lcs[i][j] {
            out.push(format!("{scope} rule {}: expected `{}`, found `{}`", i + 1, expected[i], found[j]));
            i += 1;
            j += 1;
        } else if take_expected {
            out.push(format!("{scope} rule {}: missing `{}`", i + 1, expected[i]));
            i += 1;
        } else {
            out.push(format!("{scope}: unexpected rule `{}`", found[j]));
            j += 1;
        }
    }
    out
}

/// Differences between the desired ruleset and the live `inet cnimesh` table.
pub fn nft_drift(desired: &Ruleset, live: Option<&LiveTable>) -> Vec<String> {
    let Some(live) = live else {
        return vec![format!("table inet {} is missing", crate::rules::TABLE)];
    };
    let mut out = Vec::new();
    if live.dormant {
        out.push(format!("table inet {} is dormant: its rules are not evaluated", crate::rules::TABLE));
    }
    for chain in &desired.chains {
        let Some(found) = live.chains.iter().find(|c| c.name == chain.name) else {
            out.push(format!("chain {} is missing", chain.name));
            continue;
        };
        match &found.base {
            Ok(base) if *base == chain.base => {}
            Ok(base) => out.push(format!(
                "chain {}: expected {}, found {}",
                chain.name,
                chain.base.map_or("a regular chain".into(), |b| format!("`{b}`")),
                base.map_or("a regular chain".into(), |b| format!("`{b}`")),
            )),
            Err(e) => out.push(format!("chain {}: {e}", chain.name)),
        }
        let expected: Vec<String> = chain.rules.iter().map(ToString::to_string).collect();
        let got: Vec<String> = found
            .rules
            .iter()
            .map(|r| match &r.rule {
                Ok(rule) => rule.to_string(),
                Err(e) => format!("<unrecognised rule: {e}>"),
            })
            .collect();
        out.extend(line_drift(&format!("chain {}", chain.name), &expected, &got));
    }
    for extra in live.chains.iter().filter(|c| desired.chain(&c.name).is_none()) {
        out.push(format!("unexpected chain {}", extra.name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::{LiveChain, LiveRule};
    use crate::spec::{PortRange, RedirectSpec};

    fn live_of(rs: &Ruleset) -> LiveTable {
        LiveTable {
            dormant: false,
            chains: rs
                .chains
                .iter()
                .map(|c| LiveChain {
                    name: c.name.clone(),
                    base: Ok(c.base),
                    rules: c.rules.iter().map(|r| LiveRule { rule: Ok(r.clone()), packets: 3, bytes: 180 }).collect(),
                })
                .collect(),
        }
    }

    #[test]
    fn identical_tables_have_no_drift_whatever_the_counters() {
        let rs = Ruleset::from_spec(&RedirectSpec::default());
        assert!(nft_drift(&rs, Some(&live_of(&rs))).is_empty());
    }

    #[test]
    fn drift_is_named() {
        let rs = Ruleset::from_spec(&RedirectSpec::default());
        assert_eq!(nft_drift(&rs, None), vec!["table inet cnimesh is missing"]);

        let mut other = RedirectSpec::default();
        other.skip_inbound_ports[1] = PortRange::single(4192);
        other.skip_outbound_ports.push(PortRange::single(25));
        let mut live = live_of(&Ruleset::from_spec(&other));
        live.chains[4].rules.remove(1);
        let drift = nft_drift(&rs, Some(&live));
        assert_eq!(
            drift,
            vec![
                "chain inbound rule 2: expected `tcp dport 4191 counter return`, found `tcp dport 4192 counter return`",
                "chain outbound rule 2: missing `oifname \"lo\" counter return`",
                "chain outbound: unexpected rule `tcp dport 25 counter return`",
            ]
        );
    }

    /// A pod set up before the guard covered the unspecified addresses: CHECK names each missing
    /// rule (and repair, which re-applies the desired ruleset on drift, adds them).
    #[test]
    fn a_guard_without_the_unspecified_addresses_is_drift() {
        let rs = Ruleset::from_spec(&RedirectSpec::default());
        let mut live = live_of(&rs);
        let guard = live.chains.iter_mut().find(|c| c.name == crate::rules::GUARD_CHAIN).unwrap();
        let old_guard = ["127.0.0.0/8", "::1 ", "::ffff:127.0.0.0/104"];
        guard.rules.retain(|r| old_guard.iter().any(|net| r.rule.as_ref().unwrap().to_string().contains(net)));
        assert_eq!(guard.rules.len(), 3);
        let drift = nft_drift(&rs, Some(&live));
        for missing in ["ip daddr 0.0.0.0/8", "ip6 daddr :: ", "ip6 daddr ::ffff:0.0.0.0/104"] {
            assert!(drift.iter().any(|d| d.contains(missing)), "{missing} in {drift:#?}");
        }
    }
}
