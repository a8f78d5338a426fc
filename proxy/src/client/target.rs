//! Where a target's requests go: one fixed upstream (the original destination, with the
//! identity it is known to have), or a discovered service's endpoints, balanced per request
//! (HTTP) or per connection (opaque). Each endpoint's [`Upstream`] is built once and kept here.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::client::discovery::accrual::{Accruing, Admission, ConsecutiveFailures};
use crate::client::discovery::balance::{self, Load};
/// Whether a service's endpoints span clusters is a property of its endpoint set, worked out by
/// discovery; routes read it from there.
pub use crate::client::discovery::spans_clusters;
use crate::client::discovery::{Endpoint, Endpoints, cluster_of};
use crate::client::upstream::Upstream;
use crate::transport::identity::Identity;
use crate::transport::labels::TlsLabel;
use crate::transport::tls::{self, UpstreamTls};

pub enum Route {
    Fixed(Arc<Upstream>),
    Balanced(Balanced),
}

/// A service's live endpoints and a client per endpoint.
pub struct Balanced {
    pub service: String,
    endpoints: watch::Receiver<Arc<Endpoints>>,
    identity: Option<Arc<Identity>>,
    connect_timeout: Duration,
    upstreams: Mutex<HashMap<SocketAddr, Arc<Upstream>>>,
}

/// A chosen upstream; `load` counts it as in flight on its endpoint until dropped.
pub struct Picked {
    pub upstream: Arc<Upstream>,
    pub load: Option<Load>,
    /// The linked cluster of the endpoint picked ([`cluster_of`]), so that a
    /// federated Service's requests are labelled with the cluster each one went to.
    pub cluster: Option<Arc<str>>,
}

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("service {0} has no endpoints")]
    NoEndpoints(String),
    #[error("{0}")]
    NoIdentity(&'static str),
}

impl Route {
    pub fn fixed(addr: SocketAddr, tls: Option<UpstreamTls>, connect_timeout: Duration) -> Self {
        Route::Fixed(Arc::new(Upstream::new(addr, tls, connect_timeout)))
    }

    pub fn balanced(
        service: String,
        endpoints: watch::Receiver<Arc<Endpoints>>,
        identity: Option<Arc<Identity>>,
        connect_timeout: Duration,
    ) -> Self {
        Route::Balanced(Balanced { service, endpoints, identity, connect_timeout, upstreams: Mutex::default() })
    }

    /// An upstream for one request or connection. `accrual`, the Service's failure accrual
    /// (HTTP requests whose outbound policy has one), keeps failed endpoints out of the pick.
    pub fn pick(&self, accrual: Option<&ConsecutiveFailures>) -> Result<Picked, RouteError> {
        match self {
            Route::Fixed(upstream) => Ok(Picked { upstream: upstream.clone(), load: None, cluster: None }),
            Route::Balanced(b) => b.pick(accrual),
        }
    }

    /// Whether the control plane says, now, that the service exists (a fixed route:
    /// always). A cached target outlives its Service: a gateway checks this for every
    /// connection, so a Service unexported (or deleted) stops being reachable at once.
    pub fn routable(&self) -> bool {
        match self {
            Route::Fixed(_) => true,
            Route::Balanced(b) => b.endpoints.borrow().routable(),
        }
    }

    /// `target_cluster_name` of a service whose endpoints are all in one linked
    /// cluster (a mirror); `None` for the cluster's own (its series keep their label set) and
    /// for one spanning clusters (a federated Service), whose requests are labelled per endpoint
    /// instead ([`Picked::cluster`]).
    pub fn target_cluster(&self) -> Option<Arc<str>> {
        let Route::Balanced(Balanced { endpoints, .. }) = self else { return None };
        let set = endpoints.borrow();
        let first = cluster_of(set.list.first()?)?.clone();
        set.list.iter().all(|e| cluster_of(e).map(|c| &**c) == Some(&*first)).then_some(first)
    }

    /// Whether Destination says, now, that every endpoint takes this port as opaque (and there
    /// is one); a fixed route: never known. A multicluster gateway forwards opaque sessions only
    /// to such a target: on any other port the target's proxy may read HTTP from the bytes,
    /// and believe headers in them no proxy set.
    pub fn declared_opaque(&self) -> bool {
        let Route::Balanced(b) = self else { return false };
        let set = b.endpoints.borrow();
        !set.list.is_empty() && set.list.iter().all(|e| e.opaque)
    }

    /// Whether its requests are labelled per endpoint (a federated Service spanning
    /// clusters); read per request, so it follows the endpoints as they change.
    pub fn spans_clusters(&self) -> bool {
        matches!(self, Route::Balanced(b) if b.endpoints.borrow().spans_clusters)
    }

    /// The connection's TLS label: for a service, `tls="true"` when every endpoint is meshed,
    /// with `server_id` when they share one identity.
    pub fn tls_label(&self) -> TlsLabel {
        match self {
            Route::Fixed(u) => u.tls.as_ref().map_or_else(TlsLabel::plaintext, UpstreamTls::label),
            Route::Balanced(Balanced { endpoints, identity, .. }) => {
                let set = endpoints.borrow();
                let ids: Vec<_> = set.list.iter().map(|e| e.identity.as_ref()).collect();
                if identity.is_none() || ids.is_empty() || ids.iter().any(Option::is_none) {
                    return TlsLabel::plaintext();
                }
                let first = ids[0];
                let server_id = ids.iter().all(|i| *i == first).then(|| first.map(ToString::to_string)).flatten();
                TlsLabel { tls: true, client_id: None, server_id }
            }
        }
    }
}

impl Balanced {
    fn pick(&self, accrual: Option<&ConsecutiveFailures>) -> Result<Picked, RouteError> {
        let set = self.endpoints.borrow().clone();
        let no_endpoints = || RouteError::NoEndpoints(self.service.clone());
        let Some(policy) = accrual else {
            let (endpoint, other) = balance::pick(&set.list, |e| &e.stats).ok_or_else(no_endpoints)?;
            return self.picked(endpoint, other, &set, None);
        };
        // The clock is read only when an endpoint is out (a healthy service's requests never).
        let clock = std::cell::OnceCell::new();
        let now = || *clock.get_or_init(Instant::now);
        let eligible = |e: &Arc<Endpoint>| e.stats.health.is_available() || e.stats.health.eligible(now());
        let admit = |e: &Arc<Endpoint>| {
            if e.stats.health.is_available() { Some(Admission::Normal) } else { e.stats.health.admit(now()) }
        };
        // An endpoint may stop being eligible between the pick and its admission (another
        // request took its one probe): pick again once, then fall back.
        for _ in 0..2 {
            let Some((endpoint, other)) = balance::pick_where(&set.list, |e| &e.stats, eligible) else {
                break;
            };
            if let Some(admission) = admit(endpoint) {
                let accruing = Accruing::new(*policy, admission, set.accrual.clone(), endpoint.addr);
                return self.picked(endpoint, other, &set, Some(accruing));
            }
        }
        // Every endpoint is out: tried anyway, as if none were (no blackout of the service).
        let (endpoint, other) = balance::pick(&set.list, |e| &e.stats).ok_or_else(no_endpoints)?;
        let admission = admit(endpoint).unwrap_or(Admission::Fallback);
        let accruing = Accruing::new(*policy, admission, set.accrual.clone(), endpoint.addr);
        self.picked(endpoint, other, &set, Some(accruing))
    }

    fn picked(
        &self,
        endpoint: &Arc<Endpoint>,
        other: Option<&Arc<Endpoint>>,
        set: &Endpoints,
        accruing: Option<Accruing>,
    ) -> Result<Picked, RouteError> {
        // The load first: an error below still ends it (and frees a probe's slot).
        let load = Load::accruing(endpoint.stats.clone(), accruing);
        let upstream = self.upstream(endpoint, set)?;
        if let Some(other) = other {
            other.stats.passed_over();
        }
        Ok(Picked { upstream, load: Some(load), cluster: cluster_of(endpoint).cloned() })
    }

    /// The endpoint's client, built on first use (again if its identity changed).
    fn upstream(&self, endpoint: &Endpoint, set: &Endpoints) -> Result<Arc<Upstream>, RouteError> {
        let mut upstreams = self.upstreams.lock();
        if let Some(u) = upstreams.get(&endpoint.addr)
            && u.tls.as_ref().map(|t| &t.server_id) == endpoint.identity.as_ref()
            && u.gateway == endpoint.gateway
        {
            return Ok(u.clone());
        }
        let tls = tls::outbound(self.identity.as_deref(), endpoint.identity.clone()).map_err(RouteError::NoIdentity)?;
        // A gateway is only ever reached over mTLS (the transport header tells it
        // where to go; in plaintext anyone could read or forge it).
        if endpoint.gateway.is_some() && tls.is_none() {
            return Err(RouteError::NoIdentity("no identity of our own for mTLS to a multicluster gateway"));
        }
        let upstream =
            Arc::new(Upstream::new(endpoint.addr, tls, self.connect_timeout).with_gateway(endpoint.gateway.clone()));
        // Endpoints that left the set take their connections with them.
        if upstreams.len() >= set.list.len() + 8 {
            upstreams.retain(|addr, _| set.list.iter().any(|e| e.addr == *addr));
        }
        upstreams.insert(endpoint.addr, upstream.clone());
        Ok(upstream)
    }
}
