//! What the host must provide, and the rule for tests that cannot run without it: under `CI=true`
//! a missing prerequisite fails the test; elsewhere the test is skipped with a loud message.

use std::path::{Path, PathBuf};

/// Debian's containernetworking-plugins.
pub const REFERENCE_PLUGIN_DIR: &str = "/usr/lib/cni";

fn missing() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root (network namespaces, nftables)".into());
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        if !Path::new(REFERENCE_PLUGIN_DIR).join(plugin).is_file() {
            return Some(format!("needs {REFERENCE_PLUGIN_DIR}/{plugin} (apt install containernetworking-plugins)"));
        }
    }
    for (tool, package) in [
        ("ip", "iproute2"),
        ("nft", "nftables"),
        ("iptables-legacy-restore", "iptables"),
        ("iptables-nft-restore", "iptables"),
    ] {
        if std::process::Command::new(tool).arg("--version").output().is_err() {
            return Some(format!("needs {tool} (apt install {package})"));
        }
    }
    None
}

/// True when the test can run. Panics under CI when it cannot; otherwise prints why it is skipped.
pub fn require_root(test: &str) -> bool {
    match missing() {
        None => true,
        Some(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: {why}; CI=true, so this is a failure, not a skip")
        }
        Some(why) => {
            eprintln!("\n!!! SKIPPED {test}: {why}. Run the README's test command as root. !!!\n");
            false
        }
    }
}

/// A unique, short name (interface names are limited to 15 bytes).
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}{n:x}", std::process::id() & 0xfffff)
}

/// Runs a command, failing with its stderr.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(program).args(args).output()?;
    if !out.status.success() {
        anyhow::bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A mount under a test's directory, lazily unmounted on drop (so a failing test never leaves a
/// busy mount behind).
pub struct Mounted(pub PathBuf);

impl Mounted {
    /// A tmpfs of `size` (e.g. `64k`) at `at`.
    pub fn tmpfs(at: &Path, size: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(at)?;
        let target = at.to_str().ok_or_else(|| anyhow::anyhow!("non-UTF-8 path {}", at.display()))?;
        run("mount", &["-t", "tmpfs", "-o", &format!("size={size}"), "cnimesh-test", target])?;
        Ok(Self(at.to_path_buf()))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
