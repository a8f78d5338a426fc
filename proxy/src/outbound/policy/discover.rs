//! Outbound policy discovery: one `OutboundPolicies.Watch` stream per original destination,
//! opened by the first connection to it and shared by every later one (a resolved target holds
//! its [`PolicyWatch`]), reconnected with backoff by the same loop as Destination
//! ([`crate::client::discovery::follow::retrying`]). The last good answer stays in force while the
//! control plane is away. A target the control plane does not know (NotFound: a pod IP, an
//! address outside the cluster) has no policy, and neither has any target of a control plane
//! that does not serve OutboundPolicies (Unimplemented): their connections detect, as before.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use linkerd2_proxy_api::outbound::{self as api, outbound_policies_client::OutboundPoliciesClient};
use parking_lot::Mutex;
use tokio::sync::watch;
use tonic::transport::Channel;

use super::model::OutboundPolicy;
use crate::client::discovery::{StreamCounters, StreamKind, StreamMetrics};

/// The control plane's answer about one target.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Not a target the control plane has a policy for.
    NoPolicy,
    Policy(Arc<OutboundPolicy>),
}

type Rx = watch::Receiver<Option<Answer>>;

/// A target's policy as it stands now. Cheap to clone; reading it takes no lock but the
/// watch's own.
#[derive(Debug, Clone)]
pub struct PolicyWatch(Rx);

impl PolicyWatch {
    /// The last good policy; `None` until the control plane has answered with one.
    pub fn current(&self) -> Option<Arc<OutboundPolicy>> {
        match &*self.0.borrow() {
            Some(Answer::Policy(p)) => Some(p.clone()),
            Some(Answer::NoPolicy) | None => None,
        }
    }
}

#[cfg(test)]
impl PolicyWatch {
    /// A policy that never changes: what the request path does under a given policy, tested
    /// without a control plane.
    pub(crate) fn fixed(policy: Arc<OutboundPolicy>) -> Self {
        let (_tx, rx) = watch::channel(Some(Answer::Policy(policy)));
        PolicyWatch(rx)
    }
}

pub struct OutboundPolicies {
    client: OutboundPoliciesClient<Channel>,
    /// `ns:pod` as the control plane knows this workload, or empty.
    workload: String,
    first_answer: Duration,
    max_backoff: Duration,
    counted: StreamCounters,
    targets: Mutex<HashMap<Key, Rx>>,
}

/// What a watch is about: an original destination, or a Service port by name (an ingress-mode
/// proxy's request that names one).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Addr(SocketAddr),
    Authority(String),
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Addr(addr) => addr.fmt(f),
            Key::Authority(authority) => f.write_str(authority),
        }
    }
}

impl OutboundPolicies {
    pub fn new(
        channel: Channel,
        workload: String,
        first_answer: Duration,
        max_backoff: Duration,
        streams: &StreamMetrics,
    ) -> Self {
        Self {
            client: OutboundPoliciesClient::new(channel),
            workload,
            first_answer,
            max_backoff,
            counted: streams.of(StreamKind::outbound_policy),
            targets: Mutex::default(),
        }
    }

    /// The policy of `addr`; the first caller starts the watch, and every caller waits up to the
    /// first-answer bound while none has come.
    pub async fn target(&self, addr: SocketAddr) -> PolicyWatch {
        self.watch(Key::Addr(addr)).await
    }

    /// The policy of the Service port `authority` (`name.ns.svc.<domain>:port`), as
    /// [`Self::target`]: the control plane answers NotFound ([`Answer::NoPolicy`]) for a
    /// name that is no Service port.
    pub async fn service(&self, authority: &str) -> PolicyWatch {
        self.watch(Key::Authority(authority.to_string())).await
    }

    async fn watch(&self, key: Key) -> PolicyWatch {
        let mut rx = crate::client::discovery::shared(&self.targets, &key, || {
            let (tx, rx) = watch::channel(None);
            let target = match &key {
                Key::Addr(addr) => api::traffic_spec::Target::Addr((*addr).into()),
                Key::Authority(authority) => api::traffic_spec::Target::Authority(authority.clone()),
            };
            let spec = api::TrafficSpec { source_workload: self.workload.clone(), target: Some(target) };
            let counted = (self.max_backoff, self.counted.clone());
            tokio::spawn(follow(self.client.clone(), spec, key.clone(), tx, counted));
            rx
        });
        if rx.borrow().is_none() {
            let _ = tokio::time::timeout(self.first_answer, rx.wait_for(Option::is_some)).await;
        }
        PolicyWatch(rx)
    }
}

/// Streams `addr`'s policy into `tx` until nobody holds its receiver; an answer the proxy
/// refuses is logged and the last good one kept.
async fn follow(
    client: OutboundPoliciesClient<Channel>,
    spec: api::TrafficSpec,
    addr: Key,
    tx: watch::Sender<Option<Answer>>,
    (max_backoff, counted): (Duration, StreamCounters),
) {
    let published = &tx;
    let open = || {
        let (mut client, spec) = (client.clone(), spec.clone());
        async move {
            let opened = client.watch(spec).await.map(tonic::Response::into_inner);
            if let Err(status) = &opened
                && matches!(status.code(), tonic::Code::NotFound | tonic::Code::Unimplemented)
            {
                published.send_replace(Some(Answer::NoPolicy));
            }
            opened
        }
    };
    let apply = |policy: api::OutboundPolicy, _first| match OutboundPolicy::from_api(policy) {
        Ok(policy) => {
            tracing::debug!(%addr, parent = %policy.parent.name, protocol = ?policy.protocol, "outbound policy updated");
            published.send_if_modified(|current| {
                let changed = !matches!(current, Some(Answer::Policy(p)) if **p == policy);
                if changed {
                    *current = Some(Answer::Policy(Arc::new(policy)));
                }
                changed
            });
        }
        Err(why) => tracing::error!(%addr, %why, "outbound policy refused; keeping the last good one"),
    };
    tokio::select! {
        () = tx.closed() => {}
        () = crate::client::discovery::follow::retrying(format!("outbound policy {addr}"), max_backoff, counted, open, apply) => {}
    }
}
