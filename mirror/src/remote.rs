//! A linked cluster, as the mirror reads it through its API server (kube-rs watchers, with a
//! client built from the Link's kubeconfig by [`super::kubeconfig`]): a snapshot of its Services,
//! EndpointSlices and Pods after every change, or word that it stopped answering. The same
//! reader follows this cluster itself, with its Links ([`ClusterState`]); each Link's credentials
//! Secret is followed on its own, by name ([`Credentials`]): the mirror may read no other Secret.
//!
//! Layer: runtime (kube).

use std::collections::BTreeMap;
use std::time::Duration;

use cnimesh_common::names::{LINK_CREDENTIALS_KEY, LINK_CREDENTIALS_SECRET_TYPE};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::crd::Link;
use super::plan::Snapshot;
use cnimesh_model::meta::NsName;

/// What one read of a cluster found. Links only when reading this cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    pub snapshot: Snapshot,
    pub links: Vec<Link>,
}

/// The generated `Link` has no `PartialEq`: Links compare by what the controller reads of them,
/// their name and spec. Not their resourceVersion: the controller's own status writes change it,
/// and each would come back as a change of this cluster, and a second round of writes.
impl PartialEq for ClusterState {
    fn eq(&self, other: &Self) -> bool {
        fn links(s: &ClusterState) -> Vec<(&Option<String>, &Option<String>, &super::crd::LinkSpec)> {
            s.links.iter().map(|l| (&l.metadata.namespace, &l.metadata.name, &l.spec)).collect()
        }
        self.snapshot == other.snapshot && links(self) == links(other)
    }
}

#[derive(Debug, Clone)]
pub enum RemoteEvent {
    /// The cluster answered: all of it, as it is now (the first event is the full sync, and the
    /// first after [`RemoteEvent::Lost`] the resync).
    Synced(Box<ClusterState>),
    /// The cluster stopped answering, with why.
    Lost(String),
}

/// One watch's news.
enum Watched {
    Listed(usize, Vec<Object>),
    Applied(usize, Object),
    Deleted(usize, Object),
    Failed(String),
    /// The kind is not served (404: the Link CRD is not installed): none of it.
    Absent(usize, String),
}

#[derive(Debug, Clone)]
enum Object {
    Service(Box<Service>),
    Slice(Box<EndpointSlice>),
    Pod(Box<Pod>),
    Link(Box<Link>),
}

impl Object {
    fn key(&self) -> NsName {
        let meta = match self {
            Object::Service(o) => &o.metadata,
            Object::Slice(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
            Object::Link(o) => &o.metadata,
        };
        NsName::of(meta)
    }
}

/// A cluster's API server: one watcher per kind, all namespaces (Links: the control
/// plane's namespace only). Lost once watches have kept failing for `lost_after`; synced again
/// when they list again.
pub struct KubeCluster {
    news: mpsc::UnboundedReceiver<Watched>,
    stores: Vec<BTreeMap<NsName, Object>>,
    listed: Vec<bool>,
    failing_since: Option<(Instant, String)>,
    lost_after: Duration,
    lost: bool,
    last: Option<ClusterState>,
    _tasks: Vec<AbortOnDrop>,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl KubeCluster {
    /// Follows `client`'s cluster; with `links_namespace`, also its Links there.
    pub fn new(client: kube::Client, links_namespace: Option<&str>, lost_after: Duration) -> Self {
        Self::watching(client, links_namespace, true, lost_after)
    }

    /// Only the Links in `links_namespace`: what this cluster's mirror watches
    /// until there is a Link, so a control plane with no Link pays for no second watch of every
    /// Service, EndpointSlice and Pod (the sources already watch those for Destination).
    pub fn links_only(client: kube::Client, links_namespace: &str, lost_after: Duration) -> Self {
        Self::watching(client, Some(links_namespace), false, lost_after)
    }

    fn watching(client: kube::Client, links_namespace: Option<&str>, objects: bool, lost_after: Duration) -> Self {
        let (tx, news) = mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        if objects {
            tasks.push(spawn_watch(Api::<Service>::all(client.clone()), 0, tx.clone(), |o| {
                Object::Service(Box::new(o))
            }));
            tasks.push(spawn_watch(Api::<EndpointSlice>::all(client.clone()), 1, tx.clone(), |o| {
                Object::Slice(Box::new(o))
            }));
            tasks.push(spawn_watch(Api::<Pod>::all(client.clone()), 2, tx.clone(), |o| Object::Pod(Box::new(o))));
        }
        if let Some(ns) = links_namespace {
            tasks.push(spawn_watch(Api::<Link>::namespaced(client, ns), 3, tx, |o| Object::Link(Box::new(o))));
        }
        // Indexed by kind; a kind not watched counts as listed (and empty) from the start.
        let watched = |kind: usize| if kind < 3 { objects } else { links_namespace.is_some() };
        Self {
            news,
            stores: vec![BTreeMap::new(); 4],
            listed: (0..4).map(|kind| !watched(kind)).collect(),
            failing_since: None,
            lost_after,
            lost: false,
            last: None,
            _tasks: tasks,
        }
    }

    fn take(&mut self, news: Watched) {
        match news {
            Watched::Listed(kind, objects) => {
                self.stores[kind] = objects.into_iter().map(|o| (o.key(), o)).collect();
                self.listed[kind] = true;
                self.failing_since = None;
            }
            Watched::Applied(kind, object) => {
                self.stores[kind].insert(object.key(), object);
                self.failing_since = None;
            }
            Watched::Deleted(kind, object) => {
                self.stores[kind].remove(&object.key());
                self.failing_since = None;
            }
            Watched::Absent(kind, error) => {
                if !self.listed[kind] {
                    tracing::info!(
                        %error,
                        "multicluster is not installed here (no Link CRD, or no permission to read Links: \
                         `cnimesh multicluster install`): no Links; watching for them"
                    );
                }
                self.stores[kind].clear();
                self.listed[kind] = true;
            }
            Watched::Failed(error) => {
                if self.failing_since.is_none() {
                    self.failing_since = Some((Instant::now(), error));
                } else if let Some((_, last)) = self.failing_since.as_mut() {
                    *last = error;
                }
            }
        }
    }

    fn state(&self) -> ClusterState {
        let mut state = ClusterState::default();
        for store in &self.stores {
            for object in store.values() {
                match object.clone() {
                    Object::Service(o) => state.snapshot.services.push(*o),
                    Object::Slice(o) => state.snapshot.slices.push(*o),
                    Object::Pod(o) => state.snapshot.pods.push(*o),
                    Object::Link(o) => state.links.push(*o),
                }
            }
        }
        state
    }

    /// The next change; a repeat of the same state is not a change.
    pub async fn next(&mut self) -> RemoteEvent {
        let tick = (self.lost_after / 3).max(Duration::from_millis(100));
        loop {
            tokio::select! {
                news = self.news.recv() => match news {
                    Some(news) => {
                        self.take(news);
                        while let Ok(more) = self.news.try_recv() {
                            self.take(more);
                        }
                    }
                    None => std::future::pending::<()>().await,
                },
                _ = tokio::time::sleep(tick) => {}
            }
            if let Some((since, error)) = &self.failing_since
                && since.elapsed() >= self.lost_after
            {
                if !self.lost {
                    self.lost = true;
                    return RemoteEvent::Lost(format!(
                        "the API server has been failing for {:?}: {error}",
                        self.lost_after
                    ));
                }
                continue;
            }
            if !self.listed.iter().all(|l| *l) || self.failing_since.is_some() {
                continue;
            }
            let state = self.state();
            if self.lost || self.last.as_ref() != Some(&state) {
                self.lost = false;
                self.last = Some(state.clone());
                return RemoteEvent::Synced(Box::new(state));
            }
        }
    }
}

/// The first wait before a failed watch starts over; doubled on each failure in a row.
const RESTART_FIRST: Duration = Duration::from_millis(500);
/// The longest wait before a failed watch starts over (how late a cluster that answers again is
/// noticed, at worst).
const RESTART_MAX: Duration = Duration::from_secs(10);
/// The same for a kind this cluster does not serve (no Link CRD, no permission): rarely fixed.
const RESTART_MAX_ABSENT: Duration = Duration::from_secs(30);

/// Follows one kind. After any failure the watch starts over from a full list (after a backoff),
/// never resumes: a cluster that answers again must be seen to, and a resumed watch with nothing
/// new to say would never say so (the controller promises a full resync on every reconnect).
fn spawn_watch<K>(api: Api<K>, kind: usize, tx: mpsc::UnboundedSender<Watched>, wrap: fn(K) -> Object) -> AbortOnDrop
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    AbortOnDrop(tokio::spawn(async move {
        let mut backoff = RESTART_FIRST;
        loop {
            let events = watcher::watcher(api.clone(), watcher::Config::default());
            let mut events = std::pin::pin!(events);
            let mut listed = Vec::new();
            let error = loop {
                let news = match events.next().await {
                    Some(Ok(Event::Init)) => {
                        listed.clear();
                        continue;
                    }
                    Some(Ok(Event::InitApply(object))) => {
                        listed.push(wrap(object));
                        continue;
                    }
                    Some(Ok(Event::InitDone)) => {
                        backoff = RESTART_FIRST;
                        Watched::Listed(kind, std::mem::take(&mut listed))
                    }
                    Some(Ok(Event::Apply(object))) => Watched::Applied(kind, wrap(object)),
                    Some(Ok(Event::Delete(object))) => Watched::Deleted(kind, wrap(object)),
                    Some(Err(error)) => break error,
                    // A watcher never ends; if it did, start over.
                    None => break watcher::Error::NoResourceVersion,
                };
                if tx.send(news).is_err() {
                    return;
                }
            };
            let absent = kind >= 3 && not_served(&error);
            let news = if absent { Watched::Absent(kind, error.to_string()) } else { Watched::Failed(failure(&error)) };
            if tx.send(news).is_err() {
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(if absent { RESTART_MAX_ABSENT } else { RESTART_MAX });
        }
    }))
}

/// A watch failure in words. An API server's answer is named by its code and reason (`401
/// Unauthorized: …` for a Link's wrong token), which is what an operator acts on.
fn failure(error: &watcher::Error) -> String {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status),
        watcher::Error::WatchError(status) => Some(status),
        _ => None,
    };
    match status {
        Some(status) => format!("the API server answered {} {}: {}", status.code, status.reason, status.message),
        None => cnimesh_common::error::with_causes(error.to_string(), error),
    }
}

/// Links this cluster cannot read: the CRD is not installed (404) or the mirror
/// was not given `cnimesh multicluster install`'s permissions (403). Both mean "no Links", not a
/// broken cluster: a mirror without multicluster must not report itself lost.
fn not_served(error: &watcher::Error) -> bool {
    matches!(error,
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) if matches!(status.code, 403 | 404))
}

/// One Link's credentials Secret, followed by name (a watch of `metadata.name=<name>`, which a
/// Role naming that one Secret allows): the mirror reads no other Secret of the namespace.
pub struct Credentials {
    namespace: String,
    name: String,
    events: BoxStream<'static, Result<Event<Secret>, watcher::Error>>,
    /// The Secret being listed again (after a (re)connect), until the list is done.
    listing: Option<Option<Secret>>,
}

impl Credentials {
    pub fn follow(client: kube::Client, namespace: &str, name: &str) -> Self {
        let api = Api::<Secret>::namespaced(client, namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let events = kube::runtime::WatchStreamExt::default_backoff(watcher::watcher(api, config)).boxed();
        Self { namespace: namespace.to_string(), name: name.to_string(), events, listing: None }
    }

    /// The kubeconfig the Secret holds after its next change (the first: as it is now), or why
    /// there is none.
    pub async fn next(&mut self) -> Result<String, String> {
        let secret = loop {
            match self.events.next().await {
                Some(Ok(Event::Init)) => self.listing = Some(None),
                Some(Ok(Event::InitApply(secret))) => self.listing = Some(Some(secret)),
                Some(Ok(Event::InitDone)) => break self.listing.take().flatten(),
                Some(Ok(Event::Apply(secret))) => break Some(secret),
                Some(Ok(Event::Delete(_))) => break None,
                Some(Err(error)) => {
                    let hint = if not_served(&error) {
                        " (is the Role `cnimesh multicluster link` prints beside the Secret applied?)"
                    } else {
                        ""
                    };
                    return Err(format!(
                        "cannot read the credentials Secret {}/{}: {}{hint}",
                        self.namespace,
                        self.name,
                        failure(&error)
                    ));
                }
                None => std::future::pending::<()>().await,
            }
        };
        kubeconfig_in(secret.as_ref(), &self.namespace, &self.name)
    }
}

/// The kubeconfig in a Link's Secret, or why there is none.
fn kubeconfig_in(secret: Option<&Secret>, namespace: &str, name: &str) -> Result<String, String> {
    let secret = secret.ok_or_else(|| format!("the credentials Secret {namespace}/{name} does not exist"))?;
    if let Some(kind) = secret.type_.as_deref()
        && kind != LINK_CREDENTIALS_SECRET_TYPE
    {
        return Err(format!(
            "the credentials Secret {namespace}/{name} is of type {kind:?}, not {LINK_CREDENTIALS_SECRET_TYPE:?}"
        ));
    }
    let data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(LINK_CREDENTIALS_KEY))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned());
    let string_data = secret.string_data.as_ref().and_then(|d| d.get(LINK_CREDENTIALS_KEY)).cloned();
    data.or(string_data)
        .ok_or_else(|| format!("the credentials Secret {namespace}/{name} has no {LINK_CREDENTIALS_KEY:?} key"))
}
