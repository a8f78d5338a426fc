//! One outbound request through its target's routes: the rule it takes, the rule's filters, a
//! backend by weight and that backend's target (resolved once and then reused: targets are
//! cached per service and address, and each connection keeps the few its requests used), or
//! the proxy's own answer (a redirect, an injected failure, 404 when no route matches).

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use parking_lot::Mutex;

use super::apply::{self, Answer};
use super::metrics::RouteHandles;
use super::model::{Backend, Filter, ResourceRef, Retry, Rule};
use crate::client::targets::Target;
use crate::http::Body;
use crate::http::error::{ProxyError, error_response, full};
use crate::outbound::Outbound;
use crate::outbound::policy::model::OutboundPolicy;

/// Where a routed request goes, and what its response gets.
pub struct Routed {
    pub target: Arc<Target>,
    /// Answered 504 when the response has not begun within it.
    pub timeout: Option<Duration>,
    pub route: Arc<str>,
    /// The route's metrics (`duration` is observed by the caller).
    pub handles: RouteHandles,
    policy: Arc<OutboundPolicy>,
    version: http::Version,
    index: (usize, usize),
    backend: usize,
}

impl Routed {
    fn rule(&self) -> &Rule {
        &self.policy.routes(self.version).routes()[self.index.0].rules[self.index.1]
    }

    /// The rule's retry policy, if it has one.
    pub fn retry(&self) -> Option<&Retry> {
        self.rule().retry.as_ref()
    }

    fn filters(&self) -> impl Iterator<Item = &Filter> {
        let rule = self.rule();
        let backend = rule.backends.get(self.backend);
        rule.filters.iter().chain(backend.into_iter().flat_map(|b| b.filters.iter()))
    }

    /// The rule's and the backend's response header modifiers.
    pub fn response_headers(&self, headers: &mut http::HeaderMap) {
        apply::response_headers(self.filters(), headers);
    }
}

/// What one connection's routed requests used: backend targets (a handful at most). Held by
/// the connection, not the policy, so that a target nobody uses any more can go idle.
#[derive(Default)]
pub struct ConnRoutes {
    targets: Mutex<Vec<(Backend, Arc<Target>)>>,
}

const MAX_MEMO: usize = 8;

impl ConnRoutes {
    /// The target of `backend`. A Service discovery does not know (yet) is an error, unless it
    /// is the parent itself (the control plane's default route): then the connection's own
    /// target, as without routes.
    async fn target(
        &self,
        backend: &Backend,
        parent: (&ResourceRef, &Arc<Target>),
        outbound: &Outbound,
    ) -> Result<Arc<Target>, ProxyError> {
        if let Some((_, t)) = self.targets.lock().iter().find(|(b, _)| b == backend) {
            return Ok(t.clone());
        }
        let target = match backend {
            Backend::Forward { addr, .. } => crate::outbound::resolve(*addr, outbound)
                .await
                .map_err(|e| ProxyError::Backend { backend: backend.meta().name.to_string(), why: e.to_string() })?,
            Backend::Service { path, meta } => match crate::outbound::service(path, outbound).await {
                Some(target) => target,
                None if meta == parent.0 => return Ok(parent.1.clone()),
                None => {
                    let why = format!("backend {} unknown", backend.meta().name);
                    return Err(ProxyError::Unavailable(why));
                }
            },
        };
        let mut memo = self.targets.lock();
        if memo.len() < MAX_MEMO {
            memo.push((backend.clone(), target.clone()));
        }
        Ok(target)
    }
}

/// The route of `req` under `target`'s outbound policy: `Ok(None)` when the policy has no routes
/// for the request's protocol (the request goes to the target as before), `Err` with the
/// proxy's own answer.
pub async fn route<B>(
    req: &mut Request<B>,
    target: &Arc<Target>,
    memo: &ConnRoutes,
    outbound: &Outbound,
) -> Result<Option<Routed>, Response<Body>> {
    let Some(policy) = crate::outbound::policy_of(target).and_then(|p| p.current()) else { return Ok(None) };
    let egress = crate::outbound::egress::is_egress(&policy.parent).then(|| egress_request(req, &policy, outbound));
    let version = req.version();
    let table = policy.routes(version);
    if table.is_empty() {
        return Ok(None);
    }
    let Some(selected) = table.select(req) else {
        return Err(error_response(&ProxyError::NoRoute));
    };
    let rule = selected.rule;
    let roll = || crate::transport::rng::with(|r| rand::Rng::random_range(r, 0.0..1.0));
    let picked = apply::pick_backend(&rule.backends, roll);
    let backend = picked.and_then(|i| rule.backends.get(i));
    let filters = rule.filters.iter().chain(backend.into_iter().flat_map(|b| b.filters.iter()));
    apply::request_filters(filters, req, selected.prefix, roll).map_err(|a| match (a, &egress) {
        // issue 30: the EgressNetwork's refusal is the proxy's own answer, named and counted.
        (Answer::Fail { status, .. }, Some(labels)) if status == http::StatusCode::FORBIDDEN => {
            outbound.egress.outbound_egress_denied_total.get_or_create(labels).inc();
            let network = crate::outbound::egress::network_name(&policy.parent);
            error_response(&ProxyError::EgressDenied { network })
        }
        (a, _) => answer(a),
    })?;
    let (Some(backend_index), Some(backend)) = (picked, backend) else {
        let why = format!("route {} has no backend", selected.route.meta.name);
        return Err(error_response(&ProxyError::Misconfigured(why)));
    };
    let handles = table.handles(&policy.parent, &selected, backend_index, &outbound.routes).clone();
    handles.backend_requests.inc();
    let routed_target =
        memo.target(&backend.backend, (&policy.parent, target), outbound).await.map_err(|e| error_response(&e))?;
    let (timeout, route, index) = (rule.request_timeout, selected.route.meta.name.clone(), selected.index);
    Ok(Some(Routed { target: routed_target, timeout, route, handles, index, backend: backend_index, version, policy }))
}

/// issue 30: counts an egress request by its hostname (the authority's host, else the Host
/// header's) and returns the labels a refusal is counted with.
fn egress_request<B>(
    req: &Request<B>,
    policy: &OutboundPolicy,
    outbound: &Outbound,
) -> crate::outbound::egress::EgressConnLabels {
    let host = crate::outbound::egress::request_hostname(req).unwrap_or_else(|| "unknown".into());
    let labels = outbound.egress.labels(&policy.parent, &host);
    outbound.egress.outbound_egress_requests_total.get_or_create(&labels).inc();
    crate::outbound::egress::EgressConnLabels {
        egress: labels,
        protocol: crate::outbound::egress::EgressProtocol::http,
    }
}

fn answer(a: Answer) -> Response<Body> {
    match a {
        Answer::Redirect { status, location } => {
            let mut r = Response::new(full(bytes::Bytes::new()));
            *r.status_mut() = status;
            r.headers_mut().insert(http::header::LOCATION, location);
            r
        }
        Answer::Fail { status, message } => error_response(&ProxyError::Injected { status, message }),
        Answer::FailGrpc { code, message } => {
            let mut r = Response::new(full(bytes::Bytes::new()));
            let h = r.headers_mut();
            h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
            h.insert("grpc-status", http::HeaderValue::from(code));
            if let Ok(v) = http::HeaderValue::from_str(&message) {
                h.insert("grpc-message", v);
            }
            r
        }
    }
}
