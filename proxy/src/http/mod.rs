//! HTTP rules that hold whichever way a request goes: hop-by-hop headers, response
//! classification (gRPC trailers included), Linkerd's HTTP/1-over-HTTP/2 marker, upgrades,
//! the proxy's own error answers, and serving a client connection with hyper. Routing lives in
//! [`crate::outbound`] and [`crate::inbound`]; the executor that runs each request's decision in [`crate::serve::forward`].

pub mod classify;
pub mod decision;
pub mod error;
pub mod headers;
pub mod orig_proto;
pub mod origin_form;
pub mod path_prefix;
pub mod serve_conn;
pub mod tap;
pub mod trace;
pub mod upgrade;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response body the proxy serves, boxed once: an upstream's body (with its
/// classification) or one of the proxy's own answers.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;
