//! One outbound request through its target's routes: the rule it takes, the rule's filters, a
//! backend by weight and that backend's target (resolved once and then reused: targets are
//! cached per service and address, and each connection keeps the few its requests used), or
//! the proxy's own answer (a redirect, an injected failure, 404 when no route matches).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use parking_lot::Mutex;

use crate::client::targets::Target;
use crate::http::Body;
use crate::http::error::{ProxyError, error_response, full};
use crate::outbound::Outbound;
use crate::outbound::egress::{EgressConnLabels, SeenAs};
use crate::outbound::policy::model::OutboundPolicy;
use crate::outbound::routes::apply::{self, Answer};
use crate::outbound::routes::metrics::RouteHandles;
use crate::outbound::routes::model::{Backend, Filter, ResourceRef, Retry, Rule};

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
    (target, addr): (&Arc<Target>, SocketAddr),
    memo: &ConnRoutes,
    outbound: &Outbound,
) -> Result<Option<Routed>, Response<Body>> {
    let Some(policy) = crate::outbound::policy_of(target).and_then(|p| p.current()) else { return Ok(None) };
    let egress = match crate::outbound::egress::is_egress(&policy.parent) {
        true => Some(egress_request(req, addr, &policy, outbound).await?),
        false => None,
    };
    let version = req.version();
    let table = policy.routes(version);
    if table.is_empty() {
        return Ok(None);
    }
    // An egress request whose Host is not bound to the destination is routed as one naming the
    // destination's IP: the routes that name hosts do not apply to it.
    let unbound = egress.as_ref().and_then(|_| req.extensions().get::<SeenAs>()).filter(|seen| seen.unbound);
    let selected = match unbound {
        Some(seen) => table.select(&as_addressed_to(req, &seen.hostname)),
        None => table.select(req),
    };
    let Some(selected) = selected else {
        return Err(error_response(&ProxyError::NoRoute));
    };
    let rule = selected.rule;
    let roll = || crate::transport::rng::with(|r| rand::Rng::random_range(r, 0.0..1.0));
    let picked = apply::pick_backend(&rule.backends, roll);
    let backend = picked.and_then(|i| rule.backends.get(i));
    let filters = rule.filters.iter().chain(backend.into_iter().flat_map(|b| b.filters.iter()));
    apply::request_filters(filters, req, selected.prefix, roll).map_err(|a| match (a, &egress) {
        // The EgressNetwork's refusal is the proxy's own answer, named and counted.
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

/// Counts an egress request by its hostname (the authority's host, else the Host
/// header's, when the destination `addr` is among its addresses; else the IP) and returns the
/// labels a refusal is counted with; what it was seen as goes into its extensions
/// ([`SeenAs`]). A request whose authority and Host header disagree is refused.
async fn egress_request<B>(
    req: &mut Request<B>,
    addr: SocketAddr,
    policy: &OutboundPolicy,
    outbound: &Outbound,
) -> Result<EgressConnLabels, Response<Body>> {
    let host = crate::outbound::egress::request_hostname(req);
    let disagree = crate::outbound::egress::hosts_disagree(req);
    let bound = match &host {
        Some(host) if !disagree => outbound.egress_names.bound(host, addr.ip()).await,
        _ => false,
    };
    let seen = match host {
        Some(host) if bound => SeenAs { hostname: host, unbound: false },
        _ => SeenAs { hostname: addr.ip().to_string(), unbound: true },
    };
    let labels = outbound.egress.labels(&policy.parent, &seen.hostname);
    req.extensions_mut().insert(seen);
    outbound.egress.outbound_egress_requests_total.get_or_create(&labels).inc();
    let labels = EgressConnLabels { egress: labels, protocol: crate::outbound::egress::EgressProtocol::http };
    if disagree {
        outbound.egress.outbound_egress_denied_total.get_or_create(&labels).inc();
        let why = "egress refused: the request's authority and Host header name different hosts".to_string();
        return Err(error_response(&ProxyError::Refused { status: http::StatusCode::FORBIDDEN, why }));
    }
    Ok(labels)
}

/// The head of `req` as if it named `host` (routing only; the request itself is not changed).
fn as_addressed_to<B>(req: &Request<B>, host: &str) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = req.method().clone();
    *head.version_mut() = req.version();
    *head.headers_mut() = req.headers().clone();
    let host = match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => format!("[{v6}]"),
        _ => host.to_string(),
    };
    if let Ok(value) = http::HeaderValue::from_str(&host) {
        head.headers_mut().insert(http::header::HOST, value);
    }
    let mut parts = req.uri().clone().into_parts();
    if parts.authority.is_some() {
        parts.authority = host.parse().ok();
    }
    *head.uri_mut() = http::Uri::from_parts(parts).unwrap_or_else(|_| req.uri().clone());
    head
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
            h.insert(crate::http::headers::GRPC_STATUS, http::HeaderValue::from(code));
            if let Ok(v) = http::HeaderValue::from_str(&message) {
                h.insert(crate::http::headers::GRPC_MESSAGE, v);
            }
            r
        }
    }
}
