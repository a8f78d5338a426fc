//! Where pending join tokens live and how they are used up: the one Secret
//! [`join::SECRET_NAME`] in the control plane's namespace ([`crate::identity::join`] has the why), read and
//! written with kube-rs. The CLI stores a token's hash there ([`JoinStore::put`]); the Identity
//! service checks and consumes it ([`JoinStore::consume`]) and asks whether an identity still
//! belongs to an ExternalWorkload before renewing with a certificate ([`JoinStore::renewable`]).
//!
//! Both writes are compare-and-swaps on the Secret's resourceVersion: two uses of one token at
//! the same time cannot both remove it, so exactly one is certified; a conflict caused by
//! another workload's token is retried.
//!
//! Only the control plane's namespace is read: a Secret of the same name anywhere else, whatever
//! it holds, is never looked at.
//!
//! Layer: sources (kube): Secrets and ExternalWorkloads through the API server.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

use super::{ExternalRecord, ExternalWorkload};
use crate::identity::join::{self, JoinError, JoinToken, Pending};

/// Compare-and-swap attempts before giving up (as Unavailable): each conflict is another write
/// to the Secret, a join or a use of another token, so a handful is plenty.
const ATTEMPTS: usize = 8;

/// The pending tokens of the Secret in `namespace` (the control plane's).
#[derive(Clone)]
pub struct JoinStore {
    client: kube::Client,
    namespace: String,
}

impl JoinStore {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self { client, namespace: namespace.into() }
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn workloads(&self, namespace: &str) -> Api<ExternalWorkload> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// The ExternalWorkload `namespace/name`, checked: what `join` binds a token to.
    pub async fn workload(&self, namespace: &str, name: &str) -> Result<(ExternalWorkload, ExternalRecord), JoinError> {
        let workload = self
            .workloads(namespace)
            .get_opt(name)
            .await
            .map_err(|e| JoinError::Unavailable(format!("reading ExternalWorkload {namespace}/{name}: {e}")))?
            .ok_or_else(|| JoinError::Denied(format!("ExternalWorkload {namespace}/{name} does not exist")))?;
        let record = ExternalRecord::from_crd(&workload)
            .map_err(|e| JoinError::Denied(format!("ExternalWorkload {namespace}/{name} is invalid: {e}")))?;
        if record.revoked {
            return Err(JoinError::Denied(format!("ExternalWorkload {namespace}/{name} is revoked")));
        }
        Ok((workload, record))
    }

    /// Stores `pending` as the one pending token of `token`'s workload, replacing any older one;
    /// makes the Secret when there is none.
    pub async fn put(&self, token: &JoinToken, pending: &Pending) -> Result<(), JoinError> {
        let value = ByteString(serde_json::to_vec(pending).expect("plain data serialises"));
        for _ in 0..ATTEMPTS {
            let written = match self.read().await? {
                None => {
                    let secret = Secret {
                        metadata: ObjectMeta {
                            name: Some(join::SECRET_NAME.into()),
                            namespace: Some(self.namespace.clone()),
                            labels: Some(BTreeMap::from([(
                                "app.kubernetes.io/part-of".to_string(),
                                "cnimesh".to_string(),
                            )])),
                            ..ObjectMeta::default()
                        },
                        type_: Some(join::SECRET_TYPE.into()),
                        data: Some(BTreeMap::from([(token.key(), value.clone())])),
                        ..Secret::default()
                    };
                    self.secrets().create(&PostParams::default(), &secret).await.map(drop)
                }
                Some(mut secret) => {
                    secret.data.get_or_insert_default().insert(token.key(), value.clone());
                    self.secrets().replace(join::SECRET_NAME, &PostParams::default(), &secret).await.map(drop)
                }
            };
            match written {
                Ok(()) => return Ok(()),
                Err(e) if conflict(&e) => continue,
                Err(e) => return Err(JoinError::Unavailable(format!("writing Secret {}: {e}", self.where_()))),
            }
        }
        Err(JoinError::Unavailable(format!("Secret {} kept changing; try again", self.where_())))
    }

    /// Checks `token` for the identity of service account `service_account` in `namespace`, and
    /// uses it up: after `Ok` (the ExternalWorkload's name) no one can use it again.
    pub async fn consume(&self, token: &JoinToken, namespace: &str, service_account: &str) -> Result<(), JoinError> {
        if token.namespace != namespace {
            return Err(JoinError::Denied(format!(
                "the join token is for ExternalWorkload {}/{}, not for an identity of namespace {namespace}",
                token.namespace, token.name
            )));
        }
        for _ in 0..ATTEMPTS {
            let mut secret = self.read().await?.ok_or_else(|| unknown(token))?;
            let data = secret.data.get_or_insert_default();
            let pending: Pending = data
                .get(&token.key())
                .ok_or_else(|| unknown(token))
                .and_then(|v| {
                    serde_json::from_slice(&v.0).map_err(|e| {
                        JoinError::Unauthenticated(format!(
                            "the pending join token for {}/{} is unreadable ({e}): run `cnimesh external-workload join` again",
                            token.namespace, token.name
                        ))
                    })
                })?;
            pending.check(token, service_account, SystemTime::now())?;
            let (workload, record) = self.workload(&token.namespace, &token.name).await?;
            if workload.metadata.uid.as_deref() != Some(pending.uid.as_str()) {
                return Err(JoinError::Denied(format!(
                    "ExternalWorkload {}/{} was deleted and made again since the token was made",
                    token.namespace, token.name
                )));
            }
            if record.service_account != service_account {
                return Err(JoinError::Denied(format!(
                    "ExternalWorkload {}/{} holds service account {:?}, not {service_account:?}",
                    token.namespace, token.name, record.service_account
                )));
            }
            data.remove(&token.key());
            match self.secrets().replace(join::SECRET_NAME, &PostParams::default(), &secret).await {
                Ok(_) => return Ok(()),
                // Someone wrote the Secret since we read it: maybe a use of this very token.
                Err(e) if conflict(&e) => continue,
                Err(e) => return Err(JoinError::Unavailable(format!("using up the join token: {e}"))),
            }
        }
        Err(JoinError::Unavailable(format!("Secret {} kept changing; try again", self.where_())))
    }

    /// The ExternalWorkload of `namespace` that holds service account `service_account` and is
    /// not revoked: only then may a certificate of that identity renew itself.
    pub async fn renewable(&self, namespace: &str, service_account: &str) -> Result<String, JoinError> {
        let list = self
            .workloads(namespace)
            .list(&Default::default())
            .await
            .map_err(|e| JoinError::Unavailable(format!("listing the ExternalWorkloads of {namespace}: {e}")))?;
        list.items
            .iter()
            .filter_map(|w| Some((w, ExternalRecord::from_crd(w).ok()?)))
            .find(|(_, record)| !record.revoked && record.service_account == service_account)
            .map(|(w, _)| w.metadata.name.clone().unwrap_or_default())
            .ok_or_else(|| {
                JoinError::Denied(format!(
                    "no ExternalWorkload of namespace {namespace} holds service account {service_account:?} (deleted or revoked): \
                     renewing with a certificate is for ExternalWorkloads; a revoked host needs a new `cnimesh external-workload join`"
                ))
            })
    }

    /// The Secret, when it exists and is ours (its type); a Secret of that name with another
    /// type is refused rather than read.
    async fn read(&self) -> Result<Option<Secret>, JoinError> {
        let secret = self
            .secrets()
            .get_opt(join::SECRET_NAME)
            .await
            .map_err(|e| JoinError::Unavailable(format!("reading Secret {}: {e}", self.where_())))?;
        match secret {
            Some(s) if s.type_.as_deref() != Some(join::SECRET_TYPE) => Err(JoinError::Unauthenticated(format!(
                "Secret {} has type {:?}, not {}: not read",
                self.where_(),
                s.type_,
                join::SECRET_TYPE
            ))),
            other => Ok(other),
        }
    }

    fn where_(&self) -> String {
        format!("{}/{}", self.namespace, join::SECRET_NAME)
    }
}

fn unknown(token: &JoinToken) -> JoinError {
    JoinError::Unauthenticated(format!(
        "no join token is pending for ExternalWorkload {}/{}: already used, or never made; run `cnimesh external-workload join` again",
        token.namespace, token.name
    ))
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 409)
}
