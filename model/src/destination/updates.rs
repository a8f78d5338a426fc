//! The updates `Get` streams for a service port, worked out once per change and shared.
//!
//! Every stream of a service port follows the same snapshots, and when a change comes nearly all
//! of them stand at the same previous state. So the step from that state to the new one (its
//! removals, additions and `no_endpoints`) is computed and encoded once, by the first stream that
//! needs it, and every other stream at that state sends the very same bytes: a change costs one
//! diff and one encoding per service port, not one per subscriber. A stream that lags (its client
//! did not read, so it skipped snapshots) or is new (it has sent nothing) gets the step from its
//! own state, which is shared in turn with the streams standing where it stands.
//!
//! What a stream is sent is exactly what a diff of its own last-sent set against the new one
//! gives ([`updates`]); the sharing only avoids recomputing it. Each stream's own state is a
//! [`super::follower::Follower`].
//!
//! Layer: model/index (pure): linkerd2-proxy-api messages encoded with prost, no tonic.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use linkerd2_proxy_api::destination::{AddrSet, NoEndpoints, Update, WeightedAddr, WeightedAddrSet, update};
use parking_lot::Mutex;
use prost::Message;

use crate::meta::NsName;

/// The ready endpoints of one port, keyed by address so streams can diff them.
pub type Endpoints = Arc<BTreeMap<SocketAddr, WeightedAddr>>;

/// Encoded [`Update`] messages, in the order they are sent; shared by every stream sending them.
pub type Encoded = Arc<[Bytes]>;

/// How many distinct earlier states of its streams a port's snapshot keeps the step from. Nearly
/// all streams share one (the previous snapshot) and new streams another (nothing sent); a few
/// more cover streams that lag. Steps from further states are computed for their stream alone.
const SHARED_STEPS: usize = 4;

/// One port's endpoints in one snapshot, and the steps into them that streams have needed so far.
pub struct PortEndpoints {
    pub endpoints: Endpoints,
    steps: Mutex<Vec<Step>>,
}

/// The messages that take a stream from `from` to a port's endpoints.
struct Step {
    /// What the stream had sent; `None` for nothing. A weak reference: it keeps the allocation,
    /// so its address cannot be reused by another set while this step is kept, but not the
    /// endpoints in it.
    from: Option<Weak<BTreeMap<SocketAddr, WeightedAddr>>>,
    no_endpoints: Option<bool>,
    messages: Encoded,
}

impl PortEndpoints {
    pub fn new(endpoints: BTreeMap<SocketAddr, WeightedAddr>) -> Self {
        Self { endpoints: Arc::new(endpoints), steps: Mutex::default() }
    }

    /// The messages from a stream's state to these endpoints: the shared ones if some stream at
    /// the same state asked before, else worked out (and kept for the next, while there is room).
    pub fn step_from(&self, key: &NsName, sent: &Endpoints, no_endpoints: Option<bool>) -> Encoded {
        let from = (!sent.is_empty()).then_some(sent);
        let mut steps = self.steps.lock();
        let same = |step: &&Step| {
            step.no_endpoints == no_endpoints
                && match (&step.from, from) {
                    (Some(a), Some(b)) => std::ptr::eq(a.as_ptr(), Arc::as_ptr(b)),
                    (None, None) => true,
                    _ => false,
                }
        };
        if let Some(step) = steps.iter().find(same) {
            return step.messages.clone();
        }
        let messages = encode(&updates(Some(key), sent, &self.endpoints, no_endpoints));
        if steps.len() < SHARED_STEPS {
            steps.push(Step { from: from.map(Arc::downgrade), no_endpoints, messages: messages.clone() });
        }
        messages
    }
}

/// The messages that take a client holding `sent` to `next`; `key` is the service (`None` when it
/// does not exist, which also makes `next` empty).
///
/// Removals first, then additions (an endpoint whose metadata changed is re-added; proxies treat
/// an add of a known address as a replacement). `no_endpoints` only when the set is empty, and
/// only when it says something new (`no_endpoints` is what the client was last told): so the
/// first message for a service with endpoints is an add, and a service that goes away says
/// `exists: false` so clients may fall back to DNS.
pub fn updates(
    key: Option<&NsName>,
    sent: &BTreeMap<SocketAddr, WeightedAddr>,
    next: &BTreeMap<SocketAddr, WeightedAddr>,
    no_endpoints: Option<bool>,
) -> Vec<Update> {
    let mut updates = Vec::new();
    let removed: Vec<_> = sent.keys().filter(|a| !next.contains_key(a)).map(|a| (*a).into()).collect();
    if !removed.is_empty() {
        updates.push(update::Update::Remove(AddrSet { addrs: removed }));
    }
    let added: Vec<_> = next.iter().filter(|(a, w)| sent.get(a) != Some(w)).map(|(_, w)| w.clone()).collect();
    if let (false, Some(key)) = (added.is_empty(), key) {
        let metric_labels = HashMap::from([
            ("namespace".to_string(), key.namespace.clone()),
            ("service".to_string(), key.name.clone()),
        ]);
        updates.push(update::Update::Add(WeightedAddrSet { addrs: added, metric_labels }));
    }
    let exists = key.is_some();
    if next.is_empty() && no_endpoints != Some(exists) {
        updates.push(update::Update::NoEndpoints(NoEndpoints { exists }));
    }
    updates.into_iter().map(|u| Update { update: Some(u) }).collect()
}

/// Each message's bytes.
pub fn encode(updates: &[Update]) -> Encoded {
    updates.iter().map(|u| Bytes::from(u.encode_to_vec())).collect()
}
