//! Identity, the model and sources layers: the issuer (loaded and reloaded from files), CSR
//! validation, token authentication (files, or the API server's TokenReview in
//! [`kube_tokens`]), join tokens for ExternalWorkloads ([`join`]), the control plane's own
//! certificate, and the issuing [`Policy`]. The gRPC
//! service that answers proxies with these is `cnimesh_control::grpc::identity`.

use std::time::Duration;

pub mod csr;
pub mod issuer;
pub mod join;
pub mod kube_tokens;
pub mod own_cert;
pub mod reserved;
pub mod tokens;

pub use issuer::{Issuer, IssuerRx};
pub use kube_tokens::KubeTokens;
pub use reserved::Reserved;
pub use tokens::{Authenticator, ServiceAccount, TokenError};

/// How leaves are issued.
#[derive(Debug, Clone)]
pub struct Policy {
    pub trust_domain: String,
    pub lifetime: Duration,
    /// Leaves start this far in the past, so that a peer whose clock is a little behind ours
    /// does not reject a certificate "not yet valid".
    pub clock_skew: Duration,
}
