//! Serving a connection once accepted, and each of its HTTP requests: the state every connection
//! shares ([`shared`]), the connection's entry and its error counted once ([`accept`]), its
//! protocol served opaque or as HTTP ([`dispatch`]), the executor of each HTTP request's decision
//! with its metrics, tap and span wrappers ([`forward`]), the request spans of distributed
//! tracing ([`spans`]), the metrics registry ([`metrics`]), graceful draining ([`drain`]), and the
//! tap server the request path feeds ([`tap`]).

pub mod accept;
pub mod dispatch;
pub mod drain;
pub mod forward;
pub mod metrics;
pub mod shared;
pub mod spans;
pub mod tap;
