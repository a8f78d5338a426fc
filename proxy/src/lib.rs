//! `cnimesh-proxy`: the sidecar. Captured connections arrive on the inbound (4143) and outbound
//! (4140) listeners; their original destination, detected protocol and the proxy's layers decide
//! where and how they go: mTLS with the workload's identity when both ends are meshed, plaintext
//! otherwise.
//!
//! Layers: transport → http → client → inbound | outbound → gateway → serve → app
//!
//! Each layer uses only the layers before it; inbound and outbound do not use each other.
//! - [`transport`]: bytes on connections: original destination, protocol detection, mesh TLS
//!   and the workload identity it presents, opaque forwarding; small utilities (rng, backoff).
//! - [`http`]: HTTP rules for both directions: serving a client connection with hyper
//!   ([`http::serve_conn`]), classification, Linkerd's HTTP/1-over-HTTP/2, the proxy's own
//!   error answers, and the tap registry requests are offered to ([`http::tap`]).
//! - [`client`]: per-target clients shared by both directions: the target cache, discovery,
//!   balancing, per-endpoint connection pools.
//! - [`inbound`]: connections to this pod: admission of the destination, mTLS termination,
//!   inbound authorization policy, and each request's decision ([`inbound::http`]).
//! - [`outbound`]: connections from the app: resolving a target, outbound policy and routes,
//!   and each request's decision ([`outbound::http`]).
//! - [`gateway`]: a multicluster gateway's admission: mesh mTLS only, the transport
//!   header, Services of its own cluster only; served by [`serve`] through the outbound side.
//! - [`serve`]: a connection once accepted and each of its requests: its entry, where its
//!   error is counted ([`serve::accept`]), detecting its protocol and serving it opaque or as
//!   HTTP ([`serve::dispatch`]), the executor of each HTTP request's decision, with its metrics,
//!   tap and span wrappers ([`serve::forward`]), request spans, the metrics registry, draining,
//!   the tap server.
//! - [`app`]: the process: configuration and command line, wiring ([`app::run`]), the
//!   listeners and their connection limits ([`app::listen`]), the admin server.
//!
//! A connection's path: listener ([`app::listen`]) → accepted ([`serve::accept`]) → inbound:
//! destination checks and TLS ([`inbound::connection`]) / outbound: target
//! ([`outbound::resolve`]) → protocol detection ([`serve::dispatch`]) → HTTP server
//! ([`http::serve_conn`]); every step's error is one [`transport::conn_error::ConnError`],
//! counted where the connection was accepted. Per request: the decision ([`inbound::http`] /
//! [`outbound::http`], a [`http::decision::Decision`]) → the executor ([`serve::forward`]) →
//! client ([`client::targets`]) → upstream ([`client::upstream`]).

pub mod app;
pub mod client;
pub mod gateway;
pub mod http;
pub mod inbound;
pub mod outbound;
pub mod serve;
pub mod transport;

pub use app::run::run;
