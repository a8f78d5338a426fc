//! The inbound side: connections addressed to this pod. [`connection`] admits them (only this
//! pod's own, non-loopback addresses), terminates mTLS and finds each port's target and
//! policy; [`policy`] is the inbound authorization policy those ports are served under.

pub mod connection;
pub mod policy;
