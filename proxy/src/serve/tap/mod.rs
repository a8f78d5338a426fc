//! Serving Linkerd's tap API to the control plane: the Observe call ([`grpc`]) and TLS on the
//! admin port in front of it ([`listen`]). The sessions they open are the registry the request
//! path feeds ([`crate::http::tap`]).
//!
//! - [`grpc`]: the Observe call (authorization, validation, the event stream);
//! - [`listen`]: TLS on the admin port and the gRPC server behind it.

pub mod grpc;
pub mod listen;

pub use listen::TapListener;
