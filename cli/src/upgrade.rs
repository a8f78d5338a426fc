//! `cnimesh upgrade`: this version's manifests for a cluster that already runs the mesh, for
//! `kubectl apply -f -`. Everything a new install would generate is read back from the cluster
//! instead and reused byte for byte: the trust anchors (the ConfigMap proxies are given, and the
//! issuer Secret's own copy), the issuer's certificate and key, the webhook's CA and serving
//! certificate (so the caBundle stays what the running control plane serves), unless that
//! certificate is due and upgrade is its keeper ([`install::webhook_renewal`]). The options come
//! from the stored install values ([`install::stored`]): the operator's earlier overrides, with
//! this run's `--values`/`--set` over them and this version's defaults under them.
//!
//! `--crds` prints only the CustomResourceDefinitions, to apply first when they change.
//!
//! The node agents' guard follows the server's version as install's does ([`install::guard`]),
//! read again on every upgrade: a cluster upgraded to 1.30 gets the policy with the next one.

use anyhow::Context;
use serde_json::Value;

use super::install::guard::{self, NodeGuard};
use super::install::webhook_renewal::{self, Renewal};
use super::install::{
    self, Options, TRUST_ANCHORS_CONFIG_MAP, TRUST_ANCHORS_KEY, ValuesArgs, cluster, values::Overrides,
};
use super::{ClusterArgs, yaml};

#[derive(Debug, Default, clap::Args)]
pub struct UpgradeArgs {
    #[command(flatten)]
    pub values: ValuesArgs,
    /// Print only the CustomResourceDefinitions (apply them first: `cnimesh upgrade --crds | kubectl apply -f -`).
    #[arg(long)]
    pub crds: bool,
    /// Renew the webhook's serving certificate now, even if it is not due (by a new CA; the caBundle
    /// keeps trusting the old one until it expires). Without `ha` only: with it the control plane keeps
    /// the certificate.
    #[arg(long)]
    pub renew_webhook_certificate: bool,
}

pub async fn main(cluster: &ClusterArgs, args: UpgradeArgs) -> anyhow::Result<String> {
    let client = cluster.client().await?;
    let (text, guard, renewal) = upgrade(&client, &args).await?;
    if let Some(warning) = guard.warning() {
        eprintln!("{warning}");
    }
    if let Some(notice) = renewal.notice() {
        eprintln!("{notice}");
    }
    Ok(text)
}

/// Reads what the cluster holds and renders this version over it, for the server's version.
pub async fn upgrade(client: &kube::Client, args: &UpgradeArgs) -> anyhow::Result<(String, NodeGuard, Renewal)> {
    let installed = cluster::read(client).await.context("reading the installed mesh from the cluster")?;
    let mut certs = installed.certificates()?;
    let mut overrides = installed.overrides()?;
    overrides.merge(&args.values.overrides(Overrides::default())?);
    let mut options = Options::new(overrides)?;
    let version = guard::server_version(client).await.context("reading the API server's version")?;
    let guard = options.fit(Some(version))?;
    // With `ha` the control plane keeps the webhook's certificate; otherwise upgrade does.
    let renewal = match (options.values.ha, args.renew_webhook_certificate) {
        (true, true) => anyhow::bail!(
            "--renew-webhook-certificate: with `ha` the control plane keeps the webhook's certificate \
             (renewed at 2/3 of its life by the holder of the Lease cnimesh-control-webhook-write)"
        ),
        (true, false) => Renewal::Kept,
        (false, force) => {
            webhook_renewal::renew(&mut certs, &installed.webhook_keeper(), force, std::time::SystemTime::now())?
        }
    };
    let mut docs = install::documents(&certs, &options)?;
    // The anchors proxies are given may be a bundle the issuer Secret's copy is not (during a
    // rotation): keep the ConfigMap's as it is.
    if let Some(bundle) = installed.anchors_bundle() {
        for doc in &mut docs {
            if doc["kind"] == "ConfigMap" && doc["metadata"]["name"] == TRUST_ANCHORS_CONFIG_MAP {
                doc["data"][TRUST_ANCHORS_KEY] = Value::String(bundle.clone());
            }
        }
    }
    let from = installed.version().map_or_else(|| "a version without stored values".to_string(), |v| v.to_string());
    if args.crds {
        docs.retain(|d| d["kind"] == "CustomResourceDefinition");
        let text = format!(
            "# cnimesh {}: `cnimesh upgrade --crds` (from {from}) — apply first with `kubectl apply -f -`.\n{}",
            env!("CARGO_PKG_VERSION"),
            yaml::render(&docs)
        );
        return Ok((text, guard, renewal));
    }
    let text = format!(
        "# cnimesh {}: `cnimesh upgrade` (from {from}) — apply with `kubectl apply -f -` after `cnimesh upgrade --crds`.\n\
         # Reuses the cluster's trust anchors, issuer and webhook CA; holds the issuer's private key: keep it secret.\n{}",
        env!("CARGO_PKG_VERSION"),
        yaml::render(&docs)
    );
    Ok((text, guard, renewal))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::install::mock_api::ObjectsApi;
    use crate::install::{ISSUER_SECRET, WEBHOOK_SECRET};
    use k8s_openapi::api::core::v1::Secret;

    fn install(set: &[&str]) -> String {
        crate::install::mock_api::rendered_install(set)
    }

    fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name}"))
    }

    fn identities(docs: &[Value]) -> BTreeSet<String> {
        docs.iter().map(yaml::describe).collect()
    }

    #[tokio::test]
    async fn upgrade_keeps_the_anchors_the_issuer_the_webhook_ca_and_the_install_options() {
        let cluster = ObjectsApi::default();
        let first = install(&["controlPlane.replicas=3", "proxy.logLevel=debug"]);
        cluster.apply(&first);
        let first = yaml::documents(&first, "install").unwrap();

        let upgraded = upgrade(&cluster.client(), &UpgradeArgs::default()).await.unwrap().0;
        let upgraded = yaml::documents(&upgraded, "upgrade").unwrap();
        for (kind, name) in
            [("Secret", ISSUER_SECRET), ("Secret", WEBHOOK_SECRET), ("ConfigMap", TRUST_ANCHORS_CONFIG_MAP)]
        {
            assert_eq!(find(&upgraded, kind, name)["data"], find(&first, kind, name)["data"], "{kind} {name}");
        }
        let bundle =
            |docs: &[Value]| find(docs, "MutatingWebhookConfiguration", "cnimesh-proxy-injector")["webhooks"].clone();
        assert_eq!(bundle(&upgraded), bundle(&first), "same caBundle");
        let secret: Secret = serde_json::from_value(find(&upgraded, "Secret", ISSUER_SECRET).clone()).unwrap();
        let data = secret.data.unwrap();
        cnimesh_model::identity::issuer::Issuer::from_pem(&data["ca.crt"].0, &data["tls.crt"].0, &data["tls.key"].0)
            .expect("the kept issuer still works");

        // The options given at install survive an upgrade without --set.
        let deployment = find(&upgraded, "Deployment", "cnimesh-control");
        assert_eq!(deployment["spec"]["replicas"], 3);
        let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap();
        assert!(env.iter().any(|e| e["name"] == "CNIMESH_CONTROL_PROXY_LOG_LEVEL" && e["value"] == "debug"));

        // It applies over the first: every object the first created is there again.
        assert_eq!(identities(&upgraded), identities(&first));

        // New --set values go over the stored ones, and are stored in turn.
        cluster.apply(&yaml::render(&upgraded));
        let args = UpgradeArgs {
            values: ValuesArgs { set: vec!["controlPlane.replicas=1".into()], ..Default::default() },
            ..Default::default()
        };
        let again = yaml::documents(&upgrade(&cluster.client(), &args).await.unwrap().0, "again").unwrap();
        assert_eq!(find(&again, "Deployment", "cnimesh-control")["spec"]["replicas"], 1);
        let env =
            find(&again, "Deployment", "cnimesh-control")["spec"]["template"]["spec"]["containers"][0]["env"].clone();
        assert!(env.as_array().unwrap().iter().any(|e| e["value"] == "debug"), "earlier overrides kept");
        // One replica has no disruption budget: the rest is the same set, the budget is what prune removes.
        let mut expected = identities(&first);
        expected.remove("PodDisruptionBudget/cnimesh/cnimesh-control");
        assert_eq!(identities(&again), expected);
    }

    #[tokio::test]
    async fn upgrade_crds_prints_only_the_crds_and_a_missing_mesh_is_a_clear_error() {
        let empty = ObjectsApi::default();
        let error = format!("{:#}", upgrade(&empty.client(), &UpgradeArgs::default()).await.unwrap_err());
        assert!(error.contains("the mesh is not installed") && error.contains("cnimesh install"), "{error}");

        let cluster = ObjectsApi::default();
        cluster.apply(&install(&[]));
        let crds = upgrade(&cluster.client(), &UpgradeArgs { crds: true, ..Default::default() }).await.unwrap().0;
        let crds = yaml::documents(&crds, "crds").unwrap();
        assert!(!crds.is_empty());
        assert!(crds.iter().all(|d| d["kind"] == "CustomResourceDefinition"));
    }

    #[tokio::test]
    async fn upgrade_follows_the_servers_version_and_adds_the_policy_once_the_cluster_reaches_1_30() {
        let cluster = ObjectsApi::at(24);
        let (first, guard) = install::install(Some(&cluster.client()), &Default::default()).await.unwrap();
        assert!(guard.warning().is_some());
        cluster.apply(&first);
        let kinds = |text: &str| -> Vec<String> {
            yaml::documents(text, "upgrade")
                .unwrap()
                .iter()
                .filter(|d| guard::POLICY_KINDS.iter().any(|k| d["kind"] == *k))
                .map(yaml::describe)
                .collect()
        };
        let (upgraded, guard, _) = upgrade(&cluster.client(), &UpgradeArgs::default()).await.unwrap();
        assert_eq!(kinds(&upgraded), Vec::<String>::new(), "1.24 has no policy API");
        assert!(guard.warning().unwrap().contains("Kubernetes 1.24"));

        cluster.upgrade_to(30);
        let (upgraded, guard, _) = upgrade(&cluster.client(), &UpgradeArgs::default()).await.unwrap();
        assert_eq!(kinds(&upgraded).len(), 2, "the cluster reached 1.30: the policy and its binding");
        assert_eq!(guard.warning(), None);
    }

    #[tokio::test]
    async fn leaving_ha_hands_the_webhook_certificate_back_re_issued_by_the_ca_the_control_plane_kept() {
        use cnimesh_identity::ca::{Signer, new_private_ca};
        use cnimesh_model::inject::{DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_NAMESPACE, webhook_dns_names};
        use k8s_openapi::ByteString;
        const DAY: std::time::Duration = std::time::Duration::from_secs(86400);

        let cluster = ObjectsApi::default();
        cluster.apply(&install(&["ha=true"]));
        // What the managed mode leaves in the Secret: its CA with the key, a 30-day certificate.
        let ca = new_private_ca("cnimesh webhook CA", 365 * DAY).unwrap();
        let names = webhook_dns_names(DEFAULT_CONTROL_NAMESPACE, DEFAULT_CLUSTER_DOMAIN);
        let serving = Signer::new(&ca).unwrap().new_server_cert(&names, 30 * DAY).unwrap();
        let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
        let managed = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(WEBHOOK_SECRET.into()),
                namespace: Some(DEFAULT_CONTROL_NAMESPACE.into()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(
                [
                    ("ca.crt", bytes(&ca.cert_pem)),
                    ("tls.crt", bytes(&serving.cert_pem)),
                    ("tls.key", bytes(&serving.key_pem)),
                    ("issuer.crt", bytes(&ca.cert_pem)),
                    ("issuer.key", bytes(&ca.key_pem)),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            ),
            ..Default::default()
        };
        let mut doc = serde_json::to_value(&managed).unwrap();
        doc["apiVersion"] = "v1".into();
        doc["kind"] = "Secret".into();
        cluster.apply(&yaml::render(&[doc]));
        let tls = |docs: &[Value], key: &str| -> String {
            let secret: Secret = serde_json::from_value(find(docs, "Secret", WEBHOOK_SECRET).clone()).unwrap();
            String::from_utf8(secret.data.unwrap()[key].0.clone()).unwrap()
        };

        // Still HA: the control plane keeps the certificate; upgrade neither renews nor may be told to.
        let (text, _, renewal) = upgrade(&cluster.client(), &UpgradeArgs::default()).await.unwrap();
        assert_eq!(renewal, Renewal::Kept);
        assert_eq!(tls(&yaml::documents(&text, "ha").unwrap(), "tls.crt"), serving.cert_pem);
        let forced = UpgradeArgs { renew_webhook_certificate: true, ..Default::default() };
        let error = format!("{:#}", upgrade(&cluster.client(), &forced).await.unwrap_err());
        assert!(error.contains("with `ha` the control plane keeps the webhook's certificate"), "{error}");

        // Leaving HA: re-issued by the kept CA for a year; the caBundle stays the CA.
        let args = UpgradeArgs {
            values: ValuesArgs { set: vec!["ha=false".into()], ..Default::default() },
            ..Default::default()
        };
        let (text, _, renewal) = upgrade(&cluster.client(), &args).await.unwrap();
        assert_eq!(renewal, Renewal::ByKeptCa);
        let docs = yaml::documents(&text, "files").unwrap();
        let cert = tls(&docs, "tls.crt");
        assert_ne!(cert, serving.cert_pem);
        assert_eq!(tls(&docs, "ca.crt"), ca.cert_pem);
        let (_, until) = cnimesh_identity::tls::first_validity(&cert).unwrap();
        assert!(until > std::time::SystemTime::now() + 300 * DAY, "a year at most the CA's life, not 30 days");
        let webhooks = &find(&docs, "MutatingWebhookConfiguration", "cnimesh-proxy-injector")["webhooks"];
        let expected: Value = serde_json::to_value(bytes(&ca.cert_pem)).unwrap();
        assert!(webhooks.as_array().unwrap().iter().all(|w| w["clientConfig"]["caBundle"] == expected));
    }

    #[tokio::test]
    async fn install_twice_refuses_the_second_time_and_points_to_upgrade() {
        let cluster = ObjectsApi::default();
        install::refuse_existing(&cluster.client()).await.expect("an empty cluster takes an install");
        cluster.apply(&install(&[]));
        let error = install::refuse_existing(&cluster.client()).await.unwrap_err().to_string();
        assert!(error.contains("already installed"), "{error}");
        assert!(error.contains("Secret cnimesh/cnimesh-identity-issuer"), "{error}");
        assert!(error.contains("Use `cnimesh upgrade`"), "{error}");
        assert!(error.contains("--force"), "{error}");
    }
}
