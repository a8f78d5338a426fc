//! The control plane's tap relay (the role of Linkerd's viz tap API): `GET /tap?…` on the admin
//! listener opens `io.linkerd.proxy.tap.Tap/Observe` to each proxy of the asked-for resource
//! over mTLS, merges their streams and writes one JSON object per event per line
//! (`application/x-ndjson`, flushed per event), each with the pod whose proxy saw it.
//!
//! - the query string and one line of the answer (`cnimesh_model::tap`), shared with the
//!   `cnimesh tap` / `top` commands;
//! - [`matcher`]: the `ObserveRequest` built from it;
//! - [`admission`]: `limit` and `max-rps`;
//! - [`client`]: the mTLS gRPC stream to one proxy;
//! - [`relay`]: authentication, the pods, the merge.
//!
//! Pods that cannot be reached are an error line in the stream, not a failure of the tap. The
//! tap ends at its limit or when the caller goes away (the proxies' streams are dropped then).

pub mod admission;
pub mod client;
pub mod matcher;
pub mod relay;

pub use relay::{AdminBody, Relay};
