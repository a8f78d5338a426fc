//! The outbound side: what an application's connection is for (its original destination, a
//! discovered service, or a service a request names), resolved once per target into a cached
//! [`targets::Target`] with its balancer and per-endpoint clients ([`upstream::Upstream`]).

pub mod target;
pub mod targets;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::shared::Shared;
use crate::transport::tls;
use target::Route;
use targets::Target;

/// An outbound connection's target: a discovered service's endpoints, or its original
/// destination with the identity it is known to have (from discovery or configuration).
pub async fn resolve(addr: SocketAddr, shared: &Shared) -> anyhow::Result<Arc<Target>> {
    if let Some(target) = shared.outbound.by_addr.get(&addr) {
        return Ok(target);
    }
    let timeout = shared.config.connect_timeout;
    let mut expected = shared.static_identities.identity(addr);
    let mut watch = None;
    if let Some(discovery) = &shared.discovery {
        let (profile, rx) = discovery.profile(addr).await;
        let Some(profile) = profile else {
            // No answer yet: not cached, the next connection asks again.
            let tls = tls::outbound(shared.identity.as_deref(), expected).map_err(|why| anyhow::anyhow!(why))?;
            return Ok(Target::new(Route::fixed(addr, tls, timeout)));
        };
        if let Some(service) = profile.service {
            let authority = format!("{service}:{}", addr.port());
            let endpoints = discovery.endpoints(&authority).await;
            // Never heard back about the service: let the original destination handle it.
            if endpoints.borrow().routable() {
                let target = Target::new(Route::balanced(authority, endpoints, shared.identity.clone(), timeout));
                shared.outbound.by_addr.insert(addr, target.clone(), Some(rx));
                return Ok(target);
            }
            tracing::warn!(%addr, %authority, "no answer about the service yet; forwarding to the original destination");
            let tls = tls::outbound(shared.identity.as_deref(), expected).map_err(|why| anyhow::anyhow!(why))?;
            return Ok(Target::new(Route::fixed(addr, tls, timeout)));
        }
        if let Some(identity) = profile.endpoint.and_then(|e| e.identity.clone()) {
            expected = Some(identity);
        }
        watch = Some(rx);
    }
    let tls = tls::outbound(shared.identity.as_deref(), expected).map_err(|why| anyhow::anyhow!(why))?;
    let target = Target::new(Route::fixed(addr, tls, timeout));
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
