//! The mirror controller: per Link, follow its credentials Secret (by name), connect to the target cluster,
//! follow it (a full resync on every (re)connect), probe its gateway; on every change, plan the
//! mirrors ([`super::plan`]) and write what differs ([`super::write`]), then the Link's status
//! and the `multicluster_*` metrics.
//!
//! - A Link that cannot be carried out (invalid, no Secret, a kubeconfig that is not inline data
//!   only, a `file://` server) is refused by name, with the reason (the field)
//!   in its status and the log; the mirrors it made stay as they are.
//! - A lost link (the target's API failing for three probe periods) keeps its
//!   mirrors and their last endpoints, annotated `mirror.cnimesh.io/link-state=lost`; on recovery
//!   the target is read whole again and the annotation goes.
//! - A Link deleted: all its mirrors are deleted (what `cnimesh multicluster unlink` relies on).
//! - A mirror name two claimants share stays with its holder; the statuses of both Links name
//!   the collision (see [`super::plan`]).
//! - Of two Links whose cluster names overlap (equal, or one a `-`-suffix of the other), the one
//!   created later is refused as a whole and mirrors nothing; both statuses name the other
//!   ([`super::overlap`]).
//! - Every followed Link's status is written at least every [`HEARTBEAT_PERIOD`], with
//!   `lastHeartbeat` set while the task following the target runs and sees it up: an idle, healthy
//!   link keeps an old `lastSync` (it moves on changes only) but a fresh heartbeat, and a dead
//!   controller's heartbeat goes old.
//! - Only the leader of the [`MIRROR_WRITE`] Lease writes (one writer across replicas); the
//!   others follow and stay ready to take over.
//!
//! Layer: runtime.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use super::crd::{
    ClusterNameConflict, GatewayStatus, HEARTBEAT_PERIOD, LinkState, LinkStatus, MirrorCollision, MirrorStatus,
};
use super::kubeconfig::{self, LinkKubeconfig};
use super::link::{Gateway, ValidLink};
use super::overlap::{self, Conflict};
use super::plan::{self, LinkInput, Local, Snapshot, View};
use super::remote::{ClusterState, Credentials, KubeCluster, RemoteEvent};
use super::write::KubeWriter;
use crate::metrics::Metrics;
use cnimesh_runtime::leader::Leadership;

/// The mirror's writer role (Lease `cnimesh-control-mirror-write`, the name it had when the
/// mirror ran in the control plane: replicas of either version never both write).
pub const MIRROR_WRITE: &str = "mirror-write";
/// How long this cluster's own API may fail before its view counts as stale.
const LOCAL_LOST_AFTER: Duration = Duration::from_secs(30);
/// A gateway probe's bound, whatever the period.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

pub struct MirrorController {
    /// This cluster's API server, as the mirror's ServiceAccount.
    pub client: kube::Client,
    /// The Links' (and their Secrets') namespace.
    pub namespace: String,
    /// This cluster's trust and cluster domains (federated members of this cluster).
    pub trust_domain: String,
    pub cluster_domain: String,
    pub metrics: Arc<Metrics>,
    pub leadership: Leadership,
}

/// What a Link's task reports.
enum News {
    Remote(RemoteEvent),
    Probe(GatewayStatus, Option<IpAddr>),
    Refused(String),
}

/// What the controller knows of a linked cluster.
enum Seen {
    Connecting,
    Up(Snapshot),
    Lost(Snapshot, String),
    Refused(String),
}

struct LinkRun {
    link: ValidLink,
    /// The Link's spec and its kubeconfig, to restart the task when either changes.
    fingerprint: String,
    generation: u64,
    seen: Seen,
    last_sync: Option<String>,
    gateway: Option<GatewayStatus>,
    gateway_ip: Option<IpAddr>,
    /// Following the target first, then probing its gateway.
    tasks: Vec<AbortOnDrop>,
}

impl LinkRun {
    /// Up, and the task following the target still runs (a watch that ended says nothing more).
    fn alive(&self) -> bool {
        matches!(self.seen, Seen::Up(_)) && self.tasks.first().is_some_and(|t| !t.0.is_finished())
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl MirrorController {
    /// Runs until `stopped` turns true.
    pub async fn run(self, mut stopped: watch::Receiver<bool>) {
        let mut local = KubeCluster::links_only(self.client.clone(), &self.namespace, LOCAL_LOST_AFTER);
        let writer = KubeWriter::new(self.client.clone(), &self.namespace);
        let (tx, mut rx) = mpsc::unbounded_channel::<(String, u64, News)>();
        let mut state = State {
            controller: &self,
            writer,
            links: BTreeMap::new(),
            refused: BTreeMap::new(),
            overlapping: BTreeMap::new(),
            conflicts: BTreeMap::new(),
            local: None,
            next_generation: 0,
            reported: BTreeSet::new(),
        };
        // Links only until the first Link appears, then this cluster's objects too (its federated
        // members); never back, a Link is likely to return.
        let mut links_only = true;
        let mut leadership = self.leadership.clone();
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT_PERIOD, HEARTBEAT_PERIOD);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mut watch_objects = false;
            tokio::select! {
                // The statuses again, changes or not: their heartbeat. Not before this cluster was
                // read: a plan without its Links would take their mirrors for orphans.
                _ = heartbeat.tick() => if state.local.is_none() {
                    continue;
                },
                // Leading again (or for the first time): what changed meanwhile was not written,
                // and nothing else may come to say so (a Link without a gateway has no probes).
                _ = leadership.acquired(), if !self.leadership.is_leading() => {
                    tracing::info!("leading the mirror's writes: bringing the mirrors in line");
                }
                event = local.next() => match event {
                    RemoteEvent::Synced(cluster) if links_only && !cluster.links.is_empty() => watch_objects = true,
                    RemoteEvent::Synced(cluster) => state.local_changed(*cluster, &tx),
                    RemoteEvent::Lost(reason) => {
                        tracing::warn!(%reason, "cannot read this cluster; the mirrors stay as they are");
                        continue;
                    }
                },
                Some((cluster, generation, news)) = rx.recv() => {
                    if !state.take(&cluster, generation, news) {
                        continue;
                    }
                }
                _ = stopped.wait_for(|s| *s) => return,
            }
            if watch_objects {
                tracing::info!("a Link exists: watching this cluster's Services, EndpointSlices and Pods too");
                local = KubeCluster::new(self.client.clone(), Some(&self.namespace), LOCAL_LOST_AFTER);
                links_only = false;
                continue;
            }
            state.reconcile().await;
        }
    }
}

struct State<'a> {
    controller: &'a MirrorController,
    writer: KubeWriter,
    links: BTreeMap<String, LinkRun>,
    /// Links refused before they could run (invalid): Link name → (cluster, reason).
    refused: BTreeMap<String, (String, String)>,
    /// Links refused because their cluster name overlaps an earlier Link's: name → (cluster,
    /// reason). They mirror nothing.
    overlapping: BTreeMap<String, (String, String)>,
    /// Every Link's cluster-name conflicts, by Link name.
    conflicts: BTreeMap<String, Vec<Conflict>>,
    local: Option<Snapshot>,
    next_generation: u64,
    /// Skipped exports already logged, so a steady state does not log every round.
    reported: BTreeSet<String>,
}

impl State<'_> {
    /// This cluster changed: its federated members, and maybe its Links and their Secrets.
    fn local_changed(&mut self, cluster: ClusterState, tx: &mpsc::UnboundedSender<(String, u64, News)>) {
        let namespace = self.controller.namespace.as_str();
        let in_namespace = |ns: &Option<String>| ns.as_deref().is_none_or(|n| n == namespace);
        let mut wanted = BTreeMap::new();
        self.refused.clear();
        self.overlapping.clear();
        let ours: Vec<&super::crd::Link> =
            cluster.links.iter().filter(|l| in_namespace(&l.metadata.namespace)).collect();
        self.conflicts = overlap::conflicts(&ours);
        for link in ours {
            let name = link.metadata.name.clone().unwrap_or_default();
            let cluster_name = &link.spec.target_cluster_name;
            if let Some(reason) = self.conflicts.get(&name).and_then(|c| overlap::refusal(cluster_name, c)) {
                let reason = format!("Link {namespace}/{name} {reason}");
                if self.reported.insert(reason.clone()) {
                    tracing::warn!(link = %name, %reason, "Link refused; it mirrors nothing");
                }
                self.overlapping.insert(name, (cluster_name.clone(), reason));
                continue;
            }
            match ValidLink::from_link(link) {
                Ok(valid) => {
                    let fingerprint = format!("{:?}", link.spec);
                    wanted.insert(valid.cluster.clone(), (valid, fingerprint));
                }
                Err(error) => {
                    let reason = format!("Link {namespace}/{name} refused: {error}");
                    if self.reported.insert(reason.clone()) {
                        tracing::warn!(link = %name, %error, "Link refused; the mirrors it made stay as they are");
                    }
                    self.refused.insert(name, (link.spec.target_cluster_name.clone(), reason));
                }
            }
        }
        self.links.retain(|cluster, run| {
            let keep = wanted.get(cluster).is_some_and(|(_, f)| *f == run.fingerprint);
            if !wanted.contains_key(cluster) {
                tracing::info!(cluster, "Link removed; deleting its mirrors");
                self.controller.metrics.forget_cluster(cluster);
            }
            keep
        });
        for (cluster, (link, fingerprint)) in wanted {
            if self.links.contains_key(&cluster) {
                continue;
            }
            self.next_generation += 1;
            let generation = self.next_generation;
            tracing::info!(cluster, link = %link.name, "following Link");
            let credentials = Credentials::follow(self.controller.client.clone(), namespace, &link.credentials_secret);
            let tasks = start_link(&link, credentials, generation, tx.clone());
            self.links.insert(
                cluster,
                LinkRun {
                    link,
                    fingerprint,
                    generation,
                    seen: Seen::Connecting,
                    last_sync: None,
                    gateway: None,
                    gateway_ip: None,
                    tasks,
                },
            );
        }
        self.local = Some(cluster.snapshot);
    }

    /// A Link's news; `false` when it changes nothing (a task since replaced).
    fn take(&mut self, cluster: &str, generation: u64, news: News) -> bool {
        let Some(run) = self.links.get_mut(cluster).filter(|r| r.generation == generation) else { return false };
        let metrics = &self.controller.metrics;
        match news {
            News::Remote(RemoteEvent::Synced(state)) => {
                if matches!(run.seen, Seen::Lost(..)) {
                    tracing::info!(cluster, "link back; resynced");
                }
                run.seen = Seen::Up(state.snapshot);
                run.last_sync = Some(now());
                metrics.set_link_up(cluster, true);
            }
            News::Remote(RemoteEvent::Lost(reason)) => {
                tracing::warn!(cluster, %reason, "link lost; its mirrors keep their last endpoints");
                run.seen = match std::mem::replace(&mut run.seen, Seen::Connecting) {
                    Seen::Up(snapshot) | Seen::Lost(snapshot, _) => Seen::Lost(snapshot, reason),
                    _ => Seen::Refused(format!("cannot reach the target: {reason}")),
                };
                metrics.set_link_up(cluster, false);
            }
            News::Refused(reason) => {
                tracing::warn!(cluster, %reason, "Link refused; the mirrors it made stay as they are");
                run.seen = Seen::Refused(reason);
                metrics.set_link_up(cluster, false);
            }
            News::Probe(status, ip) => {
                metrics.gateway_probed(cluster, status.alive.then_some(status.latency_ms).flatten());
                // A DNS gateway address is resolved by each probe; the last address found stays.
                if ip.is_some() {
                    run.gateway_ip = ip;
                }
                run.gateway = Some(status);
            }
        }
        true
    }

    /// Plans against what is written, writes the difference (as leader), then the statuses.
    async fn reconcile(&mut self) {
        if !self.controller.leadership.is_leading() {
            return;
        }
        let existing = match self.writer.list().await {
            Ok(existing) => existing,
            Err(error) => {
                tracing::warn!(%error, "cannot list the mirrors; retrying on the next change");
                return;
            }
        };
        let refused: Vec<ValidLink> =
            self.refused.iter().map(|(name, (cluster, _))| ValidLink::refused(name, cluster)).collect();
        let overlapping: Vec<ValidLink> =
            self.overlapping.iter().map(|(name, (cluster, _))| ValidLink::refused(name, cluster)).collect();
        let mut inputs: Vec<LinkInput<'_>> = self
            .links
            .values()
            .map(|run| LinkInput {
                link: &run.link,
                gateway_ip: run.gateway_ip.or_else(|| run.link.gateway.as_ref().ok().and_then(Gateway::ip)),
                view: match &run.seen {
                    Seen::Up(s) => View::Up(s),
                    Seen::Lost(s, _) => View::Lost(s),
                    Seen::Connecting | Seen::Refused(_) => View::Unavailable,
                },
            })
            .collect();
        inputs.extend(refused.iter().map(|link| LinkInput { link, gateway_ip: None, view: View::Unavailable }));
        inputs.extend(overlapping.iter().map(|link| LinkInput { link, gateway_ip: None, view: View::Overlapping }));
        let local = Local {
            snapshot: self.local.as_ref(),
            trust_domain: &self.controller.trust_domain,
            cluster_domain: &self.controller.cluster_domain,
        };
        let plan = plan::plan(&inputs, &local, &existing);
        let mut errors: BTreeMap<String, String> = BTreeMap::new();
        for skipped in &plan.skipped {
            let line = format!("{}: {} {}", skipped.cluster, skipped.service, skipped.reason);
            if self.reported.insert(line) {
                tracing::warn!(cluster = %skipped.cluster, service = %skipped.service, reason = %skipped.reason, "export not mirrored");
            }
        }
        let metrics = &self.controller.metrics;
        let cluster_of = |m: &plan::Mirror| m.cluster().unwrap_or(plan::FEDERATED_SUFFIX).to_string();
        for key in &plan.deletes {
            let cluster = existing.iter().find(|m| m.key() == *key).map(cluster_of).unwrap_or_default();
            let result = self.writer.delete(key).await;
            metrics.mirror_synced(&cluster, result.is_ok());
            match result {
                Ok(()) => tracing::info!(mirror = %key, cluster, "mirror deleted"),
                Err(error) => {
                    tracing::warn!(mirror = %key, %error, "cannot delete the mirror");
                    errors.insert(cluster, error.to_string());
                }
            }
        }
        for mirror in &plan.upserts {
            let cluster = cluster_of(mirror);
            let result = self.writer.apply(mirror).await;
            metrics.mirror_synced(&cluster, result.is_ok());
            match result {
                Ok(()) => {
                    tracing::info!(mirror = %mirror.key(), cluster, endpoints = mirror.endpoints(), "mirror written")
                }
                Err(error) => {
                    tracing::warn!(mirror = %mirror.key(), %error, "cannot write the mirror");
                    errors.insert(cluster, error.to_string());
                }
            }
        }
        for run in self.links.values() {
            let cluster = &run.link.cluster;
            let mirrors: Vec<MirrorStatus> = plan
                .desired
                .iter()
                .filter(|m| m.cluster() == Some(cluster))
                .map(|m| MirrorStatus {
                    mirror: m.key().to_string(),
                    remote: m.remote(),
                    mode: m.mode().to_string(),
                    endpoints: m.endpoints(),
                    last_sync: run.last_sync.clone(),
                })
                .collect();
            metrics.set_mirrors(cluster, mirrors.len());
            let (state, reason) = match &run.seen {
                Seen::Up(_) => (Some(LinkState::Up), errors.get(cluster).cloned()),
                Seen::Lost(_, reason) => (Some(LinkState::Lost), Some(reason.clone())),
                Seen::Refused(reason) => (None, Some(reason.clone())),
                Seen::Connecting => (None, Some("connecting".to_string())),
            };
            let status = LinkStatus {
                state,
                reason,
                last_sync: run.last_sync.clone(),
                last_heartbeat: run.alive().then(now),
                gateway: run.gateway.clone(),
                mirrors,
                collisions: collisions_of(&plan, cluster),
                cluster_name_conflicts: self.conflicts_of(&run.link.name),
            };
            if let Err(error) = self.writer.status(&run.link.name, &status).await {
                tracing::warn!(link = %run.link.name, %error, "cannot write the Link's status");
            }
        }
        for (name, (cluster, reason)) in self.refused.iter().chain(&self.overlapping) {
            let overlapping = self.overlapping.contains_key(name);
            let status = LinkStatus {
                reason: Some(reason.clone()),
                collisions: if overlapping { Vec::new() } else { collisions_of(&plan, cluster) },
                cluster_name_conflicts: self.conflicts_of(name),
                ..Default::default()
            };
            if let Err(error) = self.writer.status(name, &status).await {
                tracing::debug!(link = %name, %error, "cannot write the refused Link's status");
            }
        }
    }
}

impl State<'_> {
    /// The Link `name`'s cluster-name conflicts, for its status.
    fn conflicts_of(&self, name: &str) -> Vec<ClusterNameConflict> {
        self.conflicts
            .get(name)
            .into_iter()
            .flatten()
            .map(|c| ClusterNameConflict { link: c.link.clone(), cluster: c.cluster.clone(), refused: c.refused })
            .collect()
    }
}

/// The collisions of `cluster`'s exports, for its Link's status.
fn collisions_of(plan: &plan::Plan, cluster: &str) -> Vec<MirrorCollision> {
    plan.collisions
        .iter()
        .filter(|c| c.cluster.as_deref() == Some(cluster))
        .map(|c| MirrorCollision {
            mirror: c.mirror.to_string(),
            remote: c.remote.clone(),
            holder: c.holder,
            with: c.with.clone(),
        })
        .collect()
}

/// The Link's tasks: following the target, and probing its gateway.
fn start_link(
    link: &ValidLink,
    mut credentials: Credentials,
    generation: u64,
    tx: mpsc::UnboundedSender<(String, u64, News)>,
) -> Vec<AbortOnDrop> {
    let cluster = link.cluster.clone();
    let period = link.probe.period;
    let follow = {
        let (cluster, tx) = (cluster.clone(), tx.clone());
        async move {
            let send = |news| tx.send((cluster.clone(), generation, news)).is_ok();
            // Connected anew whenever the Secret changes; refused (by name) while it is missing,
            // unreadable or not a kubeconfig the mirror accepts.
            let mut kubeconfig = credentials.next().await;
            loop {
                let mut remote = match connect(kubeconfig.clone(), period).await {
                    Ok(remote) => Some(remote),
                    Err(reason) => {
                        if !send(News::Refused(reason)) {
                            return;
                        }
                        None
                    }
                };
                loop {
                    tokio::select! {
                        event = next_of(&mut remote) => if !send(News::Remote(event)) {
                            return;
                        },
                        changed = credentials.next() => if changed != kubeconfig {
                            kubeconfig = changed;
                            break;
                        },
                    }
                }
            }
        }
    };
    let mut tasks = vec![AbortOnDrop(tokio::spawn(follow))];
    if let Ok(gateway) = link.gateway.clone() {
        let probe = link.probe.clone();
        tasks.push(AbortOnDrop(tokio::spawn(async move {
            let mut interval = tokio::time::interval(probe.period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let (status, ip) = probe_gateway(&gateway, &probe.path, probe.port, probe.period).await;
                if tx.send((cluster.clone(), generation, News::Probe(status, ip))).is_err() {
                    return;
                }
            }
        })));
    }
    tasks
}

/// The target cluster, from the Link's kubeconfig: read as data only ([`kubeconfig::parse`]), the
/// client built from that data, so nothing the kubeconfig names is run or read here.
async fn connect(kubeconfig: Result<String, String>, period: Duration) -> Result<KubeCluster, String> {
    let refused = |e: kubeconfig::KubeconfigError| format!("the kubeconfig is refused: {e}");
    match kubeconfig::parse(&kubeconfig?).map_err(refused)? {
        LinkKubeconfig::Files(dir) => Err(format!(
            "the kubeconfig's server is a directory ({}): a linked cluster is reached through its API server",
            dir.display()
        )),
        LinkKubeconfig::Api(api) => {
            let config = api.client_config().map_err(refused)?;
            let client = kube::Client::try_from(config).map_err(|e| format!("a client for {}: {e}", api.server))?;
            Ok(KubeCluster::new(client, None, period * 3))
        }
    }
}

/// The followed cluster's next news; none while there is no cluster to follow.
async fn next_of(remote: &mut Option<KubeCluster>) -> RemoteEvent {
    match remote {
        Some(remote) => remote.next().await,
        None => std::future::pending().await,
    }
}

/// `GET http://<gateway>:<port><path>`: alive on a 2xx, with the round trip.
async fn probe_gateway(gateway: &Gateway, path: &str, port: u16, period: Duration) -> (GatewayStatus, Option<IpAddr>) {
    let started = Instant::now();
    let attempt = async {
        let ip = match gateway.ip() {
            Some(ip) => ip,
            None => tokio::net::lookup_host((gateway.address.as_str(), port))
                .await
                .map_err(|e| (None, format!("resolving {}: {e}", gateway.address)))?
                .next()
                .map(|a| a.ip())
                .ok_or_else(|| (None, format!("{} has no address", gateway.address)))?,
        };
        let fail = |e: String| (Some(ip), e);
        let mut stream = tokio::net::TcpStream::connect((ip, port))
            .await
            .map_err(|e| fail(format!("connecting to {ip}:{port}: {e}")))?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", gateway.address);
        stream.write_all(request.as_bytes()).await.map_err(|e| fail(e.to_string()))?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.map_err(|e| fail(format!("reading the answer: {e}")))?;
        let status = std::str::from_utf8(&head[9..12]).ok().and_then(|s| s.parse::<u16>().ok()).unwrap_or(0);
        if (200..300).contains(&status) { Ok(ip) } else { Err(fail(format!("{path} answered {status}"))) }
    };
    let timeout = period.min(PROBE_TIMEOUT);
    let result = match tokio::time::timeout(timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err((gateway.ip(), format!("no answer within {timeout:?}"))),
    };
    let last_probe = Some(now());
    match result {
        Ok(ip) => {
            let latency = started.elapsed().as_secs_f64() * 1000.0;
            (GatewayStatus { alive: true, latency_ms: Some(latency), last_probe, error: None }, Some(ip))
        }
        Err((ip, error)) => (GatewayStatus { alive: false, latency_ms: None, last_probe, error: Some(error) }, ip),
    }
}

fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}
