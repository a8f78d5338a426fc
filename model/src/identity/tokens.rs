//! Who is asking: a token is exchanged for the service account it was issued to. The service
//! then compares that account with the identity requested, in one place for every backend.
//!
//! Layer: model ([`Authenticator`]; the backend is [`super::KubeTokens`]).

use futures::future::BoxFuture;

/// Longer than any service-account token Kubernetes issues (about 1 KiB), short enough that a
/// client cannot make us forward megabytes to the API server.
pub const MAX_TOKEN_LEN: usize = 16 * 1024;

/// A Kubernetes service account.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceAccount {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The caller could not prove anything: no token, an unknown or expired one.
    #[error("{0}")]
    Unauthenticated(String),
    /// The token is fine but does not carry what we need (wrong audience, not a service account).
    #[error("{0}")]
    Denied(String),
    /// We could not find out (API server unreachable).
    #[error("{0}")]
    Unavailable(String),
}

/// Exchanges a token for the service account it proves. Boxed futures so that tests can stand
/// in for the API server's TokenReview.
pub trait Authenticator: Send + Sync + 'static {
    fn authenticate<'a>(&'a self, token: &'a [u8]) -> BoxFuture<'a, Result<ServiceAccount, TokenError>>;
}

/// Helpers for this crate's tests and, behind `test-util`, the servers' tests.
#[cfg(any(test, feature = "test-util"))]
pub mod tests {
    use super::*;

    /// Tokens known in advance, `(token, namespace, service account)`: a test's stand-in for
    /// TokenReview. Surrounding whitespace is ignored, as a token file's newline.
    pub struct Known(pub Vec<(&'static str, &'static str, &'static str)>);

    impl Authenticator for Known {
        fn authenticate<'a>(&'a self, token: &'a [u8]) -> BoxFuture<'a, Result<ServiceAccount, TokenError>> {
            let found = self.0.iter().find(|(t, _, _)| t.as_bytes() == token.trim_ascii());
            let result = found
                .map(|(_, ns, sa)| ServiceAccount { namespace: ns.to_string(), name: sa.to_string() })
                .ok_or_else(|| TokenError::Unauthenticated("the token matches no service account".into()));
            Box::pin(async move { result })
        }
    }
}
