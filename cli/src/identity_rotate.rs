//! `cnimesh identity rotate bundle|switch-issuer|drop-old`: replacing the mesh's trust anchor
//! (and the issuer under it) without a failed request. Each step reads the issuer
//! Secret and the trust-anchors ConfigMap from the cluster and prints both as they must be next,
//! for `kubectl apply -f -`; nothing is written by the command itself. The order is what keeps
//! every handshake verifiable (docs/install/rotation.md):
//! 1. `bundle --new-anchor NEW/ca.crt`: anchors = old + new; the issuer is unchanged. The
//!    control plane reloads the Secret and injects the bundle into new pods; restart meshed
//!    workloads so running proxies hold it too (`cnimesh check` lists those that do not).
//! 2. `switch-issuer --issuer-dir NEW`: the issuer signed by the new anchor (`cnimesh ca init
//!    --dir NEW` wrote it); anchors stay old + new, so peers accept both generations of
//!    certificates while proxies renew theirs.
//! 3. `drop-old`: anchors = those the current issuer chains to.
//!
//! Every result is checked as the control plane will check it ([`Issuer::from_pem`]: the issuer
//! must sign leaves that verify against the anchors) before anything is printed: a step that
//! would leave the control plane without an issuer is refused with the step to run first.
//!
//! Layer: commands (reads the cluster, prints manifests).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use cnimesh_model::identity::Issuer;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use serde_json::{Value, json};

use crate::ClusterArgs;
use crate::install::{ISSUER_SECRET, TRUST_ANCHORS_CONFIG_MAP, TRUST_ANCHORS_KEY};
use cnimesh_common::names::CONTROL_NAMESPACE;

const ANCHORS: &str = "ca.crt";
const ISSUER_CERT: &str = "tls.crt";
const ISSUER_KEY: &str = "tls.key";

#[derive(Debug, Subcommand)]
pub enum IdentityCommand {
    /// Rotate the trust anchor and the issuer, one step at a time; each step prints the issuer
    /// Secret and the trust-anchors ConfigMap for `kubectl apply -f -`.
    #[command(subcommand)]
    Rotate(RotateStep),
}

#[derive(Debug, Subcommand)]
pub enum RotateStep {
    /// Step 1: trust the new anchor beside the old one (the issuer does not change).
    Bundle(BundleArgs),
    /// Step 2: sign with the issuer under the new anchor (run `bundle` first).
    SwitchIssuer(SwitchIssuerArgs),
    /// Step 3: trust only the anchor the current issuer chains to.
    DropOld,
}

#[derive(Debug, Args)]
pub struct BundleArgs {
    /// The new trust anchor's certificate (PEM), e.g. ca.crt of `cnimesh ca init --dir NEW`.
    #[arg(long)]
    pub new_anchor: PathBuf,
}

#[derive(Debug, Args)]
pub struct SwitchIssuerArgs {
    /// A directory with the new issuer's tls.crt and tls.key (`cnimesh ca init --dir NEW`).
    #[arg(long)]
    pub issuer_dir: PathBuf,
}

/// Why a step cannot be taken; each says what to do instead.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RotateError {
    #[error("{what}: {why}")]
    Invalid { what: String, why: String },
    #[error("the trust anchors already hold {0}: nothing to bundle")]
    AlreadyBundled(String),
    #[error(
        "the new issuer ({0}) does not chain to any anchor the cluster trusts yet: run `cnimesh identity rotate bundle --new-anchor <its anchor>` first, and restart meshed workloads"
    )]
    NotBundled(String),
    #[error("the trust anchors hold a single anchor ({0}): there is no old anchor to drop")]
    NothingToDrop(String),
    #[error(
        "the issuer does not chain to the newest anchor of the bundle yet; switch to the new issuer first: cnimesh identity rotate switch-issuer --issuer-dir NEW"
    )]
    NotSwitched,
    #[error("the result would not load in the control plane: {0}")]
    Rejected(String),
}

/// The issuer Secret's three files as PEM text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// One PEM block per anchor, in bundle order.
    pub anchors: Vec<String>,
    pub issuer_cert: String,
    pub issuer_key: String,
}

impl Stored {
    pub fn anchors_pem(&self) -> String {
        self.anchors.concat()
    }

    /// What the control plane would make of it: refuses anything it would refuse.
    fn validated(self) -> Result<Self, RotateError> {
        Issuer::from_pem(self.anchors_pem().as_bytes(), self.issuer_cert.as_bytes(), self.issuer_key.as_bytes())
            .map_err(|e| RotateError::Rejected(e.to_string()))?;
        Ok(self)
    }

    /// Whether the current issuer chains to `anchor` alone.
    fn chains_to(&self, anchor: &str) -> bool {
        Issuer::from_pem(anchor.as_bytes(), self.issuer_cert.as_bytes(), self.issuer_key.as_bytes()).is_ok()
    }
}

/// The subject of the first certificate in `pem`, for messages.
fn subject(pem: &str) -> String {
    let der = cnimesh_identity::pem::certs(pem.as_bytes(), "certificate").ok().and_then(|c| c.into_iter().next());
    der.and_then(|d| cnimesh_identity::tls::subject_of(&d)).unwrap_or_else(|| "an unreadable certificate".into())
}

/// Anchors as PEM blocks, each checked to be a certificate.
fn anchor_blocks(pem: &str, what: &str) -> Result<Vec<String>, RotateError> {
    let invalid = |why: String| RotateError::Invalid { what: what.to_string(), why };
    cnimesh_identity::pem::certs(pem.as_bytes(), what).map_err(|e| invalid(e.to_string()))?;
    let blocks: Vec<String> = cnimesh_identity::pem::split_pem(pem)
        .into_iter()
        .filter(|b| b.contains("-----BEGIN CERTIFICATE-----"))
        .collect();
    if blocks.is_empty() {
        return Err(invalid("no certificate".into()));
    }
    Ok(blocks)
}

/// Whether two PEM blocks are the same certificate (whitespace aside).
fn same(a: &str, b: &str) -> bool {
    let der = |p: &str| cnimesh_identity::pem::certs(p.as_bytes(), "anchor").ok();
    der(a).is_some() && der(a) == der(b)
}

/// Step 1: `stored`'s anchors plus `new_anchor`.
pub fn bundle(stored: &Stored, new_anchor: &str) -> Result<Stored, RotateError> {
    let new = anchor_blocks(new_anchor, "the new anchor")?;
    let mut next = stored.clone();
    for block in new {
        if next.anchors.iter().any(|a| same(a, &block)) {
            return Err(RotateError::AlreadyBundled(subject(&block)));
        }
        next.anchors.push(block);
    }
    next.validated()
}

/// Step 2: the issuer in `cert`/`key`, which must chain to an anchor already trusted.
pub fn switch_issuer(stored: &Stored, cert: &str, key: &str) -> Result<Stored, RotateError> {
    let next = Stored { anchors: stored.anchors.clone(), issuer_cert: cert.into(), issuer_key: key.into() };
    match Issuer::from_pem(next.anchors_pem().as_bytes(), cert.as_bytes(), key.as_bytes()) {
        Ok(_) => Ok(next),
        Err(cnimesh_model::identity::issuer::IssuerError::Chain(_)) => Err(RotateError::NotBundled(subject(cert))),
        Err(e) => Err(RotateError::Rejected(e.to_string())),
    }
}

/// Step 3: only the anchors the current issuer chains to.
pub fn drop_old(stored: &Stored) -> Result<Stored, RotateError> {
    if stored.anchors.len() < 2 {
        return Err(RotateError::NothingToDrop(stored.anchors.first().map(|a| subject(a)).unwrap_or_default()));
    }
    // `bundle` appends the new anchor: until the issuer chains to it, nothing may be dropped.
    if !stored.anchors.last().is_some_and(|newest| stored.chains_to(newest)) {
        return Err(RotateError::NotSwitched);
    }
    let kept: Vec<String> = stored.anchors.iter().filter(|a| stored.chains_to(a)).cloned().collect();
    Stored { anchors: kept, ..stored.clone() }.validated()
}

/// Reads the Secret's files.
pub fn stored_from(secret: &Secret) -> anyhow::Result<Stored> {
    let text = |key: &str| -> anyhow::Result<String> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .with_context(|| format!("Secret {CONTROL_NAMESPACE}/{ISSUER_SECRET} has no {key}"))?;
        String::from_utf8(bytes.0.clone()).with_context(|| format!("{key} of Secret {ISSUER_SECRET} is not PEM"))
    };
    let anchors = anchor_blocks(&text(ANCHORS)?, &format!("{ANCHORS} of Secret {ISSUER_SECRET}"))?;
    Ok(Stored { anchors, issuer_cert: text(ISSUER_CERT)?, issuer_key: text(ISSUER_KEY)? })
}

/// Drops what the API server owns, keeps what the operator (or install) set: labels and
/// annotations survive `kubectl apply`.
fn applied_meta(meta: &kube::api::ObjectMeta) -> Value {
    let mut annotations = meta.annotations.clone().unwrap_or_default();
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    let mut out = json!({"name": meta.name, "namespace": CONTROL_NAMESPACE});
    if let Some(labels) = meta.labels.as_ref().filter(|l| !l.is_empty()) {
        out["labels"] = json!(labels);
    }
    if !annotations.is_empty() {
        out["annotations"] = json!(annotations);
    }
    out
}

/// The Secret and the ConfigMap holding `next`, keeping the existing objects' labels.
pub fn manifests(next: &Stored, secret: &Secret, config_map: Option<&ConfigMap>) -> Vec<Value> {
    let data: BTreeMap<&str, ByteString> =
        [(ANCHORS, next.anchors_pem()), (ISSUER_CERT, next.issuer_cert.clone()), (ISSUER_KEY, next.issuer_key.clone())]
            .into_iter()
            .map(|(k, v)| (k, ByteString(v.into_bytes())))
            .collect();
    let config_map_meta = match config_map {
        Some(cm) => applied_meta(&cm.metadata),
        None => json!({"name": TRUST_ANCHORS_CONFIG_MAP, "namespace": CONTROL_NAMESPACE}),
    };
    vec![
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": applied_meta(&secret.metadata),
            "type": secret.type_.clone().unwrap_or_else(|| "kubernetes.io/tls".into()),
            "data": data,
        }),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": config_map_meta,
            "data": BTreeMap::from([(TRUST_ANCHORS_KEY, next.anchors_pem())]),
        }),
    ]
}

fn read(path: &PathBuf) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Computes `step` from what `client`'s cluster holds; returns the manifests' YAML and a note
/// for stderr (what to do after applying).
pub async fn plan(client: kube::Client, step: &RotateStep) -> anyhow::Result<(String, &'static str)> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), CONTROL_NAMESPACE);
    let config_maps: Api<ConfigMap> = Api::namespaced(client, CONTROL_NAMESPACE);
    let secret = secrets
        .get_opt(ISSUER_SECRET)
        .await
        .with_context(|| format!("reading Secret {CONTROL_NAMESPACE}/{ISSUER_SECRET}"))?
        .with_context(|| format!("no Secret {CONTROL_NAMESPACE}/{ISSUER_SECRET}: is the mesh installed?"))?;
    let config_map = config_maps
        .get_opt(TRUST_ANCHORS_CONFIG_MAP)
        .await
        .with_context(|| format!("reading ConfigMap {CONTROL_NAMESPACE}/{TRUST_ANCHORS_CONFIG_MAP}"))?;
    let stored = stored_from(&secret)?;
    let (next, note) = match step {
        RotateStep::Bundle(args) => (
            bundle(&stored, &read(&args.new_anchor)?)?,
            "next: apply, restart meshed workloads (kubectl rollout restart), wait until `cnimesh check` says every proxy holds the bundle, then run switch-issuer",
        ),
        RotateStep::SwitchIssuer(args) => (
            switch_issuer(
                &stored,
                &read(&args.issuer_dir.join(ISSUER_CERT))?,
                &read(&args.issuer_dir.join(ISSUER_KEY))?,
            )?,
            "next: apply, wait until `cnimesh check` says every proxy holds a certificate from the new issuer (at most one certificate lifetime), then run drop-old",
        ),
        RotateStep::DropOld => (drop_old(&stored)?, "next: apply; the rotation is done"),
    };
    Ok((crate::yaml::render(&manifests(&next, &secret, config_map.as_ref())), note))
}

pub async fn main(cluster: &ClusterArgs, command: IdentityCommand, out: &mut impl Write) -> anyhow::Result<()> {
    let IdentityCommand::Rotate(step) = command;
    let (yaml, note) = plan(cluster.client().await?, &step).await?;
    out.write_all(yaml.as_bytes())?;
    eprintln!("{note}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use cnimesh_identity::ca;

    const DAY: Duration = Duration::from_secs(86400);

    fn generation() -> (ca::CaPem, ca::CaPem) {
        let anchor = ca::new_trust_anchor("cluster.local", DAY).unwrap();
        let issuer = ca::new_issuer(&anchor, "cluster.local", DAY).unwrap();
        (anchor, issuer)
    }

    #[test]
    fn the_three_steps_bundle_switch_and_drop_and_each_refuses_to_run_out_of_order() {
        let (old, old_issuer) = generation();
        let (new, new_issuer) = generation();
        let start = Stored {
            anchors: vec![old.cert_pem.clone()],
            issuer_cert: old_issuer.cert_pem.clone(),
            issuer_key: old_issuer.key_pem.clone(),
        };
        assert_eq!(drop_old(&start), Err(RotateError::NothingToDrop(subject(&old.cert_pem))));
        assert!(matches!(
            switch_issuer(&start, &new_issuer.cert_pem, &new_issuer.key_pem),
            Err(RotateError::NotBundled(_))
        ));

        let bundled = bundle(&start, &new.cert_pem).unwrap();
        assert_eq!(bundled.anchors, [old.cert_pem.clone(), new.cert_pem.clone()]);
        assert_eq!(bundled.issuer_cert, old_issuer.cert_pem, "the issuer does not change yet");
        assert!(matches!(bundle(&bundled, &new.cert_pem), Err(RotateError::AlreadyBundled(_))));
        assert_eq!(drop_old(&bundled), Err(RotateError::NotSwitched), "dropping now would drop nothing useful");

        // A key that is not the certificate's is refused as the control plane would.
        assert!(matches!(
            switch_issuer(&bundled, &new_issuer.cert_pem, &old_issuer.key_pem),
            Err(RotateError::NotBundled(_) | RotateError::Rejected(_))
        ));
        let switched = switch_issuer(&bundled, &new_issuer.cert_pem, &new_issuer.key_pem).unwrap();
        assert_eq!(switched.anchors.len(), 2, "both anchors stay while proxies renew");

        let done = drop_old(&switched).unwrap();
        assert_eq!(done.anchors, std::slice::from_ref(&new.cert_pem));
        assert_eq!(done.issuer_cert, new_issuer.cert_pem);
    }

    #[test]
    fn a_new_anchor_that_is_not_a_certificate_is_named_in_the_error() {
        let (old, old_issuer) = generation();
        let start =
            Stored { anchors: vec![old.cert_pem], issuer_cert: old_issuer.cert_pem, issuer_key: old_issuer.key_pem };
        let e = bundle(&start, "not a certificate").unwrap_err().to_string();
        assert!(e.contains("the new anchor"), "{e}");
    }

    #[tokio::test]
    async fn each_step_prints_the_secret_and_the_config_map_keeping_their_labels() {
        use crate::check::mock::MockApi;
        let (old, old_issuer) = generation();
        let (new, _) = generation();
        let b64 = |s: &str| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, s);
        let labels = json!({"app.kubernetes.io/part-of": "cnimesh"});
        let mut api = MockApi::default();
        api.get(
            &format!("/api/v1/namespaces/cnimesh/secrets/{ISSUER_SECRET}"),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": ISSUER_SECRET, "namespace": "cnimesh", "labels": labels, "resourceVersion": "7"},
                "data": {"ca.crt": b64(&old.cert_pem), "tls.crt": b64(&old_issuer.cert_pem), "tls.key": b64(&old_issuer.key_pem)}}),
        )
        .get(
            &format!("/api/v1/namespaces/cnimesh/configmaps/{TRUST_ANCHORS_CONFIG_MAP}"),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": TRUST_ANCHORS_CONFIG_MAP, "namespace": "cnimesh", "labels": labels},
                "data": {"ca.crt": old.cert_pem}}),
        );
        let dir = tempfile::tempdir().unwrap();
        let anchor = dir.path().join("ca.crt");
        std::fs::write(&anchor, &new.cert_pem).unwrap();
        let (yaml, note) =
            plan(api.client(), &RotateStep::Bundle(BundleArgs { new_anchor: anchor.clone() })).await.unwrap();
        assert!(note.contains("switch-issuer"), "{note}");
        let docs = crate::yaml::documents(&yaml, "rotate").unwrap();
        assert_eq!(docs.len(), 2);
        let bundle_pem = format!("{}{}", old.cert_pem, new.cert_pem);
        assert_eq!(docs[0]["data"]["ca.crt"], json!(b64(&bundle_pem)));
        assert_eq!(docs[0]["metadata"]["labels"], labels);
        assert!(docs[0]["metadata"].get("resourceVersion").is_none(), "applies over any version");
        assert_eq!(docs[1]["data"]["ca.crt"], json!(bundle_pem));
        assert_eq!(docs[1]["metadata"]["labels"], labels);

        let e = plan(api.client(), &RotateStep::DropOld).await.unwrap_err().to_string();
        assert!(e.contains("no old anchor"), "{e}");
    }
}
