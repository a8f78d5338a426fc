//! The node agent's patching of the primary CNI configuration (whatever the primary CNI wrote):
//! any JSON in, our entry exactly once and last out, everything else kept, idempotent, and
//! removal giving the original plugins back.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use cnimesh_node::chain::{self, Applied, ChainError, PLUGIN_TYPE};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fn dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temp dir")).path()
}

fn is_ours(p: &Value) -> bool {
    p.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

fn read(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fuzz_target!(|data: &[u8]| {
    let Some((ext, body)) = data.split_first() else { return };
    let ext = ["conflist", "conf", "json"][*ext as usize % 3];
    let dir = dir();
    for entry in std::fs::read_dir(dir).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let source = dir.join(format!("10-primary.{ext}"));
    std::fs::write(&source, body).unwrap();
    let ours = chain::entry(&json!({"stateDir": "/var/lib/cnimesh", "nodeAgent": {"socket": "/run/x.sock"}}));

    let (applied, scan) = match chain::apply(dir, &ours) {
        Ok(done) => done,
        Err(ChainError::NoPrimary(_)) => {
            // Not a configuration libcni would load: left exactly as it was, nothing written.
            assert_eq!(std::fs::read(&source).unwrap(), body);
            assert_eq!(std::fs::read_dir(dir).unwrap().count(), 1);
            return;
        }
        Err(e) => panic!("apply failed on a readable dir: {e}"),
    };
    assert_eq!(scan.primary.as_deref(), Some(source.as_path()));
    let original: Value = serde_json::from_slice(body).expect("the primary is JSON");
    let file = applied.file().to_path_buf();
    let patched = read(&file);
    let plugins = patched["plugins"].as_array().expect("a plugins list");
    assert_eq!(plugins.iter().filter(|p| is_ours(p)).count(), 1, "{patched}");
    assert_eq!(plugins.last(), Some(&ours), "{patched}");
    let list = if ext == "conflist" {
        // Patched in place: every other key kept.
        assert_eq!(file, source);
        for (k, v) in original.as_object().unwrap() {
            if k != "plugins" {
                assert_eq!(patched.get(k), Some(v), "key {k} changed: {patched}");
            }
        }
        original.clone()
    } else {
        // The original is never rewritten; the generated list wraps it.
        assert_eq!(std::fs::read(&source).unwrap(), body);
        chain::as_list(&original)
    };
    let others: Vec<&Value> = list["plugins"].as_array().unwrap().iter().filter(|p| !is_ours(p)).collect();
    assert_eq!(plugins[..plugins.len() - 1].iter().collect::<Vec<_>>(), others, "other plugins kept in order");
    assert_eq!(chain::is_chained(dir).as_deref(), Some(file.as_path()));

    // Idempotent: a second pass writes nothing.
    let (again, _) = chain::apply(dir, &ours).expect("a second apply");
    assert!(matches!(again, Applied::Unchanged { .. }), "second apply rewrote: {again:?}");
    assert_eq!(read(&file), patched);

    // Removal gives back the original without our entries.
    chain::remove(dir).expect("remove");
    if ext == "conflist" {
        assert_eq!(read(&source), chain::unchain(&original));
    } else {
        assert_eq!(std::fs::read(&source).unwrap(), body);
        assert!(!file.exists());
    }
});
