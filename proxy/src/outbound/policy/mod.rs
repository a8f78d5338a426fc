//! Outbound policy: what the control plane's `OutboundPolicies` says about a destination
//! ([`discover`]), checked into plain structures when it arrives ([`model`], and for an EgressNetwork its
//! rules for connections that are not HTTP, [`streams`]). Today its
//! protocol decides how a connection is served: declared opaque, it is forwarded at once (a
//! server-speaks-first client never waits for detection); declared HTTP, detection is skipped.

pub mod discover;
pub mod model;
pub mod streams;
