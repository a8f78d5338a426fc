//! Chaining `cnimesh-cni` into the node's primary CNI configuration.
//!
//! libcni (and so every runtime) uses the lexicographically first valid `.conf`, `.conflist` or
//! `.json` file of the config dir. We find that file the same way and:
//! - a `.conflist` is patched in place: our object appended to `plugins`, exactly once, last, every
//!   other key and plugin kept as they were;
//! - a single-plugin `.conf`/`.json` is **not renamed or rewritten** (other components — the
//!   primary CNI itself, monitoring, kubelet's readiness check — keep reading the file they know).
//!   Instead we write `<stem>.cnimesh.conflist` beside it: that name sorts before `<stem>.conf`
//!   and `<stem>.json` (".cn" < ".co" < ".js"), so libcni picks it, and removing it restores the
//!   original exactly. The generated file is re-derived whenever the original changes.
//!
//! All writes are atomic (temp file + rename) with names libcni ignores.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use cnimesh_common::fs::write_atomic;
use serde_json::{Map, Value};

pub const PLUGIN_TYPE: &str = "cnimesh-cni";
pub const GENERATED_SUFFIX: &str = ".cnimesh.conflist";
const EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("no CNI configuration in {0} yet")]
    NoPrimary(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ChainError + '_ {
    move |source| ChainError::Io { path: path.to_path_buf(), source }
}

/// What a scan of the config dir found.
#[derive(Debug, Default)]
pub struct Scan {
    /// The file libcni would use (ours excluded).
    pub primary: Option<PathBuf>,
    /// Files skipped because they do not parse, with why (left untouched, reported).
    pub invalid: Vec<(PathBuf, String)>,
    /// Our generated files.
    pub generated: Vec<PathBuf>,
}

pub fn is_generated(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(GENERATED_SUFFIX))
}

fn is_conflist(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "conflist")
}

/// Why a file is not a configuration libcni would load, if it is not.
fn validate(path: &Path, body: &[u8]) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not valid JSON: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    if is_conflist(path) {
        match obj.get("plugins").and_then(Value::as_array) {
            Some(p) if !p.is_empty() => {}
            _ => return Err("conflist without plugins".into()),
        }
    } else if !obj.get("type").is_some_and(Value::is_string) {
        return Err("plugin configuration without a type".into());
    }
    Ok(v)
}

pub fn scan(dir: &Path) -> Result<Scan, ChainError> {
    let mut names: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io_err(dir))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().and_then(|e| e.to_str()).is_some_and(|e| EXTENSIONS.contains(&e)))
        .collect();
    names.sort();
    let mut scan = Scan::default();
    for path in names {
        if is_generated(&path) {
            scan.generated.push(path);
            continue;
        }
        if scan.primary.is_some() {
            continue;
        }
        match fs::read(&path).map_err(|e| e.to_string()).and_then(|b| validate(&path, &b)) {
            Ok(_) => scan.primary = Some(path),
            Err(why) => scan.invalid.push((path, why)),
        }
    }
    Ok(scan)
}

fn is_ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

/// `list` with every cnimesh entry removed and `entry` appended: once, last.
pub fn chain_into(list: &Value, entry: &Value) -> Value {
    let mut out = list.clone();
    if let Some(plugins) = out.get_mut("plugins").and_then(Value::as_array_mut) {
        plugins.retain(|p| !is_ours(p));
        plugins.push(entry.clone());
    }
    out
}

/// `list` without cnimesh entries.
pub fn unchain(list: &Value) -> Value {
    let mut out = list.clone();
    if let Some(plugins) = out.get_mut("plugins").and_then(Value::as_array_mut) {
        plugins.retain(|p| !is_ours(p));
    }
    out
}

/// A single-plugin configuration as the list libcni would make of it.
pub fn as_list(conf: &Value) -> Value {
    let mut list = Map::new();
    for key in ["cniVersion", "name"] {
        if let Some(v) = conf.get(key) {
            list.insert(key.into(), v.clone());
        }
    }
    list.insert("plugins".into(), Value::Array(vec![conf.clone()]));
    Value::Object(list)
}

/// Our plugin object: `{"type": "cnimesh-cni"}` plus the configured settings.
pub fn entry(settings: &Value) -> Value {
    let mut obj = Map::new();
    obj.insert("type".into(), Value::from(PLUGIN_TYPE));
    if let Some(s) = settings.as_object() {
        obj.extend(s.iter().filter(|(k, _)| k.as_str() != "type").map(|(k, v)| (k.clone(), v.clone())));
    }
    Value::Object(obj)
}

fn render(v: &Value) -> Vec<u8> {
    let mut body = serde_json::to_vec_pretty(v).expect("JSON values serialise");
    body.push(b'\n');
    body
}

/// Writes `value` unless the file already holds exactly it; returns whether it wrote.
fn write_if_changed(path: &Path, value: &Value) -> Result<bool, ChainError> {
    let current = fs::read(path).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    if current.as_ref() == Some(value) {
        return Ok(false);
    }
    write_atomic(path, &render(value), None).map_err(io_err(path))?;
    Ok(true)
}

/// What [`apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Our entry was already in place.
    Unchanged { file: PathBuf },
    /// A conflist was patched in place.
    Patched { file: PathBuf },
    /// A conflist was generated beside a single-plugin file.
    Generated { file: PathBuf, source: PathBuf },
}

impl Applied {
    pub fn file(&self) -> &Path {
        match self {
            Applied::Unchanged { file } | Applied::Patched { file } | Applied::Generated { file, .. } => file,
        }
    }

    pub fn wrote(&self) -> bool {
        !matches!(self, Applied::Unchanged { .. })
    }
}

/// The generated conflist for a single-plugin source file.
pub fn generated_path(source: &Path) -> PathBuf {
    let stem = source.file_stem().and_then(|s| s.to_str()).unwrap_or("cni");
    source.with_file_name(format!("{stem}{GENERATED_SUFFIX}"))
}

/// Makes the primary configuration chain our entry. Idempotent; stale generated files (whose
/// source is gone or no longer primary) are removed.
pub fn apply(dir: &Path, entry: &Value) -> Result<(Applied, Scan), ChainError> {
    let scan = scan(dir)?;
    let Some(primary) = scan.primary.clone() else {
        // The primary CNI removed its configuration (e.g. to mark the node not ready): a
        // generated copy must not keep the node's pod network alive behind its back.
        for stale in &scan.generated {
            fs::remove_file(stale).map_err(io_err(stale))?;
        }
        return Err(ChainError::NoPrimary(dir.to_path_buf()));
    };
    let body = fs::read(&primary).map_err(io_err(&primary))?;
    let current: Value = serde_json::from_slice(&body)
        .map_err(|e| ChainError::Io { path: primary.clone(), source: io::Error::new(io::ErrorKind::InvalidData, e) })?;
    let applied = if is_conflist(&primary) {
        let wrote = write_if_changed(&primary, &chain_into(&current, entry))?;
        if wrote { Applied::Patched { file: primary.clone() } } else { Applied::Unchanged { file: primary.clone() } }
    } else {
        let file = generated_path(&primary);
        let wrote = write_if_changed(&file, &chain_into(&as_list(&current), entry))?;
        if wrote { Applied::Generated { file, source: primary.clone() } } else { Applied::Unchanged { file } }
    };
    for stale in scan.generated.iter().filter(|g| *g != applied.file()) {
        fs::remove_file(stale).map_err(io_err(stale))?;
    }
    Ok((applied, scan))
}

/// Removes our entry everywhere in the dir: generated files deleted, conflists unpatched.
/// Returns the files changed.
pub fn remove(dir: &Path) -> Result<Vec<PathBuf>, ChainError> {
    let mut changed = Vec::new();
    let scan = scan(dir)?;
    for g in &scan.generated {
        fs::remove_file(g).map_err(io_err(g))?;
        changed.push(g.clone());
    }
    let mut lists: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io_err(dir))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| is_conflist(p) && !is_generated(p))
        .collect();
    lists.sort();
    for path in lists {
        let Ok(v) = fs::read(&path).map_err(|_| ()).and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|_| ()))
        else {
            continue;
        };
        if write_if_changed(&path, &unchain(&v))? {
            changed.push(path);
        }
    }
    Ok(changed)
}

/// Whether the configuration libcni would use now chains our plugin (for status and readiness).
pub fn is_chained(dir: &Path) -> Option<PathBuf> {
    let scan = scan(dir).ok()?;
    let first =
        scan.generated.first().filter(|g| scan.primary.as_ref().is_none_or(|p| *g < p)).or(scan.primary.as_ref())?;
    let v: Value = serde_json::from_slice(&fs::read(first).ok()?).ok()?;
    let plugins = v.get("plugins")?.as_array()?;
    (plugins.last().is_some_and(is_ours) && plugins.iter().filter(|p| is_ours(p)).count() == 1).then(|| first.clone())
}

#[cfg(test)]
mod tests;
