//! Service account tokens: issued by the token request subresource
//! (`serviceaccounts/<name>/token`) or [`crate::ClusterApi::issue_token`], and checked by
//! TokenReview (`authentication.k8s.io/v1`), as the control plane checks a proxy's token.
//!
//! A token is 32 random bytes (hex) that the server remembers; it is not a JWT, so only this
//! server can review it. A token issued for no audience is the API's own and also authenticates
//! requests to this server; one issued for audiences (`identity.cnimesh.io`) does not, as with
//! a real API server.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Who a token was issued to.
#[derive(Debug, Clone)]
pub(crate) struct Issued {
    namespace: String,
    service_account: String,
    uid: String,
    audiences: Vec<String>,
}

/// The tokens this server issued.
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    issued: BTreeMap<String, Issued>,
}

/// A reason a token cannot be made.
#[derive(Debug, thiserror::Error)]
#[error("no randomness for a token")]
pub struct NoRandomness;

fn random_token() -> Result<String, NoRandomness> {
    let mut bytes = [0u8; 32];
    cnimesh_identity::provider::provider().secure_random.fill(&mut bytes).map_err(|_| NoRandomness)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Tokens {
    /// A new token for `namespace/service_account` (whose uid, if stored, is `uid`).
    pub(crate) fn issue(
        &mut self,
        namespace: &str,
        service_account: &str,
        uid: &str,
        audiences: Vec<String>,
    ) -> Result<String, NoRandomness> {
        let token = random_token()?;
        let issued = Issued {
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
            uid: uid.to_string(),
            audiences,
        };
        self.issued.insert(token.clone(), issued);
        Ok(token)
    }

    /// The token authenticates requests to this server: issued for the API (no audiences).
    pub(crate) fn is_api_token(&self, token: &str) -> bool {
        self.issued.get(token).is_some_and(|i| i.audiences.is_empty())
    }

    /// The service account an API token (issued for no audience) authenticates; `None` for any
    /// other token.
    pub(crate) fn user_of(&self, token: &str) -> Option<crate::rbac::User> {
        let issued = self.issued.get(token).filter(|i| i.audiences.is_empty())?;
        Some(crate::rbac::User::service_account(&issued.namespace, &issued.service_account))
    }

    /// The TokenReview's answer: `status` of the review in `request`.
    pub(crate) fn review(&self, request: &Value) -> Value {
        let token = request["spec"]["token"].as_str().unwrap_or_default();
        let wanted: Vec<&str> =
            request["spec"]["audiences"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let Some(issued) = self.issued.get(token) else {
            return json!({"authenticated": false, "error": "invalid bearer token"});
        };
        // The token's audiences; none: the API's own, which a review asking for audiences
        // does not accept.
        let audiences: Vec<&str> = if wanted.is_empty() {
            issued.audiences.iter().map(String::as_str).collect()
        } else {
            wanted.iter().copied().filter(|w| issued.audiences.iter().any(|a| a == w)).collect()
        };
        if !wanted.is_empty() && audiences.is_empty() {
            return json!({"authenticated": false, "error": "token audiences do not match the review's audiences"});
        }
        let ns = &issued.namespace;
        json!({
            "authenticated": true,
            "user": {
                "username": format!("system:serviceaccount:{ns}:{}", issued.service_account),
                "uid": issued.uid,
                "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"],
            },
            "audiences": audiences,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_accepts_only_issued_tokens_for_the_audiences_asked() {
        let mut tokens = Tokens::default();
        let token = tokens.issue("shop", "web", "u-1", vec!["identity.cnimesh.io".into()]).unwrap();
        let review =
            |token: &str, audiences: &[&str]| tokens.review(&json!({"spec": {"token": token, "audiences": audiences}}));
        let ok = review(&token, &["identity.cnimesh.io"]);
        assert_eq!(ok["authenticated"], true);
        assert_eq!(ok["user"]["username"], "system:serviceaccount:shop:web");
        assert_eq!(review(&token, &["tap.cnimesh.io"])["authenticated"], false);
        assert_eq!(review("forged", &["identity.cnimesh.io"])["authenticated"], false);
        assert!(!tokens.is_api_token(&token), "a token for other audiences does not open the API");
    }
}
