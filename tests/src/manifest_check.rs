//! The one strict check of the manifests under `daemonset/`, shared by every test that reads
//! them (node-agent/tests, control/tests and the images test include this file by path, so the
//! check exists once without those crates depending on the test crate).
//!
//! Every document is parsed into a `serde_json::Value`, deserialised into its typed k8s-openapi
//! struct, serialised back and compared with the original. k8s-openapi silently drops fields it
//! does not know, so a misspelt field (`hostNetwrok: true`) makes the round trip differ and fails
//! the test — the API server would have dropped it the same way, and the operator never notice.

// Each includer uses its own subset.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// `daemonset/` at the repository root (every crate is a sibling of it).
pub fn daemonset_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemonset")
}

/// The `*.yaml` files of `daemonset/` whose names `select` accepts, sorted.
pub fn yaml_files(select: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let dir = daemonset_dir();
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|ext| ext == "yaml"))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&select))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no matching manifests in {}", dir.display());
    files
}

/// Every non-empty document of a (multi-document) YAML file.
pub fn documents(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every non-empty document of a (multi-document) YAML text; duplicate keys are an error.
pub fn parse(yaml: &str) -> Result<Vec<Value>, String> {
    let docs = serde_saphyr::from_multiple::<Value>(yaml).map_err(|e| format!("YAML parse error: {e}"))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// `path document i (Kind name)`, for messages.
pub fn describe(path: &Path, i: usize, doc: &Value) -> String {
    format!(
        "{} document {i} ({} {})",
        path.display(),
        doc.get("kind").and_then(Value::as_str).unwrap_or("?"),
        doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("?"),
    )
}

/// The strictness check: `doc` deserialises into `T` and serialises back to the same JSON
/// (integers compared by value), or a readable list of what differs.
pub fn strict<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let typed: T = serde_json::from_value(doc.clone())
        .map_err(|e| format!("does not deserialise as {}: {e}", std::any::type_name::<T>()))?;
    let back = serde_json::to_value(&typed).map_err(|e| format!("serialising back: {e}"))?;
    let diff = diff(&normalise(doc), &normalise(&back));
    if diff.is_empty() { Ok(typed) } else { Err(format!("round trip through k8s-openapi differs:\n{diff}")) }
}

/// Every `.rs` file under `dir`, concatenated: for "is this flag / variable read anywhere".
pub fn source_of(dir: &Path) -> String {
    let mut source = String::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                source.push_str(&fs::read_to_string(&path).expect("a source file"));
            }
        }
    }
    source
}

/// Integers are compared by value whatever their JSON representation (`u64` vs `i64`).
fn normalise(v: &Value) -> Value {
    match v {
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => v.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(normalise).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), normalise(v))).collect()),
        _ => v.clone(),
    }
}

/// Leaves (scalars, empty objects, empty arrays) keyed by JSON pointer.
fn leaves(v: &Value, pointer: String, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, child) in map {
                let escaped = k.replace('~', "~0").replace('/', "~1");
                leaves(child, format!("{pointer}/{escaped}"), out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, child) in items.iter().enumerate() {
                leaves(child, format!("{pointer}/{i}"), out);
            }
        }
        _ => {
            out.insert(pointer, v.clone());
        }
    }
}

/// A readable difference between a manifest and its round trip; empty if they are equal.
fn diff(original: &Value, round_tripped: &Value) -> String {
    if original == round_tripped {
        return String::new();
    }
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    leaves(original, String::new(), &mut a);
    leaves(round_tripped, String::new(), &mut b);
    let mut out = String::new();
    for (path, value) in &a {
        match b.get(path) {
            None => {
                let _ = writeln!(out, "  dropped (unknown or misspelt field?): {path} = {value}");
            }
            Some(other) if other != value => {
                let _ = writeln!(out, "  changed: {path}: {value} -> {other}");
            }
            Some(_) => {}
        }
    }
    for (path, value) in &b {
        if !a.contains_key(path) {
            let _ = writeln!(out, "  added by the round trip: {path} = {value}");
        }
    }
    if out.is_empty() {
        let _ = writeln!(out, "  manifest:   {original}\n  round trip: {round_tripped}");
    }
    out
}
