//! The injection webhook's registration and every certificate the mesh depends on. The API
//! server only calls the webhook if the `caBundle` verifies the serving certificate, and proxies
//! only get identities while the issuer is valid and chains to the anchors they trust, so each of
//! these links is checked on its own and named when it breaks.
//!
//! Layer: runtime (operator CLI).

use std::collections::BTreeSet;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;

use super::certs;
use super::report::{Category, Check, Status, plural};
use super::{CONTROL_NAMESPACE, kube_error, read_hint};
use cnimesh_model::inject::{WEBHOOK_CA_FILE, WEBHOOK_CERT_FILE, WEBHOOK_SERVICE};

const WEBHOOK: &Category = &Category::Webhook;
const CERTS: &Category = &Category::Certificates;
/// The MutatingWebhookConfiguration (`daemonset/control-webhook.yaml`).
pub const WEBHOOK_CONFIGURATION: &str = "cnimesh-proxy-injector";
pub use crate::install::{ISSUER_SECRET, TRUST_ANCHORS_CONFIG_MAP as ANCHORS_CONFIG_MAP, WEBHOOK_SECRET};

/// DER certificates read from a Secret, or what was wrong with it.
type Certs = Result<Vec<Vec<u8>>, String>;

/// A Secret's key, read: `Err` says what is missing.
fn secret_key(secret: &Option<Secret>, name: &str, key: &str) -> Result<Vec<u8>, String> {
    let secret = secret.as_ref().ok_or_else(|| format!("Secret {CONTROL_NAMESPACE}/{name} is missing"))?;
    let data = secret.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.clone());
    data.filter(|d| !d.is_empty()).ok_or_else(|| format!("Secret {CONTROL_NAMESPACE}/{name} has no {key}"))
}

fn pem_key(secret: &Option<Secret>, name: &str, key: &str) -> Certs {
    let bytes = secret_key(secret, name, key)?;
    certs::parse_pem(&bytes).map_err(|e| format!("{key} of Secret {CONTROL_NAMESPACE}/{name}: {e}"))
}

async fn read_secret(client: &kube::Client, name: &str) -> Result<Option<Secret>, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), CONTROL_NAMESPACE);
    api.get_opt(name).await.map_err(|e| format!("reading Secret {CONTROL_NAMESPACE}/{name}: {}", kube_error(&e)))
}

pub async fn check(client: &kube::Client, now: i64, checks: &mut Vec<Check>) {
    let webhook_secret = read_secret(client, WEBHOOK_SECRET).await;
    webhook(client, &webhook_secret, checks).await;
    certificates(client, &webhook_secret, now, checks).await;
}

async fn webhook(client: &kube::Client, secret: &Result<Option<Secret>, String>, checks: &mut Vec<Check>) {
    let reinstall = "re-create it: cnimesh install | kubectl apply -f -";
    let exists = "the proxy injector is registered";
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let config = match api.get_opt(WEBHOOK_CONFIGURATION).await {
        Ok(Some(c)) => c,
        Ok(None) => {
            checks.push(Check::fail(
                WEBHOOK,
                exists,
                format!("no MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION}: pods are not injected"),
                reinstall,
            ));
            return skip_webhook(checks, "the webhook is not registered");
        }
        Err(e) => {
            checks.push(Check::fail(
                WEBHOOK,
                exists,
                format!("reading MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION}: {}", kube_error(&e)),
                read_hint(&e, "allow reading mutatingwebhookconfigurations"),
            ));
            return skip_webhook(checks, "the webhook registration could not be read");
        }
    };
    let webhooks = config.webhooks.unwrap_or_default();
    checks.push(Check::ok(WEBHOOK, exists, format!("{WEBHOOK_CONFIGURATION} ({} webhooks)", webhooks.len())));

    let bundles: Vec<(String, Option<Vec<u8>>)> = webhooks
        .iter()
        .map(|w| (w.name.clone(), w.client_config.ca_bundle.as_ref().map(|b| b.0.clone()).filter(|b| !b.is_empty())))
        .collect();
    let empty: Vec<&str> = bundles.iter().filter(|(_, b)| b.is_none()).map(|(n, _)| n.as_str()).collect();
    let name = "every webhook has a caBundle";
    let patch_hint = format!(
        "patch clientConfig.caBundle with the base64 of {WEBHOOK_CA_FILE} from Secret {CONTROL_NAMESPACE}/{WEBHOOK_SECRET}"
    );
    checks.push(if webhooks.is_empty() {
        Check::fail(WEBHOOK, name, "the configuration lists no webhooks", reinstall)
    } else if !empty.is_empty() {
        Check::fail(WEBHOOK, name, format!("empty caBundle: {}", empty.join(", ")), patch_hint.clone())
    } else {
        Check::ok(WEBHOOK, name, format!("{} of {}", bundles.len(), bundles.len()))
    });

    let verifies = "the caBundle verifies the serving certificate";
    let names = "the serving certificate names the webhook Service";
    let serving = match secret {
        Ok(secret) => pem_key(secret, WEBHOOK_SECRET, WEBHOOK_CERT_FILE),
        Err(e) => Err(e.clone()),
    };
    let serving = match serving {
        Ok(chain) => chain.into_iter().next().expect("parse_pem returns at least one"),
        Err(e) => {
            let hint = "regenerate it: cnimesh ca webhook --dir D, then create the Secret from D and patch the caBundle from D/ca.crt";
            checks.push(Check::fail(WEBHOOK, verifies, e, hint));
            checks.push(Check::skip(WEBHOOK, names, "skipped: no serving certificate"));
            return;
        }
    };
    let mut failing = Vec::new();
    for (webhook, bundle) in bundles.iter().filter_map(|(n, b)| Some((n, b.as_ref()?))) {
        match certs::parse_pem(bundle) {
            Ok(cas) if cas.iter().any(|ca| certs::signed_by(&serving, ca)) => {}
            Ok(cas) => failing.push(format!(
                "{webhook}: the certificate is issued by {:?}, the caBundle holds {}",
                issuer_of(&serving),
                cas.iter().map(|c| format!("{:?}", certs::subject(c))).collect::<Vec<_>>().join(", ")
            )),
            Err(e) => failing.push(format!("{webhook}: caBundle: {e}")),
        }
    }
    checks.push(if !failing.is_empty() {
        Check::fail(
            WEBHOOK,
            verifies,
            format!(
                "the API server will reject the webhook's TLS: Secret {WEBHOOK_SECRET} and the caBundle do not match"
            ),
            patch_hint,
        )
        .details(failing)
    } else if bundles.iter().all(|(_, b)| b.is_none()) {
        Check::skip(WEBHOOK, verifies, "skipped: no caBundle")
    } else {
        Check::ok(WEBHOOK, verifies, format!("{} is signed by the caBundle's CA", WEBHOOK_SECRET))
    });

    let wanted = format!("{WEBHOOK_SERVICE}.{CONTROL_NAMESPACE}.svc");
    let dns = certs::dns_names(&serving);
    checks.push(if dns.iter().any(|n| n.eq_ignore_ascii_case(&wanted)) {
        Check::ok(WEBHOOK, names, wanted)
    } else {
        Check::fail(
            WEBHOOK,
            names,
            format!(
                "{wanted} is not among its DNS names ({})",
                if dns.is_empty() { "none".into() } else { dns.join(", ") }
            ),
            format!("regenerate it for the Service: cnimesh ca webhook --namespace {CONTROL_NAMESPACE} --dir D"),
        )
    });
}

fn issuer_of(der: &[u8]) -> String {
    use x509_parser::prelude::FromDer;
    x509_parser::certificate::X509Certificate::from_der(der).map(|(_, c)| c.issuer().to_string()).unwrap_or_default()
}

fn skip_webhook(checks: &mut Vec<Check>, why: &str) {
    for name in [
        "every webhook has a caBundle",
        "the caBundle verifies the serving certificate",
        "the serving certificate names the webhook Service",
    ] {
        checks.push(Check::skip(WEBHOOK, name, format!("skipped: {why}")));
    }
}

/// Who keeps the webhook's certificate (the control plane's `CNIMESH_CONTROL_WEBHOOK_CERTS`):
/// it decides when an expiry is worth a warning and what to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WebhookCerts {
    /// The Secret install wrote (or the operator, `cnimesh ca webhook`): renewed by `cnimesh upgrade`.
    Files,
    /// The Secret written by someone else (cert-manager), watched and reloaded.
    Secret,
    /// The Lease holder renews the serving certificate at 2/3 of its life (30-day certificates).
    Managed,
}

async fn webhook_certs_mode(client: &kube::Client) -> WebhookCerts {
    let api: Api<Deployment> = Api::namespaced(client.clone(), CONTROL_NAMESPACE);
    let deployment = api.get_opt(super::CONTROL_NAME).await.ok().flatten();
    let value = deployment
        .and_then(|d| d.spec?.template.spec)
        .and_then(|s| s.containers.into_iter().find(|c| c.name == super::CONTROL_NAME))
        .and_then(|c| c.env?.into_iter().find(|e| e.name == "CNIMESH_CONTROL_WEBHOOK_CERTS"))
        .and_then(|e| e.value);
    match value.as_deref() {
        Some("managed") => WebhookCerts::Managed,
        Some("secret") => WebhookCerts::Secret,
        _ => WebhookCerts::Files,
    }
}

/// A managed serving certificate is renewed at 2/3 of its life: only a renewal overdue by a day
/// is worth a warning (a 30-day certificate always has less than 60 days left).
fn managed_validity(der: &[u8], now: i64) -> (Status, String) {
    let (status, message) = certs::validity(der, now);
    if status != Status::Warn {
        return (status, format!("{message}; the control plane renews it at 2/3 of its life"));
    }
    let cert = certs::parse(der);
    let (from, until) = (cert.validity().not_before.timestamp(), cert.validity().not_after.timestamp());
    let renew_at = from + (until - from) * 2 / 3;
    if now > renew_at + 86400 {
        (
            Status::Warn,
            format!("{message}: its renewal at 2/3 of its life, {}, is overdue", certs::format_date(renew_at)),
        )
    } else {
        (Status::Ok, format!("{message}; the control plane renews it at 2/3 of its life"))
    }
}

/// A validity check line for one certificate (or the worst of several, each as a detail).
fn validity_check(name: &str, ders: &[Vec<u8>], now: i64, hint: &str) -> Check {
    let results: Vec<(Status, String)> = ders.iter().map(|d| certs::validity(d, now)).collect();
    let rank = |s: Status| match s {
        Status::Fail => 3,
        Status::Warn => 2,
        Status::Skip => 1,
        Status::Ok => 0,
    };
    // The worst, and among equals the soonest to expire: that is the one to act on.
    let worst = (0..ders.len())
        .max_by_key(|&i| (rank(results[i].0), -certs::not_after(&ders[i])))
        .expect("at least one certificate");
    let (status, message) = results[worst].clone();
    let mut check = Check::new(CERTS, name, status, message);
    if ders.len() > 1 {
        check =
            check.details(ders.iter().zip(&results).map(|(d, (_, m))| format!("{}: {m}", certs::subject(d))).collect());
    }
    if status != Status::Ok {
        check = check.hint(hint);
    }
    check
}

async fn certificates(
    client: &kube::Client,
    webhook_secret: &Result<Option<Secret>, String>,
    now: i64,
    checks: &mut Vec<Check>,
) {
    let issuer_secret = read_secret(client, ISSUER_SECRET).await;
    let from = |secret: &Result<Option<Secret>, String>, name: &str, key: &str| match secret {
        Ok(s) => pem_key(s, name, key),
        Err(e) => Err(e.clone()),
    };
    let missing_hint = "generate them (cnimesh ca init / ca webhook) and re-create the Secret, or re-install";
    let anchor_hint = format!(
        "rotate the trust anchors: put the new anchor next to the old one in ca.crt of Secret {ISSUER_SECRET} and ConfigMap {ANCHORS_CONFIG_MAP}, re-issue the issuer, then drop the old anchor"
    );
    let issuer_hint = format!(
        "issue a new issuer from the trust anchor (cnimesh ca init), update Secret {CONTROL_NAMESPACE}/{ISSUER_SECRET} and restart {}",
        super::CONTROL_NAME
    );
    let mode = webhook_certs_mode(client).await;
    let webhook_hint = match mode {
        WebhookCerts::Files => format!(
            "renew it: cnimesh upgrade --renew-webhook-certificate | kubectl apply -f - (the caBundle trusts the old and the new CA until the control plane has reloaded Secret {CONTROL_NAMESPACE}/{WEBHOOK_SECRET})"
        ),
        WebhookCerts::Secret => format!(
            "whoever writes Secret {CONTROL_NAMESPACE}/{WEBHOOK_SECRET} renews it (cert-manager: kubectl -n {CONTROL_NAMESPACE} describe certificate); the control plane reloads it"
        ),
        WebhookCerts::Managed => {
            let lease = cnimesh_runtime::leader::lease_name(cnimesh_runtime::leader::WEBHOOK_WRITE);
            format!(
                "the control plane renews it (--webhook-certs managed): is a replica holding the Lease {lease} (kubectl -n {CONTROL_NAMESPACE} get lease {lease})? Its logs say why a renewal failed"
            )
        }
    };

    let anchors = from(&issuer_secret, ISSUER_SECRET, "ca.crt");
    let issuer = from(&issuer_secret, ISSUER_SECRET, "tls.crt").map(|mut chain| chain.swap_remove(0));
    let items: [(&str, Certs, &str); 4] = [
        ("trust anchors are valid", anchors.clone(), &anchor_hint),
        ("issuer certificate is valid", issuer.clone().map(|i| vec![i]), &issuer_hint),
        (
            "webhook serving certificate is valid",
            from(webhook_secret, WEBHOOK_SECRET, WEBHOOK_CERT_FILE).map(|mut c| vec![c.swap_remove(0)]),
            &webhook_hint,
        ),
        ("webhook CA is valid", from(webhook_secret, WEBHOOK_SECRET, WEBHOOK_CA_FILE), &webhook_hint),
    ];
    for (name, ders, hint) in items {
        checks.push(match ders {
            Ok(ders) if mode == WebhookCerts::Managed && name == "webhook serving certificate is valid" => {
                let (status, message) = managed_validity(&ders[0], now);
                let check = Check::new(CERTS, name, status, message);
                if status == Status::Ok { check } else { check.hint(hint) }
            }
            Ok(ders) => validity_check(name, &ders, now, hint),
            Err(e) => Check::fail(CERTS, name, e, missing_hint),
        });
    }

    let chains = "issuer chains to a trust anchor";
    checks.push(match (&anchors, &issuer) {
        (Ok(anchors), Ok(issuer)) if anchors.iter().any(|a| certs::signed_by(issuer, a)) => {
            Check::ok(CERTS, chains, format!("{:?} signed by {:?}", certs::subject(issuer), issuer_of(issuer)))
        }
        (Ok(anchors), Ok(issuer)) => Check::fail(
            CERTS,
            chains,
            format!(
                "the issuer ({:?}, issued by {:?}) is not signed by any of the {} trust anchors: proxies will reject every certificate",
                certs::subject(issuer),
                issuer_of(issuer),
                anchors.len()
            ),
            issuer_hint.clone(),
        ),
        _ => Check::skip(CERTS, chains, "skipped: the issuer or the trust anchors are unreadable"),
    });

    let matches = "trust anchors ConfigMap matches the Secret";
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), CONTROL_NAMESPACE);
    let config_map = config_maps.get_opt(ANCHORS_CONFIG_MAP).await;
    let cm_hint = format!(
        "kubectl -n {CONTROL_NAMESPACE} create configmap {ANCHORS_CONFIG_MAP} --from-file=ca.crt=<ca.crt of Secret {ISSUER_SECRET}> --dry-run=client -o yaml | kubectl apply -f -"
    );
    checks.push(match (config_map, &anchors) {
        (Err(e), _) => Check::fail(
            CERTS,
            matches,
            format!("reading ConfigMap {CONTROL_NAMESPACE}/{ANCHORS_CONFIG_MAP}: {}", kube_error(&e)),
            read_hint(&e, "allow reading configmaps in the control plane's namespace"),
        ),
        (Ok(None), _) => Check::fail(
            CERTS,
            matches,
            format!("no ConfigMap {CONTROL_NAMESPACE}/{ANCHORS_CONFIG_MAP}: cnimesh inject cannot read the trust anchors"),
            cm_hint,
        ),
        (Ok(Some(_)), Err(_)) => Check::skip(CERTS, matches, "skipped: the Secret's trust anchors are unreadable"),
        (Ok(Some(cm)), Ok(anchors)) => {
            let text = cm.data.as_ref().and_then(|d| d.get("ca.crt")).cloned().unwrap_or_default();
            match certs::parse_pem(text.as_bytes()) {
                Err(e) => Check::fail(CERTS, matches, format!("ca.crt of ConfigMap {ANCHORS_CONFIG_MAP}: {e}"), cm_hint),
                Ok(in_cm) => {
                    let (a, b): (BTreeSet<_>, BTreeSet<_>) = (anchors.iter().collect(), in_cm.iter().collect());
                    if a == b {
                        Check::ok(CERTS, matches, format!("{} in both", plural(a.len(), "anchor")))
                    } else {
                        Check::fail(
                            CERTS,
                            matches,
                            format!(
                                "ConfigMap {ANCHORS_CONFIG_MAP} holds {} anchors, {} of them not in the Secret; the Secret holds {} not in the ConfigMap",
                                b.len(),
                                b.difference(&a).count(),
                                a.difference(&b).count()
                            ),
                            cm_hint,
                        )
                    }
                }
            }
        }
    });
}
