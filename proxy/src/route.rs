//! Where an outbound connection's requests go: its original destination (with the identity it
//! is known to have), or a discovered service's endpoints, balanced per request (HTTP) or per
//! connection (opaque).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

use crate::discovery::balance::{self, Load};
use crate::discovery::{Endpoint, Endpoints};
use crate::identity::Identity;
use crate::metrics::TlsLabel;
use crate::tls::{self, UpstreamTls};

/// One upstream address and how to secure it.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub tls: Option<UpstreamTls>,
}

pub enum Route {
    Fixed(Target),
    Balanced { service: String, endpoints: watch::Receiver<Arc<Endpoints>>, identity: Option<Arc<Identity>> },
}

/// A chosen upstream; `load` counts it as in flight on its endpoint until dropped.
pub struct Picked {
    pub target: Target,
    pub load: Option<Load>,
}

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("service {0} has no endpoints")]
    NoEndpoints(String),
    #[error("{0}")]
    NoIdentity(&'static str),
}

impl Route {
    pub fn pick(&self) -> Result<Picked, RouteError> {
        match self {
            Route::Fixed(target) => Ok(Picked { target: target.clone(), load: None }),
            Route::Balanced { service, endpoints, identity } => {
                let set = endpoints.borrow().clone();
                let endpoint: &Arc<Endpoint> =
                    balance::pick(&set.list, |e| &e.stats).ok_or_else(|| RouteError::NoEndpoints(service.clone()))?;
                let tls =
                    tls::outbound(identity.as_deref(), endpoint.identity.clone()).map_err(RouteError::NoIdentity)?;
                Ok(Picked {
                    target: Target { addr: endpoint.addr, tls },
                    load: Some(Load::start(endpoint.stats.clone())),
                })
            }
        }
    }

    /// The connection's TLS label: for a service, `tls="true"` when every endpoint is meshed,
    /// with `server_id` when they share one identity.
    pub fn tls_label(&self) -> TlsLabel {
        match self {
            Route::Fixed(t) => t.tls.as_ref().map_or_else(TlsLabel::plaintext, UpstreamTls::label),
            Route::Balanced { endpoints, identity, .. } => {
                let set = endpoints.borrow();
                let ids: Vec<_> = set.list.iter().map(|e| e.identity.as_ref()).collect();
                if identity.is_none() || ids.is_empty() || ids.iter().any(Option::is_none) {
                    return TlsLabel::plaintext();
                }
                let first = ids[0];
                let server_id = ids.iter().all(|i| *i == first).then(|| first.map(ToString::to_string)).flatten();
                TlsLabel { tls: true, client_id: None, server_id }
            }
        }
    }
}
