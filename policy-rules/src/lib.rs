//! The inbound authorization rules, in one place: what a port's policy says (its
//! authorizations: networks and authentication; its routes: path and method matches) and how a
//! client and a request are decided against it. The proxy enforces these rules; the CLI
//! (`cnimesh authz`, `cnimesh policy generate`) explains and reads them with the same code, so
//! the two can never disagree on who is admitted (the IPv4-mapped addresses an IPv6 socket
//! reports are one such case).
//!
//! Pure: no I/O, no runtime, no allocation on the decision path.
//!
//! Layers: model | path_prefix → decide
//!
//! - [`model`]: the policy as plain structures, and the names the rules give special meaning
//!   (the kubelet probe route, audit mode's authorization).
//! - [`path_prefix`]: Gateway API's path-prefix rule (whole segments).
//! - [`decide`]: which authorization admits a client (and why each other refused it), which
//!   route a request takes.

pub mod decide;
pub mod model;
pub mod path_prefix;

pub use decide::{Client, Decision, Refusal, authorized, decide, route_for};
pub use model::{
    AUDIT_KIND, Authn, Authz, Network, PROBE_ROUTE, PathMatch, Resource, Route, RouteMatch, is_probe_route, suffix,
};
pub use path_prefix::segment_prefix;
