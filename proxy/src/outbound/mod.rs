//! The outbound side: what an application's connection is for (its original destination, a
//! discovered service, or a service a request names), resolved once per target into a cached
//! [`targets::Target`] with its balancer and per-endpoint clients ([`upstream::Upstream`]).
//! Addresses outside the cluster that an EgressNetwork holds are seen by hostname and allowed
//! or refused by its policy ([`egress`]). [`http`] decides each HTTP request (its route).

pub mod egress;
pub mod http;
pub mod ingress;
pub mod policy;
pub mod routes;
pub mod static_identities;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::client::discovery::Discovery;
use crate::client::target::Route;
use crate::client::targets::{Target, Targets};
use crate::transport::conn_error::ConnError;
use crate::transport::identity::Identity;
use crate::transport::tls;
use policy::discover::{OutboundPolicies, PolicyWatch};
use routes::metrics::RouteMetrics;
use static_identities::MeshedEndpoints;

/// What the outbound side keeps for every connection: resolved targets and how to resolve more.
pub struct Outbound {
    pub connect_timeout: Duration,
    /// Present when the proxy has an identity (and so does mTLS).
    pub identity: Option<Arc<Identity>>,
    /// Present when a Destination service is configured.
    pub discovery: Option<Arc<Discovery>>,
    /// Meshed endpoints fixed by configuration (`CNIMESH_PROXY_OUTBOUND_IDENTITIES`), for
    /// destinations discovery does not resolve.
    pub static_identities: MeshedEndpoints,
    /// Present when outbound policy discovery is configured; without it connections detect
    /// their protocol unless their port is configured opaque.
    pub policies: Option<Arc<OutboundPolicies>>,
    /// By original destination.
    pub by_addr: Targets<std::net::SocketAddr>,
    /// By service authority (`name.ns.svc.<domain>:port`), for requests that name one.
    pub by_service: Targets<String>,
    pub routes: Arc<RouteMetrics>,
    /// Egress connections, requests and refusals by hostname.
    pub egress: Arc<egress::EgressMetrics>,
    /// Egress hostnames bound to the addresses the pod's resolver gives them.
    pub egress_names: Arc<egress::names::Names>,
    /// Ingress mode: HTTP requests go to the Service they name ([`ingress`]).
    pub ingress: Option<ingress::Ingress>,
}

/// A target carrying its outbound policy, read back with [`policy_of`].
fn with_policy(route: Route, policy: Option<PolicyWatch>) -> Arc<Target> {
    let mut extensions = ::http::Extensions::new();
    if let Some(policy) = policy {
        extensions.insert(policy);
    }
    Target::with_extensions(route, extensions)
}

/// The control plane's outbound policy for a target (outbound targets, with policy discovery).
pub fn policy_of(target: &Target) -> Option<&PolicyWatch> {
    target.extensions.get::<PolicyWatch>()
}

/// An outbound connection's target: a discovered service's endpoints, or its original
/// destination with the identity it is known to have (from discovery or configuration). Its
/// profile and its outbound policy are asked for together (each wait is bounded).
pub async fn resolve(addr: SocketAddr, outbound: &Outbound) -> Result<Arc<Target>, ConnError> {
    if let Some(target) = outbound.by_addr.get(&addr) {
        return Ok(target);
    }
    let timeout = outbound.connect_timeout;
    let mut expected = outbound.static_identities.identity(addr);
    let mut watch = None;
    let policy = async {
        match &outbound.policies {
            Some(policies) => Some(policies.target(addr).await),
            None => None,
        }
    };
    let profile = async {
        match &outbound.discovery {
            Some(discovery) => Some(discovery.profile(addr).await),
            None => None,
        }
    };
    let (policy, profile) = tokio::join!(policy, profile);
    let fixed = |expected| -> Result<Arc<Target>, ConnError> {
        let tls =
            tls::outbound(outbound.identity.as_deref(), expected).map_err(|why| ConnError::NoTarget { addr, why })?;
        Ok(with_policy(Route::fixed(addr, tls, timeout), policy.clone()))
    };
    if let (Some(discovery), Some((profile, rx))) = (&outbound.discovery, profile) {
        // No answer yet: not cached, the next connection asks again.
        let Some(profile) = profile else { return fixed(expected) };
        if let Some(service) = profile.service {
            let authority = format!("{service}:{}", addr.port());
            let endpoints = discovery.endpoints(&authority).await;
            // Never heard back about the service: let the original destination handle it.
            if endpoints.borrow().routable() {
                let route = Route::balanced(authority, endpoints, outbound.identity.clone(), timeout);
                let target = with_policy(route, policy.clone());
                outbound.by_addr.insert(addr, target.clone(), Some(rx));
                return Ok(target);
            }
            tracing::warn!(%addr, %authority, "no answer about the service yet; forwarding to the original destination");
            return fixed(expected);
        }
        if let Some(identity) = profile.endpoint.and_then(|e| e.identity.clone()) {
            expected = Some(identity);
        }
        watch = Some(rx);
    }
    let target = fixed(expected)?;
    outbound.by_addr.insert(addr, target.clone(), watch);
    Ok(target)
}

/// The target of a service a request names in its authority (`web.shop.svc.cluster.local`),
/// or `None` when it is not a known service. In ingress mode it carries the Service port's
/// outbound policy (asked for by name, together with its endpoints).
pub async fn service(authority: &str, outbound: &Outbound) -> Option<Arc<Target>> {
    if let Some(target) = outbound.by_service.get(&authority.to_string()) {
        return Some(target);
    }
    let discovery = outbound.discovery.as_ref()?;
    let policy = async {
        match (&outbound.ingress, &outbound.policies) {
            (Some(_), Some(policies)) => Some(policies.service(authority).await),
            _ => None,
        }
    };
    let (endpoints, policy) = tokio::join!(discovery.endpoints(authority), policy);
    if !endpoints.borrow().routable() {
        return None;
    }
    let route = Route::balanced(authority.to_string(), endpoints, outbound.identity.clone(), outbound.connect_timeout);
    let target = with_policy(route, policy);
    outbound.by_service.insert(authority.to_string(), target.clone(), None);
    Some(target)
}
