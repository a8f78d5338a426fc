//! `cnimesh install`: every manifest of the mesh on stdout, for `kubectl apply -f -`.
//!
//! The documents are those under `daemonset/` ([`super::manifests`]) with the install's
//! [`values`] put in ([`apply`]) and four additions that no file can hold: the identity issuer
//! Secret (trust anchors, issuer certificate and key, given or generated), the trust anchors
//! ConfigMap (public; `cnimesh inject` and `check` read it), the webhook's serving Secret, whose
//! CA becomes the webhook's `caBundle`, and the install values ConfigMap ([`stored`]) that
//! `cnimesh upgrade` renders from again. Every object gets the `app.kubernetes.io/*` labels
//! ([`labels`]). With the default values nothing else differs from the files, which a test
//! asserts, so the YAML an operator reads is the YAML that gets applied.
//!
//! Install renders a *new* mesh: it reads the cluster first ([`cluster`]) and refuses when one is
//! there (new anchors would break every running proxy), unless `--force`; `--ignore-cluster`
//! renders offline. The cluster's version chooses the node agents' guard ([`guard`]); offline,
//! `--kubernetes-version` gives it.
//!
//! Layer: runtime (operator CLI).

pub mod apply;
pub mod cluster;
pub mod guard;
pub mod labels;
#[cfg(test)]
pub mod mock_api;
pub mod stored;
pub mod values;
pub mod webhook_renewal;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use cnimesh_identity::DEFAULT_TRUST_DOMAIN;
use cnimesh_identity::ca::{new_issuer, new_trust_anchor};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::{ClusterArgs, manifests, yaml};
use cnimesh_model::identity::issuer::Issuer;
use cnimesh_model::inject::ServerVersion;
use guard::{GuardError, NodeGuard};
use values::{Overrides, Values};

use cnimesh_model::inject::{DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_NAMESPACE, new_webhook_cert, webhook_dns_names};

/// The Secret the control plane signs with (`CNIMESH_CONTROL_ISSUER_DIR`).
pub const ISSUER_SECRET: &str = "cnimesh-identity-issuer";
/// The webhook's serving certificate (`CNIMESH_CONTROL_WEBHOOK_TLS_DIR`): defined beside the
/// certificate's files, since the control plane's `--webhook-secret` defaults to it too.
pub use cnimesh_model::inject::WEBHOOK_SECRET;
/// The trust anchors, public: what `cnimesh inject` hands to proxies and `check` compares.
pub const TRUST_ANCHORS_CONFIG_MAP: &str = "cnimesh-identity-trust-anchors";
pub const TRUST_ANCHORS_KEY: &str = "ca.crt";
pub use stored::VALUES_CONFIG_MAP;

const ANCHOR_LIFETIME: Duration = Duration::from_secs(10 * 365 * 86400);
const ISSUER_LIFETIME: Duration = Duration::from_secs(365 * 86400);
const WEBHOOK_LIFETIME: Duration = Duration::from_secs(365 * 86400);
/// Control plane replicas with `--ha` (the files hold the default).
const HA_REPLICAS: u32 = 3;

#[derive(Debug, Clone, Default, clap::Args)]
pub struct ValuesArgs {
    /// A YAML values file (docs/install/values.md); repeatable, later files win.
    #[arg(long = "values", short = 'f', value_name = "FILE")]
    pub values: Vec<PathBuf>,
    /// One value by its dotted key, e.g. `--set controlPlane.replicas=3`; repeatable, wins over
    /// files and the other flags.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// The registry (and path) of every image, e.g. registry.example.com/mirror (the `registry` value).
    #[arg(long, value_name = "REGISTRY")]
    pub registry: Option<String>,
}

impl ValuesArgs {
    /// Files in order, then `flags` (the older flags, as values), then `--registry`, then `--set`.
    pub fn overrides(&self, flags: Overrides) -> anyhow::Result<Overrides> {
        let mut out = Overrides::default();
        for path in &self.values {
            out.merge(&Overrides::from_file(path)?);
        }
        out.merge(&flags);
        if let Some(registry) = &self.registry {
            out.set(&format!("registry={registry}"))?;
        }
        for assignment in &self.set {
            out.set(assignment)?;
        }
        Ok(out)
    }
}

#[derive(Debug, Default, clap::Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub values: ValuesArgs,
    /// A highly available control plane: three replicas on three nodes (required anti-affinity),
    /// a disruption budget keeping two, and the webhook certificate kept by the control plane
    /// (`--webhook-certs managed`: renewed, its caBundle patched, by the Lease holder).
    /// The values `ha: true` and `controlPlane.replicas: 3`.
    #[arg(long)]
    pub ha: bool,
    /// Trust anchors (PEM) that proxies verify each other against [default: generated].
    #[arg(long, requires_all = ["identity_issuer_certificate_file", "identity_issuer_key_file"])]
    pub identity_trust_anchors_file: Option<PathBuf>,
    /// The issuer's certificate (PEM), signed by one of the trust anchors.
    #[arg(long, requires_all = ["identity_trust_anchors_file", "identity_issuer_key_file"])]
    pub identity_issuer_certificate_file: Option<PathBuf>,
    /// The issuer's private key (PEM).
    #[arg(long, requires_all = ["identity_trust_anchors_file", "identity_issuer_certificate_file"])]
    pub identity_issuer_key_file: Option<PathBuf>,
    /// What node agents do with meshed pods running uncaptured (CNIMESH_REPAIR): `delete` them
    /// (their controller recreates them captured), `label` them cnimesh.io/uncaptured=true, or
    /// nothing (`off`). The agents' ClusterRole follows: pod `delete` only for delete, pod
    /// `patch` only for label. The value `nodeAgent.repair` [default: delete].
    #[arg(long, value_enum)]
    pub node_repair: Option<NodeRepair>,
    /// Leave out the node agents' ValidatingAdmissionPolicy (daemonset/cnimesh-node-admission.yaml)
    /// even where the API server serves it. Without this flag install decides by the server's
    /// version: the policy from 1.30 on, none below (said on stderr). Their agents' tokens can
    /// then change pods and nodes cluster-wide, as far as the ClusterRole reaches. The value
    /// `nodeAgent.admissionPolicy: false`.
    #[arg(long)]
    pub without_node_admission_policy: bool,
    /// The cluster's Kubernetes version (MAJOR.MINOR, e.g. 1.30) instead of its API server's: it
    /// chooses the node agents' guard (their ValidatingAdmissionPolicy from 1.30 on). Required
    /// with --ignore-cluster unless --without-node-admission-policy, since nothing is guessed.
    #[arg(long, value_name = "MAJOR.MINOR", value_parser = guard::parse_version)]
    pub kubernetes_version: Option<ServerVersion>,
    /// Install even where the cluster already has a mesh: new trust anchors, issuer and webhook CA
    /// replace the running ones (proxies lose mTLS until restarted). Without it install refuses
    /// and points to `cnimesh upgrade`.
    #[arg(long)]
    pub force: bool,
    /// Render offline, without contacting any cluster (GitOps, CI): nothing checks for a mesh
    /// already there, and the version comes from --kubernetes-version.
    #[arg(long)]
    pub ignore_cluster: bool,
}

/// The node agents' repair mode, as `cnimesh-node run --repair` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeRepair {
    #[default]
    Delete,
    Label,
    Off,
}

impl NodeRepair {
    fn as_str(self) -> &'static str {
        match self {
            NodeRepair::Delete => "delete",
            NodeRepair::Label => "label",
            NodeRepair::Off => "off",
        }
    }

    /// The pod verbs the agent needs: reading always, then what its repair does.
    fn pod_verbs(self) -> Vec<&'static str> {
        let mut verbs = vec!["get", "list", "watch"];
        match self {
            NodeRepair::Delete => verbs.push("delete"),
            NodeRepair::Label => verbs.push("patch"),
            NodeRepair::Off => {}
        }
        verbs
    }
}

/// What changes the rendering besides the certificates: the effective values, and the
/// overrides they came from (kept in the cluster for `upgrade`).
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub values: Values,
    pub overrides: Overrides,
}

impl Options {
    pub fn new(overrides: Overrides) -> anyhow::Result<Self> {
        Ok(Options { values: overrides.resolve()?, overrides })
    }

    /// Fits the values to the cluster's version: the node agents' guard, unless the operator
    /// chose it (`nodeAgent.admissionPolicy`). The choice is not stored as an override, so an
    /// upgrade after the cluster's own upgrade to 1.30 adds the policy.
    pub fn fit(&mut self, version: Option<ServerVersion>) -> Result<NodeGuard, GuardError> {
        let explicit =
            self.overrides.has("nodeAgent.admissionPolicy").then_some(self.values.node_agent.admission_policy);
        let guard = NodeGuard::choose(explicit, version)?;
        self.values.node_agent.admission_policy = guard.policy();
        Ok(guard)
    }
}

impl InstallArgs {
    /// The values files, the flags and `--set`, checked.
    pub fn options(&self) -> anyhow::Result<Options> {
        let mut flags = Overrides::default();
        if self.ha {
            flags.set("ha=true")?;
            flags.set(&format!("controlPlane.replicas={HA_REPLICAS}"))?;
        }
        if let Some(repair) = self.node_repair {
            flags.set(&format!("nodeAgent.repair={}", repair.as_str()))?;
        }
        if self.without_node_admission_policy {
            flags.set("nodeAgent.admissionPolicy=false")?;
        }
        Options::new(self.values.overrides(flags)?)
    }
}

/// `cnimesh install`: checks the cluster (unless told not to), then renders; what weakens the
/// install for this cluster goes to stderr.
pub async fn main(cluster: &ClusterArgs, args: InstallArgs) -> anyhow::Result<String> {
    let offline = args.ignore_cluster || (args.force && args.kubernetes_version.is_some());
    let client = if offline { None } else { Some(cluster.client().await.map_err(unreachable)?) };
    let (rendered, guard) = install(client.as_ref(), &args).await?;
    if let Some(warning) = guard.warning() {
        eprintln!("{warning}");
    }
    Ok(rendered)
}

/// The install for the cluster behind `client` (none: offline, from the flags only).
pub async fn install(client: Option<&kube::Client>, args: &InstallArgs) -> anyhow::Result<(String, NodeGuard)> {
    let mut options = args.options()?;
    let version = match (args.kubernetes_version, client) {
        (Some(version), _) => Some(version),
        (None, Some(client)) => Some(guard::server_version(client).await.map_err(unreachable)?),
        (None, None) => None,
    };
    if let Some(client) = client
        && !args.force
    {
        refuse_existing(client).await?;
    }
    let guard = options.fit(version)?;
    Ok((render(&Certificates::from_args(args)?, &options)?, guard))
}

fn unreachable(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!(
        "could not read the cluster ({error}): install asks it whether a mesh is already there and which \
         Kubernetes version it runs. Pass --ignore-cluster --kubernetes-version MAJOR.MINOR to render offline, \
         or --force --kubernetes-version MAJOR.MINOR to install over whatever is there"
    )
}

/// Refuses when the cluster already has a mesh: new anchors would break its proxies.
pub async fn refuse_existing(client: &kube::Client) -> anyhow::Result<()> {
    let installed = cluster::read(client).await.map_err(unreachable)?;
    if installed.exists() {
        anyhow::bail!(
            "cnimesh is already installed in this cluster ({}): install would replace its trust anchors, \
             issuer and webhook CA under the running proxies. Use `cnimesh upgrade` (it keeps them and the \
             install's options); --force installs anew anyway",
            installed.describe()
        );
    }
    Ok(())
}

/// The PEM material `install` puts into Secrets.
#[derive(Debug, Clone)]
pub struct Certificates {
    pub anchors: String,
    pub issuer_cert: String,
    pub issuer_key: String,
    pub webhook_ca: String,
    pub webhook_cert: String,
    pub webhook_key: String,
}

impl Certificates {
    /// The given identity files (validated: the issuer must sign leaves that verify against
    /// the anchors) or a new anchor and issuer; always a new webhook certificate.
    pub fn from_args(args: &InstallArgs) -> anyhow::Result<Self> {
        let (anchors, issuer_cert, issuer_key) = match (
            &args.identity_trust_anchors_file,
            &args.identity_issuer_certificate_file,
            &args.identity_issuer_key_file,
        ) {
            (Some(anchors), Some(cert), Some(key)) => {
                let read = |path: &PathBuf| {
                    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
                };
                let (anchors, cert, key) = (read(anchors)?, read(cert)?, read(key)?);
                Issuer::from_pem(anchors.as_bytes(), cert.as_bytes(), key.as_bytes())
                    .context("the given trust anchors and issuer cannot be used together")?;
                (anchors, cert, key)
            }
            _ => {
                let anchor = new_trust_anchor(DEFAULT_TRUST_DOMAIN, ANCHOR_LIFETIME).context("a trust anchor")?;
                let issuer = new_issuer(&anchor, DEFAULT_TRUST_DOMAIN, ISSUER_LIFETIME).context("an issuer")?;
                (anchor.cert_pem, issuer.cert_pem, issuer.key_pem)
            }
        };
        let names = webhook_dns_names(DEFAULT_CONTROL_NAMESPACE, DEFAULT_CLUSTER_DOMAIN);
        let webhook = new_webhook_cert(&names, WEBHOOK_LIFETIME).context("the webhook certificate")?;
        Ok(Self {
            anchors,
            issuer_cert,
            issuer_key,
            webhook_ca: webhook.ca,
            webhook_cert: webhook.cert,
            webhook_key: webhook.key,
        })
    }
}

/// The whole install as one YAML stream.
pub fn render(certs: &Certificates, options: &Options) -> anyhow::Result<String> {
    let docs = documents(certs, options)?;
    Ok(format!(
        "# cnimesh {}: `cnimesh install{}` — apply with `kubectl apply -f -`.\n# Holds the identity issuer's private key: keep this output as secret as the key.\n{}",
        env!("CARGO_PKG_VERSION"),
        if options.values.ha { " --ha" } else { "" },
        yaml::render(&docs)
    ))
}

/// The documents of `daemonset/`, filled in, with the generated ones right after the control
/// plane's Namespace (so they exist before the Deployment that mounts them), all labelled.
pub fn documents(certs: &Certificates, options: &Options) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for mut doc in manifests::documents() {
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
        let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        if kind == "MutatingWebhookConfiguration" {
            fill_ca_bundle(&mut doc, &certs.webhook_ca)?;
        }
        if !apply::apply(&mut doc, &options.values).with_context(|| yaml::describe(&doc))? {
            continue;
        }
        let is_control_namespace = kind == "Namespace" && name == DEFAULT_CONTROL_NAMESPACE;
        out.push(doc);
        if is_control_namespace {
            out.extend(generated(certs));
            out.push(stored::config_map(&options.values, &options.overrides, &certs.anchors));
        }
    }
    anyhow::ensure!(
        out.iter().any(|d| d.pointer("/metadata/name") == Some(&json!(ISSUER_SECRET))),
        "daemonset/ has no Namespace {DEFAULT_CONTROL_NAMESPACE} to put the Secrets in"
    );
    labels::apply(&mut out);
    Ok(out)
}

/// Every webhook of the configuration trusts the generated CA: the API server verifies the
/// webhook's serving certificate against it.
fn fill_ca_bundle(doc: &mut Value, ca_pem: &str) -> anyhow::Result<()> {
    let bundle = serde_json::to_value(ByteString(ca_pem.as_bytes().to_vec()))?;
    let webhooks =
        doc.get_mut("webhooks").and_then(Value::as_array_mut).context("a webhook configuration without webhooks")?;
    for webhook in webhooks {
        let config =
            webhook.get_mut("clientConfig").and_then(Value::as_object_mut).context("a webhook without clientConfig")?;
        config.insert("caBundle".into(), bundle.clone());
    }
    Ok(())
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(DEFAULT_CONTROL_NAMESPACE.into()),
        labels: Some(BTreeMap::from([("app.kubernetes.io/part-of".to_string(), "cnimesh".to_string())])),
        ..Default::default()
    }
}

fn tls_secret(name: &str, ca: &str, cert: &str, key: &str) -> Value {
    let data = [("ca.crt", ca), ("tls.crt", cert), ("tls.key", key)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect();
    let secret = Secret {
        metadata: meta(name),
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    };
    with_type_meta(serde_json::to_value(secret).expect("a Secret serialises"), "Secret")
}

fn with_type_meta(mut value: Value, kind: &str) -> Value {
    let object = value.as_object_mut().expect("an object");
    let mut out = serde_json::Map::new();
    out.insert("apiVersion".into(), json!("v1"));
    out.insert("kind".into(), json!(kind));
    out.append(object);
    Value::Object(out)
}

/// The Secrets and the ConfigMap that no file in `daemonset/` can hold.
fn generated(certs: &Certificates) -> Vec<Value> {
    let anchors = ConfigMap {
        metadata: meta(TRUST_ANCHORS_CONFIG_MAP),
        data: Some(BTreeMap::from([(TRUST_ANCHORS_KEY.to_string(), certs.anchors.clone())])),
        ..Default::default()
    };
    vec![
        tls_secret(ISSUER_SECRET, &certs.anchors, &certs.issuer_cert, &certs.issuer_key),
        with_type_meta(serde_json::to_value(anchors).expect("a ConfigMap serialises"), "ConfigMap"),
        tls_secret(WEBHOOK_SECRET, &certs.webhook_ca, &certs.webhook_cert, &certs.webhook_key),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnimesh_common::names::AGENT_NAME;
    use cnimesh_model::inject::CONTROL_NAME;

    fn certs() -> Certificates {
        Certificates::from_args(&InstallArgs::default()).unwrap()
    }

    /// The options of these install flags.
    fn options(args: InstallArgs) -> Options {
        args.options().unwrap()
    }

    fn is_generated(doc: &Value) -> bool {
        let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        [ISSUER_SECRET, WEBHOOK_SECRET, TRUST_ANCHORS_CONFIG_MAP, VALUES_CONFIG_MAP].contains(&name)
    }

    /// The install's documents with what it generates taken out again.
    fn without_generated(docs: Vec<Value>) -> Vec<Value> {
        let mut docs: Vec<Value> = docs.into_iter().filter(|d| !is_generated(d)).collect();
        for doc in &mut docs {
            for webhook in doc.get_mut("webhooks").and_then(Value::as_array_mut).into_iter().flatten() {
                let bundle = webhook["clientConfig"].as_object_mut().unwrap().remove("caBundle");
                assert!(bundle.is_some_and(|b| b.as_str().is_some_and(|b| !b.is_empty())), "caBundle filled");
            }
        }
        docs
    }

    /// The files under `daemonset/` with the labels every install adds.
    fn labelled_files() -> Vec<Value> {
        let mut files = manifests::documents();
        labels::apply(&mut files);
        files
    }

    #[test]
    fn install_prints_daemonset_files_and_nothing_else_but_certificates() {
        let rendered = render(&certs(), &Options::default()).unwrap();
        let docs = yaml::documents(&rendered, "install").unwrap();
        assert_eq!(without_generated(docs), labelled_files(), "install and daemonset/ drifted apart");

        let ha = yaml::documents(
            &render(&certs(), &options(InstallArgs { ha: true, ..Default::default() })).unwrap(),
            "install --ha",
        )
        .unwrap();
        let mut ha = without_generated(ha);
        let files = labelled_files();
        let of = |docs: &[Value], kind: &str| docs.iter().position(|d| d["kind"] == kind).unwrap();
        let (deployment, pdb) = (of(&ha, "Deployment"), of(&ha, "PodDisruptionBudget"));
        assert_eq!(ha[deployment]["spec"]["replicas"], HA_REPLICAS);
        assert_eq!(ha[pdb]["spec"]["minAvailable"], HA_REPLICAS - 1);
        let pod = &ha[deployment]["spec"]["template"]["spec"];
        let required = &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(required["topologyKey"], "kubernetes.io/hostname");
        let env = pod["containers"][0]["env"].as_array().unwrap();
        assert!(env.contains(&json!({"name": "CNIMESH_CONTROL_WEBHOOK_CERTS", "value": "managed"})));
        assert!(pod["containers"][0]["resources"]["requests"]["cpu"].is_string(), "resource requests");
        // Nothing else differs from the files.
        ha[deployment] = files[of(&files, "Deployment")].clone();
        ha[pdb] = files[of(&files, "PodDisruptionBudget")].clone();
        assert_eq!(ha, files, "--ha changes replicas, anti-affinity, the budget and the certificates only");
    }

    #[test]
    fn the_generated_objects_are_typed_kubernetes_objects_before_the_deployment() {
        let certs = certs();
        let docs = documents(&certs, &Options::default()).unwrap();
        let position = |kind: &str, name: &str| {
            docs.iter().position(|d| d["kind"] == kind && d["metadata"]["name"] == name).unwrap()
        };
        assert!(position("Namespace", "cnimesh") < position("Secret", ISSUER_SECRET));
        assert!(position("Secret", WEBHOOK_SECRET) < position("Deployment", CONTROL_NAME));
        let issuer: Secret = serde_json::from_value(docs[position("Secret", ISSUER_SECRET)].clone()).unwrap();
        let data = issuer.data.unwrap();
        assert_eq!(data["ca.crt"].0, certs.anchors.as_bytes());
        Issuer::from_pem(&data["ca.crt"].0, &data["tls.crt"].0, &data["tls.key"].0).expect("a working issuer");
        let anchors: ConfigMap =
            serde_json::from_value(docs[position("ConfigMap", TRUST_ANCHORS_CONFIG_MAP)].clone()).unwrap();
        assert_eq!(anchors.data.unwrap()[TRUST_ANCHORS_KEY], certs.anchors);

        // The caBundle is the CA that signed the serving certificate in the Secret.
        let webhook: k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration =
            serde_json::from_value(docs.iter().find(|d| d["kind"] == "MutatingWebhookConfiguration").unwrap().clone())
                .unwrap();
        let tls: Secret = serde_json::from_value(docs[position("Secret", WEBHOOK_SECRET)].clone()).unwrap();
        let tls = tls.data.unwrap();
        for hook in webhook.webhooks.unwrap() {
            let bundle = hook.client_config.ca_bundle.unwrap().0;
            assert_eq!(bundle, tls["ca.crt"].0);
            let roots =
                cnimesh_identity::tls::roots(&cnimesh_identity::pem::certs(&bundle, "caBundle").unwrap()).unwrap();
            let chain = cnimesh_identity::pem::certs(&tls["tls.crt"].0, "tls.crt").unwrap();
            let name = rustls_pki_types::ServerName::try_from("cnimesh-webhook.cnimesh.svc").unwrap();
            let verifier =
                rustls::client::WebPkiServerVerifier::builder_with_provider(roots, cnimesh_identity::tls::provider())
                    .build()
                    .unwrap();
            rustls::client::danger::ServerCertVerifier::verify_server_cert(
                verifier.as_ref(),
                &chain[0],
                &chain[1..],
                &name,
                &[],
                rustls_pki_types::UnixTime::now(),
            )
            .expect("the API server would trust the webhook");
        }
    }

    #[test]
    fn given_identity_files_are_used_and_a_mismatched_set_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let anchor = new_trust_anchor("cluster.local", ANCHOR_LIFETIME).unwrap();
        let issuer = new_issuer(&anchor, "cluster.local", ISSUER_LIFETIME).unwrap();
        let other = new_trust_anchor("cluster.local", ANCHOR_LIFETIME).unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            Some(path)
        };
        let mut args = InstallArgs {
            identity_trust_anchors_file: write("ca.crt", &anchor.cert_pem),
            identity_issuer_certificate_file: write("issuer.crt", &issuer.cert_pem),
            identity_issuer_key_file: write("issuer.key", &issuer.key_pem),
            ..Default::default()
        };
        let certs = Certificates::from_args(&args).unwrap();
        assert_eq!(
            (certs.anchors.as_str(), certs.issuer_key.as_str()),
            (anchor.cert_pem.as_str(), issuer.key_pem.as_str())
        );
        args.identity_trust_anchors_file = write("other.crt", &other.cert_pem);
        let error = format!("{:#}", Certificates::from_args(&args).unwrap_err());
        assert!(error.contains("cannot be used together"), "{error}");
    }

    #[test]
    fn the_node_agents_pod_verbs_follow_its_repair_mode_and_the_policy_can_be_left_out() {
        let agent = |options: &Options| {
            let docs = documents(&certs(), options).unwrap();
            let role = docs.iter().find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == AGENT_NAME).unwrap();
            let pods = role["rules"].as_array().unwrap().iter().find(|r| r["resources"] == json!(["pods"])).unwrap();
            let verbs: Vec<String> = serde_json::from_value(pods["verbs"].clone()).unwrap();
            let ds = docs.iter().find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == AGENT_NAME).unwrap();
            let env = ds.pointer("/spec/template/spec/containers/0/env").unwrap().as_array().unwrap();
            let repair = env.iter().find(|e| e["name"] == "CNIMESH_REPAIR").unwrap()["value"].clone();
            let policies = docs.iter().filter(|d| d["kind"] == "ValidatingAdmissionPolicy").count();
            (verbs.join(","), repair, policies)
        };
        let default = Options::default();
        assert_eq!(agent(&default), ("get,list,watch,delete".into(), json!("delete"), 1));
        let label = options(InstallArgs { node_repair: Some(NodeRepair::Label), ..Default::default() });
        assert_eq!(agent(&label), ("get,list,watch,patch".into(), json!("label"), 1));
        let off = options(InstallArgs {
            node_repair: Some(NodeRepair::Off),
            without_node_admission_policy: true,
            ..Default::default()
        });
        assert_eq!(agent(&off), ("get,list,watch".into(), json!("off"), 0));
    }

    fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
        docs.iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == name).unwrap()
    }

    fn env_of(container: &Value, name: &str) -> Option<String> {
        container["env"].as_array()?.iter().find(|e| e["name"] == name)?["value"].as_str().map(Into::into)
    }

    fn with_set(set: &[&str]) -> Vec<Value> {
        let args = InstallArgs {
            values: ValuesArgs { set: set.iter().map(|s| s.to_string()).collect(), ..Default::default() },
            ..Default::default()
        };
        documents(&certs(), &args.options().unwrap()).unwrap()
    }

    #[test]
    fn every_object_of_install_carries_the_four_labels() {
        let docs = yaml::documents(&render(&certs(), &Options::default()).unwrap(), "install").unwrap();
        assert!(docs.iter().any(|d| d["kind"] == "CustomResourceDefinition"));
        for doc in &docs {
            let labels = &doc["metadata"]["labels"];
            assert_eq!(labels[labels::PART_OF], "cnimesh", "{}", yaml::describe(doc));
            assert_eq!(labels[labels::MANAGED_BY], "cnimesh", "{}", yaml::describe(doc));
            assert_eq!(labels[labels::VERSION], env!("CARGO_PKG_VERSION"), "{}", yaml::describe(doc));
            assert!(labels[labels::COMPONENT].as_str().is_some_and(|c| !c.is_empty()), "{}", yaml::describe(doc));
        }
        let component =
            |kind: &str, name: &str| find(&docs, kind, name)["metadata"]["labels"][labels::COMPONENT].clone();
        assert_eq!(component("Deployment", CONTROL_NAME), "control-plane");
        assert_eq!(component("DaemonSet", "cnimesh-node"), "node");
        assert_eq!(component("MutatingWebhookConfiguration", "cnimesh-proxy-injector"), "webhook");
        assert_eq!(component("Secret", ISSUER_SECRET), "identity");
    }

    #[test]
    fn set_control_plane_replicas_reaches_the_deployment_and_its_budget() {
        let docs = with_set(&["controlPlane.replicas=3"]);
        assert_eq!(find(&docs, "Deployment", CONTROL_NAME)["spec"]["replicas"], 3);
        assert_eq!(find(&docs, "PodDisruptionBudget", CONTROL_NAME)["spec"]["minAvailable"], 2);
        let one = with_set(&["controlPlane.replicas=1"]);
        assert!(!one.iter().any(|d| d["kind"] == "PodDisruptionBudget"), "one replica, no budget");
    }

    #[test]
    fn registry_rewrites_every_image_and_the_proxy_image_the_webhook_injects() {
        let docs = with_set(&["registry=mirror.example/team", "imageTags.proxy=9.9.9"]);
        let mut images = Vec::new();
        for doc in &docs {
            for list in ["containers", "initContainers"] {
                for c in
                    doc.pointer(&format!("/spec/template/spec/{list}")).and_then(Value::as_array).into_iter().flatten()
                {
                    images.push(c["image"].as_str().unwrap().to_string());
                }
            }
        }
        assert!(images.len() >= 2);
        assert!(images.iter().all(|i| i.starts_with("mirror.example/team/")), "{images:?}");
        let control = &find(&docs, "Deployment", CONTROL_NAME)["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(env_of(control, "CNIMESH_CONTROL_PROXY_IMAGE").unwrap(), "mirror.example/team/cnimesh-proxy:9.9.9");
        let flag = InstallArgs {
            values: ValuesArgs { registry: Some("r.example".into()), ..Default::default() },
            ..Default::default()
        };
        assert_eq!(flag.options().unwrap().values.registry, "r.example", "--registry is the registry value");
    }

    #[test]
    fn a_cluster_of_its_own_trust_domain_gets_it_on_its_control_plane_and_a_bad_one_is_refused() {
        let control_env = |docs: &[Value]| {
            let control = &find(docs, "Deployment", CONTROL_NAME)["spec"]["template"]["spec"]["containers"][0];
            env_of(control, "CNIMESH_CONTROL_TRUST_DOMAIN")
        };
        assert_eq!(control_env(&with_set(&[])).as_deref(), Some("cluster.local"));
        assert_eq!(control_env(&with_set(&["identityTrustDomain=west.local"])).as_deref(), Some("west.local"));
        let mut overrides = values::Overrides::default();
        let error = overrides.set("identityTrustDomain=not a domain").unwrap_err().to_string();
        assert!(error.contains("identityTrustDomain") && error.contains("not a domain"), "{error}");
    }

    #[test]
    fn proxy_defaults_and_json_logs_reach_every_component() {
        let docs = with_set(&["logFormat=json", "proxy.defaultInboundPolicy=deny", "proxy.resources.limits.cpu=1"]);
        let control = &find(&docs, "Deployment", CONTROL_NAME)["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(env_of(control, "CNIMESH_LOG_FORMAT").as_deref(), Some("json"));
        assert_eq!(env_of(control, apply::PROXY_LOG_FORMAT_ENV).as_deref(), Some("json"));
        assert_eq!(env_of(control, "CNIMESH_CONTROL_DEFAULT_INBOUND_POLICY").as_deref(), Some("deny"));
        assert_eq!(env_of(control, "CNIMESH_CONTROL_PROXY_CPU_LIMIT").as_deref(), Some("1"));
        let node = &find(&docs, "DaemonSet", "cnimesh-node")["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(env_of(node, "CNIMESH_LOG_FORMAT").as_deref(), Some("json"));

        // The control plane reads those variables and hands the format to the proxies it injects.
        let vars: Vec<(String, String)> = control["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
            .filter(|(name, _)| name.starts_with("CNIMESH_CONTROL_PROXY_"))
            .collect();
        let mut argv = vec!["webhook".to_string()];
        for (name, value) in vars {
            let flag = name.trim_start_matches("CNIMESH_CONTROL_").to_lowercase().replace('_', "-");
            argv.push(format!("--{flag}={value}"));
        }
        #[derive(clap::Parser)]
        struct Webhook {
            #[command(flatten)]
            args: cnimesh_model::inject::WebhookArgs,
        }
        let parsed = <Webhook as clap::Parser>::try_parse_from(&argv).unwrap();
        let config = parsed.args.inject_config("cluster.local").unwrap();
        assert!(config.json_logs);
        let pod = cnimesh_model::inject::PodProxySettings {
            identity: config.control_identity().unwrap(),
            opaque_ports: None,
            log_level: "info".into(),
        };
        let proxy = cnimesh_model::inject::proxy_container(&config, &pod).unwrap();
        let env = proxy.env.unwrap();
        assert!(env.iter().any(|e| e.name == "CNIMESH_LOG_FORMAT" && e.value.as_deref() == Some("json")));
    }

    #[test]
    fn proxy_tracing_values_reach_the_webhook_and_from_there_every_injected_proxy() {
        let collector = "http://otel-collector.cnimesh-tracing.svc.cluster.local:4317";
        let docs = with_set(&[&format!("proxy.tracing.collector={collector}"), "proxy.tracing.sampling=0.25"]);
        let control = &find(&docs, "Deployment", CONTROL_NAME)["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(env_of(control, "CNIMESH_CONTROL_PROXY_TRACE_COLLECTOR").as_deref(), Some(collector));
        assert_eq!(env_of(control, "CNIMESH_CONTROL_PROXY_TRACE_SAMPLING").as_deref(), Some("0.25"));
        let untraced = with_set(&[]);
        let control_default = &find(&untraced, "Deployment", CONTROL_NAME)["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(env_of(control_default, "CNIMESH_CONTROL_PROXY_TRACE_COLLECTOR"), None, "no tracing by default");

        // The control plane reads them as its webhook flags and injects them into proxies.
        #[derive(clap::Parser)]
        struct Webhook {
            #[command(flatten)]
            args: cnimesh_model::inject::WebhookArgs,
        }
        let argv = [
            "webhook".to_string(),
            format!("--proxy-trace-collector={}", env_of(control, "CNIMESH_CONTROL_PROXY_TRACE_COLLECTOR").unwrap()),
            format!("--proxy-trace-sampling={}", env_of(control, "CNIMESH_CONTROL_PROXY_TRACE_SAMPLING").unwrap()),
        ];
        let config =
            <Webhook as clap::Parser>::try_parse_from(argv).unwrap().args.inject_config("cluster.local").unwrap();
        assert_eq!(
            config.tracing.env().unwrap(),
            [
                (cnimesh_model::inject::TRACE_COLLECTOR_ENV, collector.to_string()),
                (cnimesh_model::inject::TRACE_SAMPLING_ENV, "0.25".to_string())
            ]
        );
    }

    #[test]
    fn the_values_config_map_holds_the_overrides_the_values_and_no_secret() {
        let certs = certs();
        let args = InstallArgs {
            values: ValuesArgs { set: vec!["ha=true".into()], ..Default::default() },
            ..Default::default()
        };
        let docs = documents(&certs, &args.options().unwrap()).unwrap();
        let map: ConfigMap = serde_json::from_value(find(&docs, "ConfigMap", VALUES_CONFIG_MAP).clone()).unwrap();
        let data = map.data.unwrap();
        assert_eq!(data[stored::OVERRIDES_KEY], "ha: true\n");
        assert_eq!(data[stored::VERSION_KEY], env!("CARGO_PKG_VERSION"));
        assert_eq!(data[stored::FINGERPRINT_KEY], stored::fingerprint(&certs.anchors));
        let values: Values = serde_saphyr::from_str(&data[stored::VALUES_KEY]).unwrap();
        assert!(values.ha);
        let text = serde_json::to_string(&data).unwrap();
        assert!(!text.contains("PRIVATE KEY") && !text.contains("BEGIN CERTIFICATE"), "no key, no certificate");
    }

    #[tokio::test]
    async fn an_unreachable_cluster_is_an_error_naming_both_flags() {
        let service = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, _>(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused",
            ))
        });
        let client = kube::Client::new(service, "default");
        let error = refuse_existing(&client).await.unwrap_err().to_string();
        assert!(error.contains("--ignore-cluster") && error.contains("--force"), "{error}");
        // --ignore-cluster never builds a client: a kubeconfig that does not exist is not read.
        let cluster = ClusterArgs { kubeconfig: Some("/nonexistent/kubeconfig".into()), context: None };
        let args = InstallArgs { ignore_cluster: true, ..Default::default() };
        let error = main(&cluster, args).await.unwrap_err().to_string();
        assert!(error.contains("--kubernetes-version"), "an offline render without a version: {error}");
        let args = InstallArgs {
            ignore_cluster: true,
            kubernetes_version: Some(guard::parse_version("1.30").unwrap()),
            ..Default::default()
        };
        let rendered = main(&cluster, args).await.unwrap();
        assert!(rendered.contains("kind: Deployment") && rendered.contains("kind: ValidatingAdmissionPolicy"));
        let args = InstallArgs::default();
        let error = main(&cluster, args).await.unwrap_err().to_string();
        assert!(error.contains("--ignore-cluster") && error.contains("--force"), "{error}");
    }

    fn policies(rendered: &str) -> usize {
        let docs = yaml::documents(rendered, "install").unwrap();
        docs.iter().filter(|d| guard::POLICY_KINDS.iter().any(|k| d["kind"] == *k)).count()
    }

    #[tokio::test]
    async fn install_leaves_the_agents_policy_out_on_a_1_24_server_says_so_and_keeps_it_on_1_30() {
        for (minor, expected) in [(24, 0), (29, 0), (30, 2), (33, 2)] {
            let cluster = mock_api::ObjectsApi::at(minor);
            let (rendered, guard) = install(Some(&cluster.client()), &InstallArgs::default()).await.unwrap();
            assert_eq!(policies(&rendered), expected, "Kubernetes 1.{minor}");
            let warning = guard.warning();
            assert_eq!(warning.is_some(), minor < 30, "1.{minor}: {warning:?}");
            if let Some(warning) = warning {
                assert!(warning.contains(&format!("Kubernetes 1.{minor}")) && warning.contains(guard::RESIDUAL_RISK));
            }
        }
    }

    #[tokio::test]
    async fn an_explicit_policy_on_a_server_without_the_api_is_refused_and_the_flags_win_over_the_server() {
        let old = mock_api::ObjectsApi::at(24);
        let args = InstallArgs {
            values: ValuesArgs { set: vec!["nodeAgent.admissionPolicy=true".into()], ..Default::default() },
            ..Default::default()
        };
        let error = install(Some(&old.client()), &args).await.unwrap_err().to_string();
        assert!(error.contains("nodeAgent.admissionPolicy: true") && error.contains("1.24"), "{error}");

        let new = mock_api::ObjectsApi::at(31);
        let args = InstallArgs { without_node_admission_policy: true, ..Default::default() };
        let (rendered, guard) = install(Some(&new.client()), &args).await.unwrap();
        assert_eq!(policies(&rendered), 0);
        assert!(guard.warning().unwrap().contains("nodeAgent.admissionPolicy: false"));

        // Offline, the version is the flag's.
        for (version, expected) in [("1.24", 0), ("v1.30.1", 2)] {
            let args = InstallArgs {
                ignore_cluster: true,
                kubernetes_version: Some(guard::parse_version(version).unwrap()),
                ..Default::default()
            };
            assert_eq!(policies(&install(None, &args).await.unwrap().0), expected, "{version}");
        }
        let offline = InstallArgs { ignore_cluster: true, ..Default::default() };
        let error = install(None, &offline).await.unwrap_err().to_string();
        assert!(error.contains("--kubernetes-version"), "{error}");
        let offline = InstallArgs { ignore_cluster: true, without_node_admission_policy: true, ..Default::default() };
        assert_eq!(policies(&install(None, &offline).await.unwrap().0), 0, "an explicit choice needs no version");
    }

    #[test]
    fn the_example_of_docs_install_values_md_is_valid() {
        let doc = include_str!("../../../docs/install/values.md");
        let start = doc.find("```yaml\n# prod.yaml\n").expect("the example") + "```yaml\n".len();
        let end = start + doc[start..].find("```").unwrap();
        let values = Overrides::from_yaml(&doc[start..end], "values.md").unwrap().resolve().unwrap();
        assert_eq!(values.control_plane.replicas, 3);
        assert_eq!(values.proxy.resources.limits.cpu.as_deref(), Some("1"));
        assert_eq!(values.log_format, values::LogFormat::Json);
    }
}
