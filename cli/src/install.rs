//! `cnimesh install`: every manifest of the mesh on stdout, for `kubectl apply -f -`.
//!
//! The documents are those under `daemonset/` ([`super::manifests`]), with three additions that
//! no file can hold: the identity issuer Secret (trust anchors, issuer certificate and key, given
//! or generated), the trust anchors ConfigMap (public; `cnimesh inject` and `check` read it) and
//! the webhook's serving Secret, whose CA becomes the webhook's `caBundle`. Nothing else differs,
//! which a test asserts, so the YAML an operator reads is the YAML that gets applied.
//!
//! Layer: runtime (operator CLI).

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

use super::{manifests, yaml};
use cnimesh_common::names::AGENT_NAME;
use cnimesh_control::identity::issuer::Issuer;

use cnimesh_control::inject::{
    CONTROL_NAME, DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_NAMESPACE, new_webhook_cert, webhook_dns_names,
};

/// The Secret the control plane signs with (`CNIMESH_CONTROL_ISSUER_DIR`).
pub const ISSUER_SECRET: &str = "cnimesh-identity-issuer";
/// The webhook's serving certificate (`CNIMESH_CONTROL_WEBHOOK_TLS_DIR`): defined beside the
/// certificate's files, since the control plane's `--webhook-secret` defaults to it too.
pub use cnimesh_control::inject::WEBHOOK_SECRET;
/// The trust anchors, public: what `cnimesh inject` hands to proxies and `check` compares.
pub const TRUST_ANCHORS_CONFIG_MAP: &str = "cnimesh-identity-trust-anchors";
pub const TRUST_ANCHORS_KEY: &str = "ca.crt";

const ANCHOR_LIFETIME: Duration = Duration::from_secs(10 * 365 * 86400);
const ISSUER_LIFETIME: Duration = Duration::from_secs(365 * 86400);
const WEBHOOK_LIFETIME: Duration = Duration::from_secs(365 * 86400);
/// Control plane replicas with `--ha` (the files hold the default).
const HA_REPLICAS: i64 = 3;

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// A highly available control plane: three replicas on three nodes (required anti-affinity),
    /// a disruption budget keeping two, and the webhook certificate kept by the control plane
    /// (`--webhook-certs managed`: renewed, its caBundle patched, by the Lease holder).
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
    /// `patch` only for label.
    #[arg(long, value_enum, default_value_t = NodeRepair::Delete)]
    pub node_repair: NodeRepair,
    /// Leave out the node agents' ValidatingAdmissionPolicy (daemonset/cnimesh-node-admission.yaml),
    /// for API servers older than 1.30, which lack the API. Their agents' tokens can then change
    /// pods and nodes cluster-wide, as far as the ClusterRole reaches.
    #[arg(long)]
    pub without_node_admission_policy: bool,
}

/// The node agents' repair mode, as `cnimesh-node run --repair` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
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

/// What changes the rendering besides the certificates.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub ha: bool,
    pub node_repair: NodeRepair,
    pub without_node_admission_policy: bool,
}

impl InstallArgs {
    pub fn options(&self) -> Options {
        Options {
            ha: self.ha,
            node_repair: self.node_repair,
            without_node_admission_policy: self.without_node_admission_policy,
        }
    }
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
        if options.ha { " --ha" } else { "" },
        yaml::render(&docs)
    ))
}

/// The documents of `daemonset/`, filled in, with the generated ones right after the control
/// plane's Namespace (so they exist before the Deployment that mounts them).
pub fn documents(certs: &Certificates, options: &Options) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for mut doc in manifests::documents() {
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
        let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        match kind.as_str() {
            "MutatingWebhookConfiguration" => fill_ca_bundle(&mut doc, &certs.webhook_ca)?,
            "Deployment" if name == CONTROL_NAME && options.ha => make_ha(&mut doc)?,
            "PodDisruptionBudget" if name == CONTROL_NAME && options.ha => {
                // Two of three stay through voluntary disruptions: one drain at a time.
                doc["spec"]["minAvailable"] = json!(HA_REPLICAS - 1);
            }
            "ClusterRole" if name == AGENT_NAME => set_agent_pod_verbs(&mut doc, options.node_repair)?,
            "DaemonSet" if name == AGENT_NAME => set_agent_repair(&mut doc, options.node_repair)?,
            "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding"
                if name.starts_with(AGENT_NAME) && options.without_node_admission_policy =>
            {
                continue;
            }
            _ => {}
        }
        let is_control_namespace = kind == "Namespace" && name == DEFAULT_CONTROL_NAMESPACE;
        out.push(doc);
        if is_control_namespace {
            out.extend(generated(certs));
        }
    }
    anyhow::ensure!(
        out.iter().any(|d| d.pointer("/metadata/name") == Some(&json!(ISSUER_SECRET))),
        "daemonset/ has no Namespace {DEFAULT_CONTROL_NAMESPACE} to put the Secrets in"
    );
    Ok(out)
}

/// The agent's ClusterRole grants on pods exactly what its repair mode uses.
fn set_agent_pod_verbs(doc: &mut Value, repair: NodeRepair) -> anyhow::Result<()> {
    let rules = doc.get_mut("rules").and_then(Value::as_array_mut).context("the agent's ClusterRole has no rules")?;
    let pods = rules
        .iter_mut()
        .find(|r| r["apiGroups"] == json!([""]) && r["resources"] == json!(["pods"]))
        .context("the agent's ClusterRole has no rule for pods")?;
    pods["verbs"] = json!(repair.pod_verbs());
    Ok(())
}

fn set_agent_repair(doc: &mut Value, repair: NodeRepair) -> anyhow::Result<()> {
    let env = doc
        .pointer_mut("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array_mut)
        .context("the agent's container has no env")?;
    let var = env.iter_mut().find(|e| e["name"] == "CNIMESH_REPAIR").context("the agent has no CNIMESH_REPAIR")?;
    var["value"] = json!(repair.as_str());
    Ok(())
}

/// `--ha`: three replicas, each on its own node (required anti-affinity: with three replicas
/// and `maxUnavailable: 0` a rollout needs a fourth node for its surge pod, which an HA cluster
/// has), and the webhook certificate kept by the control plane itself (`--webhook-certs
/// managed`: the Lease holder renews it and patches the caBundle; every replica reloads it).
fn make_ha(doc: &mut Value) -> anyhow::Result<()> {
    doc["spec"]["replicas"] = json!(HA_REPLICAS);
    let pod = doc.pointer_mut("/spec/template/spec").context("a Deployment without a pod template")?;
    let term = pod
        .pointer("/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/podAffinityTerm")
        .cloned()
        .context("the control plane's Deployment has no anti-affinity term to require")?;
    pod["affinity"]["podAntiAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution": [term]});
    let container = pod
        .pointer_mut("/containers/0/env")
        .and_then(Value::as_array_mut)
        .context("the control plane's container has no env")?;
    container.push(json!({"name": "CNIMESH_CONTROL_WEBHOOK_CERTS", "value": "managed"}));
    Ok(())
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

    fn certs() -> Certificates {
        let args = InstallArgs {
            ha: false,
            identity_trust_anchors_file: None,
            identity_issuer_certificate_file: None,
            identity_issuer_key_file: None,
            node_repair: NodeRepair::Delete,
            without_node_admission_policy: false,
        };
        Certificates::from_args(&args).unwrap()
    }

    fn is_generated(doc: &Value) -> bool {
        let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        [ISSUER_SECRET, WEBHOOK_SECRET, TRUST_ANCHORS_CONFIG_MAP].contains(&name)
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

    #[test]
    fn install_prints_daemonset_files_and_nothing_else_but_certificates() {
        let rendered = render(&certs(), &Options::default()).unwrap();
        let docs = yaml::documents(&rendered, "install").unwrap();
        assert_eq!(without_generated(docs), manifests::documents(), "install and daemonset/ drifted apart");

        let ha =
            yaml::documents(&render(&certs(), &Options { ha: true, ..Default::default() }).unwrap(), "install --ha")
                .unwrap();
        let mut ha = without_generated(ha);
        let files = manifests::documents();
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
            ha: false,
            identity_trust_anchors_file: write("ca.crt", &anchor.cert_pem),
            identity_issuer_certificate_file: write("issuer.crt", &issuer.cert_pem),
            identity_issuer_key_file: write("issuer.key", &issuer.key_pem),
            node_repair: NodeRepair::Delete,
            without_node_admission_policy: false,
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
        let label = Options { node_repair: NodeRepair::Label, ..Default::default() };
        assert_eq!(agent(&label), ("get,list,watch,patch".into(), json!("label"), 1));
        let off = Options { node_repair: NodeRepair::Off, without_node_admission_policy: true, ..Default::default() };
        assert_eq!(agent(&off), ("get,list,watch".into(), json!("off"), 0));
    }
}
