//! HTTP routes of outbound policy (Gateway API HTTPRoutes with a Service as parent, as the
//! control plane turns them into `OutboundPolicies` answers): checked when the policy arrives
//! ([`model`]), selected per request ([`select`]) and applied to it ([`apply`], [`retry`]);
//! [`crate::outbound::http::routed`] puts them together for the per-request proxy.

pub mod apply;
pub mod grpc;
pub mod metrics;
pub mod model;
pub mod retry;
pub mod select;
