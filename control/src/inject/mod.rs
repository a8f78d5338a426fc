//! The injection webhook's server: a mutating admission webhook that adds the `cnimesh-proxy`
//! sidecar to pods that ask for the mesh (namespace label or pod annotation
//! `cnimesh.io/inject=enabled`). The mutation itself is pure and lives in the model crate
//! (`cnimesh_model::inject`), which `cnimesh inject` shares.
//!
//! [`serve_webhook`] is the HTTPS endpoint; [`Namespaces`] the namespaces' injection and policy
//! defaults it reads; [`watch_server_version`] the API server's version it plans for.
//! Deployment and failure policy: `daemonset/README.md`.

mod namespaces;
mod server;
#[cfg(test)]
mod tests;
mod version;

pub use namespaces::Namespaces;
pub use server::{INJECT_PATH, MAX_BODY, OPT_IN_PATH, Webhook, serve_webhook};
pub use version::watch_server_version;
