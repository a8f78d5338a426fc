//! The Identity service: certificates for workloads whose token proves who they are.

pub mod csr;
pub mod issuer;
pub mod kube_tokens;
pub mod own_cert;
pub mod service;
pub mod tokens;

pub use issuer::{Issuer, IssuerRx};
pub use kube_tokens::KubeTokens;
pub use service::{IdentityService, Policy};
pub use tokens::{Authenticator, FileTokens, ServiceAccount, TokenError};
