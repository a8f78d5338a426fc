//! Installer behaviour on real-world shaped configurations in temp dirs.

use std::fs;
use std::path::Path;

use serde_json::{Value, json};

use super::*;

const CALICO: &str = r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [
    {
      "type": "calico",
      "log_level": "info",
      "datastore_type": "kubernetes",
      "mtu": 0,
      "ipam": { "type": "calico-ipam" },
      "policy": { "type": "k8s" },
      "kubernetes": { "kubeconfig": "/etc/cni/net.d/calico-kubeconfig" }
    },
    { "type": "portmap", "snat": true, "capabilities": { "portMappings": true } },
    { "type": "bandwidth", "capabilities": { "bandwidth": true } }
  ]
}
"#;

const CILIUM: &str = r#"{
  "cniVersion": "0.3.1",
  "name": "cilium",
  "type": "cilium-cni",
  "enable-debug": false,
  "log-file": "/var/run/cilium/cilium-cni.log"
}
"#;

const FLANNEL: &str = r#"{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    { "type": "flannel", "delegate": { "hairpinMode": true, "isDefaultGateway": true } },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
"#;

fn ours() -> Value {
    entry(&json!({"stateDir": "/var/lib/cnimesh", "nodeAgent": {"socket": "/var/run/cnimesh/node.sock"}}))
}

fn read(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

fn types(v: &Value) -> Vec<String> {
    v["plugins"].as_array().unwrap().iter().map(|p| p["type"].as_str().unwrap().to_string()).collect()
}

#[test]
fn calico_conflist_is_patched_in_place_keeping_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("10-calico.conflist");
    fs::write(&path, CALICO).unwrap();
    let (applied, _) = apply(dir.path(), &ours()).unwrap();
    assert_eq!(applied, Applied::Patched { file: path.clone() });
    let v = read(&path);
    assert_eq!(types(&v), ["calico", "portmap", "bandwidth", "cnimesh-cni"]);
    let original: Value = serde_json::from_str(CALICO).unwrap();
    assert_eq!(unchain(&v), original, "all other fields preserved");
    // Key order is preserved too (diff-friendly for operators).
    let text = fs::read_to_string(&path).unwrap();
    assert!(text.find("\"name\"").unwrap() < text.find("\"cniVersion\"").unwrap());
    // Idempotent.
    assert!(!apply(dir.path(), &ours()).unwrap().0.wrote());
    assert_eq!(is_chained(dir.path()), Some(path.clone()));
    // Uninstall restores the original.
    assert_eq!(remove(dir.path()).unwrap(), vec![path.clone()]);
    assert_eq!(read(&path), original);
}

#[test]
fn cilium_single_conf_gets_a_generated_list_that_libcni_prefers() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("05-cilium.conf");
    fs::write(&conf, CILIUM).unwrap();
    let (applied, _) = apply(dir.path(), &ours()).unwrap();
    let generated = dir.path().join("05-cilium.cnimesh.conflist");
    assert_eq!(applied, Applied::Generated { file: generated.clone(), source: conf.clone() });
    assert_eq!(fs::read_to_string(&conf).unwrap(), CILIUM, "the original is untouched");
    let v = read(&generated);
    assert_eq!(v["name"], "cilium");
    assert_eq!(v["cniVersion"], "0.3.1");
    assert_eq!(types(&v), ["cilium-cni", "cnimesh-cni"]);
    assert_eq!(v["plugins"][0], serde_json::from_str::<Value>(CILIUM).unwrap());
    // libcni's choice (first file by name) is now ours.
    let mut files: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    files.sort();
    assert_eq!(files[0], "05-cilium.cnimesh.conflist");
    assert_eq!(is_chained(dir.path()), Some(generated.clone()));
    // Uninstall removes only ours.
    remove(dir.path()).unwrap();
    assert!(!generated.exists());
    assert_eq!(fs::read_to_string(&conf).unwrap(), CILIUM);
    assert_eq!(is_chained(dir.path()), None);
}

#[test]
fn the_first_valid_file_wins_like_libcni() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("00-broken.conflist"), "{ nope").unwrap();
    fs::write(dir.path().join("10-flannel.conflist"), FLANNEL).unwrap();
    fs::write(dir.path().join("20-calico.conflist"), CALICO).unwrap();
    fs::write(dir.path().join("99-loopback.conf"), r#"{"cniVersion":"0.3.1","name":"lo","type":"loopback"}"#).unwrap();
    fs::write(dir.path().join("README"), "not a config").unwrap();
    let (applied, scan) = apply(dir.path(), &ours()).unwrap();
    assert_eq!(applied.file(), dir.path().join("10-flannel.conflist"));
    assert_eq!(scan.invalid.len(), 1, "the malformed file is reported");
    assert!(scan.invalid[0].1.contains("not valid JSON"));
    assert_eq!(fs::read_to_string(dir.path().join("00-broken.conflist")).unwrap(), "{ nope", "and left alone");
    assert_eq!(
        types(&read(&dir.path().join("20-calico.conflist"))),
        ["calico", "portmap", "bandwidth"],
        "others untouched"
    );
}

#[test]
fn duplicate_entries_collapse_to_one_last() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("10-calico.conflist");
    let mut v: Value = serde_json::from_str(CALICO).unwrap();
    let plugins = v["plugins"].as_array_mut().unwrap();
    plugins.insert(1, json!({"type": "cnimesh-cni", "old": true}));
    plugins.push(json!({"type": "cnimesh-cni", "old": true}));
    fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    apply(dir.path(), &ours()).unwrap();
    let v = read(&path);
    assert_eq!(types(&v), ["calico", "portmap", "bandwidth", "cnimesh-cni"]);
    assert_eq!(v["plugins"][3], ours(), "the current settings replace stale ones");
}

#[test]
fn no_primary_yet_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(apply(dir.path(), &ours()), Err(ChainError::NoPrimary(_))));
}

#[test]
fn generated_file_follows_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("05-cilium.conf");
    fs::write(&conf, CILIUM).unwrap();
    apply(dir.path(), &ours()).unwrap();
    // The primary CNI rewrites its file: the generated list is re-derived.
    fs::write(&conf, CILIUM.replace("\"enable-debug\": false", "\"enable-debug\": true")).unwrap();
    let (applied, _) = apply(dir.path(), &ours()).unwrap();
    assert!(applied.wrote());
    assert_eq!(read(applied.file())["plugins"][0]["enable-debug"], true);
    // The primary CNI switches to a conflist with another name: the stale generated file goes.
    fs::remove_file(&conf).unwrap();
    fs::write(dir.path().join("05-cilium.conflist"), FLANNEL).unwrap();
    let (applied, _) = apply(dir.path(), &ours()).unwrap();
    assert_eq!(applied, Applied::Patched { file: dir.path().join("05-cilium.conflist") });
    assert!(!dir.path().join("05-cilium.cnimesh.conflist").exists());
}

#[test]
fn atomic_write_keeps_mode_and_leaves_no_temp() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("10-calico.conflist");
    fs::write(&path, CALICO).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    apply(dir.path(), &ours()).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
}
