//! A decided outbound request on its way: its target (the route's backend, a Service its
//! authority names, or the connection's own), the Service's failure accrual, the route's
//! timeout and retries (the body buffered, within the target's retry budget). Each try goes
//! through the executor's [`Try`]: the endpoint pick and the request's form for its hop are
//! the same in both directions.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::Either;
use hyper::body::Incoming;
use tower::retry::budget::Budget as _;

use super::OutboundHttp;
use crate::client::discovery::accrual::ConsecutiveFailures;
use crate::client::discovery::balance::Load;
use crate::client::target::Route;
use crate::client::targets::Target;
use crate::client::upstream::RequestBody;
use crate::http::error::ProxyError;
use crate::http::headers::authority_of;
use crate::http::trace::{self, Traced};
use crate::outbound::Outbound;
use crate::outbound::http::routed::Routed;
use crate::outbound::routes::model::Retry;
use crate::outbound::routes::retry;

/// A request's answer from its endpoint, with the endpoint's load (held until the response
/// ends), or the proxy's error.
pub type Exchanged = Result<(Response<Incoming>, Option<Load>), ProxyError>;

/// Where and how one try goes.
pub struct TryTo<'a> {
    /// An endpoint of this target.
    pub target: &'a Arc<Target>,
    /// The Service's failure accrual, for the endpoint pick.
    pub accrual: Option<ConsecutiveFailures>,
    /// Answered within this, if given.
    pub timeout: Option<Duration>,
    /// When traced, this try's span: it names the endpoint and is the next hop's parent (with
    /// B3 in `b3`'s form too).
    pub span: Option<&'a mut cnimesh_trace::Span>,
    pub b3: Option<cnimesh_trace::B3Form>,
}

/// One try of a request: the executor's, the same in both directions.
pub trait Try {
    fn send(&self, req: Request<RequestBody>, to: TryTo<'_>) -> impl Future<Output = Exchanged> + Send;
}

impl OutboundHttp {
    /// Sends a decided request: to its route's backend, the Service it named in ingress mode, a
    /// Service its authority names, or the connection's target; under the route's timeout and
    /// retries; each try through `tries`.
    pub async fn forward(
        &self,
        req: Request<Incoming>,
        (routed, service): (Option<&Routed>, Option<&Arc<Target>>),
        mut traced: Option<&mut Traced>,
        outbound: &Outbound,
        tries: &impl Try,
    ) -> Exchanged {
        let named = match (routed, service) {
            (Some(_), _) => None,
            (None, Some(service)) => Some(service.clone()),
            // Ingress mode has looked at what the request names already: nothing known.
            (None, None) if outbound.ingress.is_some() => None,
            (None, None) => self.named_target(authority_of(&req), outbound).await,
        };
        if let (Some(traced), Some(Route::Balanced(b))) = (traced.as_deref_mut(), named.as_ref().map(|t| &t.route)) {
            traced.set_service(&b.service);
        }
        let target = routed.map(|r| &r.target).or(named.as_ref()).unwrap_or(&self.target);
        // The deciding Service's failure accrual applies to its balancers (the backends of its
        // routes too, as in Linkerd): the connection's, or in ingress mode the one the request
        // named; a Service a request names outside ingress mode has no policy of ours.
        let parent = match (service, &named) {
            (Some(service), _) => Some(service),
            (None, Some(_)) => None,
            (None, None) => Some(&self.target),
        };
        let policy = parent.and_then(|t| crate::outbound::policy_of(t)).and_then(|p| p.current());
        let accrual = policy.as_deref().and_then(|p| p.accrual(req.version())).copied();
        let route_timeout = routed.and_then(|r| r.timeout.map(|t| (t, &r.route)));
        let exchange = async {
            match routed.and_then(|r| Some((r, r.retry()?))) {
                // Boxed: retries hold a buffered body and their backoff, and unboxed their
                // future would size every request's, retried or not.
                Some((routed, retry)) if retry::bufferable(&req, retry) => {
                    Box::pin(with_retries(target, req, (routed, retry), accrual, traced.as_deref_mut(), tries)).await
                }
                _ => {
                    let b3 = traced.as_deref().and_then(Traced::b3);
                    let span = traced.as_deref_mut().map(|t| &mut t.span);
                    tries.send(req.map(Either::Left), TryTo { target, accrual, timeout: None, span, b3 }).await
                }
            }
        };
        let mut result = match route_timeout {
            Some((timeout, route)) => match tokio::time::timeout(timeout, exchange).await {
                Ok(result) => result,
                Err(_) => {
                    if let Some(traced) = traced {
                        trace::timeout_event(&mut traced.span, "route", timeout);
                    }
                    return Err(ProxyError::RouteTimeout { route: route.to_string(), after: timeout });
                }
            },
            None => exchange.await,
        };
        if let (Some(routed), Ok((response, _))) = (routed, &mut result) {
            routed.response_headers(response.headers_mut());
        }
        result
    }
}

/// A request of a rule with retries, its body buffered: sent again while its answer is one the
/// rule retries (a response whose status the rule names, or a failure of the upstream
/// itself, [`ProxyError::retryable`]), up to the rule's limit and as far as the target's
/// retry budget allows.
async fn with_retries(
    target: &Arc<Target>,
    req: Request<Incoming>,
    (routed, retry): (&Routed, &Retry),
    accrual: Option<ConsecutiveFailures>,
    mut traced: Option<&mut Traced>,
    tries: &impl Try,
) -> Exchanged {
    let budget = target.retry_budget();
    budget.deposit();
    let (parts, body) = req.into_parts();
    let body = retry::buffer(body, retry).await?;
    let mut attempt = 0;
    loop {
        let req = retry::request(&parts, body.clone());
        // Traced: each try is a child span of the request's, and the next hop's parent.
        let mut try_span = traced.as_deref().map(|t| t.attempt(attempt));
        let b3 = traced.as_deref().and_then(Traced::b3);
        let to = TryTo { target, accrual, timeout: retry.timeout, span: try_span.as_mut(), b3 };
        let result = tries.send(req, to).await;
        let again = match &result {
            Ok((response, _)) => retry.retries(response.status(), response.headers()),
            // By kind, not by status: the proxy's own 502 (no identity yet) would fail again.
            Err(e) => e.retryable(),
        };
        if let (Some(traced), Some(mut span)) = (traced.as_deref_mut(), try_span) {
            let why = match &result {
                Ok((response, _)) => {
                    let grpc = response.headers().get(&crate::http::headers::GRPC_STATUS).and_then(|v| v.to_str().ok());
                    trace::end(&mut span, Some(response.status()), grpc, again, None);
                    response.status().as_u16().to_string()
                }
                Err(e) => {
                    trace::end(&mut span, Some(e.status()), None, true, Some(e.to_string()));
                    e.to_string()
                }
            };
            traced.record(span);
            if again && attempt < retry.max_retries {
                traced.retry_event(attempt + 1, why);
            }
        }
        if !again || attempt >= retry.max_retries {
            return result;
        }
        if !budget.withdraw() {
            routed.handles.retry_overflow.inc();
            return result;
        }
        drop(result);
        attempt += 1;
        routed.handles.retries.inc();
        if let Some(wait) = retry::backoff(retry, attempt) {
            tokio::time::sleep(wait).await;
        }
    }
}
