//! Leader election: one `coordination.k8s.io/v1` Lease per writer role (`cnimesh-control-<role>`
//! in the control plane's namespace). Every replica serves reads; only the holder of a role's
//! Lease writes for that role (today: the webhook's Secret and caBundle).
//!
//! Why our own elector rather than kube-lease-manager 0.13 (which compiles with kube 5): its
//! watch loop keeps reporting "leader" while its API calls fail (a partitioned leader never
//! learns it lost), its durations are whole seconds, and it brings rand 0.10 beside our 0.9.
//! The algorithm here is client-go's, which Linkerd uses:
//! - a follower takes over only after it has seen the same Lease record (resourceVersion) for a
//!   whole `lease_duration` *on its own clock* (no trust in other nodes' clocks), or at once
//!   when the holder released it;
//! - every write to the Lease carries the resourceVersion read before it, so of two replicas
//!   racing for an expired Lease one gets 409 Conflict and stays a follower;
//! - the leader's own fence: it leads until `renew_deadline` (2/3 of the lease duration) after
//!   the *start* of its last successful renewal. A follower's takeover comes at least
//!   `lease_duration` after it saw that renewal, which was after the renewal started, so the old
//!   leader has stopped before the new one starts, even when its API calls fail or hang
//!   (partition): [`Leadership::is_leading`] is a clock check, not a message it must receive.
//!
//! Failover after a crash (no release): `lease_duration` after the follower last saw the record
//! change, plus up to one `renew_interval` of polling: about `lease_duration ± renew_interval`
//! (30 s ± 2 s by default). After a graceful stop (release): at most one `renew_interval`.
//!
//! Layer: runtime: kube in, a [`Leadership`] handle out; writers check it before every write.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The webhook certificate's writer: the Secret `cnimesh-webhook-tls` and the caBundle.
pub const WEBHOOK_WRITE: &str = "webhook-write";
/// Lease names are `cnimesh-control-<role>`.
pub const LEASE_PREFIX: &str = "cnimesh-control-";
/// Linkerd's defaults.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(30);
pub const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(2);

/// Where a process reports whether it leads a role: its metrics (the control plane's
/// `control_leader`, the mirror's `mirror_leader`).
pub trait LeaderGauge: Send + Sync {
    fn set_leader(&self, role: &str, leading: bool);
}

impl LeaderGauge for cnimesh_model::metrics::Metrics {
    fn set_leader(&self, role: &str, leading: bool) {
        cnimesh_model::metrics::Metrics::set_leader(self, role, leading);
    }
}

/// The Lease's name for `role`.
pub fn lease_name(role: &str) -> String {
    format!("{LEASE_PREFIX}{role}")
}

#[derive(Debug, thiserror::Error)]
pub enum ElectionConfigError {
    #[error("the renew interval ({renew:?}) must be under a third of the lease duration ({lease:?})")]
    RenewTooSlow { renew: Duration, lease: Duration },
    #[error("the lease duration must be at least 1ms")]
    Zero,
}

/// How one replica takes part in elections.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// The Leases' namespace (the control plane's).
    pub namespace: String,
    /// Unique per replica (pod name plus a random suffix): a restarted pod is a new candidate.
    pub identity: String,
    /// How long a Lease holds without renewal before a follower may take it.
    pub lease_duration: Duration,
    /// How often the leader renews and followers look.
    pub renew_interval: Duration,
}

impl ElectionConfig {
    pub fn validate(&self) -> Result<(), ElectionConfigError> {
        if self.lease_duration.is_zero() {
            return Err(ElectionConfigError::Zero);
        }
        if self.renew_interval.is_zero() || self.renew_interval * 3 > self.lease_duration {
            return Err(ElectionConfigError::RenewTooSlow { renew: self.renew_interval, lease: self.lease_duration });
        }
        Ok(())
    }

    /// How long a leader keeps leading after its last successful renewal began.
    pub fn renew_deadline(&self) -> Duration {
        self.lease_duration * 2 / 3
    }

    /// A replica identity: `base` (the pod name) and a random suffix.
    pub fn unique_identity(base: &str) -> String {
        let mut bytes = [0u8; 4];
        cnimesh_identity::tls::random(&mut bytes);
        let suffix: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!("{base}_{suffix}")
    }
}

/// Whether this replica leads a role, and until when. Cheap to clone; writers call
/// [`is_leading`](Self::is_leading) right before each write.
#[derive(Debug, Clone)]
pub struct Leadership {
    role: Arc<str>,
    until: watch::Receiver<Option<Instant>>,
}

impl Leadership {
    /// A handle that always leads: for a single replica with no elections (local mode, tests).
    pub fn always(role: &str) -> Self {
        let (tx, until) = watch::channel(Some(Instant::now() + Duration::from_secs(100 * 365 * 86400)));
        std::mem::drop(tx);
        Self { role: role.into(), until }
    }

    /// A handle that never leads: a follower whose elector never wins (tests of followers).
    pub fn never(role: &str) -> Self {
        let (tx, until) = watch::channel(None);
        std::mem::drop(tx);
        Self { role: role.into(), until }
    }

    pub fn role(&self) -> &str {
        &self.role
    }

    pub fn is_leading(&self) -> bool {
        self.leading_at(Instant::now())
    }

    /// Whether this replica leads at `now` (tests compare replicas at one instant).
    pub fn leading_at(&self, now: Instant) -> bool {
        matches!(*self.until.borrow(), Some(until) if now < until)
    }

    /// Resolves once this replica leads; never if the elector stopped.
    pub async fn acquired(&mut self) {
        loop {
            if self.is_leading() {
                return;
            }
            if self.until.changed().await.is_err() && !self.is_leading() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Resolves as soon as this replica no longer leads: a lost or released Lease, or its own
    /// fence passing (even when the elector is stuck on an API call). Writers race their writes
    /// against it.
    pub async fn lost(&mut self) {
        loop {
            let until = *self.until.borrow_and_update();
            let Some(until) = until.filter(|u| Instant::now() < *u) else { return };
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return,
                changed = self.until.changed() => if changed.is_err() {
                    // The elector is gone: the fence still holds until it passes.
                    tokio::time::sleep_until(until).await;
                    return;
                },
            }
        }
    }
}

/// Starts electing for `role`; the task runs until `stopped` turns true, then releases the
/// Lease if it holds it so a follower takes over within one renew interval.
pub fn spawn(
    client: kube::Client,
    role: &str,
    config: ElectionConfig,
    metrics: Arc<dyn LeaderGauge>,
    stopped: watch::Receiver<bool>,
) -> (Leadership, JoinHandle<()>) {
    let (tx, until) = watch::channel(None);
    metrics.set_leader(role, false);
    let elector = Elector {
        api: Api::namespaced(client, &config.namespace),
        name: lease_name(role),
        role: role.into(),
        config,
        tx,
        observed: None,
        metrics,
    };
    let leadership = Leadership { role: role.into(), until };
    (leadership, tokio::spawn(elector.run(stopped)))
}

struct Elector {
    api: Api<Lease>,
    name: String,
    role: String,
    config: ElectionConfig,
    tx: watch::Sender<Option<Instant>>,
    /// A record held by another replica: its resourceVersion and when we first saw it.
    observed: Option<(String, Instant)>,
    metrics: Arc<dyn LeaderGauge>,
}

/// What one round learnt.
enum Round {
    /// We hold the Lease as of this write (kept to release it).
    Leading(Box<Lease>),
    /// Someone else holds it (or won a race).
    Following,
}

impl Elector {
    async fn run(mut self, mut stopped: watch::Receiver<bool>) {
        let mut held: Option<Box<Lease>> = None;
        loop {
            if *stopped.borrow() {
                break;
            }
            let started = Instant::now();
            // A round may not outlive the fence: a hung call must not keep us from noticing.
            let round = tokio::time::timeout(self.config.renew_interval.max(self.config.lease_duration / 3), async {
                self.round(started).await
            })
            .await;
            match round {
                Ok(Ok(Round::Leading(lease))) => {
                    held = Some(lease);
                    self.lead_until(Some(started + self.config.renew_deadline()));
                }
                Ok(Ok(Round::Following)) => {
                    held = None;
                    self.lead_until(None);
                }
                Ok(Err(error)) => {
                    let error = cnimesh_common::error::with_causes(error.to_string(), &error);
                    tracing::debug!(lease = %self.name, %error, "lease round failed");
                }
                Err(_) => tracing::debug!(lease = %self.name, "lease round timed out"),
            }
            // Sleep a renew interval, but wake when the fence passes to say so at once.
            let fence = self.tx.borrow().filter(|u| *u > Instant::now());
            let wake = started + self.config.renew_interval;
            let wake = fence.map_or(wake, |f| wake.min(f));
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {}
                _ = stopped.wait_for(|s| *s) => {}
            }
            if fence.is_some_and(|f| f <= Instant::now()) {
                held = None;
                self.lead_until(None);
            }
        }
        let leading = self.tx.borrow().is_some_and(|u| u > Instant::now());
        self.lead_until(None);
        if let (true, Some(lease)) = (leading, held) {
            self.release(lease).await;
        }
    }

    /// Publishes the fence; logs and counts changes of leadership.
    fn lead_until(&self, until: Option<Instant>) {
        let was = self.tx.borrow().is_some_and(|u| u > Instant::now());
        let now = until.is_some_and(|u| u > Instant::now());
        self.tx.send_replace(until);
        if was != now {
            self.metrics.set_leader(&self.role, now);
            if now {
                tracing::info!(role = %self.role, lease = %self.name, identity = %self.config.identity, "became leader");
            } else {
                tracing::info!(role = %self.role, lease = %self.name, identity = %self.config.identity, "no longer leader");
            }
        }
    }

    async fn round(&mut self, started: Instant) -> Result<Round, kube::Error> {
        let Some(current) = self.api.get_opt(&self.name).await? else {
            return self.create().await;
        };
        let rv = current.metadata.resource_version.clone().unwrap_or_default();
        let holder = current.spec.as_ref().and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty());
        match holder {
            Some(holder) if holder == self.config.identity => self.write(current, false).await,
            None => self.write(current, true).await,
            Some(other) => {
                let seen_since = match &self.observed {
                    Some((seen_rv, since)) if *seen_rv == rv => *since,
                    _ => {
                        // First sight of this record: the clock starts now, not at its renewTime.
                        self.observed = Some((rv, Instant::now()));
                        if self.tx.borrow().is_some() {
                            tracing::warn!(lease = %self.name, holder = %other, "the lease is held by another replica");
                        }
                        return Ok(Round::Following);
                    }
                };
                if started.duration_since(seen_since) < self.config.lease_duration {
                    return Ok(Round::Following);
                }
                tracing::info!(lease = %self.name, holder = %other, "the lease expired; taking over");
                self.write(current, true).await
            }
        }
    }

    async fn create(&mut self) -> Result<Round, kube::Error> {
        let lease = Lease {
            metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
            spec: Some(self.spec(None, true)),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(lease) => Ok(Round::Leading(Box::new(lease))),
            Err(e) if is_conflict(&e) => Ok(Round::Following),
            Err(e) => Err(e),
        }
    }

    /// Renews (or, with `acquire`, takes) the Lease, guarded by the resourceVersion just read.
    async fn write(&mut self, mut current: Lease, acquire: bool) -> Result<Round, kube::Error> {
        current.spec = Some(self.spec(current.spec.take(), acquire));
        match self.api.replace(&self.name, &PostParams::default(), &current).await {
            Ok(lease) => {
                self.observed = None;
                Ok(Round::Leading(Box::new(lease)))
            }
            Err(e) if is_conflict(&e) => {
                tracing::info!(lease = %self.name, "lost a race for the lease (409 Conflict)");
                self.observed = None;
                Ok(Round::Following)
            }
            Err(e) => Err(e),
        }
    }

    fn spec(&self, old: Option<LeaseSpec>, acquire: bool) -> LeaseSpec {
        let old = old.unwrap_or_default();
        let now = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        let seconds = self.config.lease_duration.as_secs_f64().ceil() as i32;
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(seconds.max(1)),
            acquire_time: if acquire { now.clone() } else { old.acquire_time },
            renew_time: now,
            lease_transitions: Some(old.lease_transitions.unwrap_or(0) + i32::from(acquire)),
            ..old
        }
    }

    /// Hands the Lease back (holder cleared), so that a follower takes it on its next look.
    async fn release(&self, mut lease: Box<Lease>) {
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
        }
        let released = tokio::time::timeout(
            self.config.renew_interval,
            self.api.replace(&self.name, &PostParams::default(), &lease),
        )
        .await;
        match released {
            Ok(Ok(_)) => tracing::info!(lease = %self.name, "released the lease"),
            Ok(Err(error)) => tracing::info!(lease = %self.name, %error, "could not release the lease; it will expire"),
            Err(_) => tracing::info!(lease = %self.name, "releasing the lease timed out; it will expire"),
        }
    }
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(lease: u64, renew: u64) -> ElectionConfig {
        ElectionConfig {
            namespace: "cnimesh".into(),
            identity: "a".into(),
            lease_duration: Duration::from_millis(lease),
            renew_interval: Duration::from_millis(renew),
        }
    }

    #[test]
    fn renewals_must_fit_the_lease() {
        config(30_000, 2_000).validate().unwrap();
        assert!(config(30_000, 10_001).validate().is_err());
        assert!(config(0, 0).validate().is_err());
        assert_eq!(config(30_000, 2_000).renew_deadline(), Duration::from_secs(20));
        assert_eq!(lease_name(WEBHOOK_WRITE), "cnimesh-control-webhook-write");
        let (a, b) = (ElectionConfig::unique_identity("pod"), ElectionConfig::unique_identity("pod"));
        assert!(a.starts_with("pod_") && a != b, "{a} {b}");
    }

    #[tokio::test]
    async fn always_leads_and_a_fence_passes_by_itself() {
        assert!(Leadership::always("x").is_leading());
        let (tx, until) = watch::channel(Some(Instant::now() + Duration::from_millis(30)));
        let mut leadership = Leadership { role: "x".into(), until };
        assert!(leadership.is_leading());
        // Nobody sends: the fence alone ends leadership.
        tokio::time::timeout(Duration::from_secs(5), leadership.lost()).await.unwrap();
        assert!(!leadership.is_leading());
        drop(tx);
    }
}
