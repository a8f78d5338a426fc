//! What local mode needs from the host and does to it: prerequisite checks, `ip` commands, and
//! the detached processes it starts (and finds again, even without its own records, to stop them).

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Debian's containernetworking-plugins: the stand-in primary CNI.
pub const REFERENCE_PLUGIN_DIR: &str = "/usr/lib/cni";
/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/var/run/netns";
/// Set on every process local mode starts, so `down` finds them even when pid files are gone.
pub const ROOT_ENV: &str = "CNIMESH_LOCAL_ROOT";

/// Everything `up` creates directly in the root dir.
pub const ROOT_ENTRIES: [&str; 16] = [
    "local.json",
    "logs",
    "run",
    // The administrator's kubeconfig of local mode's API server, and its components' own.
    "kubeconfig",
    "kubeconfigs",
    "net.d",
    "cni-bin",
    "state",
    "attachments",
    "ca",
    "ipam",
    "proxies",
    "node.sock",
    // The collector stand-in's spans (`crate::demo_trace::TRACES_FILE`).
    "traces.jsonl",
    // The second cluster's root (`up --clusters 2`).
    "west",
    // The ingress controller's nginx.conf and temporary files (`up::ingress::DIR`).
    "ingress",
];

/// Refuses a root dir that `down` must not touch: `down` kills processes mentioning it and
/// deletes it, so `/`, `/tmp` or a directory holding anything else is never taken for ours.
pub fn check_root(root: &Path) -> anyhow::Result<()> {
    let depth = root.components().filter(|c| matches!(c, std::path::Component::Normal(_))).count();
    if !root.is_absolute() || depth < 2 || root.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        bail!("--dir {}: give an absolute path at least two levels deep, e.g. /run/cnimesh-local", root.display());
    }
    for entry in fs::read_dir(root).into_iter().flatten().flatten() {
        let name = entry.file_name();
        if !ROOT_ENTRIES.iter().any(|ours| name == *ours) {
            bail!(
                "{} holds {:?}, which local mode never creates: not touching a directory that is not ours",
                root.display(),
                name
            );
        }
    }
    Ok(())
}

/// Fails naming the package to install for the first thing missing.
pub fn check_prerequisites() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("local mode needs root (network namespaces, nftables, bridges): run it with sudo");
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        let path = Path::new(REFERENCE_PLUGIN_DIR).join(plugin);
        if !path.is_file() {
            bail!("{} is missing: apt install containernetworking-plugins", path.display());
        }
    }
    for (tool, package) in [("ip", "iproute2"), ("setpriv", "util-linux")] {
        if Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
            bail!("`{tool}` is missing: apt install {package}");
        }
    }
    Ok(())
}

/// Runs a command to completion, failing with its stderr.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Named namespaces starting with `<prefix>-`.
pub fn netns_with_prefix(prefix: &str) -> Vec<String> {
    let start = format!("{prefix}-");
    let mut names: Vec<String> = fs::read_dir(NETNS_DIR)
        .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    names.retain(|n| n.starts_with(&start));
    names.sort();
    names
}

pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// A long-running process of local mode: its own process group (a Ctrl-C in the shell that ran
/// `up` does not reach it), output appended to `<root>/logs/<name>.log`, pid in
/// `<root>/run/<name>.pid`.
pub fn spawn_detached(root: &Path, name: &str, mut cmd: Command) -> anyhow::Result<u32> {
    let log_path = root.join("logs").join(format!("{name}.log"));
    let log = fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).env(ROOT_ENV, root).process_group(0);
    let child = cmd.spawn().with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
    let pid = child.id();
    fs::write(root.join("run").join(format!("{name}.pid")), format!("{pid}\n"))?;
    Ok(pid)
}

/// The last lines of a process's log, for error messages.
pub fn log_tail(root: &Path, name: &str) -> String {
    let body = fs::read_to_string(root.join("logs").join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = body.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

fn alive(pid: u32) -> bool {
    // A zombie has exited: only its parent's wait is missing.
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_none_or(|(_, rest)| !rest.starts_with('Z')))
}

/// Processes that belong to this local mode: in its pid files, mentioning `root` on their command
/// line or in [`ROOT_ENV`], or living in one of `netns` (all of which are ours).
pub fn find_processes(root: &Path, netns: &[String]) -> BTreeSet<u32> {
    let mut pids = BTreeSet::new();
    for entry in fs::read_dir(root.join("run")).into_iter().flatten().flatten() {
        if let Some(pid) = fs::read_to_string(entry.path()).ok().and_then(|s| s.trim().parse().ok()) {
            pids.insert(pid);
        }
    }
    let root_bytes = root.as_os_str().as_encoded_bytes();
    let marker = [ROOT_ENV.as_bytes(), b"=", root_bytes].concat();
    let namespaces: BTreeSet<(u64, u64)> =
        netns.iter().filter_map(|n| fs::metadata(netns_path(n)).ok()).map(|m| (m.dev(), m.ino())).collect();
    let within = [root_bytes, b"/"].concat();
    // The root itself or a path under it; not a sibling such as `<root>-old`.
    let mentions_root =
        |cmdline: &[u8]| cmdline.split(|b| *b == 0).any(|arg| arg.ends_with(root_bytes) || contains(arg, &within));
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let dir = entry.path();
        let cmdline = fs::read(dir.join("cmdline")).unwrap_or_default();
        let environ = fs::read(dir.join("environ")).unwrap_or_default();
        let in_our_netns = fs::metadata(dir.join("ns/net")).is_ok_and(|m| namespaces.contains(&(m.dev(), m.ino())));
        if mentions_root(&cmdline) || environ.split(|b| *b == 0).any(|v| v == marker) || in_our_netns {
            pids.insert(pid);
        }
    }
    pids.remove(&std::process::id());
    pids.retain(|pid| alive(*pid));
    pids
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// SIGTERM, a grace period, then SIGKILL for what is left. Returns how many were signalled.
pub fn stop_processes(pids: &BTreeSet<u32>, grace: Duration) -> usize {
    let signal = |sig| pids.iter().filter(|p| kill(Pid::from_raw(**p as i32), sig).is_ok()).count();
    let count = signal(Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if pids.iter().any(|p| alive(*p)) {
        signal(Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_own_root_dirs_are_accepted() {
        for bad in ["/", "/tmp", "relative/dir", "/run/../etc"] {
            assert!(check_root(Path::new(bad)).is_err(), "{bad}");
        }
        let dir = tempfile::tempdir().unwrap();
        check_root(dir.path()).unwrap();
        std::fs::create_dir(dir.path().join("logs")).unwrap();
        check_root(dir.path()).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        let e = check_root(dir.path()).unwrap_err().to_string();
        assert!(e.contains("notes.txt"), "{e}");
    }
}
