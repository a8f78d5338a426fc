//! The outbound request path, up to the decision: in ingress mode the Service port the request
//! names ([`crate::outbound::ingress`]), whose routes then decide it; the route that takes a
//! request (its rule, filters, backend and the backend's target, an EgressNetwork's verdict on
//! it) or the proxy's own answer ([`OutboundHttp::decide`]), and the Service a request names
//! when it has no route ([`OutboundHttp::named_target`]); then the decided request's way to its
//! target, under its route's timeout and retries ([`OutboundHttp::forward`]).

mod exchange;
pub mod routed;

use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderValue, Request};
use parking_lot::Mutex;

use crate::client::target::Route;
use crate::client::targets::Target;
use crate::http::decision::{Answer, AnswerKind, Decision};
use crate::http::error::{ProxyError, error_response};
use crate::outbound::Outbound;
use crate::outbound::ingress::OverrideError;
pub use exchange::{Exchanged, Try, TryTo};
use routed::{ConnRoutes, Routed};

/// One outbound connection's request path: its target and what its requests used.
pub struct OutboundHttp {
    pub target: Arc<Target>,
    /// The connection's original destination.
    pub addr: SocketAddr,
    /// What this connection's routed requests used (backend targets, metric handles).
    routes: ConnRoutes,
    /// Services this connection's requests named (`None`: not a known service).
    named: Mutex<Vec<(String, Option<Arc<Target>>)>>,
    /// A gateway connection's requests never follow a Service they name: the connection was
    /// admitted for its target alone (the gateway is not an open proxy).
    pinned: bool,
    /// A gateway's connection: its client's verified identity, set on every request it
    /// forwards as [`crate::http::headers::GATEWAY_CLIENT_ID`].
    pub gateway_client: Option<HeaderValue>,
}

/// Services a connection remembers the target of; beyond, no memo.
const MAX_NAMED: usize = 8;

/// Where an outbound request goes, as decided before anything is sent.
pub struct Decided {
    /// The route that took it (`None`: its target's policy has no routes for it).
    pub routed: Option<Routed>,
    /// Ingress mode: the Service port the request named, whose policy decided it (`None`: the
    /// connection's target's did).
    pub service: Option<Arc<Target>>,
}

impl OutboundHttp {
    pub fn new(target: Arc<Target>, addr: SocketAddr) -> Self {
        Self {
            target,
            addr,
            routes: ConnRoutes::default(),
            named: Mutex::default(),
            pinned: false,
            gateway_client: None,
        }
    }

    /// A gateway's connection: pinned to its target, each request carrying `client` there.
    pub fn for_gateway(self, pinned: bool, client: Option<&cnimesh_identity::Name>) -> Self {
        let gateway_client = client.and_then(|c| HeaderValue::from_str(c.as_str()).ok());
        Self { pinned, gateway_client, ..self }
    }

    /// Where `req` goes under its target's outbound policy: the route that takes it (`None`
    /// without routes for its protocol: to the target as before), or the proxy's own answer (no
    /// route matches, a fault the route injects, an EgressNetwork's refusal). Nothing is sent
    /// to the target; finding the backend's target may wait for discovery's first answer about
    /// it, and an egress hostname's binding for the pod's resolver.
    ///
    /// In ingress mode the Service port the request names decides instead of the connection's
    /// target, when it is one the control plane knows (a destination override that cannot be
    /// read is answered 400).
    pub async fn decide<B>(&self, req: &mut Request<B>, outbound: &Outbound) -> Decision<Decided> {
        let service = match self.ingress_service(req, outbound).await {
            Ok(service) => service,
            Err(e) => {
                let answer = error_response(&ProxyError::BadRequest(e.to_string()));
                return Decision::Answer(Answer::new(AnswerKind::Malformed, answer));
            }
        };
        let target = service.as_ref().unwrap_or(&self.target);
        match routed::route(req, (target, self.addr), &self.routes, outbound).await {
            Ok(routed) => Decision::Forward(Decided { routed, service }),
            Err(answer) => Decision::Answer(Answer::new(AnswerKind::Route, answer)),
        }
    }

    /// Ingress mode: the target of the Service port `req` names, when the control plane has a
    /// policy for it and it is not the connection's own; `None` otherwise, and always outside
    /// ingress mode and on a gateway's connection. The override headers are taken off in every
    /// mode.
    async fn ingress_service<B>(
        &self,
        req: &mut Request<B>,
        outbound: &Outbound,
    ) -> Result<Option<Arc<Target>>, OverrideError> {
        let Some(ingress) = outbound.ingress.as_ref().filter(|_| !self.pinned) else {
            // Not followed here, and no upstream should see it (an unmeshed one or a skipped
            // port has no inbound proxy to take it off).
            crate::http::headers::strip_dst_override(req.headers_mut());
            return Ok(None);
        };
        let Some(named) = ingress.named(req)? else { return Ok(None) };
        for key in named.candidates(self.addr.port()) {
            if matches!(&self.target.route, Route::Balanced(b) if b.service == key) {
                return Ok(None);
            }
            // Known only as a Service port: a name without a policy (no such Service, or no
            // such port) leaves the request to its original destination.
            let target = self.remembered(key, outbound).await;
            if let Some(target) = target.filter(|t| crate::outbound::policy_of(t).and_then(|p| p.current()).is_some()) {
                return Ok(Some(target));
            }
        }
        Ok(None)
    }

    /// The target of a service the request names (`web.shop.svc.cluster.local`), when it
    /// differs from the connection's own. Only followed with discovery, and never on a
    /// gateway's connection.
    pub async fn named_target(&self, authority: &str, outbound: &Outbound) -> Option<Arc<Target>> {
        if self.pinned || outbound.discovery.is_none() || !authority.contains(".svc.") {
            return None;
        }
        let key = match authority.rsplit_once(':') {
            Some((_, p)) => {
                p.parse::<u16>().ok()?;
                authority.to_string()
            }
            None => format!("{authority}:{}", self.addr.port()),
        };
        if matches!(&self.target.route, Route::Balanced(b) if b.service == key) {
            return None;
        }
        self.remembered(key, outbound).await
    }

    /// The target of the service `key`, remembered by the connection (known or not).
    async fn remembered(&self, key: String, outbound: &Outbound) -> Option<Arc<Target>> {
        if let Some((_, t)) = self.named.lock().iter().find(|(k, _)| *k == key) {
            return t.clone();
        }
        let target = crate::outbound::service(&key, outbound).await;
        let mut named = self.named.lock();
        if named.len() < MAX_NAMED {
            named.push((key, target.clone()));
        }
        target
    }
}

#[cfg(test)]
pub(crate) mod tests;
