//! Attachment records: one JSON file per (network, container, interface) the plugin captured.
//!
//! GC, the node agent's repair loop and the debug CLI read these, so the format is versioned and
//! documented (docs/reference/cni-config.md, "State records"). Files are written atomically (temp file, rename): a
//! reader never sees half a record, even if the plugin is killed mid-write. They are deliberately
//! not fsync'd: a record describes a live netns, and no netns survives a node crash, so durability
//! across power loss buys nothing while an fsync costs milliseconds on every pod start.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use cnimesh_common::fs::{Durability, write_atomic_with};
use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::netns::NetnsId;
use crate::spec::RedirectSpec;

/// Bumped on any incompatible change of [`AttachmentRecord`].
pub const RECORD_VERSION: u32 = 1;
const RECORDS_SUBDIR: &str = "attachments";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentRecord {
    pub version: u32,
    /// The CNI network (conflist `name`) this attachment belongs to.
    pub network: String,
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    /// Identity of the netns at ADD time, so a reused path is never mistaken for this pod's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_id: Option<NetnsId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    pub backend: Backend,
    pub spec: RedirectSpec,
    /// Seconds since the Unix epoch when the rules were applied.
    pub created_at: u64,
}

impl AttachmentRecord {
    pub fn now() -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default()
    }

    /// Whether `netns` (a path from this record or the runtime) is still this attachment's
    /// namespace. Records without an identity trust the path.
    pub fn netns_matches(&self, netns: &Path) -> bool {
        match (self.netns_id, NetnsId::of(netns)) {
            (Some(recorded), Some(current)) => recorded == current,
            (Some(_), None) => false,
            (None, _) => true,
        }
    }

    /// Whether another record is for the same pod network namespace (e.g. a second network of
    /// the pod under Multus): the rules are per netns, so they must outlive this attachment.
    pub fn shares_netns_with(&self, other: &AttachmentRecord) -> bool {
        let same_attachment =
            (&self.network, &self.container_id, &self.ifname) == (&other.network, &other.container_id, &other.ifname);
        let same_netns = match (self.netns_id, other.netns_id) {
            (Some(a), Some(b)) => a == b,
            _ => self.netns == other.netns,
        };
        !same_attachment && same_netns
    }
}

/// The directory of records under a plugin `stateDir`.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
}

/// Keeps file names to a safe alphabet whatever a runtime passes as ids. Anything outside
/// `[A-Za-z0-9.-]` (including the `_` separator) is percent-encoded, so distinct ids never share
/// a file.
fn sanitize(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for b in part.bytes() {
        if b.is_ascii_alphanumeric() || b == b'.' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl StateStore {
    pub fn new(state_dir: &Path) -> Self {
        Self { dir: state_dir.join(RECORDS_SUBDIR) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.dir.join(format!("{}_{}_{}.json", sanitize(network), sanitize(container_id), sanitize(ifname)))
    }

    pub fn write(&self, record: &AttachmentRecord) -> io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let path = self.path(&record.network, &record.container_id, &record.ifname);
        let body = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
        // Not synced: a record describes a live network namespace, which no crash survives, and
        // a sync would add milliseconds to every pod's ADD.
        write_atomic_with(&path, &body, None, Durability::Unsynced)
    }

    pub fn read(&self, network: &str, container_id: &str, ifname: &str) -> io::Result<Option<AttachmentRecord>> {
        read_record(&self.path(network, container_id, ifname))
    }

    /// Removes a record; a missing one is not an error (DEL is idempotent).
    pub fn remove(&self, network: &str, container_id: &str, ifname: &str) -> io::Result<()> {
        match fs::remove_file(self.path(network, container_id, ifname)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every record file with its parse result; unreadable ones are reported, not hidden.
    pub fn list(&self) -> io::Result<Vec<(PathBuf, io::Result<AttachmentRecord>)>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "json") {
                let record = read_record(&path).and_then(|r| r.ok_or_else(|| io::ErrorKind::NotFound.into()));
                out.push((path, record));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

fn read_record(path: &Path) -> io::Result<Option<AttachmentRecord>> {
    let body = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    parse_record(&body).map(Some)
}

/// One record file's content, checked for a version this plugin understands. Public so the fuzz
/// crate (fuzz/) can feed it untrusted bytes without a file system.
pub fn parse_record(body: &[u8]) -> io::Result<AttachmentRecord> {
    let record: AttachmentRecord = serde_json::from_slice(body).map_err(io::Error::other)?;
    // Older versions are read as they are (fields added since are optional); a newer one was
    // written by a newer plugin and may mean something we do not know.
    if record.version > RECORD_VERSION {
        return Err(io::Error::other(format!(
            "record version {} is newer than this plugin's ({RECORD_VERSION}): upgrade cnimesh-cni",
            record.version
        )));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(cid: &str) -> AttachmentRecord {
        AttachmentRecord {
            version: RECORD_VERSION,
            network: "k8s-pod-network".into(),
            container_id: cid.into(),
            ifname: "eth0".into(),
            netns: "/var/run/netns/x".into(),
            netns_id: None,
            pod_namespace: Some("default".into()),
            pod_name: Some("web-0".into()),
            pod_uid: None,
            backend: Backend::Nftables,
            spec: RedirectSpec::default(),
            created_at: 1,
        }
    }

    #[test]
    fn write_read_list_remove() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        assert!(store.list().unwrap().is_empty());
        store.write(&record("abc")).unwrap();
        store.write(&record("../evil")).unwrap();
        // `_` is the separator: ids containing it must not collide with others.
        assert_ne!(store.path("a_b", "c", "eth0"), store.path("a", "b_c", "eth0"));
        assert_eq!(store.read("k8s-pod-network", "abc", "eth0").unwrap(), Some(record("abc")));
        let listed = store.list().unwrap();
        assert_eq!(listed.len(), 2);
        assert!(listed.iter().any(|(p, _)| p.to_string_lossy().contains("..%2Fevil")));
        assert!(listed.iter().all(|(p, r)| p.starts_with(store.dir()) && r.is_ok()));
        store.remove("k8s-pod-network", "abc", "eth0").unwrap();
        store.remove("k8s-pod-network", "abc", "eth0").unwrap();
        assert_eq!(store.read("k8s-pod-network", "abc", "eth0").unwrap(), None);
        // No temporary files left behind.
        assert_eq!(fs::read_dir(store.dir()).unwrap().count(), 1);
    }

    #[test]
    fn format_is_stable() {
        let json = serde_json::to_value(record("abc")).unwrap();
        for key in [
            "version",
            "network",
            "containerID",
            "ifname",
            "netns",
            "podNamespace",
            "podName",
            "backend",
            "spec",
            "createdAt",
        ] {
            assert!(json.get(key).is_some(), "missing {key}");
        }
        assert_eq!(json["backend"], "nftables");
        assert_eq!(json["spec"]["skipOutboundPorts"], serde_json::json!([443, 6443]));
    }
}
