//! Service discovery from the control plane's Destination API (linkerd2-proxy-api).
//!
//! An outbound connection's original destination is looked up with `GetProfile(ip:port)`: a
//! ClusterIP answers with its service's name, which is then followed with `Get(name:port)` for the
//! live endpoint set; a pod IP answers with that one endpoint and its identity. Each lookup is one
//! long-lived stream shared by every connection to that destination, kept (with the last answer)
//! while the control plane is unreachable, and re-established with backoff.

pub mod accrual;
pub mod balance;
pub(crate) mod follow;
pub use follow::{StreamCounters, StreamKind, StreamMetrics};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cnimesh_common::names::{CONTEXT_TOKEN_CALLER_KEY, CONTEXT_TOKEN_GATEWAY, MIRROR_LOCAL_CLUSTER};
use cnimesh_identity::Name;
use linkerd2_proxy_api::destination::{self as api, destination_client::DestinationClient};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tonic::transport::Channel;

pub use balance::Stats;

/// One endpoint of a service.
#[derive(Debug)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// The identity a meshed endpoint proves (mTLS); `None` for a plaintext endpoint.
    pub identity: Option<Name>,
    /// A multicluster gateway: the connection starts with the transport header naming
    /// this `name:port` (the remote Service), and HTTP requests carry it as their authority.
    pub gateway: Option<Arc<GatewayTarget>>,
    /// `target_cluster_name`, the linked cluster a mirror's endpoint is in.
    pub target_cluster: Option<Arc<str>>,
    /// Destination's protocol hint says the endpoint's port is opaque (the pod declares it so,
    /// and its proxy then forwards the port's bytes without reading HTTP from them).
    pub opaque: bool,
    pub stats: Arc<Stats>,
}

impl Endpoint {
    /// A plaintext endpoint of this cluster with the balancing statistics `stats`.
    pub fn plaintext(addr: SocketAddr, stats: Arc<Stats>) -> Self {
        Self { addr, identity: None, gateway: None, target_cluster: None, opaque: false, stats }
    }
}

/// Whether `list` is in more than one cluster (this one counting as one).
pub fn spans_clusters(list: &[Arc<Endpoint>]) -> bool {
    let mut clusters = list.iter().map(|e| cluster_of(e));
    let Some(first) = clusters.next() else { return false };
    clusters.any(|c| c != first)
}

/// The `target_cluster_name` an endpoint's traffic carries: its linked cluster, and
/// none for this cluster's own endpoints. Destination labels a federated Service's local
/// members `local`; they are left unlabelled like every other local endpoint, so the series of
/// requests that stayed in the cluster are the same whether they went through `<name>` or
/// `<name>-federated` (and a federated Service down to its local member is labelled as a
/// plain Service).
pub fn cluster_of(endpoint: &Endpoint) -> Option<&Arc<str>> {
    endpoint.target_cluster.as_ref().filter(|c| &***c != MIRROR_LOCAL_CLUSTER)
}

/// Where a gateway forwards a connection (the endpoint's authority override).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayTarget {
    /// The remote Service's fully qualified name.
    pub name: String,
    pub port: u16,
    /// `name:port`, as requests' `:authority`/`Host`.
    pub authority: http::HeaderValue,
}

impl GatewayTarget {
    /// From an authority override `name:port`; `None` when it is not one.
    pub fn parse(authority: &str) -> Option<Self> {
        let (name, port) = authority.rsplit_once(':')?;
        let port = port.parse().ok().filter(|p| *p != 0)?;
        let valid = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        Some(Self {
            name: name.to_string(),
            port,
            authority: http::HeaderValue::from_str(authority).ok().filter(|_| valid)?,
        })
    }
}

/// A service's endpoints as last heard.
#[derive(Debug, Default)]
pub struct Endpoints {
    pub list: Vec<Arc<Endpoint>>,
    /// Whether the control plane has answered at all (until then nothing is known).
    pub known: bool,
    /// Whether the service exists (a service with no endpoints does; a name nobody defined
    /// does not, and its traffic keeps its original destination).
    pub exists: bool,
    /// The service's failure accrual series (made on its first endpoint state change).
    pub accrual: Arc<accrual::ServiceAccrual>,
    /// Its endpoints are in more than one cluster (a federated Service), so each
    /// request is labelled with the cluster of the endpoint it went to
    /// ([`spans_clusters`]); worked out once per update, not per request.
    pub spans_clusters: bool,
    /// `outbound_connect_retries_total` of the service: requests sent to another endpoint
    /// because no connection to the one picked could be made.
    pub connect_retries: Counter,
}

impl Endpoints {
    /// Worth routing to: known to exist (even with no endpoints: that answers 503).
    pub fn routable(&self) -> bool {
        self.known && self.exists
    }
}

/// What the control plane says about an address.
#[derive(Debug, Default, Clone)]
pub struct Profile {
    /// The service this address belongs to (a ClusterIP), `name.ns.svc.<domain>`.
    pub service: Option<String>,
    /// The single endpoint this address is (a pod IP), with its identity.
    pub endpoint: Option<Arc<Endpoint>>,
}

/// Distinct lookups kept before the caches are reset (their streams then end).
const MAX_LOOKUPS: usize = 4096;

/// `outbound_endpoints`' label: the service's authority.
#[derive(Debug, Clone, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
pub struct ServiceLabels {
    pub authority: String,
}

pub struct Discovery {
    channel: Channel,
    profiles: Mutex<HashMap<SocketAddr, watch::Receiver<Option<Profile>>>>,
    services: Mutex<HashMap<String, watch::Receiver<Arc<Endpoints>>>>,
    /// How long a new connection waits for the control plane's first answer before it is
    /// forwarded to its original destination as if undiscovered.
    first_answer: Duration,
    max_backoff: Duration,
    metrics: DiscoveryMetrics,
    /// The `context_token` of every request: empty, or the gateway's marker ([`Self::for_gateway`]).
    context_token: Arc<str>,
}

/// The families discovery and its balancers count into: `outbound_endpoints`, failure
/// accrual's ([`accrual::AccrualMetrics`]) and `outbound_connect_retries_total`.
#[derive(Debug, Clone, Default)]
pub struct DiscoveryMetrics {
    pub endpoints: Family<ServiceLabels, Gauge>,
    pub accrual: accrual::AccrualMetrics,
    pub connect_retries: Family<ServiceLabels, Counter>,
    pub streams: follow::StreamMetrics,
}

/// The cached receiver for `key`, starting its stream with `start` on first use (every
/// control-plane lookup keyed by target shares it).
pub(crate) fn shared<K: std::hash::Hash + Eq + Clone, V>(
    map: &Mutex<HashMap<K, watch::Receiver<V>>>,
    key: &K,
    start: impl FnOnce() -> watch::Receiver<V>,
) -> watch::Receiver<V> {
    let mut map = map.lock();
    if let Some(rx) = map.get(key) {
        return rx.clone();
    }
    if map.len() >= MAX_LOOKUPS {
        map.clear();
    }
    let rx = start();
    map.insert(key.clone(), rx.clone());
    rx
}

impl Discovery {
    pub fn new(channel: Channel, first_answer: Duration, max_backoff: Duration, metrics: DiscoveryMetrics) -> Self {
        Self {
            channel,
            profiles: Mutex::default(),
            services: Mutex::default(),
            first_answer,
            max_backoff,
            metrics,
            context_token: Arc::from(""),
        }
    }

    /// Discovery for a multicluster gateway. Every request says so in its
    /// `context_token`, and the control plane answers as if only the Services exported through
    /// the gateway (`mirror.cnimesh.io/exported=true`) existed: any other Service, and any
    /// address, is unknown to this proxy. Every lookup of this proxy carries the marker, so
    /// it has one view only and nothing it caches can be another caller's.
    pub fn for_gateway(mut self) -> Self {
        let token = serde_json::json!({ CONTEXT_TOKEN_CALLER_KEY: CONTEXT_TOKEN_GATEWAY });
        self.context_token = Arc::from(token.to_string());
        self
    }

    fn client(&self) -> DestinationClient<Channel> {
        DestinationClient::new(self.channel.clone())
    }

    /// What is known of `target`, waiting (bounded) for the first answer, and the watch that
    /// tells of later answers. `None` when the control plane has not answered: the caller treats
    /// the address as undiscovered.
    pub async fn profile(self: &Arc<Self>, target: SocketAddr) -> (Option<Profile>, watch::Receiver<Option<Profile>>) {
        let mut rx = shared(&self.profiles, &target, || {
            let (tx, rx) = watch::channel(None);
            let counted = self.metrics.streams.of(follow::StreamKind::profile);
            tokio::spawn(follow::profile(
                self.client(),
                self.context_token.clone(),
                target,
                tx,
                self.max_backoff,
                counted,
            ));
            rx
        });
        if rx.borrow().is_none() {
            let _ = tokio::time::timeout(self.first_answer, rx.wait_for(Option::is_some)).await;
        }
        let profile = rx.borrow_and_update().clone();
        (profile, rx)
    }

    /// The live endpoints of `authority` (`name.ns.svc.<domain>:port`), after waiting (bounded)
    /// for the first answer.
    pub async fn endpoints(self: &Arc<Self>, authority: &str) -> watch::Receiver<Arc<Endpoints>> {
        let mut rx = shared(&self.services, &authority.to_string(), || {
            let (tx, rx) = watch::channel(Arc::new(Endpoints::default()));
            let gauge = ServiceLabels { authority: authority.to_string() };
            tokio::spawn(follow::endpoints(
                self.client(),
                self.context_token.clone(),
                authority.to_string(),
                tx,
                self.max_backoff,
                (self.metrics.clone(), gauge),
            ));
            rx
        });
        if !rx.borrow().known {
            let _ = tokio::time::timeout(self.first_answer, rx.wait_for(|e| e.known)).await;
        }
        rx
    }
}

/// Every lookup a proxy follows with its last answer: profiles by address (`None`: not answered
/// yet) and endpoint sets by service authority.
pub struct Snapshot {
    pub profiles: Vec<(SocketAddr, Option<Profile>)>,
    pub services: Vec<(String, Arc<Endpoints>)>,
}

impl Discovery {
    /// What the admin server's `/endpoints.json` shows.
    pub fn snapshot(&self) -> Snapshot {
        let profiles = self.profiles.lock();
        let mut profiles: Vec<_> = profiles.iter().map(|(addr, rx)| (*addr, rx.borrow().clone())).collect();
        profiles.sort_by_key(|(addr, _)| *addr);
        let services = self.services.lock();
        let mut services: Vec<_> = services.iter().map(|(name, rx)| (name.clone(), rx.borrow().clone())).collect();
        services.sort_by(|a, b| a.0.cmp(&b.0));
        Snapshot { profiles, services }
    }
}

/// An endpoint from the API's form; `None` when it has no usable address.
fn endpoint(addr: &api::WeightedAddr) -> Option<Endpoint> {
    let tcp = addr.addr?;
    let ip = std::net::IpAddr::try_from(tcp.ip?).ok()?;
    // An endpoint the control plane says is meshed, with an identity we cannot check, is left
    // out rather than dialled in plaintext.
    let identity = match addr.tls_identity.as_ref() {
        None => None,
        Some(t) => match &t.strategy {
            Some(api::tls_identity::Strategy::DnsLikeIdentity(d)) => match d.name.parse() {
                Ok(name) => Some(name),
                Err(e) => {
                    tracing::warn!(error = %e, "endpoint with an invalid identity left out");
                    return None;
                }
            },
            other => {
                tracing::warn!(identity = ?other, "endpoint with an identity kind we cannot verify left out");
                return None;
            }
        },
    };
    let mut addr_port = u16::try_from(tcp.port).ok()?;
    let target_cluster =
        addr.metric_labels.get(cnimesh_common::names::TARGET_CLUSTER_METRIC_LABEL).map(|c| c.as_str().into());
    // Opaque transport (a multicluster gateway) means the transport header, which
    // only makes sense over mTLS and with the authority it names; anything less is left out
    // rather than sent somewhere it cannot be routed.
    let opaque_transport = addr.protocol_hint.as_ref().and_then(|h| h.opaque_transport.as_ref());
    let gateway = match opaque_transport {
        None => None,
        Some(transport) => {
            let override_ = addr.authority_override.as_ref().map(|a| a.authority_override.as_str());
            let Some(gateway) = override_.and_then(GatewayTarget::parse).filter(|_| identity.is_some()) else {
                tracing::warn!(authority = ?override_, "gateway endpoint without an identity or a valid authority override left out");
                return None;
            };
            addr_port = u16::try_from(transport.inbound_port).ok().filter(|p| *p != 0)?;
            Some(Arc::new(gateway))
        }
    };
    let opaque = matches!(
        addr.protocol_hint.as_ref().and_then(|h| h.protocol.as_ref()),
        Some(api::protocol_hint::Protocol::Opaque(_))
    );
    Some(Endpoint {
        addr: SocketAddr::new(ip, addr_port),
        identity,
        gateway,
        target_cluster,
        opaque,
        stats: Arc::default(),
    })
}
