//! One outbound request through its target's routes: the rule it takes, the rule's filters, a
//! backend by weight and that backend's target (resolved once and then reused: targets are
//! cached per service and address, and each connection keeps the few its requests used), or
//! the proxy's own answer (a redirect, an injected failure, 404 when no route matches).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};

use super::apply::{self, Answer};
use super::model::{Backend, Filter, HttpRoute, ResourceRef, Retry, Rule};
use super::select::Selected;
use crate::http::Body;
use crate::http::error::{ProxyError, error_response, full};
use crate::metrics::{RouteBackendLabels, RouteHandles, RouteLabels};
use crate::outbound::policy::model::OutboundPolicy;
use crate::outbound::targets::Target;
use crate::shared::Shared;

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
        &self.policy.routes(self.version)[self.index.0].rules[self.index.1]
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

/// What one connection's routed requests used: backend targets, and metric handles per (policy
/// version, rule, backend). A handful of each at most.
#[derive(Default)]
pub struct ConnRoutes {
    targets: Mutex<Vec<(Backend, Arc<Target>)>>,
    handles: Mutex<Vec<Handles>>,
}

/// Metric handles of one policy version (held, so compared by address safely), rule (route and
/// rule index) and backend index.
struct Handles {
    policy: Arc<OutboundPolicy>,
    rule: (usize, usize),
    backend: usize,
    handles: RouteHandles,
}

const MAX_MEMO: usize = 8;

impl ConnRoutes {
    fn handles(
        &self,
        policy: &Arc<OutboundPolicy>,
        selected: &Selected<'_>,
        backend: usize,
        shared: &Shared,
    ) -> RouteHandles {
        let mut memo = self.handles.lock().expect("not poisoned");
        let same = |h: &&Handles| Arc::ptr_eq(&h.policy, policy) && h.rule == selected.index && h.backend == backend;
        if let Some(h) = memo.iter().find(same) {
            return h.handles.clone();
        }
        let labels = RouteBackendLabels {
            route: RouteLabels { parent: policy.parent.clone(), route: selected.route.meta.clone() },
            backend: selected.rule.backends[backend].backend.meta().clone(),
        };
        let handles = shared.metrics.route_handles(labels);
        if memo.len() >= MAX_MEMO * 2 {
            memo.clear();
        }
        memo.push(Handles { policy: policy.clone(), rule: selected.index, backend, handles: handles.clone() });
        handles
    }

    /// The target of `backend`. A Service discovery does not know (yet) is an error, unless it
    /// is the parent itself (the control plane's default route): then the connection's own
    /// target, as without routes.
    async fn target(
        &self,
        backend: &Backend,
        parent: (&ResourceRef, &Arc<Target>),
        shared: &Shared,
    ) -> Result<Arc<Target>, ProxyError> {
        if let Some((_, t)) = self.targets.lock().expect("not poisoned").iter().find(|(b, _)| b == backend) {
            return Ok(t.clone());
        }
        let target = match backend {
            Backend::Forward { addr, .. } => crate::outbound::resolve(*addr, shared).await.map_err(|e| {
                ProxyError::new(StatusCode::BAD_GATEWAY, format!("backend {}: {e}", backend.meta().name))
            })?,
            Backend::Service { path, meta } => match crate::outbound::service(path, shared).await {
                Some(target) => target,
                None if meta == parent.0 => return Ok(parent.1.clone()),
                None => {
                    let why = format!("backend {} unknown", backend.meta().name);
                    return Err(ProxyError::new(StatusCode::SERVICE_UNAVAILABLE, why));
                }
            },
        };
        let mut memo = self.targets.lock().expect("not poisoned");
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
    shared: &Shared,
) -> Result<Option<Routed>, Response<Body>> {
    let Some(policy) = target.policy.as_ref().and_then(|p| p.current()) else { return Ok(None) };
    let version = req.version();
    let routes: &[HttpRoute] = policy.routes(version);
    if routes.is_empty() {
        return Ok(None);
    }
    let Some(selected) = super::select::select(routes, req) else {
        return Err(error_response(&ProxyError::new(StatusCode::NOT_FOUND, "no route matches the request")));
    };
    let rule = selected.rule;
    let roll = || crate::rng::with(|r| rand::Rng::random_range(r, 0.0..1.0));
    let picked = apply::pick_backend(&rule.backends, roll());
    let backend = picked.and_then(|i| rule.backends.get(i));
    let filters = rule.filters.iter().chain(backend.into_iter().flat_map(|b| b.filters.iter()));
    apply::request_filters(filters, req, selected.prefix, roll).map_err(answer)?;
    let (Some(backend_index), Some(backend)) = (picked, backend) else {
        let why = format!("route {} has no backend", selected.route.meta.name);
        return Err(error_response(&ProxyError::new(StatusCode::INTERNAL_SERVER_ERROR, why)));
    };
    let handles = memo.handles(&policy, &selected, backend_index, shared);
    handles.backend_requests.inc();
    let routed_target =
        memo.target(&backend.backend, (&policy.parent, target), shared).await.map_err(|e| error_response(&e))?;
    Ok(Some(Routed {
        target: routed_target,
        timeout: rule.request_timeout,
        route: selected.route.meta.name.clone(),
        handles,
        index: selected.index,
        backend: backend_index,
        version,
        policy: policy.clone(),
    }))
}

fn answer(a: Answer) -> Response<Body> {
    match a {
        Answer::Redirect { status, location } => {
            let mut r = Response::new(full(bytes::Bytes::new()));
            *r.status_mut() = status;
            r.headers_mut().insert(http::header::LOCATION, location);
            r
        }
        Answer::Fail { status, message } => error_response(&ProxyError::new(status, message)),
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
