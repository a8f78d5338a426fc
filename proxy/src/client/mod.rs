//! Clients to upstreams, shared by both directions: a [`targets::Target`] per destination
//! (cached, evicted when idle), its [`target::Route`] (a fixed address or a balanced service),
//! the endpoints discovery reports for a service ([`discovery`]) with their balancer, and the
//! per-endpoint connection pools ([`upstream::Upstream`]).

pub mod discovery;
pub mod target;
pub mod targets;
pub mod upstream;
