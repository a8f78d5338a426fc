//! The inbound request path, up to the decision: what a request carries to the app and whether
//! it may go there. [`InboundHttp::decide`] sets the identity headers (ours only), normalises
//! the path under policy, takes a multicluster gateway's word on who called, and authorizes the
//! request (the kubelet's probes outside every rate limit, then the Server's rate limit) with
//! [`crate::inbound::policy`]; no I/O, so it is tested as a table of requests and verdicts.

mod identity;

use std::borrow::Cow;
use std::sync::Arc;

use http::{Request, Uri};

use crate::http::decision::{Answer, AnswerKind, Decision};
use crate::http::error::{ProxyError, error_response};
use crate::http::headers::{IDENTITY_HEADERS, strip_dst_override, wants_upgrade};
use crate::inbound::policy::enforce::ConnPolicy;
use crate::transport::labels::TlsLabel;
use identity::FromGateway;

/// An authorized inbound request: the policy of the remote workload a multicluster gateway
/// forwarded it for, when it came that way and the port has policy. A tunnel it opens ends
/// when that workload's authorization does.
pub struct Authorized {
    pub forwarded: Option<Arc<ConnPolicy>>,
}

/// One inbound connection's request path: what every request of it is checked against.
pub struct InboundHttp {
    /// The port's policy for this connection's client; without it every request is allowed.
    policy: Option<Arc<ConnPolicy>>,
    /// `l5d-client-id` for the app: the identity the client's certificate proved.
    client_id: Option<http::HeaderValue>,
    /// The connection comes from this cluster's multicluster gateway: each request names the
    /// remote workload that called, and is authorized as that workload.
    from_gateway: Option<FromGateway>,
}

impl InboundHttp {
    /// The request path of a connection secured as `tls` under `policy`; `own` is this proxy's
    /// identity (its trust domain tells our own gateway from others).
    pub fn new(tls: &TlsLabel, policy: Option<Arc<ConnPolicy>>, own: Option<&cnimesh_identity::Name>) -> Self {
        let client_id = tls.client_id.as_deref().and_then(|id| http::HeaderValue::from_str(id).ok());
        let from_gateway = FromGateway::of(tls.client_id.as_deref(), own);
        Self { policy, client_id, from_gateway }
    }

    /// The same request path under `policy`.
    pub fn with_policy(self, policy: Option<Arc<ConnPolicy>>) -> Self {
        Self { policy, ..self }
    }

    /// The port's policy for this connection.
    pub fn policy(&self) -> Option<&Arc<ConnPolicy>> {
        self.policy.as_ref()
    }

    /// What becomes of `req`, which is readied for the app when it goes on: identity headers
    /// set by us only (a client's own `l5d-client-id` could name anyone; so could a gateway
    /// client header from anyone but this cluster's gateway), and under policy the path
    /// authorization matches and the app reads, normalized ([`crate::inbound::policy::path`]);
    /// a path servers read differently is refused with 400. From the gateway, the request is
    /// authorized as the remote workload it names (which `l5d-client-id` then names).
    pub fn decide<B>(&self, req: &mut Request<B>) -> Decision<Authorized> {
        let forwarded = match &self.from_gateway {
            Some(gateway) => match gateway.client(req.headers(), self.policy.as_deref()) {
                Ok(forwarded) => Some(forwarded),
                Err(refused) => return malformed(refused.to_string()),
            },
            None => None,
        };
        let headers = req.headers_mut();
        for name in &IDENTITY_HEADERS {
            headers.remove(name);
        }
        // A destination override steers only the outbound proxy of the app that set it; from the
        // network it means nothing, and the app behind this proxy never sees it.
        strip_dst_override(headers);
        if let Some(id) = forwarded.as_ref().map(|(id, _)| id).or(self.client_id.as_ref()) {
            headers.insert(IDENTITY_HEADERS[0].clone(), id.clone());
        }
        let forwarded = forwarded.and_then(|(_, policy)| policy);
        let Some(policy) = forwarded.as_ref().or(self.policy.as_ref()) else {
            return Decision::Forward(Authorized { forwarded });
        };
        if let Err(why) = normalize_path(req) {
            return malformed(why);
        }
        match policy.deny_request(req, wants_upgrade(req)) {
            Some(denied) => Decision::Answer(Answer::new(AnswerKind::Policy, denied)),
            None => Decision::Forward(Authorized { forwarded }),
        }
    }
}

fn malformed<F>(why: String) -> Decision<F> {
    Decision::Answer(Answer::new(AnswerKind::Malformed, error_response(&ProxyError::BadRequest(why))))
}

/// Rewrites `req`'s path to its normalized form (the query kept); a path that has none is
/// refused, with why.
fn normalize_path<B>(req: &mut Request<B>) -> Result<(), String> {
    let normalized = match crate::inbound::policy::path::normalize(req.uri().path()) {
        Ok(Cow::Borrowed(_)) => return Ok(()),
        Ok(Cow::Owned(path)) => path,
        Err(why) => return Err(format!("refused: {why}")),
    };
    let path_and_query = match req.uri().query() {
        Some(q) => format!("{normalized}?{q}"),
        None => normalized,
    };
    let invalid = |e: &dyn std::fmt::Display| format!("refused: the normalized path is not a valid URI: {e}");
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(http::uri::PathAndQuery::try_from(path_and_query).map_err(|e| invalid(&e))?);
    *req.uri_mut() = Uri::from_parts(parts).map_err(|e| invalid(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests;
