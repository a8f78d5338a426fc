//! The proxy as a program: configuration and command line, wiring and the listeners ([`run`],
//! [`accept`], where a connection's error is counted), each connection's protocol
//! ([`dispatch`]) and the executor of each HTTP request's decision ([`forward`]), the state
//! every connection shares, connection limits, draining, the admin server, the metrics
//! registry, the tap server, and the request spans of distributed tracing ([`spans`]).

pub mod accept;
pub mod admin;
pub mod admission;
pub mod cli;
pub mod config;
pub mod dispatch;
pub mod drain;
pub mod forward;
pub mod metrics;
pub mod run;
pub mod shared;
pub mod spans;
pub mod tap;
