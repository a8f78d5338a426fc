//! Inbound authorization policy: each port's policy discovered from the control plane
//! ([`discover`]), checked into plain structures when it arrives ([`model`]), decided purely
//! ([`authorize`]) on the request path as the app will read it ([`path`]) and enforced per connection and per request ([`enforce`]).

pub mod authorize;
pub mod discover;
pub mod enforce;
pub mod metrics;
pub mod model;
pub mod path;
