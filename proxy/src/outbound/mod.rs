//! The outbound side: what an application's connection is for (its original destination, a
//! discovered service, or a service a request names), resolved once per target into a cached
//! [`targets::Target`] with its balancer and per-endpoint clients ([`upstream::Upstream`]).

pub mod policy;
pub mod routes;
pub mod static_identities;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::app::shared::Shared;
use crate::client::target::Route;
use crate::client::targets::Target;
use crate::transport::tls;

/// An outbound connection's target: a discovered service's endpoints, or its original
/// destination with the identity it is known to have (from discovery or configuration). Its
/// profile and its outbound policy are asked for together (each wait is bounded).
pub async fn resolve(addr: SocketAddr, shared: &Shared) -> anyhow::Result<Arc<Target>> {
    if let Some(target) = shared.outbound.by_addr.get(&addr) {
        return Ok(target);
    }
    let timeout = shared.config.connect_timeout;
    let mut expected = shared.static_identities.identity(addr);
    let mut watch = None;
    let policy = async {
        match &shared.outbound_policies {
            Some(policies) => Some(policies.target(addr).await),
            None => None,
        }
    };
    let profile = async {
        match &shared.discovery {
            Some(discovery) => Some(discovery.profile(addr).await),
            None => None,
        }
    };
    let (policy, profile) = tokio::join!(policy, profile);
    let fixed = |expected| -> anyhow::Result<Arc<Target>> {
        let tls = tls::outbound(shared.identity.as_deref(), expected).map_err(|why| anyhow::anyhow!(why))?;
        Ok(Target::with_policy(Route::fixed(addr, tls, timeout), policy.clone()))
    };
    if let (Some(discovery), Some((profile, rx))) = (&shared.discovery, profile) {
        // No answer yet: not cached, the next connection asks again.
        let Some(profile) = profile else { return fixed(expected) };
        if let Some(service) = profile.service {
            let authority = format!("{service}:{}", addr.port());
            let endpoints = discovery.endpoints(&authority).await;
            // Never heard back about the service: let the original destination handle it.
            if endpoints.borrow().routable() {
                let route = Route::balanced(authority, endpoints, shared.identity.clone(), timeout);
                let target = Target::with_policy(route, policy.clone());
                shared.outbound.by_addr.insert(addr, target.clone(), Some(rx));
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
    shared.outbound.by_addr.insert(addr, target.clone(), watch);
    Ok(target)
}

/// The target of a service a request names in its authority (`web.shop.svc.cluster.local`),
/// or `None` when it is not a known service.
pub async fn service(authority: &str, shared: &Shared) -> Option<Arc<Target>> {
    let discovery = shared.discovery.as_ref()?;
    if let Some(target) = shared.outbound.by_service.get(&authority.to_string()) {
        return Some(target);
    }
    let endpoints = discovery.endpoints(authority).await;
    if !endpoints.borrow().routable() {
        return None;
    }
    let route =
        Route::balanced(authority.to_string(), endpoints, shared.identity.clone(), shared.config.connect_timeout);
    let target = Target::new(route);
    shared.outbound.by_service.insert(authority.to_string(), target.clone(), None);
    Some(target)
}
