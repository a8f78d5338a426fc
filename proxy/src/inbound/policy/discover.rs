//! Inbound policy discovery: one `InboundServerPolicies.WatchPort` stream per port of this pod
//! (reconnected with backoff by the same loop as Destination,
//! [`crate::client::discovery::follow::retrying`]). The last good answer stays in force while the control
//! plane is away.
//!
//! Nothing here ever falls open:
//! - The ports the pod declares (`CNIMESH_PROXY_INBOUND_PORTS`) are watched from start-up and
//!   never evicted, however many there are.
//! - Other ports are watched on first contact, at most [`MAX_UNDECLARED`] at once (inbound capture
//!   takes connections to any port, and a scan must not open a stream per port). When the table is
//!   full, the least recently used watch of a port with no open connection goes; when every watch
//!   is in use, the connection is refused ([`WatchLimit`]) — never given a wider default.
//! - A port not answered yet uses the fallback: the effective default policy, as injected
//!   (`CNIMESH_PROXY_POLICY_DEFAULT`) and then as the control plane last stated it for a port
//!   without a Server (so a namespace annotation changed after injection is honoured).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ipnet::IpNet;
use linkerd2_proxy_api::inbound::{self as api, inbound_server_policies_client::InboundServerPoliciesClient};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tonic::transport::Channel;

use super::model::{DefaultPolicy, PortPolicy};
use crate::client::discovery::{StreamCounters, StreamKind, StreamMetrics};

/// Undeclared ports watched at once; declared ports do not count against it.
pub const MAX_UNDECLARED: usize = 128;

type Answer = watch::Receiver<Option<Arc<PortPolicy>>>;

/// A port's policy as it stands now: the control plane's last answer, else the fallback. Held by
/// each connection to the port for its life, which keeps the port's watch from being evicted.
#[derive(Clone)]
pub struct PortWatch {
    answer: Answer,
    fallback: watch::Receiver<Arc<PortPolicy>>,
    /// Counts the connections using an undeclared port's watch (see [`Undeclared::evictable`]).
    _in_use: Option<Arc<()>>,
}

impl PortWatch {
    /// Always `policy` (tests, and callers without a control plane).
    pub fn fixed(policy: Arc<PortPolicy>) -> Self {
        // The senders go at once: a closed channel keeps its last value for ever.
        let (_, answer) = watch::channel(Some(policy.clone()));
        let (_, fallback) = watch::channel(policy);
        Self { answer, fallback, _in_use: None }
    }

    /// A port following `answer`, with `fallback` until answered (tests).
    #[cfg(test)]
    pub(crate) fn following(answer: Answer, fallback: watch::Receiver<Arc<PortPolicy>>) -> Self {
        Self { answer, fallback, _in_use: None }
    }

    pub fn current(&self) -> Arc<PortPolicy> {
        if let Some(policy) = &*self.answer.borrow() {
            return policy.clone();
        }
        self.fallback.borrow().clone()
    }

    /// Whether the control plane has answered for this port.
    pub fn answered(&self) -> bool {
        self.answer.borrow().is_some()
    }

    /// Resolves when [`PortWatch::current`] may have changed (a new answer, or a new fallback);
    /// never when neither can change any more.
    pub async fn changed(&mut self) {
        let (answer, fallback) = (&mut self.answer, &mut self.fallback);
        tokio::select! {
            Ok(()) = answer.changed() => {}
            Ok(()) = fallback.changed() => {}
            else => std::future::pending().await,
        }
    }
}

/// A connection refused because every undeclared-port watch is held by an open connection.
#[derive(Debug, thiserror::Error)]
#[error("port {port}: {MAX_UNDECLARED} undeclared ports already have connections open; refused rather than unchecked")]
pub struct WatchLimit {
    pub port: u16,
}

/// One undeclared port's watch.
struct Watched {
    answer: Answer,
    task: AbortHandle,
    in_use: Arc<()>,
    /// [`Undeclared::clock`] at its last use.
    used: u64,
}

#[derive(Default)]
struct Undeclared {
    ports: HashMap<u16, Watched>,
    clock: u64,
}

impl Undeclared {
    /// The least recently used port with no open connection.
    fn evictable(&self) -> Option<u16> {
        self.ports
            .iter()
            .filter(|(_, w)| Arc::strong_count(&w.in_use) == 1)
            .min_by_key(|(_, w)| w.used)
            .map(|(p, _)| *p)
    }
}

/// When the control plane last answered, per port and for the default: the freshness the admin's
/// `/policy.json` shows (an answer equal to the last one still counts: the stream is alive).
#[derive(Debug, Default)]
struct Heard {
    ports: HashMap<u16, SystemTime>,
    default_stated: Option<SystemTime>,
}

/// One watched port as it stands now, for the admin's `/policy.json`.
#[derive(Debug, Clone)]
pub struct PortStatus {
    pub port: u16,
    /// Declared by the pod (`CNIMESH_PROXY_INBOUND_PORTS`), so watched from start-up.
    pub declared: bool,
    /// The policy enforced now: the control plane's answer, else the fallback.
    pub policy: Arc<PortPolicy>,
    pub answered: bool,
    /// When the control plane last answered for this port.
    pub last_answer: Option<SystemTime>,
}

pub struct Policies {
    client: InboundServerPoliciesClient<Channel>,
    heard: Arc<Mutex<Heard>>,
    /// `ns:pod`, as the control plane accepts it.
    workload: String,
    fallback: Arc<watch::Sender<Arc<PortPolicy>>>,
    cluster_networks: Arc<[IpNet]>,
    first_answer: Duration,
    max_backoff: Duration,
    counted: StreamCounters,
    declared: HashMap<u16, Answer>,
    undeclared: Mutex<Undeclared>,
}

impl Policies {
    /// Starts the declared ports' watches (so needs a runtime). `default` is the effective
    /// default as injected; unanswered ports use it until the control plane states another.
    pub fn new(
        channel: Channel,
        workload: String,
        default: DefaultPolicy,
        cluster_networks: Vec<IpNet>,
        declared: &[u16],
        (first_answer, max_backoff): (Duration, Duration),
        streams: &StreamMetrics,
    ) -> Self {
        let cluster_networks: Arc<[IpNet]> = cluster_networks.into();
        let (fallback, _) = watch::channel(Arc::new(default.policy(&cluster_networks)));
        let mut policies = Self {
            client: InboundServerPoliciesClient::new(channel),
            heard: Arc::default(),
            workload,
            fallback: Arc::new(fallback),
            cluster_networks,
            first_answer,
            max_backoff,
            counted: streams.of(StreamKind::inbound_policy),
            declared: HashMap::new(),
            undeclared: Mutex::default(),
        };
        for &port in declared {
            let (answer, _task) = policies.watch(port);
            policies.declared.insert(port, answer);
        }
        policies
    }

    fn watch(&self, port: u16) -> (Answer, AbortHandle) {
        let (tx, rx) = watch::channel(None);
        let follow = Follow {
            client: self.client.clone(),
            heard: self.heard.clone(),
            workload: self.workload.clone(),
            port,
            fallback: self.fallback.clone(),
            cluster_networks: self.cluster_networks.clone(),
            counted: self.counted.clone(),
        };
        let task = tokio::spawn(follow.run(tx, self.max_backoff)).abort_handle();
        (rx, task)
    }

    /// The policy of `port`. An undeclared port's first caller starts its watch; a port not
    /// answered yet is waited for up to the first-answer bound (then the fallback applies).
    pub async fn port(&self, port: u16) -> Result<PortWatch, WatchLimit> {
        let (mut answer, in_use) = match self.declared.get(&port) {
            Some(answer) => (answer.clone(), None),
            None => {
                let (answer, in_use) = self.undeclared(port)?;
                (answer, Some(in_use))
            }
        };
        if answer.borrow().is_none() {
            let _ = tokio::time::timeout(self.first_answer, answer.wait_for(Option::is_some)).await;
        }
        Ok(PortWatch { answer, fallback: self.fallback.subscribe(), _in_use: in_use })
    }

    fn undeclared(&self, port: u16) -> Result<(Answer, Arc<()>), WatchLimit> {
        let mut table = self.undeclared.lock();
        table.clock += 1;
        let now = table.clock;
        if let Some(w) = table.ports.get_mut(&port) {
            w.used = now;
            return Ok((w.answer.clone(), w.in_use.clone()));
        }
        if table.ports.len() >= MAX_UNDECLARED {
            let evicted = table.evictable().ok_or(WatchLimit { port })?;
            if let Some(w) = table.ports.remove(&evicted) {
                w.task.abort();
                self.heard.lock().ports.remove(&evicted);
                tracing::debug!(
                    port = evicted,
                    "inbound policy watch evicted (least recently used, no connection open)"
                );
            }
        }
        let (answer, task) = self.watch(port);
        let in_use = Arc::new(());
        table.ports.insert(port, Watched { answer: answer.clone(), task, in_use: in_use.clone(), used: now });
        Ok((answer, in_use))
    }

    /// Waits until every declared port has its first answer, for at most `bound`; returns
    /// whether they all have.
    pub async fn declared_answered(&self, bound: Duration) -> bool {
        let all = async {
            for answer in self.declared.values() {
                let _ = answer.clone().wait_for(Option::is_some).await;
            }
        };
        tokio::time::timeout(bound, all).await.is_ok()
    }

    /// Declared ports still without an answer.
    pub fn unanswered(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.declared.iter().filter(|(_, a)| a.borrow().is_none()).map(|(p, _)| *p).collect();
        ports.sort_unstable();
        ports
    }

    /// Undeclared ports watched now (tests, status).
    pub fn undeclared_watched(&self) -> usize {
        self.undeclared.lock().ports.len()
    }

    /// The policy unanswered ports get now.
    pub fn fallback(&self) -> Arc<PortPolicy> {
        self.fallback.borrow().clone()
    }

    /// When the control plane last stated the default (else the fallback is the injected one).
    pub fn fallback_stated(&self) -> Option<SystemTime> {
        self.heard.lock().default_stated
    }

    /// Every watched port (declared and undeclared), sorted, with the policy in force now.
    pub fn status(&self) -> Vec<PortStatus> {
        let fallback = self.fallback();
        // The watch table's lock is released before the freshness lock is taken: eviction takes
        // them in the other order.
        let mut answers: Vec<(u16, bool, Option<Arc<PortPolicy>>)> =
            self.declared.iter().map(|(&p, a)| (p, true, a.borrow().clone())).collect();
        answers.extend(self.undeclared.lock().ports.iter().map(|(&p, w)| (p, false, w.answer.borrow().clone())));
        let heard = self.heard.lock();
        let mut ports: Vec<PortStatus> = answers
            .into_iter()
            .map(|(port, declared, answer)| PortStatus {
                port,
                declared,
                answered: answer.is_some(),
                policy: answer.unwrap_or_else(|| fallback.clone()),
                last_answer: heard.ports.get(&port).copied(),
            })
            .collect();
        ports.sort_by_key(|s| s.port);
        ports
    }
}

impl Drop for Policies {
    fn drop(&mut self) {
        for w in self.undeclared.get_mut().ports.values() {
            w.task.abort();
        }
    }
}

/// One port's stream.
struct Follow {
    client: InboundServerPoliciesClient<Channel>,
    heard: Arc<Mutex<Heard>>,
    workload: String,
    port: u16,
    fallback: Arc<watch::Sender<Arc<PortPolicy>>>,
    cluster_networks: Arc<[IpNet]>,
    counted: StreamCounters,
}

impl Follow {
    /// Streams the port's policy into `tx`; an answer the proxy cannot enforce is logged and the
    /// last good one kept. An answer for a port without a Server names the effective default,
    /// which becomes the fallback of every port not answered yet.
    async fn run(self, tx: watch::Sender<Option<Arc<PortPolicy>>>, max_backoff: Duration) {
        let Self { client, heard, workload, port, fallback, cluster_networks, counted } = self;
        let spec = api::PortSpec { workload: workload.clone(), port: u32::from(port) };
        let open = || {
            let (mut client, spec) = (client.clone(), spec.clone());
            async move { client.watch_port(spec).await.map(tonic::Response::into_inner) }
        };
        let apply = |server: api::Server, _first| match PortPolicy::from_api(server) {
            Ok(mut policy) => {
                if let Some(previous) = tx.borrow().as_deref() {
                    policy.carry_rate_limit_from(previous);
                }
                let stated = stated_default(&policy);
                {
                    let mut heard = heard.lock();
                    let now = SystemTime::now();
                    heard.ports.insert(port, now);
                    if stated.is_some() {
                        heard.default_stated = Some(now);
                    }
                }
                tracing::debug!(port, server = %policy.server.name, authorizations = policy.authorizations.len(), "inbound policy updated");
                if let Some(default) = stated {
                    let policy = Arc::new(default.policy(&cluster_networks));
                    fallback.send_if_modified(|current| {
                        let changed = **current != *policy;
                        if changed {
                            tracing::info!(
                                default = default.name(),
                                "default inbound policy stated by the control plane"
                            );
                            *current = policy;
                        }
                        changed
                    });
                }
                tx.send_if_modified(|current| {
                    let changed = current.as_deref() != Some(&policy);
                    if changed {
                        *current = Some(Arc::new(policy));
                    }
                    changed
                });
            }
            Err(why) => tracing::error!(port, %workload, %why, "inbound policy refused; keeping the last good one"),
        };
        crate::client::discovery::follow::retrying(
            format!("inbound policy {workload} port {port}"),
            max_backoff,
            counted,
            open,
            apply,
        )
        .await;
    }
}

/// The default policy an answer stands for, when its server is a default (`""`/`default`/name).
fn stated_default(policy: &PortPolicy) -> Option<DefaultPolicy> {
    let s = &policy.server;
    if !s.group.is_empty() || &*s.kind != "default" {
        return None;
    }
    s.name.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbound::policy::model::Resource;

    #[test]
    fn a_default_server_states_the_default_and_a_real_server_does_not() {
        let mut p = DefaultPolicy::AllUnauthenticated.policy(&[]);
        p.server = Resource::new("", "default", "deny");
        assert_eq!(stated_default(&p), Some(DefaultPolicy::Deny));
        p.server = Resource::new("policy.cnimesh.io", "server", "deny");
        assert_eq!(stated_default(&p), None, "a Server named deny is not the default");
        p.server = Resource::new("", "default", "probe");
        assert_eq!(stated_default(&p), None);
    }

    #[tokio::test]
    async fn a_fixed_watch_never_changes() {
        let mut w = PortWatch::fixed(Arc::new(DefaultPolicy::Deny.policy(&[])));
        assert!(w.answered());
        assert_eq!(&*w.current().server.name, "deny");
        let changed = tokio::time::timeout(Duration::from_millis(20), w.changed()).await;
        assert!(changed.is_err(), "closed channels are not changes");
    }
}
