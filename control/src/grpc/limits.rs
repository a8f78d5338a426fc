//! How much of the gRPC port one client may hold. Every pod can reach port 4190, and a stream
//! costs the control plane memory for as long as it is open (HTTP/2 and tonic state, an 8 KiB
//! encode buffer, the index's watch): without bounds one pod can exhaust it.
//!
//! The bounds, each counted while the connection or stream is open and released when it ends:
//! - connections per peer IP address (a pod);
//! - streams per peer IP address, across its connections;
//! - streams per client identity (a ServiceAccount: all replicas of a workload together);
//! - streams in total.
//!
//! HTTP/2's own `SETTINGS_MAX_CONCURRENT_STREAMS` bounds each connection as well; a client over
//! it waits for a slot. Over the other bounds a connection is closed at accept, a stream is
//! answered `RESOURCE_EXHAUSTED` at once: the proxy sees why (and backs off), instead of stalling.
//!
//! Layer: gRPC: admission of connections and calls, before any service sees them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

use cnimesh_identity::Name;

/// The largest request message Destination and policy decode (tonic's default is 4 MiB): theirs
/// are a name and a port, well under 1 KiB. Identity has its own, for a token and a CSR.
pub const MAX_REQUEST_LEN: usize = 16 * 1024;

/// What the listener allows. The defaults are what a proxy needs with room to spare: a proxy
/// opens about four connections (Identity, Destination, inbound and outbound policy) and holds
/// one stream per inbound port it serves plus two or three per destination it talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS` of each connection.
    pub streams_per_connection: u32,
    /// Open connections from one IP address (TLS handshakes in progress included).
    pub connections_per_peer: usize,
    /// Open streams from one IP address, across its connections.
    pub streams_per_peer: usize,
    /// Open streams of one client identity across all its connections (all replicas of a
    /// workload share a ServiceAccount, so this is larger than the per-peer bound).
    pub streams_per_identity: usize,
    /// Open streams in all.
    pub streams: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            streams_per_connection: 1024,
            connections_per_peer: 16,
            streams_per_peer: 1024,
            streams_per_identity: 8192,
            // Measured at about 8 KiB per open stream (tests/tests/attack_control_plane.rs: 12,000
            // streams grew the process by 90 MiB): 16,384 stay within 128 MiB, half the memory
            // limit of daemonset/control-plane.yaml.
            streams: 16_384,
        }
    }
}

/// Why a connection or stream was refused; `reason()` is its metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{peer} already has {limit} connections open to the control plane (the limit per peer)")]
    ConnectionsPerPeer { peer: IpAddr, limit: usize },
    #[error("{peer} already has {limit} streams open to the control plane (the limit per peer)")]
    StreamsPerPeer { peer: IpAddr, limit: usize },
    #[error("{identity} already has {limit} streams open to the control plane (the limit per identity)")]
    StreamsPerIdentity { identity: Name, limit: usize },
    #[error("the control plane has {limit} streams open (its limit); try again later")]
    Streams { limit: usize },
}

impl Refusal {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ConnectionsPerPeer { .. } => "connections_per_peer",
            Self::StreamsPerPeer { .. } => "streams_per_peer",
            Self::StreamsPerIdentity { .. } => "streams_per_identity",
            Self::Streams { .. } => "streams",
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    connections_by_peer: HashMap<IpAddr, usize>,
    streams_by_peer: HashMap<IpAddr, usize>,
    streams_by_identity: HashMap<Name, usize>,
    streams: usize,
}

/// Counts what is open and admits or refuses more. Cheap to share; one per listener.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    counts: Mutex<Counts>,
}

/// Held while a connection is open.
#[derive(Debug)]
pub struct ConnectionPermit {
    admission: Arc<Admission>,
    peer: IpAddr,
}

/// Held while a stream (a call, for its whole response) is open.
#[derive(Debug)]
pub struct StreamPermit {
    admission: Arc<Admission>,
    peer: IpAddr,
    identity: Option<Name>,
}

/// Decrements `map[key]`, forgetting keys that reach zero so the maps stay as small as what is open.
fn release<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self { limits, counts: Mutex::default() })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn counts(&self) -> parking_lot::MutexGuard<'_, Counts> {
        self.counts.lock()
    }

    pub fn connection(self: &Arc<Self>, peer: IpAddr) -> Result<ConnectionPermit, Refusal> {
        let mut counts = self.counts();
        let open = counts.connections_by_peer.entry(peer).or_default();
        if *open >= self.limits.connections_per_peer {
            if *open == 0 {
                counts.connections_by_peer.remove(&peer);
            }
            return Err(Refusal::ConnectionsPerPeer { peer, limit: self.limits.connections_per_peer });
        }
        *open += 1;
        Ok(ConnectionPermit { admission: self.clone(), peer })
    }

    pub fn stream(self: &Arc<Self>, peer: IpAddr, identity: Option<&Name>) -> Result<StreamPermit, Refusal> {
        let limits = &self.limits;
        let mut counts = self.counts();
        if counts.streams >= limits.streams {
            return Err(Refusal::Streams { limit: limits.streams });
        }
        if counts.streams_by_peer.get(&peer).copied().unwrap_or(0) >= limits.streams_per_peer {
            return Err(Refusal::StreamsPerPeer { peer, limit: limits.streams_per_peer });
        }
        if let Some(identity) = identity
            && counts.streams_by_identity.get(identity).copied().unwrap_or(0) >= limits.streams_per_identity
        {
            return Err(Refusal::StreamsPerIdentity { identity: identity.clone(), limit: limits.streams_per_identity });
        }
        counts.streams += 1;
        *counts.streams_by_peer.entry(peer).or_default() += 1;
        if let Some(identity) = identity {
            *counts.streams_by_identity.entry(identity.clone()).or_default() += 1;
        }
        Ok(StreamPermit { admission: self.clone(), peer, identity: identity.cloned() })
    }

    /// Open streams now (for the gauge).
    pub fn open_streams(&self) -> usize {
        self.counts().streams
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        release(&mut self.admission.counts().connections_by_peer, &self.peer);
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut counts = self.admission.counts();
        counts.streams -= 1;
        release(&mut counts.streams_by_peer, &self.peer);
        if let Some(identity) = &self.identity {
            release(&mut counts.streams_by_identity, identity);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            streams_per_connection: 10,
            connections_per_peer: 2,
            streams_per_peer: 3,
            streams_per_identity: 4,
            streams: 5,
        }
    }

    #[test]
    fn connections_over_the_per_peer_bound_are_refused_until_one_closes() {
        let admission = Admission::new(limits());
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let first = admission.connection(peer).unwrap();
        let _second = admission.connection(peer).unwrap();
        assert_eq!(admission.connection(peer).unwrap_err().reason(), "connections_per_peer");
        // Another peer is not affected.
        let _other = admission.connection("10.0.0.2".parse().unwrap()).unwrap();
        drop(first);
        let _third = admission.connection(peer).unwrap();
    }

    #[test]
    fn streams_are_bounded_per_peer_per_identity_and_in_all_and_released_when_they_end() {
        let admission = Admission::new(limits());
        let web = Name::parse("web.shop.serviceaccount.identity.cnimesh.cluster.local").unwrap();
        let (a, b, c): (IpAddr, IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap(), "10.0.0.3".parse().unwrap());
        let mut held: Vec<_> = (0..3).map(|_| admission.stream(a, Some(&web)).unwrap()).collect();
        assert_eq!(admission.stream(a, Some(&web)).unwrap_err().reason(), "streams_per_peer");
        held.push(admission.stream(b, Some(&web)).unwrap());
        // The identity's fifth stream, from a third replica.
        assert_eq!(admission.stream(c, Some(&web)).unwrap_err().reason(), "streams_per_identity");
        held.push(admission.stream(c, None).unwrap());
        assert_eq!(admission.stream(c, None).unwrap_err().reason(), "streams");
        assert_eq!(admission.open_streams(), 5);
        held.clear();
        assert_eq!(admission.open_streams(), 0);
        let counts = admission.counts();
        assert!(counts.streams_by_peer.is_empty() && counts.streams_by_identity.is_empty(), "{counts:?}");
    }
}
