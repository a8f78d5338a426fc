//! What every cnimesh crate shares and must agree on: the names and numbers of docs/architecture.md, "Names and numbers"
//! ([`names`]), errors in one line with their causes ([`error`]), and writing a file so that readers see the old content or the new, never half
//! ([`fs`]), reading a Prometheus text page ([`prom_text`]),
//! logging events that come in floods at most once a period ([`log_limit`]), and the one jittered exponential backoff ([`backoff`]). It has no dependencies, because the CNI plugin, which is exec'd for every pod, links
//! it too; the `logging` feature (the binaries' stderr format, plain or JSON: [`logging`]) adds
//! tracing-subscriber for the long-running binaries only.

pub mod backoff;
pub mod error;
pub mod fs;
pub mod log_limit;
#[cfg(feature = "logging")]
pub mod logging;
pub mod names;
pub mod prom_text;
pub mod table;
