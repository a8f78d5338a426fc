//! Where pending join tokens live and how they are used up: the one Secret
//! [`join::SECRET_NAME`] in the control plane's namespace ([`crate::identity::join`] has the why), read and
//! written with kube-rs. The CLI stores a token's hash there ([`JoinStore::put`]); the Identity
//! service checks and consumes it ([`JoinStore::consume`]), which leaves in its place the
//! binding of that workload (uid) to the key it was certified for; a renewal with a certificate
//! finds the workload by its key's binding and checks it still exists as it joined
//! ([`JoinStore::renewable`]).
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
use crate::identity::join::{self, Binding, Entry, JoinError, JoinToken, Pending};

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
    /// uses it up: after `Ok` no one can use it again, and the workload's entry binds renewals to
    /// the key certified now (`key_sha256`, [`join::key_sha256`]) and to the workload's uid. A
    /// binding of the same key to another workload is dropped: a key renews one workload.
    pub async fn consume(
        &self,
        token: &JoinToken,
        namespace: &str,
        service_account: &str,
        key_sha256: &str,
    ) -> Result<(), JoinError> {
        if token.namespace != namespace {
            return Err(JoinError::Denied(format!(
                "the join token is for ExternalWorkload {}/{}, not for an identity of namespace {namespace}",
                token.namespace, token.name
            )));
        }
        for _ in 0..ATTEMPTS {
            let mut secret = self.read().await?.ok_or_else(|| unknown(token))?;
            let data = secret.data.get_or_insert_default();
            let pending = match data.get(&token.key()).map(|v| serde_json::from_slice::<Entry>(&v.0)) {
                Some(Ok(Entry::Pending(pending))) => pending,
                Some(Ok(Entry::Bound(_))) | None => return Err(unknown(token)),
                Some(Err(e)) => {
                    return Err(JoinError::Unauthenticated(format!(
                        "the pending join token for {}/{} is unreadable ({e}): run `cnimesh external-workload join` again",
                        token.namespace, token.name
                    )));
                }
            };
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
            data.retain(|_, v| {
                !matches!(serde_json::from_slice::<Entry>(&v.0), Ok(Entry::Bound(b)) if b.key_sha256 == key_sha256)
            });
            let binding = Entry::Bound(Binding {
                uid: pending.uid,
                service_account: service_account.into(),
                key_sha256: key_sha256.into(),
            });
            data.insert(token.key(), ByteString(serde_json::to_vec(&binding).expect("plain data serialises")));
            match self.secrets().replace(join::SECRET_NAME, &PostParams::default(), &secret).await {
                Ok(_) => return Ok(()),
                // Someone wrote the Secret since we read it: maybe a use of this very token.
                Err(e) if conflict(&e) => continue,
                Err(e) => return Err(JoinError::Unavailable(format!("using up the join token: {e}"))),
            }
        }
        Err(JoinError::Unavailable(format!("Secret {} kept changing; try again", self.where_())))
    }

    /// The ExternalWorkload whose join certified the key `key_sha256` for service account
    /// `service_account` of `namespace`, when it still exists with the uid it joined with, is not
    /// revoked and still holds that service account: only then may a certificate for that key
    /// renew itself. Returns the workload's name.
    pub async fn renewable(
        &self,
        namespace: &str,
        service_account: &str,
        key_sha256: &str,
    ) -> Result<String, JoinError> {
        let refused = |why: String| {
            JoinError::Denied(format!(
                "renewing with this certificate is refused: {why}; renewing with a certificate is for the key an \
                 ExternalWorkload joined with, while it exists and is not revoked (deleted or revoked: run \
                 `cnimesh external-workload join` again)"
            ))
        };
        let secret = self.read().await?;
        let bound = secret
            .iter()
            .flat_map(|s| s.data.iter().flatten())
            .filter_map(|(key, v)| match serde_json::from_slice::<Entry>(&v.0) {
                Ok(Entry::Bound(binding)) if binding.key_sha256 == key_sha256 => Some((key, binding)),
                _ => None,
            })
            .find_map(|(key, binding)| {
                join::workload_of(key).map(|(ns, name)| (ns.to_string(), name.to_string(), binding))
            });
        let Some((ns, name, binding)) = bound else {
            return Err(refused("no ExternalWorkload joined with its key".into()));
        };
        if ns != namespace || binding.service_account != service_account {
            return Err(refused(format!(
                "its key joined as ExternalWorkload {ns}/{name} with service account {:?}, not {namespace}/{service_account:?}",
                binding.service_account
            )));
        }
        let (workload, record) = self.workload(&ns, &name).await.map_err(|e| match e {
            JoinError::Denied(m) => refused(m),
            other => other,
        })?;
        if workload.metadata.uid.as_deref() != Some(binding.uid.as_str()) {
            return Err(refused(format!("ExternalWorkload {ns}/{name} was deleted and made again since it joined")));
        }
        if record.service_account != service_account {
            return Err(refused(format!(
                "ExternalWorkload {ns}/{name} now holds service account {:?}",
                record.service_account
            )));
        }
        Ok(name)
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
