//! The tap wrapper around the executor: each request is offered to the open tap sessions
//! ([`crate::http::tap`]) with what an event says of its connection and route; with none open,
//! one relaxed load and nothing else.

use std::net::SocketAddr;
use std::time::Instant;

use http::Request;

use super::span::service_of;
use crate::client::targets::Target;
use crate::http::tap::{self, Tapped, Taps};
use crate::outbound::egress::{EgressLabels, SeenAs};
use crate::outbound::http::routed::Routed;
use crate::serve::metrics::{Direction, TlsLabel};

/// What a tap event says of the connection a request came on.
pub(super) struct TapConn<'a> {
    pub direction: Direction,
    pub peer: SocketAddr,
    pub addr: SocketAddr,
    /// The connection's TLS (inbound: the client's).
    pub tls: &'a TlsLabel,
    /// Inbound: this proxy's identity.
    pub own: Option<&'a str>,
    /// Outbound: the connection's target.
    pub target: &'a Target,
    /// Outbound to an EgressNetwork's destination.
    pub egress: Option<&'a EgressLabels>,
}

/// Offers `req` to open tap sessions; `routed` is the route that took it, if any.
pub(super) fn offer<B>(
    taps: &Taps,
    conn: &TapConn<'_>,
    req: &Request<B>,
    routed: Option<&Routed>,
    started: Instant,
) -> Option<Tapped> {
    if !taps.active() {
        return None;
    }
    let meta = match conn.direction {
        Direction::inbound => tap::Meta::inbound(conn.peer, conn.addr, conn.tls, conn.own),
        Direction::outbound => {
            let target = routed.map_or(conn.target, |r| &r.target);
            let route = routed.map(|r| &*r.route);
            let meta = tap::Meta::outbound(conn.peer, conn.addr, &target.tls, service_of(target), route);
            match conn.egress {
                // What the request was seen as (its Host when bound to the destination, else
                // the IP), else the connection's.
                Some(egress) => {
                    let hostname = req.extensions().get::<SeenAs>().map(|s| s.hostname.clone());
                    meta.egress(&egress.egress_network, &hostname.unwrap_or_else(|| egress.dst_hostname.clone()))
                }
                None => meta,
            }
        }
    };
    taps.request(req, crate::http::headers::authority_of(req), meta, started)
}
