//! The iptables fallback backends (`iptables-legacy`, `iptables-nft`), for kernels without
//! nf_tables or nodes whose other tooling insists on iptables.
//!
//! Rules are rendered from the same [`Ruleset`] as the nftables backend and loaded with
//! `iptables-restore --noflush` run inside the pod's netns, one atomic commit per family. The
//! rendering is the canonical form `iptables-save` prints, so reading back is a line comparison.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ipnet::IpNet;

use crate::rules::{Action, Match, Rule, Ruleset};

/// Seconds `iptables-restore -w` waits for the xtables lock.
const LOCK_WAIT_SECS: &str = "5";

pub const INBOUND_CHAIN: &str = "CNIMESH_INBOUND";
pub const OUTBOUND_CHAIN: &str = "CNIMESH_OUTPUT";

/// `(packets, bytes, rule)` of one `iptables-save -c` line.
pub type CountedLine = (u64, u64, String);

/// Which iptables implementation to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Legacy,
    Nft,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    fn program(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }

    fn holds(self, net: &IpNet) -> bool {
        matches!((self, net), (Family::V4, IpNet::V4(_)) | (Family::V6, IpNet::V6(_)))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    #[error(
        "{0} not found (looked in $PATH, /usr/sbin, /sbin): install the iptables package or use the nftables backend"
    )]
    Missing(String),
    #[error("{program} failed: {detail}")]
    Failed { program: String, detail: String },
}

/// Directories searched for binaries: runtimes may exec plugins with an empty PATH.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.extend(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
    dirs
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Legacy => "iptables-legacy",
            Variant::Nft => "iptables-nft",
        }
    }

    /// Path of e.g. `ip6tables-legacy-restore`.
    pub fn binary(self, family: Family, tool: &str) -> Result<PathBuf, IptablesError> {
        let suffix = match self {
            Variant::Legacy => "legacy",
            Variant::Nft => "nft",
        };
        let name = format!("{}-{suffix}-{tool}", family.program());
        search_dirs().into_iter().map(|d| d.join(&name)).find(|p| p.is_file()).ok_or(IptablesError::Missing(name))
    }

    /// Checks every binary this variant needs is present.
    pub fn available(self) -> Result<(), IptablesError> {
        for family in Family::ALL {
            for tool in ["restore", "save"] {
                self.binary(family, tool)?;
            }
        }
        Ok(())
    }

    fn run(self, family: Family, tool: &str, args: &[&str], input: Option<&str>) -> Result<String, IptablesError> {
        let path = self.binary(family, tool)?;
        let program = path.display().to_string();
        let failed = |detail: String| IptablesError::Failed { program: program.clone(), detail };
        let mut child = Command::new(&path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed(e.to_string()))?;
        if let Some(text) = input {
            child.stdin.take().expect("piped").write_all(text.as_bytes()).map_err(|e| failed(e.to_string()))?;
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().map_err(|e| failed(e.to_string()))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(failed(format!("{} ({stderr})", out.status)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The nat table as `iptables-save` prints it (must run inside the netns).
    fn save(self, family: Family) -> Result<String, IptablesError> {
        self.run(family, "save", &["-t", "nat"], None)
    }

    fn restore(self, family: Family, input: &str) -> Result<(), IptablesError> {
        // Legacy iptables takes the host-wide xtables lock (shared with kube-proxy): wait for it,
        // but boundedly, so a stuck holder fails the ADD (retried) instead of hanging it.
        self.run(family, "restore", &["--noflush", "-w", LOCK_WAIT_SECS], Some(input)).map(drop)
    }

    /// Installs the ruleset for both families. The families commit separately: if the second
    /// fails, our chains are removed from both, so no half of the capture stays behind.
    pub fn apply(self, ruleset: &Ruleset) -> Result<(), IptablesError> {
        // Read both families first: a failure here changes nothing.
        let current: Vec<String> = Family::ALL.into_iter().map(|f| self.save(f)).collect::<Result<_, _>>()?;
        for (family, current) in Family::ALL.into_iter().zip(&current) {
            if let Err(e) = self.restore(family, &restore_input(ruleset, family, current)) {
                return Err(match self.remove() {
                    Ok(()) => e,
                    Err(undo) => IptablesError::Failed {
                        program: format!("{} (and undoing it)", self.name()),
                        detail: format!("{e}; rollback failed too: {undo}"),
                    },
                });
            }
        }
        Ok(())
    }

    /// Removes our chains and the jumps to them from both families (both are tried even if one
    /// fails); a netns without them is left untouched.
    pub fn remove(self) -> Result<(), IptablesError> {
        let mut first_error = None;
        for family in Family::ALL {
            let result = self.save(family).and_then(|current| match removal_input(&current) {
                Some(input) => self.restore(family, &input),
                None => Ok(()),
            });
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Whether the netns has any rule at all in this flavour's tables (not only ours): used to
    /// stay on the flavour a netns already uses.
    pub fn has_any_rules(self) -> bool {
        Family::ALL
            .into_iter()
            .any(|f| self.run(f, "save", &[], None).is_ok_and(|out| out.lines().any(|l| l.starts_with("-A "))))
    }

    /// Our lines with their `[packets:bytes]` counters, per family (must run inside the netns).
    pub fn read_counted(self) -> Result<Vec<(Family, Vec<CountedLine>)>, IptablesError> {
        Family::ALL
            .into_iter()
            .map(|f| {
                let saved = self.run(f, "save", &["-c", "-t", "nat"], None)?;
                let lines = saved
                    .lines()
                    .filter_map(|l| {
                        let (counters, rule) = l.strip_prefix('[')?.split_once("] ")?;
                        let (p, b) = counters.split_once(':')?;
                        Some((p.parse().ok()?, b.parse().ok()?, rule.to_string()))
                    })
                    .filter(|(_, _, rule)| !ours(rule).is_empty())
                    .collect();
                Ok((f, lines))
            })
            .collect()
    }

    /// Our lines as found in the netns, per family, in `iptables-save` order.
    pub fn read(self) -> Result<Vec<(Family, Vec<String>)>, IptablesError> {
        Family::ALL.into_iter().map(|f| Ok((f, ours(&self.save(f)?)))).collect()
    }
}

/// The lines of a save output that belong to cnimesh.
fn ours(save: &str) -> Vec<String> {
    save.lines()
        .filter(|l| {
            l.starts_with(&format!("-A {INBOUND_CHAIN} "))
                || l.starts_with(&format!("-A {OUTBOUND_CHAIN} "))
                || is_jump(l)
        })
        .map(str::to_string)
        .collect()
}

fn is_jump(line: &str) -> bool {
    (line.starts_with("-A PREROUTING ") || line.starts_with("-A OUTPUT "))
        && (line.ends_with(&format!("-j {INBOUND_CHAIN}")) || line.ends_with(&format!("-j {OUTBOUND_CHAIN}")))
}

fn chain_name(nft_chain: &str) -> &'static str {
    match nft_chain {
        "prerouting" => "PREROUTING",
        "output" => "OUTPUT",
        crate::rules::INBOUND_CHAIN => INBOUND_CHAIN,
        _ => OUTBOUND_CHAIN,
    }
}

/// One rule in `iptables-save` canonical form, or `None` if it belongs to the other family.
fn render_rule(chain: &str, rule: &Rule, family: Family) -> Option<String> {
    let mut addr = Vec::new();
    let mut proto = Vec::new();
    let mut modules = Vec::new();
    for m in &rule.matches {
        match m {
            Match::SAddr(n) | Match::DAddr(n) if !family.holds(n) => return None,
            Match::SAddr(n) => addr.push(format!("-s {n}")),
            Match::DAddr(n) => addr.push(format!("-d {n}")),
            Match::OifName(name) => addr.push(format!("-o {name}")),
            Match::Tcp => proto.push("-p tcp".to_string()),
            Match::DPort(r) if r.is_single() => modules.push(format!("-m tcp --dport {}", r.first)),
            Match::DPort(r) => modules.push(format!("-m tcp --dport {}:{}", r.first, r.last)),
            Match::SkUid(uid) => modules.push(format!("-m owner --uid-owner {uid}")),
            Match::SkGid(gid) => modules.push(format!("-m owner --gid-owner {gid}")),
        }
    }
    let target = match &rule.action {
        Action::Return => "-j RETURN".to_string(),
        Action::Jump(c) => format!("-j {}", chain_name(c)),
        Action::Redirect(port) => format!("-j REDIRECT --to-ports {port}"),
    };
    let comment = format!("-m comment --comment \"cnimesh/{}\"", rule.why());
    let words: Vec<String> = [addr, proto, modules, vec![comment, target]].concat();
    Some(format!("-A {} {}", chain_name(chain), words.join(" ")))
}

/// The lines the ruleset must produce for one family, in save order.
pub fn expected_lines(ruleset: &Ruleset, family: Family) -> Vec<String> {
    ruleset.chains.iter().flat_map(|c| c.rules.iter().filter_map(|r| render_rule(&c.name, r, family))).collect()
}

/// `iptables-restore --noflush` input installing `ruleset`, given the current `iptables-save` output.
pub fn restore_input(ruleset: &Ruleset, family: Family, current: &str) -> String {
    let existing: Vec<&str> = current.lines().filter(|l| is_jump(l)).collect();
    let mut out = format!("*nat\n:{INBOUND_CHAIN} - [0:0]\n:{OUTBOUND_CHAIN} - [0:0]\n");
    for line in expected_lines(ruleset, family) {
        // Declaring our chains flushed them; the jumps live in shared chains and are added once.
        if is_jump(&line) && existing.contains(&line.as_str()) {
            continue;
        }
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str("COMMIT\n");
    out
}

fn removal_input(current: &str) -> Option<String> {
    let has_chain = |c: &str| current.lines().any(|l| l.starts_with(&format!(":{c} ")));
    if !has_chain(INBOUND_CHAIN) && !has_chain(OUTBOUND_CHAIN) {
        return None;
    }
    let mut out = format!("*nat\n:{INBOUND_CHAIN} - [0:0]\n:{OUTBOUND_CHAIN} - [0:0]\n");
    for jump in current.lines().filter(|l| is_jump(l)) {
        out.push_str(&jump.replacen("-A ", "-D ", 1));
        out.push('\n');
    }
    out.push_str(&format!("-X {INBOUND_CHAIN}\n-X {OUTBOUND_CHAIN}\nCOMMIT\n"));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RedirectSpec;

    #[test]
    fn renders_save_canonical_lines() {
        let spec = RedirectSpec {
            skip_inbound_ports: vec!["4567-4568".parse().unwrap()],
            skip_outbound_subnets: vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()],
            ..Default::default()
        };
        let rs = Ruleset::from_spec(&spec);
        let v4 = expected_lines(&rs, Family::V4);
        assert_eq!(v4[0], "-A PREROUTING -m comment --comment \"cnimesh/capture\" -j CNIMESH_INBOUND");
        assert!(v4.contains(
            &"-A CNIMESH_INBOUND -p tcp -m tcp --dport 4567:4568 -m comment --comment \"cnimesh/skip-port\" -j RETURN"
                .to_string()
        ));
        assert!(v4.contains(
            &"-A CNIMESH_OUTPUT -d 10.0.0.0/8 -m comment --comment \"cnimesh/skip-subnet\" -j RETURN".to_string()
        ));
        assert!(!v4.iter().any(|l| l.contains("fd00")));
        let v6 = expected_lines(&rs, Family::V6);
        assert!(v6.iter().any(|l| l.contains("-d fd00::/8")));
        assert!(v6.last().unwrap().ends_with("-j REDIRECT --to-ports 4140"));
    }

    #[test]
    fn jumps_are_added_once_and_removed_all() {
        let rs = Ruleset::from_spec(&RedirectSpec::default());
        let current = expected_lines(&rs, Family::V4).join("\n") + "\n:CNIMESH_INBOUND - [0:0]\n";
        let input = restore_input(&rs, Family::V4, &current);
        assert!(!input.contains("-A PREROUTING"), "{input}");
        let removal = removal_input(&current).unwrap();
        assert!(removal.contains("-D PREROUTING -m comment --comment \"cnimesh/capture\" -j CNIMESH_INBOUND"));
        assert!(removal_input("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n").is_none());
    }
}
