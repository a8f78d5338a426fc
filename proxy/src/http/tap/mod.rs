//! Linkerd's tap API (`io.linkerd.proxy.tap.Tap/Observe`): live request/response events of the
//! HTTP traffic this proxy handles, both directions, for the control plane's tap relay
//! (`cnimesh tap`/`top`). Served on the admin port to mTLS clients of the allowed identities
//! (by default the control plane's). Nothing is recorded while no session is open.
//!
//! - [`registry`]: open sessions, and a request's events to those that match it;
//! - [`matcher`]: the `ObserveRequest.Match` tree;
//! - [`events`]: the TapEvents' addresses and labels;
//! - [`body`]: a tapped response's end.
//!
//! The Observe call and its listener are served by the serving layer ([`crate::serve::tap`]).

pub mod body;
pub mod events;
pub mod matcher;
pub mod registry;

pub use body::respond;
pub use events::Meta;
pub use registry::{Tapped, Taps};
