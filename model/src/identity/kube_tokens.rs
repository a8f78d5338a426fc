//! Cluster mode: the API server vouches for a projected service-account token (TokenReview).
//! The audience is part of the review, so a token minted for another service (or the default
//! API audience) is not accepted here even though it is valid. Identity's audience by default;
//! the tap relay checks its own ([`KubeTokens::with_audience`]).
//!
//! Layer: sources (kube): TokenReview against the API server.

use cnimesh_identity::TOKEN_AUDIENCE;
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};

use super::tokens::{Authenticator, ServiceAccount, TokenError};

/// Kubernetes' username for a service account: `system:serviceaccount:<ns>:<sa>`.
const SA_PREFIX: &str = "system:serviceaccount:";

#[derive(Clone)]
pub struct KubeTokens {
    client: kube::Client,
    audience: String,
}

impl KubeTokens {
    pub fn new(client: kube::Client) -> Self {
        Self { client, audience: TOKEN_AUDIENCE.to_string() }
    }

    /// Tokens must be for `audience` instead of Identity's.
    pub fn with_audience(mut self, audience: &str) -> Self {
        self.audience = audience.to_string();
        self
    }

    async fn review(&self, token: &[u8]) -> Result<ServiceAccount, TokenError> {
        let token = std::str::from_utf8(token)
            .map_err(|_| TokenError::Unauthenticated("the token is not UTF-8".into()))?
            .trim();
        if token.is_empty() {
            return Err(TokenError::Unauthenticated("the token is empty".into()));
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), audiences: Some(vec![self.audience.clone()]) },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| TokenError::Unavailable(format!("TokenReview: {e}")))?;
        let status = answer.status.unwrap_or_default();
        if let Some(error) = status.error.filter(|e| !e.is_empty()) {
            return Err(TokenError::Unauthenticated(format!("TokenReview: {error}")));
        }
        if status.authenticated != Some(true) {
            return Err(TokenError::Unauthenticated("TokenReview: the token is not authenticated".into()));
        }
        // An API server that ignores spec.audiences answers with its own; never assume ours.
        if !status.audiences.unwrap_or_default().contains(&self.audience) {
            return Err(TokenError::Denied(format!("the token's audiences do not include {}", self.audience)));
        }
        let username = status.user.and_then(|u| u.username).unwrap_or_default();
        let (namespace, name) = username
            .strip_prefix(SA_PREFIX)
            .and_then(|rest| rest.split_once(':'))
            .filter(|(ns, sa)| !ns.is_empty() && !sa.is_empty() && !sa.contains(':'))
            .ok_or_else(|| TokenError::Denied(format!("the token belongs to {username:?}, not a service account")))?;
        Ok(ServiceAccount { namespace: namespace.to_string(), name: name.to_string() })
    }
}

impl Authenticator for KubeTokens {
    fn authenticate<'a>(&'a self, token: &'a [u8]) -> BoxFuture<'a, Result<ServiceAccount, TokenError>> {
        Box::pin(self.review(token))
    }
}

/// Helpers for this crate's tests and, behind `test-util`, the servers' tests.
#[cfg(any(test, feature = "test-util"))]
pub mod tests {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use serde_json::{Value, json};

    use super::*;

    /// A client whose API server answers every TokenReview with `status`, recording the request
    /// bodies it saw.
    pub fn mocked(status: Value) -> (KubeTokens, Arc<Mutex<Vec<Value>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let (seen, status) = (recorded.clone(), status.clone());
            async move {
                assert_eq!(req.method(), http::Method::POST);
                assert_eq!(req.uri().path(), "/apis/authentication.k8s.io/v1/tokenreviews");
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let mut review: Value = serde_json::from_slice(&body).unwrap();
                seen.lock().push(review.clone());
                review["status"] = status;
                let response = http::Response::builder()
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(review.to_string())))
                    .unwrap();
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        (KubeTokens::new(kube::Client::new(service, "default")), seen)
    }

    pub fn status(user: &str, audiences: &[&str]) -> Value {
        json!({"authenticated": true, "user": {"username": user}, "audiences": audiences})
    }

    #[tokio::test]
    async fn an_authenticated_service_account_token() {
        let (tokens, seen) = mocked(status("system:serviceaccount:shop:web", &[TOKEN_AUDIENCE]));
        let sa = tokens.authenticate(b"the-token\n").await.unwrap();
        assert_eq!(sa, ServiceAccount { namespace: "shop".into(), name: "web".into() });
        let sent = seen.lock().remove(0);
        assert_eq!(sent["spec"]["token"], "the-token");
        assert_eq!(sent["spec"]["audiences"], json!([TOKEN_AUDIENCE]));
        assert_eq!(sent["kind"], "TokenReview");
    }

    #[tokio::test]
    async fn an_unauthenticated_token() {
        let (tokens, _) = mocked(json!({"authenticated": false, "error": "token expired"}));
        let err = tokens.authenticate(b"t").await.unwrap_err();
        assert!(matches!(&err, TokenError::Unauthenticated(m) if m.contains("token expired")), "{err}");
        let (tokens, _) = mocked(json!({"authenticated": false}));
        assert!(matches!(tokens.authenticate(b"t").await, Err(TokenError::Unauthenticated(_))));
    }

    #[tokio::test]
    async fn a_token_for_another_audience() {
        let (tokens, _) = mocked(status("system:serviceaccount:shop:web", &["https://kubernetes.default.svc"]));
        assert!(matches!(tokens.authenticate(b"t").await, Err(TokenError::Denied(_))));
    }

    #[tokio::test]
    async fn another_audience_is_asked_for_and_required() {
        let tap = cnimesh_common::names::TAP_TOKEN_AUDIENCE;
        let (tokens, seen) = mocked(status("system:serviceaccount:cnimesh:cnimesh-tap", &[tap]));
        let tokens = tokens.with_audience(tap);
        assert_eq!(tokens.authenticate(b"t").await.unwrap().name, "cnimesh-tap");
        assert_eq!(seen.lock().remove(0)["spec"]["audiences"], json!([tap]));
        let (tokens, _) = mocked(status("system:serviceaccount:cnimesh:cnimesh-tap", &[TOKEN_AUDIENCE]));
        let denied = tokens.with_audience(tap).authenticate(b"t").await;
        assert!(matches!(denied, Err(TokenError::Denied(m)) if m.contains(tap)));
    }

    #[tokio::test]
    async fn a_token_of_a_user_not_a_service_account() {
        for user in ["alice", "system:serviceaccount:shop", "system:serviceaccount::web", "system:node:n1"] {
            let (tokens, _) = mocked(status(user, &[TOKEN_AUDIENCE]));
            assert!(matches!(tokens.authenticate(b"t").await, Err(TokenError::Denied(_))), "{user}");
        }
    }

    #[tokio::test]
    async fn an_api_server_failure_is_unavailable() {
        let service = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
            let response = http::Response::builder().status(503).body(Full::new(Bytes::from_static(b"down"))).unwrap();
            Ok::<_, std::convert::Infallible>(response)
        });
        let tokens = KubeTokens::new(kube::Client::new(service, "default"));
        assert!(matches!(tokens.authenticate(b"t").await, Err(TokenError::Unavailable(_))));
    }
}
