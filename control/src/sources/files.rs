//! Cluster state from a directory of Kubernetes YAML: local mode's "API server", and the source
//! tests drive by writing files.
//!
//! Every `.yaml`/`.yml` file under the directory (recursively; names starting with `.` are skipped,
//! so editors' and `kubectl`'s temporary files are not read half-written) holds any number of
//! documents. Services, EndpointSlices and Pods are used, and with a policy index
//! ([`FileSource::with_policy`]) Namespaces, the `policy.cnimesh.io/v1alpha1` resources and the
//! Gateway API routes (`HTTPRoute`, `GRPCRoute`, `ReferenceGrant`) too; with an egress index
//! ([`FileSource::with_egress`]) `EgressNetwork`, `TLSRoute` and `TCPRoute`, and the HTTPRoutes
//! and GRPCRoutes again;
//! `kind: List` is opened, anything else is ignored. A file is taken whole or not at all: when one document fails to parse, the error is
//! logged with the file and the file's previous content stays in force. Writers that want no
//! intermediate states should write a temporary file and rename it over the old one.
//!
//! Layer: sources (files).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use serde_json::Value;

use super::{Source, SourceError};
use crate::destination::{Change, Index, KINDS, Kind, Object};
use crate::egress;
use crate::meta::NsName;
use crate::metrics::Metrics;
use crate::policy::{self, crd};
use crate::routes::crd as routes;

/// Quiet time after a change before files are read: a `kubectl`-style write (truncate, write,
/// close) or a `git checkout` of many files becomes one update instead of a burst of half-states.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(10);
/// However busy the directory, changes are applied at least this often (in debounce periods).
const MAX_DEBOUNCE_PERIODS: u32 = 10;

pub struct FileSource {
    dir: PathBuf,
    debounce: Duration,
    policy: Option<policy::Index>,
    egress: Option<egress::Index>,
    /// Where a file that cannot be read or parsed is counted.
    metrics: Option<Arc<Metrics>>,
}

impl FileSource {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), debounce: DEFAULT_DEBOUNCE, policy: None, egress: None, metrics: None }
    }

    /// Counts each file it cannot read or parse (`cluster_objects_rejected_total{kind="file"}`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Also keeps an egress index in step (EgressNetworks and their routes).
    pub fn with_egress(mut self, egress: egress::Index) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Also keeps a policy index in step with the directory (same files, same rules).
    pub fn with_policy(mut self, policy: policy::Index) -> Self {
        self.policy = Some(policy);
        self
    }

    pub fn with_debounce(mut self, debounce: Duration) -> Self {
        self.debounce = debounce;
        self
    }
}

impl Source for FileSource {
    /// Reading and parsing are blocking work, so the loop lives on a blocking thread; notify's own
    /// thread feeds it events through a channel.
    async fn run(self, index: Index) -> Result<(), SourceError> {
        let (tx, rx) = mpsc::channel();
        let mut watcher = notify::recommended_watcher(move |event| {
            // The receiver only goes away when the loop has ended; nothing left to tell.
            let _ = tx.send(event);
        })
        .map_err(|source| SourceError::Watch { dir: self.dir.clone(), source })?;
        // Watch before the first read, so a change made during it is not missed.
        watcher
            .watch(&self.dir, RecursiveMode::Recursive)
            .map_err(|source| SourceError::Watch { dir: self.dir.clone(), source })?;
        let dir = self.dir.clone();
        let result = tokio::task::spawn_blocking(move || {
            let mut files = Files {
                dir: self.dir,
                defined: HashMap::new(),
                policy: self.policy,
                egress: self.egress,
                metrics: self.metrics,
            };
            files.apply(files.all_paths(), &index);
            index.apply(KINDS.map(Change::Listed));
            if let Some(policy) = &files.policy {
                policy.apply(policy::index::KINDS.map(policy::Change::Listed));
            }
            if let Some(egress) = &files.egress {
                egress.apply(egress::KINDS.map(egress::Change::Listed));
            }
            tracing::info!(dir = %files.dir.display(), files = files.defined.len(), stats = ?index.stats(), "loaded cluster state from files");
            files.follow(&rx, self.debounce, &index);
        })
        .await;
        drop(watcher);
        let reason = match result {
            Ok(()) => "its event channel closed".to_string(),
            Err(e) => e.to_string(),
        };
        Err(SourceError::Stopped { dir, reason })
    }
}

/// Which objects each file defined when it last parsed.
struct Files {
    dir: PathBuf,
    defined: HashMap<PathBuf, HashSet<ObjectId>>,
    policy: Option<policy::Index>,
    egress: Option<egress::Index>,
    metrics: Option<Arc<Metrics>>,
}

/// What a batch of file events asks for.
#[derive(Default)]
struct Pending {
    paths: HashSet<PathBuf>,
    rescan: bool,
}

impl Files {
    fn follow(&mut self, rx: &mpsc::Receiver<notify::Result<notify::Event>>, debounce: Duration, index: &Index) {
        while let Ok(event) = rx.recv() {
            let mut pending = Pending::default();
            self.note(event, &mut pending);
            let deadline = Instant::now() + debounce * MAX_DEBOUNCE_PERIODS;
            loop {
                let wait = debounce.min(deadline.saturating_duration_since(Instant::now()));
                match rx.recv_timeout(wait) {
                    Ok(event) => self.note(event, &mut pending),
                    Err(mpsc::RecvTimeoutError::Timeout) => break,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
            let started = Instant::now();
            let (files, rescan) = (pending.paths.len(), pending.rescan);
            let paths = if rescan { self.all_paths() } else { pending.paths };
            let changed = self.apply(paths, index);
            tracing::debug!(files, rescan, changed, took = ?started.elapsed(), "applied file changes");
        }
    }

    fn note(&self, event: notify::Result<notify::Event>, pending: &mut Pending) {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "file watch error; re-reading the directory");
                pending.rescan = true;
                return;
            }
        };
        // Reads are not changes, and our own reads would wake us again in an endless loop. A
        // close after writing is kept: it is the moment a file written in place is complete.
        if matches!(event.kind, EventKind::Access(kind) if kind != AccessKind::Close(AccessMode::Write)) {
            return;
        }
        if event.need_rescan() {
            pending.rescan = true;
        }
        for path in event.paths {
            // `.status/` (the mirror controller's Link status files) and any other
            // hidden directory are not cluster state.
            if in_hidden_dir(&self.dir, &path) {
                continue;
            }
            if is_manifest(&path) {
                pending.paths.insert(path);
            } else if path.is_dir() || self.defined.keys().any(|f| f.starts_with(&path)) {
                // A directory appeared, went, or was swapped (a ConfigMap volume's `..data`).
                pending.rescan = true;
            }
        }
    }

    /// Every file there is and every file there was.
    fn all_paths(&self) -> HashSet<PathBuf> {
        let mut paths: HashSet<PathBuf> = self.defined.keys().cloned().collect();
        collect_manifests(&self.dir, &mut paths);
        paths
    }

    /// Reloads files one at a time, each as one step: a file is the unit of consistency, and
    /// parsed objects never pile up beyond one file's worth (at 10,000 pods, holding them all at
    /// once roughly doubled the resident memory left behind). Returns the number of changes.
    fn apply(&mut self, paths: HashSet<PathBuf>, index: &Index) -> usize {
        paths
            .into_iter()
            .map(|path| {
                let changes = self.reload(&path);
                let count = changes.destination.len() + changes.policy.len();
                index.apply(changes.destination);
                if let Some(policy) = &self.policy {
                    policy.apply(changes.policy);
                }
                if let Some(egress) = &self.egress {
                    egress.apply(changes.egress);
                }
                count
            })
            .sum()
    }

    /// The changes that bring the index from this file's last good content to its current one.
    fn reload(&mut self, path: &Path) -> Changes {
        let Some(objects) = read(path) else {
            if let Some(metrics) = &self.metrics {
                metrics.object_rejected("file");
            }
            return Changes::default();
        };
        let ids: HashSet<ObjectId> = objects.iter().map(Parsed::id).collect();
        let old = if ids.is_empty() {
            self.defined.remove(path)
        } else {
            self.defined.insert(path.to_path_buf(), ids.clone())
        };
        let mut changes = Changes::default();
        for gone in old.into_iter().flatten().filter(|i| !ids.contains(i)) {
            // An object another file also defines lives on in that file's version. That file is
            // read again: duplicates are rare, and keeping every parsed object for them would
            // cost more memory than the whole index.
            let other = self.defined.iter().find(|(_, ids)| ids.contains(&gone)).and_then(|(p, _)| read(p));
            match other.and_then(|objects| objects.into_iter().find(|o| o.id() == gone)) {
                Some(object) => changes.upsert(object),
                None => changes.delete(gone),
            }
        }
        objects.into_iter().for_each(|o| changes.upsert(o));
        changes
    }
}

/// A document for one of the indexes (a Pod is read once and given to both).
#[derive(Debug, Clone)]
enum Parsed {
    Destination(Object),
    Policy(policy::Object),
    Egress(egress::Object),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ObjectId {
    Destination(Kind, NsName),
    Policy(policy::Kind, NsName),
    Egress(egress::Kind, NsName),
}

impl Parsed {
    fn id(&self) -> ObjectId {
        match self {
            Parsed::Destination(o) => ObjectId::Destination(o.kind(), o.key()),
            Parsed::Policy(o) => ObjectId::Policy(o.kind(), o.key()),
            Parsed::Egress(o) => ObjectId::Egress(o.kind(), o.key()),
        }
    }
}

/// The changes one file makes to each index.
#[derive(Debug, Default)]
struct Changes {
    destination: Vec<Change>,
    policy: Vec<policy::Change>,
    egress: Vec<egress::Change>,
}

impl Changes {
    /// A Service goes to policy too (its `appProtocol` declares the protocol of the pod
    /// ports it targets), as the same object: one id, so a file's edits reach both indexes.
    fn upsert(&mut self, object: Parsed) {
        match object {
            Parsed::Destination(o) => {
                if let Object::Service(s) = &o {
                    self.policy.push(policy::Change::Upsert(policy::Object::Service(s.clone())));
                }
                self.destination.push(Change::Upsert(o))
            }
            Parsed::Policy(o) => self.policy.push(policy::Change::Upsert(o)),
            Parsed::Egress(o) => self.egress.push(egress::Change::Upsert(o)),
        }
    }

    fn delete(&mut self, id: ObjectId) {
        match id {
            ObjectId::Destination(kind, key) => {
                if kind == Kind::Service {
                    self.policy.push(policy::Change::Delete(policy::Kind::Service, key.clone()));
                }
                self.destination.push(Change::Delete(kind, key))
            }
            ObjectId::Policy(kind, key) => self.policy.push(policy::Change::Delete(kind, key)),
            ObjectId::Egress(kind, key) => self.egress.push(egress::Change::Delete(kind, key)),
        }
    }
}

/// The Pods and Services of every manifest under `dir` (local mode's cluster directory), read
/// once: what `cnimesh stat --local` attributes metrics by. A file that cannot be parsed is logged
/// and left out.
pub fn pods_and_services_in(dir: &Path) -> (Vec<Pod>, Vec<Service>) {
    let mut files = HashSet::new();
    collect_manifests(dir, &mut files);
    let mut files: Vec<PathBuf> = files.into_iter().collect();
    files.sort();
    let (mut pods, mut services) = (Vec::new(), Vec::new());
    for parsed in files.iter().filter_map(|file| read(file)).flatten() {
        match parsed {
            Parsed::Destination(Object::Pod(pod)) => pods.push(*pod),
            Parsed::Destination(Object::Service(service)) => services.push(*service),
            _ => {}
        }
    }
    (pods, services)
}

/// A file's objects; `None` (logged) when it cannot be read or parsed, so its last good state
/// stays. A file that is gone has no objects.
fn read(path: &Path) -> Option<Vec<Parsed>> {
    match std::fs::read_to_string(path) {
        Ok(text) => match parse(&text) {
            Ok(objects) => Some(objects),
            Err(error) => {
                tracing::error!(file = %path.display(), %error, "cannot parse; keeping its last good state");
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(Vec::new()),
        Err(error) => {
            tracing::error!(file = %path.display(), %error, "cannot read; keeping its last good state");
            None
        }
    }
}

/// Whether `path` lies under a directory of `root` whose name starts with `.` (`.status/`).
fn in_hidden_dir(root: &Path, path: &Path) -> bool {
    let Ok(relative) = path.strip_prefix(root) else { return false };
    let mut components: Vec<_> = relative.components().collect();
    components.pop();
    components.iter().any(|c| c.as_os_str().to_string_lossy().starts_with('.'))
}

/// The Services, EndpointSlices and Pods of a directory, read now and as a whole: the
/// mirror controller's view of a linked cluster in local mode (`file://` in a Link's kubeconfig),
/// and of its own cluster. Unlike the source, a directory that cannot be listed is an error (the
/// link is lost), and so is a file that cannot be parsed (the caller keeps its last good view).
/// With `extra` (apiVersion, kind) pairs, those documents are returned too, as JSON (Links and
/// their Secrets in the local cluster's directory).
pub fn cluster_objects_in(dir: &Path, extra: &[(&str, &str)]) -> Result<ClusterObjects, ReadError> {
    let mut files = HashSet::new();
    collect_manifests_strict(dir, &mut files)?;
    let mut files: Vec<PathBuf> = files.into_iter().collect();
    files.sort();
    let mut objects = ClusterObjects::default();
    for file in files {
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            // Removed between listing and reading: not there.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(ReadError::Unreadable { path: file, source }),
        };
        let parsed = parse(&text).map_err(|e| ReadError::Parse { file: file.clone(), error: e.to_string() })?;
        for object in parsed {
            match object {
                Parsed::Destination(Object::Pod(pod)) => objects.pods.push(*pod),
                Parsed::Destination(Object::Service(service)) => objects.services.push(*service),
                Parsed::Destination(Object::EndpointSlice(slice)) => objects.slices.push(*slice),
                _ => {}
            }
        }
        if extra.is_empty() {
            continue;
        }
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .map_err(|e| ReadError::Parse { file: file.clone(), error: e.to_string() })?;
        let field = |doc: &Value, name: &str| doc.get(name).and_then(Value::as_str).unwrap_or_default().to_string();
        for doc in docs {
            let found = (field(&doc, "apiVersion"), field(&doc, "kind"));
            if extra.iter().any(|(a, k)| (*a, *k) == (found.0.as_str(), found.1.as_str())) {
                objects.other.push(doc);
            }
        }
    }
    Ok(objects)
}

/// What [`cluster_objects_in`] read.
#[derive(Debug, Default, Clone)]
pub struct ClusterObjects {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub pods: Vec<Pod>,
    /// The documents of the extra kinds asked for.
    pub other: Vec<Value>,
}

/// Why [`cluster_objects_in`] could not read a directory.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {}: {source}", path.display())]
    Unreadable { path: PathBuf, source: std::io::Error },
    #[error("cannot parse {}: {error}", file.display())]
    Parse { file: PathBuf, error: String },
}

fn collect_manifests_strict(dir: &Path, out: &mut HashSet<PathBuf>) -> Result<(), ReadError> {
    let entries = std::fs::read_dir(dir).map_err(|source| ReadError::Unreadable { path: dir.to_path_buf(), source })?;
    for entry in entries {
        let path = entry.map_err(|source| ReadError::Unreadable { path: dir.to_path_buf(), source })?.path();
        if path.is_dir() && !path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')) {
            collect_manifests_strict(&path, out)?;
        } else if is_manifest(&path) {
            out.insert(path);
        }
    }
    Ok(())
}

fn is_manifest(path: &Path) -> bool {
    let hidden = path.file_name().and_then(|n| n.to_str()).is_none_or(|n| n.starts_with('.'));
    let yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
    yaml && !hidden
}

fn collect_manifests(dir: &Path, out: &mut HashSet<PathBuf>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot list directory");
            return;
        }
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.is_dir() && !path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')) {
            collect_manifests(&path, out);
        } else if is_manifest(&path) {
            out.insert(path);
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ParseError {
    #[error("{0}")]
    Yaml(#[from] serde_saphyr::Error),
    #[error("document {index} ({kind} {name:?}): {source}")]
    Document { index: usize, kind: String, name: String, source: serde_json::Error },
}

/// The Services, EndpointSlices, Pods, Namespaces and policy resources in a YAML text.
fn parse(text: &str) -> Result<Vec<Parsed>, ParseError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)?;
    let mut objects = Vec::new();
    for (index, doc) in docs.into_iter().enumerate() {
        objects_of(doc, index + 1, &mut objects)?;
    }
    Ok(objects)
}

/// [`parse`] for the fuzz crate (fuzz/), which feeds it untrusted YAML: the Destination objects
/// (policy objects are checked by their own model), or the error that would be logged with the
/// file's name.
#[doc(hidden)]
pub fn parse_for_fuzzing(text: &str) -> Result<Vec<Object>, String> {
    let parsed = parse(text).map_err(|e| e.to_string())?;
    Ok(parsed
        .into_iter()
        .filter_map(|p| match p {
            Parsed::Destination(o) => Some(o),
            Parsed::Policy(_) | Parsed::Egress(_) => None,
        })
        .collect())
}

fn objects_of(doc: Value, index: usize, out: &mut Vec<Parsed>) -> Result<(), ParseError> {
    let field = |name: &str| doc.get(name).and_then(Value::as_str).unwrap_or_default().to_string();
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let typed = |make: fn(Value) -> serde_json::Result<Parsed>, doc: Value| {
        make(doc).map_err(|source| ParseError::Document { index, kind: kind.clone(), name: name.clone(), source })
    };
    match (api_version.as_str(), kind.as_str()) {
        ("v1", "Service") => out.push(typed(|d| serde_json::from_value::<Service>(d).map(destination_object), doc)?),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            out.push(typed(|d| serde_json::from_value::<EndpointSlice>(d).map(destination_object), doc)?)
        }
        ("v1", "Pod") => {
            let pod = typed(|d| serde_json::from_value::<Pod>(d).map(destination_object), doc)?;
            if let Parsed::Destination(Object::Pod(p)) = &pod {
                out.push(Parsed::Policy(policy::Object::Pod(p.clone())));
            }
            out.push(pod);
        }
        ("v1", "Namespace") => out.push(typed(|d| serde_json::from_value::<Namespace>(d).map(policy_object), doc)?),
        (crd::API_VERSION, "Server") => {
            out.push(typed(|d| serde_json::from_value::<crd::Server>(d).map(policy_object), doc)?)
        }
        (crd::API_VERSION, "AuthorizationPolicy") => {
            out.push(typed(|d| serde_json::from_value::<crd::AuthorizationPolicy>(d).map(policy_object), doc)?)
        }
        (crd::API_VERSION, "MeshTLSAuthentication") => {
            out.push(typed(|d| serde_json::from_value::<crd::MeshTlsAuthentication>(d).map(policy_object), doc)?)
        }
        (crd::API_VERSION, "NetworkAuthentication") => {
            out.push(typed(|d| serde_json::from_value::<crd::NetworkAuthentication>(d).map(policy_object), doc)?)
        }
        (routes::API_VERSION, "HTTPRoute") => {
            let route = typed(|d| serde_json::from_value::<routes::HttpRoute>(d).map(policy_object), doc)?;
            if let Parsed::Policy(policy::Object::HttpRoute(r)) = &route
                && egress_parent(&r.spec.parent_refs)
            {
                out.push(egress_object(*r.clone())); // egress routes
            }
            out.push(route);
        }
        (routes::API_VERSION, "GRPCRoute") => {
            let route = typed(|d| serde_json::from_value::<routes::GrpcRoute>(d).map(policy_object), doc)?;
            if let Parsed::Policy(policy::Object::GrpcRoute(r)) = &route
                && egress_parent(&r.spec.parent_refs)
            {
                out.push(egress_object(*r.clone())); // egress routes
            }
            out.push(route);
        }
        // Egress
        (egress::crd::API_VERSION, "EgressNetwork") => {
            out.push(typed(|d| serde_json::from_value::<egress::crd::EgressNetwork>(d).map(egress_object), doc)?)
        }
        (routes::ALPHA_API_VERSION, "TLSRoute") => {
            out.push(typed(|d| serde_json::from_value::<routes::TlsRoute>(d).map(egress_object), doc)?)
        }
        (routes::ALPHA_API_VERSION, "TCPRoute") => {
            out.push(typed(|d| serde_json::from_value::<routes::TcpRoute>(d).map(egress_object), doc)?)
        }
        // Rate limiting
        (crd::API_VERSION, "HTTPLocalRateLimitPolicy") => {
            out.push(typed(|d| serde_json::from_value::<crd::HttpLocalRateLimitPolicy>(d).map(policy_object), doc)?)
        }
        (routes::REFERENCE_GRANT_API_VERSION, "ReferenceGrant") => {
            out.push(typed(|d| serde_json::from_value::<routes::ReferenceGrant>(d).map(policy_object), doc)?)
        }
        ("v1", "List") => {
            for item in doc.get("items").and_then(Value::as_array).into_iter().flatten() {
                objects_of(item.clone(), index, out)?;
            }
        }
        _ => tracing::debug!(api_version, kind, name, "ignoring object of a kind neither Destination nor policy uses"),
    }
    Ok(())
}

fn destination_object<K>(object: K) -> Parsed
where
    Object: From<K>,
{
    Parsed::Destination(Object::from(object))
}

fn policy_object<K>(object: K) -> Parsed
where
    policy::Object: From<K>,
{
    Parsed::Policy(policy::Object::from(object))
}

/// Whether a route attaches to an EgressNetwork (only those go to the egress index).
fn egress_parent(refs: &[routes::ParentReference]) -> bool {
    refs.iter().any(|r| crate::routes::model::is_egress_network(r.group.as_deref(), r.kind.as_deref()))
}

fn egress_object<K>(object: K) -> Parsed
where
    egress::Object: From<K>,
{
    Parsed::Egress(egress::Object::from(object))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_several_documents_lists_and_skips_other_kinds() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: p}}\n";
        let ids: Vec<ObjectId> = parse(text).unwrap().iter().map(Parsed::id).collect();
        let (a, p) = (NsName::new("default", "a"), NsName::new("default", "p"));
        assert_eq!(
            ids,
            [
                ObjectId::Destination(Kind::Service, a),
                ObjectId::Policy(policy::Kind::Pod, p.clone()),
                ObjectId::Destination(Kind::Pod, p)
            ]
        );
    }

    #[test]
    fn our_own_reads_do_not_count_as_changes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n").unwrap();
        let mut files =
            Files { dir: dir.path().to_path_buf(), defined: HashMap::new(), policy: None, egress: None, metrics: None };
        assert_eq!(files.reload(&file).destination.len(), 1);
        let event = |kind, path: &Path| Ok(notify::Event::new(kind).add_path(path.to_path_buf()));
        let mut pending = Pending::default();
        files.note(event(EventKind::Access(AccessKind::Open(AccessMode::Any)), dir.path()), &mut pending);
        files.note(event(EventKind::Access(AccessKind::Open(AccessMode::Any)), &file), &mut pending);
        files.note(event(EventKind::Access(AccessKind::Close(AccessMode::Read)), &file), &mut pending);
        assert!(!pending.rescan && pending.paths.is_empty());
        files.note(event(EventKind::Access(AccessKind::Close(AccessMode::Write)), &file), &mut pending);
        assert_eq!(pending.paths.into_iter().collect::<Vec<_>>(), [file]);
    }

    #[test]
    fn the_mirror_controllers_status_directory_is_not_cluster_state() {
        // `.status/link-<cluster>.json` is rewritten on every gateway probe.
        let dir = tempfile::tempdir().unwrap();
        let status = dir.path().join(".status");
        std::fs::create_dir(&status).unwrap();
        std::fs::write(status.join("link-west.yaml"), "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n").unwrap();
        let files =
            Files { dir: dir.path().to_path_buf(), defined: HashMap::new(), policy: None, egress: None, metrics: None };
        assert!(files.all_paths().is_empty());
        let mut pending = Pending::default();
        let event = notify::Event::new(EventKind::Create(notify::event::CreateKind::File))
            .add_path(status.join("link-west.yaml"));
        files.note(Ok(event), &mut pending);
        assert!(!pending.rescan && pending.paths.is_empty());
        assert_eq!(cluster_objects_in(dir.path(), &[]).unwrap().services.len(), 0);
    }

    #[test]
    fn an_object_two_files_define_outlives_one_of_them() {
        let dir = tempfile::tempdir().unwrap();
        let svc = |port| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: x}}\nspec: {{ports: [{{port: {port}}}]}}\n")
        };
        let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
        std::fs::write(&a, svc(80)).unwrap();
        std::fs::write(&b, svc(81)).unwrap();
        let mut files =
            Files { dir: dir.path().to_path_buf(), defined: HashMap::new(), policy: None, egress: None, metrics: None };
        assert_eq!(files.all_paths(), HashSet::from([a.clone(), b.clone()]));
        files.reload(&a);
        files.reload(&b);
        std::fs::remove_file(&a).unwrap();
        match files.reload(&a).destination.as_slice() {
            [Change::Upsert(Object::Service(s))] => {
                assert_eq!(s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port, 81)
            }
            other => panic!("expected b's version, got {other:?}"),
        }
        std::fs::remove_file(&b).unwrap();
        assert!(matches!(files.reload(&b).destination.as_slice(), [Change::Delete(Kind::Service, _)]));
    }

    #[test]
    fn policy_kinds_are_read_and_a_bad_one_keeps_the_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("policy.yaml");
        let server = |protocol: &str| {
            format!(
                "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n---\napiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {{name: s, namespace: shop}}\nspec: {{podSelector: {{}}, port: 8080, proxyProtocol: {protocol}}}\n"
            )
        };
        std::fs::write(&file, server("opaque")).unwrap();
        let mut files =
            Files { dir: dir.path().to_path_buf(), defined: HashMap::new(), policy: None, egress: None, metrics: None };
        let kinds: Vec<policy::Kind> = files
            .reload(&file)
            .policy
            .iter()
            .map(|c| match c {
                policy::Change::Upsert(o) => o.kind(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(kinds, [policy::Kind::Namespace, policy::Kind::Server]);
        // A protocol the schema does not know fails the document, so the file's last good
        // content stays in force: nothing changes, nothing is deleted.
        std::fs::write(&file, server("SMTP")).unwrap();
        let changes = files.reload(&file);
        assert!(changes.policy.is_empty() && changes.destination.is_empty());
        assert_eq!(files.defined[&file].len(), 2);
    }

    #[test]
    fn route_kinds_are_read() {
        // The fuzz seed of this parser: it must be read whole, and every route must validate.
        let text = include_str!("../../../fuzz/corpus/control_files_yaml/routes.yaml");
        let objects = parse(text).unwrap();
        let mut kinds = Vec::new();
        for object in objects {
            let Parsed::Policy(object) = object else { panic!("{object:?}") };
            kinds.push(object.kind());
            match object {
                policy::Object::HttpRoute(r) => drop(crate::routes::Route::from_http(&r).unwrap()),
                policy::Object::GrpcRoute(r) => drop(crate::routes::Route::from_grpc(&r).unwrap()),
                _ => {}
            }
        }
        assert_eq!(kinds, [policy::Kind::HttpRoute, policy::Kind::GrpcRoute, policy::Kind::ReferenceGrant]);
    }

    #[test]
    fn egress_kinds_and_routes_with_an_egress_network_parent_reach_the_egress_index() {
        // EgressNetwork, TLSRoute and TCPRoute are egress's alone; an HTTPRoute with an
        // EgressNetwork parent goes to both indexes.
        let text = "apiVersion: policy.cnimesh.io/v1alpha1\nkind: EgressNetwork\nmetadata: {name: world, namespace: shop}\nspec: {trafficPolicy: Deny}\n---\napiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TLSRoute\nmetadata: {name: t, namespace: shop}\nspec: {parentRefs: [{group: policy.cnimesh.io, kind: EgressNetwork, name: world}]}\n---\napiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: {name: c, namespace: shop}\nspec: {parentRefs: [{group: policy.cnimesh.io, kind: EgressNetwork, name: world}]}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: h, namespace: shop}\nspec: {parentRefs: [{group: policy.cnimesh.io, kind: EgressNetwork, name: world}]}\n";
        let ids: Vec<ObjectId> = parse(text).unwrap().iter().map(Parsed::id).collect();
        let key = |n: &str| NsName::new("shop", n);
        assert_eq!(
            ids,
            [
                ObjectId::Egress(egress::Kind::EgressNetwork, key("world")),
                ObjectId::Egress(egress::Kind::TlsRoute, key("t")),
                ObjectId::Egress(egress::Kind::TcpRoute, key("c")),
                ObjectId::Egress(egress::Kind::HttpRoute, key("h")),
                ObjectId::Policy(policy::Kind::HttpRoute, key("h")),
            ]
        );
        let missing = "apiVersion: policy.cnimesh.io/v1alpha1\nkind: EgressNetwork\nmetadata: {name: world, namespace: shop}\nspec: {}\n";
        let error = parse(missing).unwrap_err().to_string();
        assert!(
            error.starts_with("document 1 (EgressNetwork \"world\"): ") && error.contains("trafficPolicy"),
            "{error}"
        );
    }

    #[test]
    fn errors_name_the_document() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: 3}\n";
        let error = parse(text).unwrap_err().to_string();
        assert!(error.starts_with("document 2 (Pod \"p\"): "), "{error}");
    }
}
