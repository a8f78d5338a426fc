//! Mount propagation of the netns directory (docs/architecture.md, lesson 17).
//!
//! The DaemonSet mounts the host's `/var/run/netns` with `mountPropagation: HostToContainer`.
//! That only carries mounts made later on the host (every new pod's netns is a bind mount there)
//! into the agent when the host mount is shared, as systemd makes it. On a host whose root mount
//! is private, namespaces created after the agent started are invisible to it, and verifying a
//! new pod's rules reports its netns as missing. The agent cannot fix the host; it says so.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// Propagation of a mount, from its optional fields in `/proc/self/mountinfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Propagation {
    /// `shared:N`: a peer of the host's mount (the agent shares the host's mount namespace, or
    /// the runtime made the mount shared).
    Shared,
    /// `master:N` without `shared`: receives the host's new mounts (HostToContainer working).
    Slave,
    /// Neither: new host mounts never show up here.
    Private,
    /// mountinfo unreadable, or no mount holds the path.
    Unknown,
}

impl Propagation {
    pub fn is_private(self) -> bool {
        self == Propagation::Private
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if bytes[i] == b'\\'
            && let Some(d) = octal
        {
            out.push(d.iter().fold(0u8, |v, b| v.wrapping_mul(8).wrapping_add(b - b'0')));
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `path` is `mount_point` or lies under it (whole path components only).
fn under(path: &Path, mount_point: &Path) -> bool {
    path.starts_with(mount_point)
}

/// The mount holding `path` in `mountinfo` (the text of `/proc/<pid>/mountinfo`), with its
/// propagation: the longest mount point containing `path`; of several mounts on one point the
/// last listed is the one on top. `path` must be absolute and free of symlinks.
pub fn propagation_in(mountinfo: &str, path: &Path) -> Option<(PathBuf, Propagation)> {
    let mut best: Option<(PathBuf, Propagation)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        // id parent major:minor root mount-point options [optional...] - fstype source super
        let Some(separator) = fields.iter().position(|f| *f == "-") else { continue };
        if separator < 6 {
            continue;
        }
        let mount_point = PathBuf::from(unescape(fields[4]));
        if !under(path, &mount_point) {
            continue;
        }
        if best.as_ref().is_some_and(|(b, _)| b.components().count() > mount_point.components().count()) {
            continue;
        }
        let optional = &fields[6..separator];
        let has = |tag: &str| optional.iter().any(|f| f.starts_with(tag));
        let propagation = if has("shared:") {
            Propagation::Shared
        } else if has("master:") {
            Propagation::Slave
        } else {
            Propagation::Private
        };
        best = Some((mount_point, propagation));
    }
    best
}

/// `path` made absolute and free of symlinks as far as it exists (`/var/run` is often a link to
/// `/run`, and mountinfo lists the target); a part that does not exist yet is kept as given.
fn resolve(path: &Path) -> PathBuf {
    let mut missing = Vec::new();
    let mut existing = path;
    loop {
        if let Ok(real) = existing.canonicalize() {
            return missing.iter().rev().fold(real, |p, part| p.join(part));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_os_string());
                existing = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// The propagation of the mount holding `dir` in this process's mount namespace.
pub fn propagation(dir: &Path) -> Propagation {
    match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => propagation_in(&text, &resolve(dir)).map_or(Propagation::Unknown, |(_, p)| p),
        Err(_) => Propagation::Unknown,
    }
}

/// The operator-facing explanation of a private netns mount.
pub fn private_message(dir: &Path) -> String {
    format!(
        "the host mount holding {} is private, so network namespaces created after cnimesh-node started are \
         invisible to it (mountPropagation: HostToContainer needs a shared mount): run `mount --make-rshared /` \
         on the host, or use a systemd host (its root mount is shared)",
        dir.display()
    )
}

/// The hint to add to a "netns not found" error for `netns`: set when its directory's mount is
/// private, the likely reason a namespace that exists on the host cannot be seen.
pub fn missing_netns_hint(netns: &Path) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    hint_in(&text, &resolve(netns.parent()?))
}

/// [`missing_netns_hint`] over given mountinfo text, for the netns directory `dir`.
fn hint_in(mountinfo: &str, dir: &Path) -> Option<String> {
    let (_, propagation) = propagation_in(mountinfo, dir)?;
    propagation.is_private().then(|| private_message(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real lines: a systemd host's root and iproute2's netns dir (shared), a container's
    // HostToContainer mount (master), and a private root as in a plain chroot or container.
    const SYSTEMD: &str = "\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
42 27 254:0 /run/netns /run/netns rw,relatime shared:5 - ext4 /dev/vda rw
43 42 0:4 net:[4026532177] /run/netns/cni-1 rw shared:6 - nsfs nsfs rw
";
    const CONTAINER: &str = "\
812 700 0:120 / / ro,relatime master:300 - overlay overlay rw,lowerdir=/l
830 812 0:25 /netns /var/run/netns ro,nosuid,nodev master:5 - tmpfs tmpfs rw
831 812 0:25 /cnimesh /var/run/cnimesh rw,nosuid,nodev - tmpfs tmpfs rw
";
    const PRIVATE: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,mode=755
";

    fn of(text: &str, path: &str) -> Option<(PathBuf, Propagation)> {
        propagation_in(text, Path::new(path))
    }

    #[test]
    fn shared_mounts() {
        assert_eq!(of(SYSTEMD, "/run/netns"), Some(("/run/netns".into(), Propagation::Shared)));
        // The nsfs file mount is not the directory's mount.
        assert_eq!(of(SYSTEMD, "/run/netns").unwrap().0, PathBuf::from("/run/netns"));
        assert_eq!(of(SYSTEMD, "/var/lib/cnimesh"), Some(("/".into(), Propagation::Shared)));
    }

    #[test]
    fn master_means_host_to_container_works() {
        assert_eq!(of(CONTAINER, "/var/run/netns"), Some(("/var/run/netns".into(), Propagation::Slave)));
        assert_eq!(of(CONTAINER, "/var/run/cnimesh").unwrap().1, Propagation::Private);
        // A sibling with a common string prefix is not under the mount.
        assert_eq!(of(CONTAINER, "/var/run/netns2").unwrap().0, PathBuf::from("/"));
    }

    #[test]
    fn private_root() {
        assert_eq!(of(PRIVATE, "/run/netns"), Some(("/".into(), Propagation::Private)));
        let hint = hint_in(PRIVATE, Path::new("/run/netns")).expect("a hint on a private mount");
        assert!(hint.contains("/run/netns is private") && hint.contains("mount --make-rshared /"), "{hint}");
        assert_eq!(hint_in(SYSTEMD, Path::new("/run/netns")), None);
        assert_eq!(hint_in(CONTAINER, Path::new("/var/run/netns")), None);
    }

    #[test]
    fn the_last_mount_on_a_point_is_on_top_and_escapes_are_undone() {
        let text = "1 0 0:1 / / rw - ext4 a rw\n2 1 0:2 / /x rw - tmpfs b rw\n3 2 0:3 / /x rw shared:9 - tmpfs c rw\n\
                    4 1 0:4 / /with\\040space rw master:2 - tmpfs d rw\n";
        assert_eq!(of(text, "/x/y").unwrap().1, Propagation::Shared);
        assert_eq!(of(text, "/with space/n").unwrap().1, Propagation::Slave);
        assert_eq!(of("garbage\n", "/x"), None);
    }
}
