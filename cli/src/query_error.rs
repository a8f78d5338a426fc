//! Why reading the mesh failed, typed: what `stat`, `diagnostics`, `authz` and the dashboard
//! decide on (the hint to give, the status to answer), built from kube's own errors, never from
//! their text. Each keeps the one-line message the commands print (`what: the API server's
//! message (code reason)`).
//!
//! Layer: runtime (operator CLI).

use std::time::Duration;

/// A kube error in one line: the API server's own message for API errors (not the debug dump
/// kube's Display adds), the cause chain otherwise.
pub fn kube_error(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({} {})", status.message, status.code, status.reason),
        other => cnimesh_common::error::with_causes(other.to_string(), other),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// The API server refused the request (403): the caller's RBAC does not grant it.
    #[error("{what}: {detail}")]
    Forbidden { what: String, detail: String },
    /// The object asked about does not exist (404).
    #[error("{what}: {detail}")]
    NotFound { what: String, detail: String },
    /// No answer: the API server, a proxy or the control plane could not be reached in time.
    #[error("{what}: {detail}")]
    Unreachable { what: String, detail: String },
    /// The API server answered with another error.
    #[error("{what}: {detail}")]
    Api { what: String, code: u16, detail: String },
    /// The question itself is wrong (a resource, flag or parameter), or asks about something the
    /// mesh does not have (a pod without a proxy, a service without that port).
    #[error("{0}")]
    BadQuery(String),
    /// An answer came but is not what was asked for (a page that is not JSON, an object the mesh
    /// cannot read, such as a selector that does not parse).
    #[error("{what}: {detail}")]
    Invalid { what: String, detail: String },
}

impl QueryError {
    /// `error` from asking the API server for `what` (`listing pods`, `reading pod ns/name`).
    pub fn from_kube(what: impl Into<String>, error: &kube::Error) -> Self {
        let (what, detail) = (what.into(), kube_error(error));
        match error {
            kube::Error::Api(status) if status.code == 403 => Self::Forbidden { what, detail },
            kube::Error::Api(status) if status.code == 404 => Self::NotFound { what, detail },
            kube::Error::Api(status) => Self::Api { what, code: status.code, detail },
            _ => Self::Unreachable { what, detail },
        }
    }

    /// `what` (`pod ns/name`) does not exist.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::NotFound { what: what.into(), detail: "not found".into() }
    }

    /// No answer to `what`, and why (`detail`).
    pub fn unreachable(what: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        Self::Unreachable { what: what.into(), detail: detail.to_string() }
    }

    /// The answer to `what` is not usable, and why (`detail`).
    pub fn invalid(what: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        Self::Invalid { what: what.into(), detail: detail.to_string() }
    }

    /// The question is wrong, and why.
    pub fn bad_query(text: impl Into<String>) -> Self {
        Self::BadQuery(text.into())
    }

    /// No answer to `what` within `after`.
    pub fn timeout(what: impl Into<String>, after: Duration) -> Self {
        Self::Unreachable { what: what.into(), detail: format!("no answer within {}s", after.as_secs()) }
    }

    /// The typed cause of `error`, wherever it is in the chain of contexts.
    pub fn find(error: &anyhow::Error) -> Option<&Self> {
        error.chain().find_map(|e| e.downcast_ref::<Self>())
    }

    /// Whether `error` is the API server's refusal (RBAC).
    pub fn is_forbidden(error: &anyhow::Error) -> bool {
        matches!(Self::find(error), Some(Self::Forbidden { .. }))
    }

    /// The same error, about `what` (the caller's words for what it was reading).
    pub fn about(self, what: impl Into<String>) -> Self {
        let what = what.into();
        match self {
            Self::Forbidden { detail, .. } => Self::Forbidden { what, detail },
            Self::NotFound { detail, .. } => Self::NotFound { what, detail },
            Self::Unreachable { detail, .. } => Self::Unreachable { what, detail },
            Self::Api { code, detail, .. } => Self::Api { what, code, detail },
            Self::Invalid { detail, .. } => Self::Invalid { what, detail },
            Self::BadQuery(text) => Self::BadQuery(format!("{what}: {text}")),
        }
    }

    /// What went wrong without what was being asked (the API server's message, or why there was
    /// no answer).
    pub fn detail(&self) -> &str {
        match self {
            Self::Forbidden { detail, .. }
            | Self::NotFound { detail, .. }
            | Self::Unreachable { detail, .. }
            | Self::Api { detail, .. }
            | Self::Invalid { detail, .. } => detail,
            Self::BadQuery(text) => text,
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    fn api(code: u16, message: &str, reason: &str) -> kube::Error {
        kube::Error::Api(Status::failure(message, reason).with_code(code).boxed())
    }

    #[test]
    fn kube_errors_are_classified_by_their_code() {
        let refused = QueryError::from_kube("listing pods", &api(403, "pods is forbidden", "Forbidden"));
        assert!(matches!(refused, QueryError::Forbidden { .. }), "{refused:?}");
        assert_eq!(refused.to_string(), "listing pods: pods is forbidden (403 Forbidden)");
        let missing = QueryError::from_kube("reading pod a/b", &api(404, "pods \"b\" not found", "NotFound"));
        assert!(matches!(missing, QueryError::NotFound { .. }), "{missing:?}");
        let other = QueryError::from_kube("listing pods", &api(500, "etcd is down", "InternalError"));
        assert!(matches!(other, QueryError::Api { code: 500, .. }), "{other:?}");
        let late = QueryError::timeout("reading pod a/b", Duration::from_secs(10));
        assert_eq!(late.to_string(), "reading pod a/b: no answer within 10s");
        assert!(matches!(late, QueryError::Unreachable { .. }));
    }

    /// The decision is on the type wherever it sits in the chain, and never on the text: a
    /// message that merely mentions 403 is not a refusal.
    #[test]
    fn a_refusal_is_found_by_type_under_contexts_and_never_by_its_text() {
        let refused = QueryError::from_kube("listing pods", &api(403, "no", "Forbidden"));
        let wrapped = anyhow::Error::new(refused.clone()).context("reading the mesh").context("the dashboard's round");
        assert_eq!(QueryError::find(&wrapped), Some(&refused));
        assert!(QueryError::is_forbidden(&wrapped));
        let lookalike = anyhow::anyhow!("the app answered (403 Forbidden)");
        assert!(!QueryError::is_forbidden(&lookalike));
        let moved = refused.about("reading /metrics of a/b's proxy");
        assert_eq!(moved.to_string(), "reading /metrics of a/b's proxy: no (403 Forbidden)");
        assert!(matches!(moved, QueryError::Forbidden { .. }));
    }
}
