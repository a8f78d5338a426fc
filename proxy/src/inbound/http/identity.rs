//! Who called, as an inbound request tells the app: the client's proven identity, or for this
//! cluster's multicluster gateway, the remote workload it forwarded the request for.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use parking_lot::Mutex;

use crate::http::headers::GATEWAY_CLIENT_ID;
use crate::inbound::policy::enforce::ConnPolicy;

/// Remote workloads whose policy a gateway connection keeps; beyond, the oldest goes.
const MAX_FORWARDED: usize = 16;

/// A request the gateway forwarded: the remote workload's identity (as the header gave it) and
/// the policy it is held to (none without policy).
pub(super) type Forwarded = (HeaderValue, Option<Arc<ConnPolicy>>);

/// Why a request of the gateway was refused.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refused {
    #[error("refused: {GATEWAY_CLIENT_ID} is missing from a request of the multicluster gateway")]
    Missing,
    #[error("refused: {GATEWAY_CLIENT_ID} appears more than once")]
    Repeated,
    #[error("refused: {GATEWAY_CLIENT_ID} is not an identity name")]
    NotAName,
    #[error("refused: {GATEWAY_CLIENT_ID} does not name a workload of another trust domain")]
    NotRemote,
}

/// A connection from this cluster's multicluster gateway.
pub(super) struct FromGateway {
    /// This proxy's trust domain: the gateway never forwards for a workload of it.
    own_trust_domain: String,
    /// The policies of the remote workloads the connection forwarded for (a few per
    /// connection: the gateway shares its connections among its clients).
    forwarded: Mutex<Vec<(HeaderValue, Arc<ConnPolicy>)>>,
}

impl FromGateway {
    /// Present when `client_id` is this cluster's gateway. Decided once per connection.
    pub(super) fn of(client_id: Option<&str>, own: Option<&cnimesh_identity::Name>) -> Option<Self> {
        if !is_own_gateway(client_id, own) {
            return None;
        }
        let own_trust_domain = own.and_then(|own| own.trust_domain())?.to_string();
        Some(Self { own_trust_domain, forwarded: Mutex::default() })
    }

    /// The remote workload a request from the gateway was forwarded for, with the policy it is
    /// held to (none without `policy`). The gateway sets the header on every HTTP request it
    /// forwards, so a request from its identity without it (or with several) is refused, never
    /// authorized as the gateway itself: it did not come through the gateway's HTTP path (e.g.
    /// HTTP bytes in an opaque session), and its headers say nothing anyone proved. A header
    /// that names no identity of another trust domain is refused too: the gateway never sends
    /// one.
    pub(super) fn client(&self, headers: &HeaderMap, policy: Option<&ConnPolicy>) -> Result<Forwarded, Refused> {
        let mut values = headers.get_all(&GATEWAY_CLIENT_ID).iter();
        let Some(value) = values.next() else { return Err(Refused::Missing) };
        if values.next().is_some() {
            return Err(Refused::Repeated);
        }
        let name = value.to_str().ok().and_then(|v| cnimesh_identity::Name::parse(v).ok());
        let Some(name) = name else { return Err(Refused::NotAName) };
        if name.trust_domain().is_none_or(|td| td == self.own_trust_domain) {
            return Err(Refused::NotRemote);
        }
        let policy = policy.map(|policy| {
            let mut forwarded = self.forwarded.lock();
            if let Some((_, p)) = forwarded.iter().find(|(v, _)| v == value) {
                return p.clone();
            }
            let p = Arc::new(policy.forwarded_for(name.as_str()));
            if forwarded.len() >= MAX_FORWARDED {
                forwarded.remove(0);
            }
            forwarded.push((value.clone(), p.clone()));
            p
        });
        Ok((value.clone(), policy))
    }
}

/// Whether `client_id` is this cluster's multicluster gateway (`own` is this proxy's identity):
/// the one peer whose word on who called ([`GATEWAY_CLIENT_ID`]) is taken.
fn is_own_gateway(client_id: Option<&str>, own: Option<&cnimesh_identity::Name>) -> bool {
    let Some(client_id) = client_id.filter(|id| id.starts_with(cnimesh_common::names::GATEWAY_NAME)) else {
        return false;
    };
    own.and_then(|own| own.trust_domain())
        .and_then(|td| {
            cnimesh_identity::Name::for_service_account(
                cnimesh_common::names::GATEWAY_NAME,
                cnimesh_common::names::MULTICLUSTER_NAMESPACE,
                td,
            )
            .ok()
        })
        .is_some_and(|gateway| gateway.as_str() == client_id)
}
