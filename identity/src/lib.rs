//! Identity shared by the proxy and the control plane: workload names, PEM loading, rustls
//! configuration on the one crypto provider (aws-lc-rs), and certificate authorities.

pub mod anchors;
pub mod ca;
pub mod current;
pub mod endorsement;
pub mod grpc_channel;
pub mod name;
pub mod pem;
pub mod provider;
pub mod secret;
pub mod tls;
pub mod trust_domain;

pub use name::{DEFAULT_TRUST_DOMAIN, Name, NameError, TOKEN_AUDIENCE};
