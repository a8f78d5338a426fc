//! The webhook's certificates, kept by the control plane: an expired webhook certificate under
//! `failurePolicy: Fail` blocks every pod creation in meshed namespaces, so no person should have
//! to remember to renew it.
//!
//! Three parts:
//! - [`files::watch_dir`] (`--webhook-certs files`): the mounted directory, reloaded when the
//!   kubelet updates it, so every mode serves a new certificate without a restart;
//! - [`watch_secret`] (every replica, in both modes): the Secret `cnimesh-webhook-tls` is
//!   watched and its `tls.crt`/`tls.key` served from then on through a certificate resolver, no
//!   restart; a Secret that does not parse is logged and the last good certificate stays;
//! - [`Manager`] (managed mode, the leader of the `webhook-write` Lease only): creates the Secret
//!   (a private CA and a serving certificate), renews the serving certificate at 2/3 of its life,
//!   keeps the MutatingWebhookConfiguration's `caBundle` equal to the Secret's `ca.crt` with a
//!   JSON patch of that one field per webhook (the rest of the object is never written), and
//!   rotates the CA in the order that never leaves the API server unable to verify us:
//!   1. a new CA is staged and *added* to `ca.crt` (old + new), and the caBundle patched;
//!   2. only once the caBundle holds both, the serving certificate is re-issued by the new CA;
//!   3. after a grace period (replicas reload the Secret), the old CA is dropped from `ca.crt`,
//!      then from the caBundle.
//!
//! Secret layout (a `kubernetes.io/tls` Secret, as `cnimesh ca webhook` writes it, plus
//! the CA keys the manager needs): `ca.crt` (the caBundle: one or two CA certificates),
//! `tls.crt`, `tls.key`, `issuer.crt`/`issuer.key` (the CA that signed `tls.crt`), during a
//! rotation `next.crt`/`next.key`, and the annotation `cnimesh.io/ca-switched-at` (Unix seconds).
//! A bring-your-own Secret (no `issuer.key`) is only read; the manager, if asked to manage it,
//! adopts it by rotating to a CA of its own.
//!
//! Layer: runtime: kube in and out, [`cnimesh_runtime::leader`] decides who writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cnimesh_identity::ca::{self, CaPem};
use cnimesh_identity::pem::split_pem;
use cnimesh_identity::tls::{CurrentCert, past_two_thirds};
use cnimesh_model::inject::{WEBHOOK_ISSUER_CERT, WEBHOOK_ISSUER_KEY};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::sync::watch;

use cnimesh_runtime::leader::{self, ElectionConfig, Leadership};

pub mod files;
use cnimesh_model::metrics::Metrics;

pub const CA_FILE: &str = "ca.crt";
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";
pub const NEXT_CERT: &str = "next.crt";
pub const NEXT_KEY: &str = "next.key";
pub const SWITCHED_AT: &str = "cnimesh.io/ca-switched-at";
/// The MutatingWebhookConfiguration `daemonset/control-webhook.yaml` installs.
pub const WEBHOOK_CONFIGURATION: &str = "cnimesh-proxy-injector";
pub const DEFAULT_SERVING_LIFETIME: Duration = Duration::from_secs(30 * 86400);
pub const DEFAULT_CA_LIFETIME: Duration = Duration::from_secs(365 * 86400);

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("certificate generation: {0}")]
    Ca(#[from] ca::CaError),
    #[error("secret {secret}: {why}")]
    Invalid { secret: String, why: String },
    #[error("not the leader of {0}: nothing written")]
    NotLeader(String),
}

/// How the manager keeps certificates.
#[derive(Debug, Clone)]
pub struct CertPolicy {
    /// The webhook Service's DNS names (`inject::webhook_dns_names`).
    pub dns_names: Vec<String>,
    pub serving_lifetime: Duration,
    pub ca_lifetime: Duration,
    /// How often the leader looks (renewals are days apart; the first look is at once).
    pub check_interval: Duration,
    /// Between switching the serving certificate to a new CA and dropping the old CA: time for
    /// every replica to load the new certificate from the Secret.
    pub rotation_grace: Duration,
}

/// Where the webhook's certificate comes from when it is a Secret (`serve --webhook-certs
/// secret|managed`).
pub struct SecretSource {
    pub client: kube::Client,
    pub namespace: String,
    pub secret: String,
    /// What the webhook listener presents (`inject::webhook_tls_from`).
    pub current: Arc<CurrentCert>,
    /// Managed mode: this replica stands for election and, leading, keeps the certificates.
    /// `None`: bring-your-own, the control plane only reads.
    pub manage: Option<(ElectionConfig, CertPolicy)>,
}

/// Starts the Secret watch and, when managed, the election and the manager; all end when
/// `stopped` turns true (the elector releasing its Lease).
pub fn spawn(
    source: SecretSource,
    metrics: Arc<Metrics>,
    stopped: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let secrets = Api::namespaced(source.client.clone(), &source.namespace);
    let mut tasks = vec![tokio::spawn(watch_secret(secrets, source.secret.clone(), source.current, stopped.clone()))];
    if let Some((election, policy)) = source.manage {
        let (leadership, elector) =
            leader::spawn(source.client.clone(), leader::WEBHOOK_WRITE, election, metrics, stopped.clone());
        let manager =
            Manager::new(source.client, &source.namespace, &source.secret, WEBHOOK_CONFIGURATION, leadership, policy);
        tasks.push(elector);
        tasks.push(tokio::spawn(manager.run(stopped)));
    }
    tasks
}

/// What one reconciliation did; tests follow rotations step by step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Idle,
    Created,
    PatchedBundle,
    RenewedServing,
    StagedCa,
    SwitchedServing,
    DroppedOldCa,
    /// The MutatingWebhookConfiguration does not exist (yet): nothing to patch.
    NoWebhookConfiguration,
}

/// The Secret's contents, parsed.
#[derive(Debug, Clone)]
struct Pki {
    bundle: Vec<String>,
    serving: CaPem,
    issuer: Option<CaPem>,
    next: Option<CaPem>,
    switched_at: Option<SystemTime>,
}

/// The certificate `tls.crt` holds and its key, checked and ready for rustls.
pub fn serving_key(secret: &Secret) -> Result<Arc<rustls::sign::CertifiedKey>, String> {
    let data = |key: &str| secret.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.clone());
    let cert = data(CERT_FILE).ok_or_else(|| format!("no {CERT_FILE}"))?;
    let key = data(KEY_FILE).ok_or_else(|| format!("no {KEY_FILE}"))?;
    let chain = cnimesh_identity::pem::certs(&cert, CERT_FILE).map_err(|e| e.to_string())?;
    let key = cnimesh_identity::pem::key(&key, KEY_FILE).map_err(|e| e.to_string())?;
    cnimesh_identity::tls::certified_key(chain, key).map_err(|e| e.to_string())
}

/// Serves whatever the Secret `name` holds through `current`, from now until `stopped`.
pub async fn watch_secret(
    api: Api<Secret>,
    name: String,
    current: Arc<CurrentCert>,
    mut stopped: watch::Receiver<bool>,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(api, config));
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = stopped.wait_for(|s| *s) => return,
        };
        match event {
            Some(Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret))) => match serving_key(&secret) {
                Ok(key) => {
                    let not_after = key.cert.first().and_then(|c| cnimesh_identity::tls::not_after(c).ok());
                    tracing::info!(secret = %name, not_after = ?not_after.map(humantime::format_rfc3339_seconds), "serving the webhook certificate");
                    current.set(key);
                }
                Err(why) => {
                    tracing::warn!(secret = %name, %why, "the webhook Secret does not hold a usable certificate; keeping the last one")
                }
            },
            Some(Ok(_)) => {}
            Some(Err(error)) => {
                tracing::warn!(secret = %name, %error, "watching the webhook Secret");
                // The watcher retries on its own; do not spin on a failing API server.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            None => return,
        }
    }
}

/// The leader's half: keeps the Secret and the caBundle.
pub struct Manager {
    secrets: Api<Secret>,
    webhooks: Api<MutatingWebhookConfiguration>,
    secret: String,
    webhook_configuration: String,
    leadership: Leadership,
    policy: CertPolicy,
}

impl Manager {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        secret: &str,
        webhook_configuration: &str,
        leadership: Leadership,
        policy: CertPolicy,
    ) -> Self {
        Self {
            secrets: Api::namespaced(client.clone(), namespace),
            webhooks: Api::all(client),
            secret: secret.into(),
            webhook_configuration: webhook_configuration.into(),
            leadership,
            policy,
        }
    }

    /// Reconciles while leading until `stopped`: at once on becoming leader, then every
    /// `check_interval`; steps of a rotation follow each other without waiting.
    pub async fn run(self, mut stopped: watch::Receiver<bool>) {
        let mut leadership = self.leadership.clone();
        loop {
            tokio::select! {
                _ = leadership.acquired() => {}
                _ = stopped.wait_for(|s| *s) => return,
            }
            for _ in 0..8 {
                let step = tokio::select! {
                    step = self.reconcile(SystemTime::now()) => step,
                    // Lost mid-step: the write in flight is dropped, no more are made.
                    _ = leadership.lost() => break,
                };
                match step {
                    Ok(Step::Idle | Step::NoWebhookConfiguration) => break,
                    Ok(step) => tracing::info!(?step, secret = %self.secret, "webhook certificates"),
                    Err(CertsError::NotLeader(_)) => break,
                    Err(error) => {
                        tracing::warn!(%error, secret = %self.secret, "keeping the webhook certificates");
                        break;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.policy.check_interval) => {}
                _ = stopped.wait_for(|s| *s) => return,
            }
        }
    }

    /// One step towards the desired state as of `now` (a parameter so tests can be 20 days
    /// later): at most one write to the Secret or one patch of the caBundle.
    pub async fn reconcile(&self, now: SystemTime) -> Result<Step, CertsError> {
        let Some(secret) = self.secrets.get_opt(&self.secret).await? else {
            let pki = self.fresh()?;
            self.guard()?;
            let secret = Secret {
                metadata: ObjectMeta { name: Some(self.secret.clone()), ..Default::default() },
                type_: Some("kubernetes.io/tls".into()),
                data: Some(encode(&pki)),
                ..Default::default()
            };
            self.secrets.create(&PostParams::default(), &secret).await?;
            return Ok(Step::Created);
        };
        let pki = self.parse(&secret)?;

        // The caBundle first: nothing else moves until the API server trusts what `ca.crt` holds.
        match self.patch_bundle(&pki.bundle.concat()).await? {
            Step::Idle => {}
            step => return Ok(step),
        }

        let mut next = pki.clone();
        let step = if let Some(new_ca) = pki.next.clone() {
            // 2. The API server has old + new: switch the serving certificate to the new CA.
            next.serving =
                ca::Signer::new(&new_ca)?.new_server_cert(&self.policy.dns_names, self.policy.serving_lifetime)?;
            next.issuer = Some(new_ca);
            next.next = None;
            next.switched_at = Some(now);
            Step::SwitchedServing
        } else if let Some(issuer) =
            pki.issuer.as_ref().filter(|i| pki.bundle.len() > 1 && pki.bundle != [i.cert_pem.clone()])
            && pki.switched_at.is_none_or(|at| now >= at + self.policy.rotation_grace)
        {
            // 3. Every replica had time to load the new serving certificate: drop the old CA.
            next.bundle = vec![issuer.cert_pem.clone()];
            next.switched_at = None;
            Step::DroppedOldCa
        } else if pki.issuer.as_ref().is_none_or(|i| past_two_thirds(&i.cert_pem, now)) && pki.bundle.len() == 1 {
            // 1. Stage a new CA beside the old one.
            let new_ca = ca::new_private_ca("cnimesh webhook CA", self.policy.ca_lifetime)?;
            next.bundle.push(new_ca.cert_pem.clone());
            next.next = Some(new_ca);
            Step::StagedCa
        } else if let Some(issuer) = pki.issuer.as_ref().filter(|_| past_two_thirds(&pki.serving.cert_pem, now)) {
            next.serving =
                ca::Signer::new(issuer)?.new_server_cert(&self.policy.dns_names, self.policy.serving_lifetime)?;
            Step::RenewedServing
        } else {
            return Ok(Step::Idle);
        };
        self.write(secret, &next).await?;
        Ok(step)
    }

    fn fresh(&self) -> Result<Pki, CertsError> {
        let issuer = ca::new_private_ca("cnimesh webhook CA", self.policy.ca_lifetime)?;
        let serving =
            ca::Signer::new(&issuer)?.new_server_cert(&self.policy.dns_names, self.policy.serving_lifetime)?;
        Ok(Pki { bundle: vec![issuer.cert_pem.clone()], serving, issuer: Some(issuer), next: None, switched_at: None })
    }

    fn guard(&self) -> Result<(), CertsError> {
        if self.leadership.is_leading() { Ok(()) } else { Err(CertsError::NotLeader(self.leadership.role().into())) }
    }

    fn parse(&self, secret: &Secret) -> Result<Pki, CertsError> {
        let invalid = |why: String| CertsError::Invalid { secret: self.secret.clone(), why };
        let text = |key: &str| -> Result<Option<String>, CertsError> {
            match secret.data.as_ref().and_then(|d| d.get(key)) {
                None => Ok(None),
                Some(bytes) => {
                    String::from_utf8(bytes.0.clone()).map(Some).map_err(|_| invalid(format!("{key} is not PEM")))
                }
            }
        };
        let pair = |cert: &str, key: &str| -> Result<Option<CaPem>, CertsError> {
            Ok(match (text(cert)?, text(key)?) {
                (Some(cert_pem), Some(key_pem)) => Some(CaPem { cert_pem, key_pem }),
                _ => None,
            })
        };
        let bundle_pem = text(CA_FILE)?.ok_or_else(|| invalid(format!("no {CA_FILE}")))?;
        let bundle = split_pem(&bundle_pem);
        if bundle.is_empty() {
            return Err(invalid(format!("{CA_FILE} holds no certificate")));
        }
        let serving = pair(CERT_FILE, KEY_FILE)?.ok_or_else(|| invalid(format!("no {CERT_FILE} and {KEY_FILE}")))?;
        let switched_at = secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SWITCHED_AT))
            .and_then(|s| s.parse::<u64>().ok())
            .map(|s| UNIX_EPOCH + Duration::from_secs(s));
        Ok(Pki {
            bundle,
            serving,
            issuer: pair(WEBHOOK_ISSUER_CERT, WEBHOOK_ISSUER_KEY)?,
            next: pair(NEXT_CERT, NEXT_KEY)?,
            switched_at,
        })
    }

    async fn write(&self, mut secret: Secret, pki: &Pki) -> Result<(), CertsError> {
        secret.data = Some(encode(pki));
        let annotations = secret.metadata.annotations.get_or_insert_with(Default::default);
        match pki.switched_at {
            Some(at) => annotations
                .insert(SWITCHED_AT.into(), at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs().to_string()),
            None => annotations.remove(SWITCHED_AT),
        };
        self.guard()?;
        // Guarded by the resourceVersion just read: a stale leader's write is refused (409).
        self.secrets.replace(&self.secret, &PostParams::default(), &secret).await?;
        Ok(())
    }

    /// Makes every webhook's caBundle `bundle`, one JSON patch per out-of-step object, each
    /// operation pinned to its webhook by a `test` of the name (a reordered list fails the
    /// patch instead of patching the wrong entry).
    async fn patch_bundle(&self, bundle: &str) -> Result<Step, CertsError> {
        let Some(config) = self.webhooks.get_opt(&self.webhook_configuration).await? else {
            tracing::warn!(name = %self.webhook_configuration, "no MutatingWebhookConfiguration to keep the caBundle of");
            return Ok(Step::NoWebhookConfiguration);
        };
        let mut ops = Vec::new();
        for (i, webhook) in config.webhooks.iter().flatten().enumerate() {
            if webhook.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()) == Some(bundle.as_bytes()) {
                continue;
            }
            ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": webhook.name}));
            let value = serde_json::to_value(ByteString(bundle.as_bytes().to_vec())).unwrap_or(Value::Null);
            ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": value}));
        }
        if ops.is_empty() {
            return Ok(Step::Idle);
        }
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops))
            .map_err(|e| CertsError::Invalid { secret: self.secret.clone(), why: e.to_string() })?;
        self.guard()?;
        self.webhooks.patch(&self.webhook_configuration, &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
        Ok(Step::PatchedBundle)
    }
}

fn encode(pki: &Pki) -> BTreeMap<String, ByteString> {
    let mut data = BTreeMap::new();
    let mut put = |key: &str, value: &str| {
        data.insert(key.to_string(), ByteString(value.as_bytes().to_vec()));
    };
    put(CA_FILE, &pki.bundle.concat());
    put(CERT_FILE, &pki.serving.cert_pem);
    put(KEY_FILE, &pki.serving.key_pem);
    if let Some(issuer) = &pki.issuer {
        put(WEBHOOK_ISSUER_CERT, &issuer.cert_pem);
        put(WEBHOOK_ISSUER_KEY, &issuer.key_pem);
    }
    if let Some(next) = &pki.next {
        put(NEXT_CERT, &next.cert_pem);
        put(NEXT_KEY, &next.key_pem);
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_split_and_certificates_fall_due_at_two_thirds() {
        let a = ca::new_private_ca("a", Duration::from_secs(30 * 86400)).unwrap();
        let b = ca::new_private_ca("b", Duration::from_secs(30 * 86400)).unwrap();
        assert_eq!(split_pem(&format!("{}{}", a.cert_pem, b.cert_pem)), [a.cert_pem.clone(), b.cert_pem]);
        let now = SystemTime::now();
        assert!(!past_two_thirds(&a.cert_pem, now + Duration::from_secs(19 * 86400)));
        assert!(past_two_thirds(&a.cert_pem, now + Duration::from_secs(21 * 86400)));
        assert!(past_two_thirds("not a certificate", now));
    }
}
