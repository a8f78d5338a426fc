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
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

use super::join_secret::JoinSecret;
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
    /// The control plane's: the watched Secret, so that checks ask the API server nothing;
    /// `None` (the CLI): read when needed.
    seen: Option<JoinSecret>,
}

impl JoinStore {
    /// Reads the Secret when needed: for `cnimesh external-workload join`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self { client, namespace: namespace.into(), seen: None }
    }

    /// Checks tokens and keys against the Secret as watched ([`JoinSecret`]) until `stopped`:
    /// the control plane's Identity service, which anyone may call. The API server is asked only
    /// once a token matched (the ExternalWorkload, the compare-and-swap) or a key is bound.
    pub fn watching(client: kube::Client, namespace: &str, stopped: tokio::sync::watch::Receiver<bool>) -> Self {
        let seen = JoinSecret::watch(client.clone(), namespace, stopped);
        Self { seen: Some(seen), ..Self::new(client, namespace) }
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
        let mut secret = self.snapshot().await?;
        // Read from the API server: nothing newer to wait for.
        let mut waited = self.seen.is_none();
        for _ in 0..ATTEMPTS {
            let pending = match pending_for(secret.as_deref(), token, service_account) {
                Ok(pending) => pending,
                // Maybe a token made an instant ago, not yet seen: wait for the next version once.
                Err(JoinError::Unauthenticated(_)) if !waited => {
                    waited = true;
                    secret = self.newer_than(&secret).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
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
            let mut secret_now = Secret::clone(secret.as_deref().expect("the pending token came from it"));
            let data = secret_now.data.get_or_insert_default();
            data.retain(|_, v| {
                !matches!(serde_json::from_slice::<Entry>(&v.0), Ok(Entry::Bound(b)) if b.key_sha256 == key_sha256)
            });
            let binding = Entry::Bound(Binding {
                uid: pending.uid,
                service_account: service_account.into(),
                key_sha256: key_sha256.into(),
            });
            data.insert(token.key(), ByteString(serde_json::to_vec(&binding).expect("plain data serialises")));
            match self.secrets().replace(join::SECRET_NAME, &PostParams::default(), &secret_now).await {
                Ok(_) => return Ok(()),
                // Someone wrote the Secret since we read (or saw) it: maybe a use of this very
                // token. Read it again from the API server: this caller holds a matching token.
                Err(e) if conflict(&e) => {
                    secret = self.read().await?.map(Arc::new);
                    waited = true;
                    continue;
                }
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
        let mut secret = self.snapshot().await?;
        let mut bound = bound_to(secret.as_deref(), key_sha256)?;
        if bound.is_none() && self.seen.is_some() {
            // Maybe it joined an instant ago, not yet seen: wait for the next version once.
            secret = self.newer_than(&secret).await?;
            bound = bound_to(secret.as_deref(), key_sha256)?;
        }
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

    /// The Secret to check a token or a key against: as watched, or (the CLI) read. Its type is
    /// checked where it is used ([`ours`]).
    async fn snapshot(&self) -> Result<Option<Arc<Secret>>, JoinError> {
        match &self.seen {
            Some(seen) => seen.current().await,
            None => Ok(self.get().await?.map(Arc::new)),
        }
    }

    /// The next version of the watched Secret than `checked` (bounded wait); `checked` itself
    /// when it is not watched.
    async fn newer_than(&self, checked: &Option<Arc<Secret>>) -> Result<Option<Arc<Secret>>, JoinError> {
        match &self.seen {
            Some(seen) => seen.newer_than(checked).await,
            None => Ok(checked.clone()),
        }
    }

    /// The Secret, when it exists and is ours (its type); a Secret of that name with another
    /// type is refused rather than read.
    async fn read(&self) -> Result<Option<Secret>, JoinError> {
        let secret = self.get().await?;
        ours(secret.as_ref())?;
        Ok(secret)
    }

    async fn get(&self) -> Result<Option<Secret>, JoinError> {
        self.secrets()
            .get_opt(join::SECRET_NAME)
            .await
            .map_err(|e| JoinError::Unavailable(format!("reading Secret {}: {e}", self.where_())))
    }

    fn where_(&self) -> String {
        format!("{}/{}", self.namespace, join::SECRET_NAME)
    }
}

/// `secret` when it is the join tokens' (its type); a Secret of that name with another type is
/// refused rather than read.
fn ours(secret: Option<&Secret>) -> Result<Option<&Secret>, JoinError> {
    match secret {
        Some(s) if s.type_.as_deref() != Some(join::SECRET_TYPE) => Err(JoinError::Unauthenticated(format!(
            "Secret {} has type {:?}, not {}: not read",
            join::SECRET_NAME,
            s.type_,
            join::SECRET_TYPE
        ))),
        other => Ok(other),
    }
}

/// The pending token of `token`'s workload in `secret`, checked against `token` (hash, expiry,
/// service account).
fn pending_for(secret: Option<&Secret>, token: &JoinToken, service_account: &str) -> Result<Pending, JoinError> {
    let data = ours(secret)?.and_then(|s| s.data.as_ref()).ok_or_else(|| join::not_pending(token))?;
    let pending = match data.get(&token.key()).map(|v| serde_json::from_slice::<Entry>(&v.0)) {
        Some(Ok(Entry::Pending(pending))) => pending,
        Some(Ok(Entry::Bound(_))) | None => return Err(join::not_pending(token)),
        Some(Err(error)) => {
            // Told to the operator's log, not to the caller: it would say an entry exists.
            tracing::warn!(workload = %token.key(), %error, "an unreadable entry in the join tokens' Secret");
            return Err(join::not_pending(token));
        }
    };
    pending.check(token, service_account, SystemTime::now())?;
    Ok(pending)
}

/// The workload (namespace, name) and binding that key `key_sha256` joined as, if any.
fn bound_to(secret: Option<&Secret>, key_sha256: &str) -> Result<Option<(String, String, Binding)>, JoinError> {
    Ok(ours(secret)?
        .iter()
        .flat_map(|s| s.data.iter().flatten())
        .filter_map(|(key, v)| match serde_json::from_slice::<Entry>(&v.0) {
            Ok(Entry::Bound(binding)) if binding.key_sha256 == key_sha256 => Some((key, binding)),
            _ => None,
        })
        .find_map(|(key, binding)| {
            join::workload_of(key).map(|(ns, name)| (ns.to_string(), name.to_string(), binding))
        }))
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 409)
}
