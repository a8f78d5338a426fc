//! Bytes on connections, below HTTP: original destinations, protocol detection, mesh TLS (peek,
//! termination, origination), replayed prefixes, byte counting, and opaque TCP forwarding.
//! Everything here works on any [`Io`], so the layers above are tested over in-memory streams.

pub mod backoff;
pub mod conn_error;
pub mod counting;
pub mod detect;
pub mod header;
pub mod identity;
pub mod labels;
pub mod maybe_tls;
pub mod orig_dst;
pub mod prefixed;
pub mod rng;
pub mod tcp;
pub mod tls;

/// A client connection the proxy can serve: a socket in production, an in-memory duplex in tests.
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> Io for T {}
