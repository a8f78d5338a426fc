//! What the cluster already holds of a mesh: the identity issuer Secret, the trust anchors, the
//! webhook's Secret and the stored install values. `install` refuses when any of the first or
//! the last is there; `upgrade` and `prune` render from it.

use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use cnimesh_identity::ca::CaPem;
use cnimesh_model::inject::{WEBHOOK_ISSUER_CERT as ISSUER_CERT, WEBHOOK_ISSUER_KEY as ISSUER_KEY};

use super::stored::{self, VALUES_CONFIG_MAP};
use super::values::Overrides;
use super::webhook_renewal::SecretKeeper;
use super::{
    Certificates, DEFAULT_CONTROL_NAMESPACE, ISSUER_SECRET, TRUST_ANCHORS_CONFIG_MAP, TRUST_ANCHORS_KEY, WEBHOOK_SECRET,
};

#[derive(Debug, Clone, Default)]
pub struct Installed {
    pub issuer: Option<Secret>,
    pub anchors: Option<ConfigMap>,
    pub webhook: Option<Secret>,
    pub values: Option<ConfigMap>,
}

/// Reads the four objects (absent ones are `None`; any other failure is an error).
pub async fn read(client: &kube::Client) -> Result<Installed, kube::Error> {
    let secrets: kube::Api<Secret> = kube::Api::namespaced(client.clone(), DEFAULT_CONTROL_NAMESPACE);
    let maps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), DEFAULT_CONTROL_NAMESPACE);
    Ok(Installed {
        issuer: secrets.get_opt(ISSUER_SECRET).await?,
        anchors: maps.get_opt(TRUST_ANCHORS_CONFIG_MAP).await?,
        webhook: secrets.get_opt(WEBHOOK_SECRET).await?,
        values: maps.get_opt(VALUES_CONFIG_MAP).await?,
    })
}

impl Installed {
    /// A mesh is installed when its issuer or its stored values exist.
    pub fn exists(&self) -> bool {
        self.issuer.is_some() || self.values.is_some()
    }

    /// What the refusal and the upgrade's header name.
    pub fn describe(&self) -> String {
        let mut found = Vec::new();
        if self.issuer.is_some() {
            found.push(format!("Secret {DEFAULT_CONTROL_NAMESPACE}/{ISSUER_SECRET}"));
        }
        if self.values.is_some() {
            found.push(format!("ConfigMap {DEFAULT_CONTROL_NAMESPACE}/{VALUES_CONFIG_MAP}"));
        }
        match self.version() {
            Some(version) => format!("{} (version {version})", found.join(", ")),
            None => found.join(", "),
        }
    }

    /// The version that rendered the stored values.
    pub fn version(&self) -> Option<&str> {
        self.values.as_ref()?.data.as_ref()?.get(stored::VERSION_KEY).map(String::as_str)
    }

    /// The stored overrides: none when the mesh predates the values ConfigMap.
    pub fn overrides(&self) -> anyhow::Result<Overrides> {
        match &self.values {
            Some(map) => stored::overrides(map),
            None => Ok(Overrides::default()),
        }
    }

    /// The trust anchors proxies hold (the ConfigMap; the issuer's `ca.crt` when it is missing).
    pub fn anchors_bundle(&self) -> Option<String> {
        self.anchors.as_ref()?.data.as_ref()?.get(TRUST_ANCHORS_KEY).cloned()
    }

    /// The issuer and the webhook certificates exactly as the cluster holds them.
    pub fn certificates(&self) -> anyhow::Result<Certificates> {
        let issuer = self.issuer.as_ref().with_context(|| {
            format!(
                "the mesh is not installed: no Secret {DEFAULT_CONTROL_NAMESPACE}/{ISSUER_SECRET}; use `cnimesh install`"
            )
        })?;
        let webhook = self.webhook.as_ref().with_context(|| {
            format!(
                "no Secret {DEFAULT_CONTROL_NAMESPACE}/{WEBHOOK_SECRET}: the webhook's CA cannot be kept; \
                 recreate it (`cnimesh ca webhook`) or reinstall with `cnimesh install --force`"
            )
        })?;
        let field = |secret: &Secret, name: &str, key: &str| -> anyhow::Result<String> {
            let bytes = secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .with_context(|| format!("the Secret {DEFAULT_CONTROL_NAMESPACE}/{name} has no {key}"))?;
            String::from_utf8(bytes.0.clone())
                .with_context(|| format!("the Secret {DEFAULT_CONTROL_NAMESPACE}/{name}'s {key} is not PEM text"))
        };
        let certs = Certificates {
            anchors: field(issuer, ISSUER_SECRET, "ca.crt")?,
            issuer_cert: field(issuer, ISSUER_SECRET, "tls.crt")?,
            issuer_key: field(issuer, ISSUER_SECRET, "tls.key")?,
            webhook_ca: field(webhook, WEBHOOK_SECRET, "ca.crt")?,
            webhook_cert: field(webhook, WEBHOOK_SECRET, "tls.crt")?,
            webhook_key: field(webhook, WEBHOOK_SECRET, "tls.key")?,
        };
        Ok(certs)
    }

    /// Who else keeps the webhook Secret: the CA key the managed mode stores in it, cert-manager's
    /// annotations ([`super::webhook_renewal`]).
    pub fn webhook_keeper(&self) -> SecretKeeper {
        let Some(secret) = &self.webhook else { return SecretKeeper::default() };
        let text = |key: &str| {
            let bytes = secret.data.as_ref()?.get(key)?;
            String::from_utf8(bytes.0.clone()).ok()
        };
        let managed_ca = match (text(ISSUER_CERT), text(ISSUER_KEY)) {
            (Some(cert_pem), Some(key_pem)) => Some(CaPem { cert_pem, key_pem }),
            _ => None,
        };
        let cert_manager =
            secret.metadata.annotations.iter().flatten().any(|(key, _)| key.starts_with("cert-manager.io/"));
        SecretKeeper { managed_ca, cert_manager }
    }
}
