//! Gateway API's path-prefix rule, shared by inbound authorization routes and outbound routes;
//! its home is the authorization rules' crate.

pub use cnimesh_policy_rules::segment_prefix;
