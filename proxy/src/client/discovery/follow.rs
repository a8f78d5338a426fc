//! The long-lived Destination streams behind discovery, one per lookup, re-opened with jittered
//! backoff ([`crate::transport::backoff`]) when they fail; the last answer stays published meanwhile. A
//! stream ends when nobody holds its receiver any more.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use linkerd2_proxy_api::destination::{self as api, destination_client::DestinationClient, update};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::watch;
use tonic::transport::Channel;

use super::accrual::ServiceAccrual;
use super::{DiscoveryMetrics, ServiceLabels};
use super::{Endpoint, Endpoints, Profile, endpoint};

/// Which kind of control-plane stream a count is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum StreamKind {
    inbound_policy,
    outbound_policy,
    endpoints,
    profile,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct StreamLabels {
    pub stream: StreamKind,
}

/// What the control plane's streams did, by kind: each message received and handed to its
/// stream's `apply` (which applies it, or refuses it and keeps the last good answer), and each
/// failure (a stream that broke, or could not be opened). A change has reached the proxy once its
/// stream's message count has moved: an operator sees the proxy hear its control plane, and a
/// test waits on the count instead of sleeping.
#[derive(Debug, Clone, Default)]
pub struct StreamMetrics {
    pub messages: Family<StreamLabels, Counter>,
    pub failures: Family<StreamLabels, Counter>,
}

impl StreamMetrics {
    /// The counters of one kind of stream.
    pub fn of(&self, stream: StreamKind) -> StreamCounters {
        let labels = StreamLabels { stream };
        StreamCounters {
            messages: self.messages.get_or_create(&labels).clone(),
            failures: self.failures.get_or_create(&labels).clone(),
        }
    }
}

/// [`StreamMetrics`]' counters of one kind of stream.
#[derive(Debug, Clone)]
pub struct StreamCounters {
    messages: Counter,
    failures: Counter,
}

/// Opens a stream with `open` and feeds its messages to `apply` (`true` for the first message
/// of each stream: a fresh snapshot) until `closed`, retrying with backoff; each message and
/// each failure is counted in `counted`.
pub(crate) async fn retrying<M, F, Fut>(
    what: String,
    max_backoff: Duration,
    counted: StreamCounters,
    mut open: F,
    mut apply: impl FnMut(M, bool),
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<tonic::Streaming<M>, tonic::Status>>,
{
    let mut delay = Duration::ZERO;
    loop {
        match open().await {
            Ok(mut stream) => {
                let mut first = true;
                loop {
                    match stream.message().await {
                        Ok(Some(m)) => {
                            apply(m, first);
                            counted.messages.inc();
                            first = false;
                            delay = Duration::ZERO;
                        }
                        Ok(None) => break,
                        Err(e) => {
                            counted.failures.inc();
                            tracing::warn!(lookup = %what, error = %cnimesh_identity::grpc_channel::describe(&e), "discovery stream failed; keeping the last answer");
                            break;
                        }
                    }
                }
            }
            // The control plane's answer that it has nothing for this lookup (a policy asked of
            // an address it does not know), not an outage: asked again later.
            Err(e) if e.code() == tonic::Code::NotFound => {
                tracing::debug!(lookup = %what, error = %cnimesh_identity::grpc_channel::describe(&e), "nothing known for this lookup")
            }
            Err(e) => {
                counted.failures.inc();
                tracing::warn!(lookup = %what, error = %cnimesh_identity::grpc_channel::describe(&e), "discovery unavailable; keeping the last answer")
            }
        }
        let (next, jittered) = crate::transport::backoff::backoff(delay, max_backoff);
        delay = next;
        tokio::time::sleep(jittered).await;
    }
}

fn request(path: String, context_token: &str) -> api::GetDestination {
    api::GetDestination { scheme: "k8s".into(), path, context_token: context_token.to_string() }
}

pub async fn profile(
    client: DestinationClient<Channel>,
    context_token: Arc<str>,
    target: SocketAddr,
    tx: watch::Sender<Option<Profile>>,
    max_backoff: Duration,
    counted: StreamCounters,
) {
    let open = || {
        let mut client = client.clone();
        let request = request(target.to_string(), &context_token);
        async move { client.get_profile(request).await.map(tonic::Response::into_inner) }
    };
    let apply = |p: api::DestinationProfile, _first| {
        let service = Some(p.fully_qualified_name).filter(|n| !n.is_empty());
        let endpoint = p.endpoint.as_ref().and_then(endpoint).map(Arc::new);
        tx.send_replace(Some(Profile { service, endpoint }));
    };
    tokio::select! {
        () = tx.closed() => {}
        () = retrying(format!("profile {target}"), max_backoff, counted, open, apply) => {}
    }
}

pub async fn endpoints(
    client: DestinationClient<Channel>,
    context_token: Arc<str>,
    authority: String,
    tx: watch::Sender<Arc<Endpoints>>,
    max_backoff: Duration,
    (metrics, gauge): (DiscoveryMetrics, ServiceLabels),
) {
    let accrual = Arc::new(ServiceAccrual::new(metrics.accrual.clone(), authority.clone()));
    let counted = metrics.streams.of(StreamKind::endpoints);
    let retries = metrics.connect_retries.get_or_create(&gauge).clone();
    let (metrics, retries_family) = (metrics.endpoints, metrics.connect_retries);
    // Endpoints by address, so balancing statistics survive updates.
    let mut current: HashMap<SocketAddr, Arc<Endpoint>> = HashMap::new();
    let open = || {
        let mut client = client.clone();
        let request = request(authority.clone(), &context_token);
        async move { client.get(request).await.map(tonic::Response::into_inner) }
    };
    let apply = |u: api::Update, first: bool| {
        // A re-opened stream starts over with the full set: forget what it no longer has.
        let mut next = if first { HashMap::new() } else { current.clone() };
        let mut exists = true;
        match u.update {
            Some(update::Update::Add(set)) => {
                for mut e in set.addrs.iter().filter_map(endpoint) {
                    if let Some(known) = current.get(&e.addr) {
                        e.stats = known.stats.clone();
                    }
                    next.insert(e.addr, Arc::new(e));
                }
            }
            Some(update::Update::Remove(set)) => {
                for a in set.addrs {
                    let port = a.port;
                    if let Some(ip) = a.ip.and_then(|ip| std::net::IpAddr::try_from(ip).ok())
                        && let Ok(port) = u16::try_from(port)
                    {
                        next.remove(&SocketAddr::new(ip, port));
                    }
                }
            }
            Some(update::Update::NoEndpoints(ref none)) => {
                next.clear();
                exists = none.exists;
            }
            None => return,
        }
        current = next;
        let mut list: Vec<_> = current.values().cloned().collect();
        list.sort_by_key(|e| e.addr);
        tracing::debug!(%authority, endpoints = list.len(), "endpoints updated");
        metrics.get_or_create(&gauge).set(list.len() as i64);
        accrual.recount(list.iter().filter(|e| !e.stats.health.is_available()).count());
        let spans_clusters = super::spans_clusters(&list);
        let connect_retries = retries.clone();
        tx.send_replace(Arc::new(Endpoints {
            list,
            known: true,
            exists,
            accrual: accrual.clone(),
            spans_clusters,
            connect_retries,
        }));
    };
    tokio::select! {
        () = tx.closed() => {}
        () = retrying(format!("endpoints {authority}"), max_backoff, counted, open, apply) => {}
    }
    metrics.remove(&gauge);
    retries_family.remove(&gauge);
    accrual.remove();
}
