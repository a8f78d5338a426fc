//! Routes as the outbound policy serves them: HTTPRoutes and GRPCRoutes read once into validated
//! records ([`Route`]), and ReferenceGrants into [`Grant`]s.
//!
//! What cannot be carried out is refused here with the route's kind, namespace, name and the
//! reason ([`Invalid`](crate::meta::Invalid)), and the index keeps the route's last good version: a regular
//! expression that does not compile, a filter type this mesh does not apply, a duration that is
//! not a Gateway API duration (GEP-2257), a backend that is not a Service port, an annotation
//! that does not parse. Whether a backend in another namespace is allowed depends on the
//! ReferenceGrants of the moment, so that is checked when answers are computed
//! ([`crate::routes::routes_of`]).
//!
//! GAMMA: a route attaches to a Service through a `parentRef` with group `""` (or `core`) and
//! kind `Service`, optionally one port; other parents (Gateways) are someone else's.
//!
//! Retries and timeouts come from the Gateway API fields (`timeouts.request`,
//! `timeouts.backendRequest`, `retry`) and, with Linkerd's `retry.linkerd.io/*` semantics, from
//! the route's annotations `retry.cnimesh.io/http` (HTTPRoute) or `retry.cnimesh.io/grpc`
//! (GRPCRoute), `retry.cnimesh.io/limit`, `retry.cnimesh.io/timeout` and
//! `timeout.cnimesh.io/request`. A rule's own field wins over the route's annotation. The same
//! annotations on a Service ([`ServiceDefaults`]) apply to its default route and to the rules of
//! its routes that set no retry (or no request timeout) by field or annotation: as in Linkerd,
//! a route's own retry configuration replaces the Service's whole.
//!
//! By kind: `http` and `grpc` read each kind's rules into [`Rule`]s (`rule`) of a [`Route`]
//! (`route`: what both share); the parts they share are `parents`, `hostnames`, `matching`,
//! `filters`, `backends`, `retry` (timeouts, retries, durations), `defaults` (the annotations)
//! and `checks`; `grant` reads ReferenceGrants.
//!
//! Layer: model/index (pure).

mod backends;
mod checks;
mod defaults;
mod filters;
mod grant;
mod grpc;
mod hostnames;
mod http;
mod kind;
mod matching;
mod parents;
mod retry;
mod route;
mod rule;

use super::crd;

pub use backends::Backend;
pub use defaults::{
    REQUEST_TIMEOUT_ANNOTATION, RETRY_GRPC_ANNOTATION, RETRY_HTTP_ANNOTATION, RETRY_LIMIT_ANNOTATION,
    RETRY_TIMEOUT_ANNOTATION, RouteDefaults, ServiceDefaults,
};
pub use filters::{Filter, HeaderModifier, PathModifier, Redirect};
pub use grant::Grant;
pub use hostnames::{HostMatch, hostnames};
pub use kind::RouteKind;
pub use matching::{GrpcMatch, HttpMatch, MatchValue, Matches, PathMatch, ValueMatch};
pub use parents::{EGRESS_NETWORK_GROUP, EGRESS_NETWORK_KIND, EgressParent, Parent, egress_parents, is_egress_network};
pub use retry::{GrpcConditions, Retry, RetryConditions, Timeouts, duration};
pub use route::Route;
pub use rule::Rule;

#[cfg(test)]
mod tests;
