//! Inbound authorization policy: each port's policy discovered from the control plane
//! ([`discover`]), checked into plain structures when it arrives ([`model`]), decided purely
//! ([`authorize`]) on the request path as the app will read it ([`path`]) and enforced per connection and per request ([`enforce`]).
//! Requests that pass are then held to the Server's rate limit ([`ratelimit`]); audit mode's
//! would-be denials are let through, logged and counted ([`enforce`]).

pub mod authorize;
pub mod discover;
pub mod enforce;
pub mod metrics;
pub mod model;
pub mod path;
pub mod ratelimit;
