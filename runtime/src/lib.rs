//! `cnimesh-runtime`: the process plumbing the control plane's binaries share (the role kubert
//! plays for Linkerd's controllers): the Lease elector that lets one replica write for a role
//! ([`leader`]), the admin listener's accept loop ([`admin_http`]), and what a process reads from
//! its command line and its signals ([`process`]).
//!
//! A crate of its own so that the control plane (`cnimesh-control`, which serves gRPC and the
//! webhook) and the multicluster mirror (`cnimesh-mirror`) are peers: neither links the other,
//! and both run their writers behind the same elector. Built on the model crate only for the
//! metrics registry a leadership is reported to.
//!
//! Layers: process | admin_http | leader

pub mod admin_http;
pub mod leader;
pub mod process;
