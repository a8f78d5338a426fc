//! The iptables fallback backends (`iptables-legacy`, `iptables-nft`), for kernels without
//! nf_tables or nodes whose other tooling insists on iptables.
//!
//! Rules are rendered from the same [`Ruleset`] as the nftables backend and loaded with
//! `iptables-restore --noflush` run inside the pod's netns, one commit per table and family. The
//! rendering is the canonical form `iptables-save` prints, so reading back is a line comparison.
//!
//! Two tables: the loopback guard lives in `raw` (its PREROUTING runs before conntrack and nat,
//! like the nftables backend's `priority raw` chain), the capture in `nat`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ipnet::IpNet;

use crate::rules::{Action, Match, Rule, Ruleset};

/// Seconds `iptables-restore -w` waits for the xtables lock.
const LOCK_WAIT_SECS: &str = "5";

pub const INBOUND_CHAIN: &str = "CNIMESH_INBOUND";
pub const OUTBOUND_CHAIN: &str = "CNIMESH_OUTPUT";
pub const GUARD_CHAIN: &str = "CNIMESH_GUARD";

/// The iptables tables we write, in the order we read and write them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Table {
    Raw,
    Nat,
}

impl Table {
    const ALL: [Table; 2] = [Table::Raw, Table::Nat];

    fn name(self) -> &'static str {
        match self {
            Table::Raw => "raw",
            Table::Nat => "nat",
        }
    }

    /// Our own chains in this table (sorted, as `iptables-save` lists user chains).
    fn chains(self) -> &'static [&'static str] {
        match self {
            Table::Raw => &[GUARD_CHAIN],
            Table::Nat => &[INBOUND_CHAIN, OUTBOUND_CHAIN],
        }
    }

    /// The table a chain of the rule model lives in.
    fn of(nft_chain: &str) -> Table {
        match nft_chain {
            crate::rules::GUARD_HOOK_CHAIN | crate::rules::GUARD_CHAIN => Table::Raw,
            _ => Table::Nat,
        }
    }
}

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

    /// Every table as `iptables-save` prints it (must run inside the netns): one run for the
    /// `raw` and `nat` tables alike.
    fn save(self, family: Family) -> Result<String, IptablesError> {
        self.run(family, "save", &[], None)
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
                let saved = self.run(f, "save", &["-c"], None)?;
                let lines = Table::ALL
                    .into_iter()
                    .flat_map(|t| {
                        section(&saved, t)
                            .into_iter()
                            .filter_map(|l| {
                                let (counters, rule) = l.strip_prefix('[')?.split_once("] ")?;
                                let (p, b) = counters.split_once(':')?;
                                Some((p.parse().ok()?, b.parse().ok()?, rule.to_string()))
                            })
                            .filter(move |(_, _, rule)| is_ours(rule, t))
                            .collect::<Vec<_>>()
                    })
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

/// The lines of one table in a save output (between `*<table>` and its `COMMIT`).
fn section(save: &str, table: Table) -> Vec<&str> {
    let mut current = None;
    let mut out = Vec::new();
    for line in save.lines() {
        if let Some(name) = line.strip_prefix('*') {
            current = Some(name.trim());
        } else if line == "COMMIT" {
            current = None;
        } else if current == Some(table.name()) {
            out.push(line);
        }
    }
    out
}

/// The lines of a save output that belong to cnimesh, table by table (raw, then nat), whatever
/// order the tool printed the tables in.
fn ours(save: &str) -> Vec<String> {
    Table::ALL
        .into_iter()
        .flat_map(|t| section(save, t).into_iter().filter(move |l| is_ours(l, t)).map(str::to_string))
        .collect()
}

fn is_ours(line: &str, table: Table) -> bool {
    table.chains().iter().any(|c| line.starts_with(&format!("-A {c} "))) || is_jump(line, table)
}

/// A jump from a built-in chain of `table` to one of our chains in it.
fn is_jump(line: &str, table: Table) -> bool {
    (line.starts_with("-A PREROUTING ") || line.starts_with("-A OUTPUT "))
        && table.chains().iter().any(|c| line.ends_with(&format!("-j {c}")))
}

fn chain_name(nft_chain: &str) -> &'static str {
    match nft_chain {
        "prerouting" | crate::rules::GUARD_HOOK_CHAIN => "PREROUTING",
        "output" => "OUTPUT",
        crate::rules::INBOUND_CHAIN => INBOUND_CHAIN,
        crate::rules::GUARD_CHAIN => GUARD_CHAIN,
        _ => OUTBOUND_CHAIN,
    }
}

/// One rule in `iptables-save` canonical form, or `None` if it belongs to the other family.
fn render_rule(chain: &str, rule: &Rule, family: Family) -> Option<String> {
    let mut addr = Vec::new();
    // `iptables-save` prints interfaces after addresses, whatever order the rule has them in.
    let mut iface = Vec::new();
    let mut proto = Vec::new();
    let mut modules = Vec::new();
    for m in &rule.matches {
        match m {
            Match::SAddr(n) | Match::DAddr(n) if !family.holds(n) => return None,
            Match::SAddr(n) => addr.push(format!("-s {n}")),
            Match::DAddr(n) => addr.push(format!("-d {n}")),
            Match::OifName(name) => iface.push(format!("-o {name}")),
            Match::IifNameNot(name) => iface.push(format!("! -i {name}")),
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
        Action::Drop => "-j DROP".to_string(),
    };
    let comment = format!("-m comment --comment \"cnimesh/{}\"", rule.why());
    let words: Vec<String> = [addr, iface, proto, modules, vec![comment, target]].concat();
    Some(format!("-A {} {}", chain_name(chain), words.join(" ")))
}

fn table_lines(ruleset: &Ruleset, family: Family, table: Table) -> Vec<String> {
    ruleset
        .chains
        .iter()
        .filter(|c| Table::of(&c.name) == table)
        .flat_map(|c| c.rules.iter().filter_map(|r| render_rule(&c.name, r, family)))
        .collect()
}

/// The lines the ruleset must produce for one family, in save order (raw, then nat).
pub fn expected_lines(ruleset: &Ruleset, family: Family) -> Vec<String> {
    Table::ALL.into_iter().flat_map(|t| table_lines(ruleset, family, t)).collect()
}

/// `:<chain> - [0:0]` for each of our chains of `table`: declaring a chain creates or flushes it.
fn declarations(table: Table) -> String {
    table.chains().iter().map(|c| format!(":{c} - [0:0]\n")).collect()
}

/// `iptables-restore --noflush` input installing `ruleset`, given the current `iptables-save`
/// output. The guard (raw) is written before the capture (nat).
pub fn restore_input(ruleset: &Ruleset, family: Family, current: &str) -> String {
    let mut out = String::new();
    for table in Table::ALL {
        let existing: Vec<&str> = section(current, table).into_iter().filter(|l| is_jump(l, table)).collect();
        out.push_str(&format!("*{}\n{}", table.name(), declarations(table)));
        for line in table_lines(ruleset, family, table) {
            // Declaring our chains flushed them; the jumps live in shared chains and are added once.
            if is_jump(&line, table) && existing.contains(&line.as_str()) {
                continue;
            }
            out.push_str(&line);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

fn removal_input(current: &str) -> Option<String> {
    let mut out = String::new();
    for table in Table::ALL {
        let lines = section(current, table);
        let has_chain = |c: &&str| lines.iter().any(|l| l.starts_with(&format!(":{c} ")));
        if !table.chains().iter().any(has_chain) {
            continue;
        }
        out.push_str(&format!("*{}\n{}", table.name(), declarations(table)));
        for jump in lines.iter().filter(|l| is_jump(l, table)) {
            out.push_str(&jump.replacen("-A ", "-D ", 1));
            out.push('\n');
        }
        for chain in table.chains() {
            out.push_str(&format!("-X {chain}\n"));
        }
        out.push_str("COMMIT\n");
    }
    (!out.is_empty()).then_some(out)
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
        assert_eq!(v4[0], "-A PREROUTING -m comment --comment \"cnimesh/guard\" -j CNIMESH_GUARD");
        assert_eq!(
            v4[1],
            "-A CNIMESH_GUARD -d 127.0.0.0/8 ! -i lo -m comment --comment \"cnimesh/loopback-destination\" -j DROP"
        );
        assert_eq!(
            v4[2],
            "-A CNIMESH_GUARD -d 0.0.0.0/8 ! -i lo -m comment --comment \"cnimesh/loopback-destination\" -j DROP"
        );
        assert_eq!(v4[3], "-A PREROUTING -m comment --comment \"cnimesh/capture\" -j CNIMESH_INBOUND");
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
        for dst in ["::1/128", "::/128", "::ffff:127.0.0.0/104", "::ffff:0.0.0.0/104"] {
            let line = format!(
                "-A CNIMESH_GUARD -d {dst} ! -i lo -m comment --comment \"cnimesh/loopback-destination\" -j DROP"
            );
            assert!(v6.contains(&line), "{line} in {v6:#?}");
        }
        assert!(v6.last().unwrap().ends_with("-j REDIRECT --to-ports 4140"));
    }

    /// A save output as the tools print it: nat before raw (legacy lists tables in load order).
    fn saved(rs: &Ruleset) -> String {
        format!(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:CNIMESH_INBOUND - [0:0]\n{}\nCOMMIT\n*raw\n:PREROUTING ACCEPT [0:0]\n:CNIMESH_GUARD - [0:0]\n{}\nCOMMIT\n",
            table_lines(rs, Family::V4, Table::Nat).join("\n"),
            table_lines(rs, Family::V4, Table::Raw).join("\n"),
        )
    }

    #[test]
    fn jumps_are_added_once_and_removed_all() {
        let rs = Ruleset::from_spec(&RedirectSpec::default());
        let current = saved(&rs);
        assert_eq!(ours(&current), expected_lines(&rs, Family::V4), "read back table by table");
        let input = restore_input(&rs, Family::V4, &current);
        assert!(!input.contains("-A PREROUTING"), "{input}");
        let raw_first = input.find("*raw").unwrap() < input.find("*nat").unwrap();
        assert!(raw_first, "the guard is in place before the capture: {input}");
        let removal = removal_input(&current).unwrap();
        assert!(removal.contains("-D PREROUTING -m comment --comment \"cnimesh/capture\" -j CNIMESH_INBOUND"));
        assert!(removal.contains("-D PREROUTING -m comment --comment \"cnimesh/guard\" -j CNIMESH_GUARD"));
        assert!(removal.contains("-X CNIMESH_GUARD\n"));
        assert!(removal_input("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n").is_none());
    }

    #[test]
    fn a_netns_with_only_the_old_nat_chains_is_cleaned_without_touching_raw() {
        // Rules written by a version without the guard: removal must still work, and must not
        // declare (create) a raw chain only to delete it.
        let old = "*nat\n:PREROUTING ACCEPT [0:0]\n:CNIMESH_INBOUND - [0:0]\n:CNIMESH_OUTPUT - [0:0]\n-A PREROUTING -m comment --comment \"cnimesh/capture\" -j CNIMESH_INBOUND\nCOMMIT\n";
        let removal = removal_input(old).unwrap();
        assert!(!removal.contains("*raw"), "{removal}");
        assert!(removal.contains("-X CNIMESH_INBOUND"));
    }
}
