//! What the mesh really trusts and serves, as opposed to what its Secrets store (a
//! control plane that kept serving an old webhook certificate, and anchors replaced under
//! running proxies, both passed the stored-objects checks of [`super::pki`]).
//!
//! - The webhook: each control-plane replica reports, on its admin port's `/trust.json`, the
//!   chain its webhook listener presents to a real TLS handshake (made over the pod's loopback);
//!   it is read through the API server's pod proxy and verified against every caBundle. Why not
//!   a handshake from here: the CLI runs outside the cluster, the API server's `services/proxy`
//!   terminates TLS itself and never shows the backend's certificate, and a port-forward reaches
//!   one pod behind the Service (and needs a streaming upgrade); the pod proxy reaches each
//!   replica, so one stale replica among three is found too.
//! - The issuer: the one each replica signs with (also `/trust.json`) must chain to the anchors
//!   every running proxy holds (the PEM the injector put in its environment).
//! - The rotation (`cnimesh identity rotate`): which step the cluster is at, from the anchors'
//!   bundle, the issuer in use and the issuer of each proxy's certificate (`/identity.json`).
//! - Version skew: meshed pods whose proxy image is not the control plane's version.
//!
//! Layer: runtime (operator CLI).

use std::collections::BTreeSet;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::ListParams;
use serde_json::Value;

use super::certs;
use super::meshed::capped;
use super::pki::{ISSUER_SECRET, WEBHOOK_CONFIGURATION};
use super::report::{Category, Check, Status, plural};
use super::{CONCURRENCY, CONTROL_NAME, CONTROL_NAMESPACE, kube_error, pod_proxy_get, pod_ready, terminating};
use cnimesh_common::names::CONTROL_ADMIN_PORT;
use cnimesh_model::inject::{PROXY_ADMIN_PORT, PROXY_CONTAINER, TRUST_ANCHORS_ENV};

pub const SERVED: &str = "the webhook serves a certificate the caBundle verifies";
pub const ISSUER_TRUSTED: &str = "the issuer in use chains to the anchors every proxy holds";
pub const ROTATION: &str = "trust anchor rotation";
pub const VERSIONS: &str = "proxies run the control plane's version";
const ROTATION_DOC: &str = "docs/install/rotation.md";

fn name_of(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn b64_ders(value: &Value) -> Vec<Vec<u8>> {
    let decode = |s: &str| base64::Engine::decode(&base64::engine::general_purpose::STANDARD, s).ok();
    value.as_array().into_iter().flatten().filter_map(|v| decode(v.as_str()?)).collect()
}

/// One control-plane replica's `/trust.json`.
struct Replica {
    pod: String,
    /// The webhook chain it serves (leaf first), or why it could not be read.
    served: Result<Vec<Vec<u8>>, String>,
    /// The issuer certificate it signs with.
    issuer: Option<Vec<u8>>,
}

async fn replicas(client: &kube::Client) -> Result<Vec<Replica>, String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), CONTROL_NAMESPACE);
    let pods = api
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing pods in {CONTROL_NAMESPACE}: {}", kube_error(&e)))?
        .items;
    // Only what the API server calls: ready pods that are not terminating (a terminating pod
    // left the Service's endpoints, and may stop answering at any moment).
    let control: Vec<String> = pods
        .iter()
        .filter(|p| pod_ready(p) && !terminating(p))
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.containers.iter().any(|c| c.name == CONTROL_NAME)))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    Ok(futures::stream::iter(control)
        .map(|pod| async move {
            let report = pod_proxy_get(client, CONTROL_NAMESPACE, &pod, CONTROL_ADMIN_PORT, "trust.json")
                .await
                .and_then(|text| serde_json::from_str::<Value>(&text).map_err(|e| format!("trust.json: {e}")));
            let pod = format!("{CONTROL_NAMESPACE}/{pod}");
            match report {
                Err(e) => Replica { pod, served: Err(e), issuer: None },
                Ok(v) => {
                    let served = match (&v["webhook"]["served"], v["webhook"]["error"].as_str()) {
                        (_, Some(error)) => Err(format!("the webhook handshake failed: {error}")),
                        (served, None) if served.is_array() => Ok(b64_ders(served)),
                        _ => Err("the webhook is not enabled on this replica".to_string()),
                    };
                    let issuer = b64_ders(&v["issuer"]["chain"]).into_iter().next();
                    Replica { pod, served, issuer }
                }
            }
        })
        .buffered(CONCURRENCY)
        .collect::<Vec<_>>()
        .await)
}

/// A meshed, running pod's proxy: the anchors in its environment and its image.
struct Proxy {
    pod: String,
    namespace: String,
    name: String,
    anchors: Option<Vec<Vec<u8>>>,
    image: Option<String>,
}

fn proxies(pods: &[Pod]) -> Vec<Proxy> {
    let mut out = Vec::new();
    for pod in pods {
        let Some(spec) = &pod.spec else { continue };
        let running = !matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        let proxy =
            spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == PROXY_CONTAINER);
        let (Some(proxy), true) = (proxy, running) else { continue };
        let anchors = proxy
            .env
            .iter()
            .flatten()
            .find(|e| e.name == TRUST_ANCHORS_ENV)
            .and_then(|e| e.value.as_ref())
            .and_then(|pem| certs::parse_pem(pem.as_bytes()).ok());
        out.push(Proxy {
            pod: name_of(pod),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            anchors,
            image: proxy.image.clone(),
        });
    }
    out
}

/// The tag of an image reference (`repo:tag`, `repo:tag@sha256:…`); `None` without one.
pub fn image_tag(image: &str) -> Option<&str> {
    let image = image.split('@').next().unwrap_or(image);
    let last = image.rsplit('/').next().unwrap_or(image);
    last.split_once(':').map(|(_, tag)| tag)
}

pub async fn check(client: &kube::Client, checks: &mut Vec<Check>) {
    let replicas = replicas(client).await;
    served(client, &replicas, checks).await;
    let pods = Api::<Pod>::all(client.clone()).list(&ListParams::default()).await.map(|l| l.items);
    let proxies = match &pods {
        Ok(pods) => Ok(proxies(pods)),
        Err(e) => Err(format!("listing pods in all namespaces: {}", kube_error(e))),
    };
    issuer(client, &replicas, &proxies, checks).await;
    versions(client, &proxies, checks).await;
}

async fn served(client: &kube::Client, replicas: &Result<Vec<Replica>, String>, checks: &mut Vec<Check>) {
    const CATEGORY: &Category = &Category::Webhook;
    let replicas = match replicas {
        Ok(r) if r.is_empty() => {
            return checks.push(Check::skip(CATEGORY, SERVED, "skipped: no ready control-plane pod"));
        }
        Ok(r) => r,
        Err(e) => {
            return checks.push(Check::fail(
                CATEGORY,
                SERVED,
                e.clone(),
                "allow listing pods in the control plane's namespace",
            ));
        }
    };
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let bundles: Vec<(String, Vec<Vec<u8>>)> = match api.get_opt(WEBHOOK_CONFIGURATION).await {
        Ok(Some(config)) => config
            .webhooks
            .into_iter()
            .flatten()
            .map(|w| {
                let bundle = w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default();
                (w.name, certs::parse_pem(&bundle).unwrap_or_default())
            })
            .collect(),
        _ => return checks.push(Check::skip(CATEGORY, SERVED, "skipped: the webhook registration could not be read")),
    };
    let stored = Api::<Secret>::namespaced(client.clone(), CONTROL_NAMESPACE)
        .get_opt(cnimesh_model::inject::WEBHOOK_SECRET)
        .await
        .ok()
        .flatten()
        .and_then(|s| s.data?.get(cnimesh_model::inject::WEBHOOK_CERT_FILE).cloned())
        .and_then(|pem| certs::parse_pem(&pem.0).ok()?.into_iter().next());
    // A certificate the caBundle does not verify is what the API server's calls fail on (x509); a
    // replica that did not answer is another problem and is named as such, never as x509.
    let (mut failing, mut unanswered, mut verified) = (Vec::new(), Vec::new(), 0);
    for replica in replicas {
        match &replica.served {
            Err(e) => unanswered.push((&replica.pod, e.to_string())),
            Ok(chain) if chain.is_empty() => unanswered.push((&replica.pod, "no certificate served".to_string())),
            Ok(chain) => {
                let before = failing.len();
                for (webhook, cas) in &bundles {
                    if cas.iter().any(|ca| certs::signed_by(&chain[0], ca)) {
                        continue;
                    }
                    let whose = if stored.as_ref() == Some(&chain[0]) { ", the Secret's certificate" } else { "" };
                    failing.push(format!(
                        "{}: serves {:?} (serial {}{whose}), which the caBundle of {webhook} does not verify",
                        replica.pod,
                        certs::subject(&chain[0]),
                        certs::serial(&chain[0]),
                    ));
                }
                if failing.len() == before {
                    verified += 1;
                }
            }
        }
    }
    let unanswered_details = || unanswered.iter().map(|(pod, why)| format!("{pod}: {why}")).collect::<Vec<_>>();
    let restart = format!(
        "kubectl -n {CONTROL_NAMESPACE} describe pod and logs of the replica; the API server sends the webhook's calls to the replicas that answer"
    );
    checks.push(if failing.is_empty() && unanswered.is_empty() {
        Check::ok(CATEGORY, SERVED, format!("{} checked by a handshake", plural(replicas.len(), "replica")))
    } else if failing.is_empty() && verified > 0 {
        Check::warn(
            CATEGORY,
            SERVED,
            format!(
                "{} of {} ready replicas did not answer (not a certificate problem); {verified} serve a certificate the caBundle verifies",
                unanswered.len(),
                replicas.len()
            ),
            restart,
        )
        .details(capped(unanswered_details()))
    } else if failing.is_empty() {
        Check::fail(
            CATEGORY,
            SERVED,
            format!(
                "no ready replica's webhook answered ({}): the API server cannot call it either, and pod creation in meshed namespaces fails",
                unanswered.first().map(|(_, why)| why.as_str()).unwrap_or_default()
            ),
            restart,
        )
        .details(capped(unanswered_details()))
    } else {
        failing.extend(unanswered_details());
        Check::fail(
            CATEGORY,
            SERVED,
            if verified > 0 {
                "the API server will reject the TLS of some replicas (x509: certificate signed by unknown authority): pod creations it sends to them fail".to_string()
            } else {
                "the API server will reject the webhook's TLS (x509: certificate signed by unknown authority): every pod creation in a meshed namespace fails".to_string()
            },
            format!(
                "the control plane reloads its certificate from Secret {CONTROL_NAMESPACE}/{} within seconds of a change; if the Secret is right and this persists, kubectl -n {CONTROL_NAMESPACE} rollout restart deployment/{CONTROL_NAME}; if the Secret is wrong, make the caBundle and the Secret's ca.crt match",
                cnimesh_model::inject::WEBHOOK_SECRET
            ),
        )
        .details(capped(failing))
    });
}

/// The issuer Secret's anchors (in bundle order) and issuer certificate.
async fn stored_issuer(client: &kube::Client) -> Option<(Vec<Vec<u8>>, Vec<u8>)> {
    let api: Api<Secret> = Api::namespaced(client.clone(), CONTROL_NAMESPACE);
    let secret = api.get_opt(ISSUER_SECRET).await.ok()??;
    let data = secret.data?;
    let anchors = certs::parse_pem(&data.get("ca.crt")?.0).ok()?;
    let issuer = certs::parse_pem(&data.get("tls.crt")?.0).ok()?.into_iter().next()?;
    Some((anchors, issuer))
}

async fn issuer(
    client: &kube::Client,
    replicas: &Result<Vec<Replica>, String>,
    proxies: &Result<Vec<Proxy>, String>,
    checks: &mut Vec<Check>,
) {
    const CATEGORY: &Category = &Category::Certificates;
    let (replicas, proxies) = match (replicas, proxies) {
        (Ok(r), Ok(p)) => (r, p),
        (Err(e), _) | (_, Err(e)) => {
            checks.push(Check::skip(CATEGORY, ISSUER_TRUSTED, format!("skipped: {e}")));
            return checks.push(Check::skip(CATEGORY, ROTATION, format!("skipped: {e}")));
        }
    };
    let in_use: Vec<(&str, &Vec<u8>)> =
        replicas.iter().filter_map(|r| Some((r.pod.as_str(), r.issuer.as_ref()?))).collect();
    let Some(&(_, issuer)) = in_use.first() else {
        checks.push(Check::skip(CATEGORY, ISSUER_TRUSTED, "skipped: no control-plane replica reported its issuer"));
        return checks.push(Check::skip(CATEGORY, ROTATION, "skipped: no control-plane replica reported its issuer"));
    };
    let mut untrusting = Vec::new();
    for (pod, issuer) in &in_use {
        for proxy in proxies {
            if let Some(anchors) = &proxy.anchors
                && !anchors.iter().any(|a| certs::signed_by(issuer, a))
            {
                untrusting.push(format!(
                    "{}: holds {}, none of which signed the issuer {pod} uses (serial {})",
                    proxy.pod,
                    plural(anchors.len(), "anchor"),
                    certs::serial(issuer)
                ));
            }
        }
    }
    untrusting.sort();
    untrusting.dedup();
    checks.push(if untrusting.is_empty() {
        let known = proxies.iter().filter(|p| p.anchors.is_some()).count();
        Check::ok(CATEGORY, ISSUER_TRUSTED, format!("{} of {} checked", plural(known, "proxy"), proxies.len()))
    } else {
        Check::fail(
            CATEGORY,
            ISSUER_TRUSTED,
            format!(
                "{} do not trust the issuer in use: certificates it signs fail there (invalid peer certificate: BadSignature) and they lose discovery",
                plural(untrusting.len(), "proxy")
            ),
            format!(
                "put the anchor these proxies hold back beside the new one (cnimesh identity rotate bundle --new-anchor <new ca.crt> over the old Secret, or re-apply the old Secret), then restart these workloads; the safe order is in {ROTATION_DOC}"
            ),
        )
        .details(capped(untrusting))
    });
    checks.push(rotation(client, issuer, proxies).await);
}

/// Which step of a rotation the cluster is at.
async fn rotation(client: &kube::Client, in_use: &[u8], proxies: &[Proxy]) -> Check {
    const CATEGORY: &Category = &Category::Certificates;
    let Some((anchors, stored)) = stored_issuer(client).await else {
        return Check::skip(CATEGORY, ROTATION, format!("skipped: Secret {ISSUER_SECRET} is unreadable"));
    };
    if stored != in_use {
        return Check::warn(
            CATEGORY,
            ROTATION,
            format!(
                "the control plane signs with issuer serial {}, Secret {ISSUER_SECRET} holds serial {}: not reloaded yet",
                certs::serial(in_use),
                certs::serial(&stored)
            ),
            "the control plane reloads the Secret's volume within a minute of a change; run check again",
        );
    }
    if anchors.len() < 2 {
        return Check::ok(CATEGORY, ROTATION, "no rotation in progress: 1 trust anchor");
    }
    let bundle: BTreeSet<&Vec<u8>> = anchors.iter().collect();
    let lacking: Vec<String> = proxies
        .iter()
        .filter(|p| p.anchors.as_ref().is_some_and(|a| !bundle.iter().all(|b| a.contains(b))))
        .map(|p| p.pod.clone())
        .collect();
    // `bundle` appends the new anchor: an issuer under the last one has been switched to.
    let switched = anchors.last().is_some_and(|new| certs::signed_by(in_use, new));
    if !switched {
        return if lacking.is_empty() {
            Check::ok(
                CATEGORY,
                ROTATION,
                format!(
                    "step 1 of 3 (bundle) done: {} trusted, every proxy holds them; next: cnimesh identity rotate switch-issuer",
                    plural(anchors.len(), "anchor")
                ),
            )
        } else {
            Check::warn(
                CATEGORY,
                ROTATION,
                format!("step 1 of 3 (bundle): {} still without the new anchor", plural(lacking.len(), "proxy")),
                format!(
                    "proxies with the cnimesh-trust-bundle volume take the bundle within seconds of the control plane's reload; restart the others (injected before it) before switch-issuer; see {ROTATION_DOC}"
                ),
            )
            .details(capped(lacking))
        };
    }
    // Switched: who still holds a certificate from the previous issuer.
    let serial = certs::serial(in_use);
    let renewed: Vec<(String, Result<bool, String>)> = futures::stream::iter(proxies)
        .map(|p| {
            let serial = serial.clone();
            async move {
                let held = pod_proxy_get(client, &p.namespace, &p.name, PROXY_ADMIN_PORT, "identity.json").await;
                let held =
                    held.and_then(|t| serde_json::from_str::<Value>(&t).map_err(|e| e.to_string())).and_then(|v| {
                        v["certificate"]["issuer"]["serial"]
                            .as_str()
                            .map(|s| s.eq_ignore_ascii_case(&serial))
                            .ok_or_else(|| "its certificate's issuer is not reported".to_string())
                    });
                (p.pod.clone(), held)
            }
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let behind: Vec<String> = renewed
        .iter()
        .filter_map(|(pod, r)| match r {
            Ok(true) => None,
            Ok(false) => Some(format!("{pod}: certificate from the previous issuer")),
            Err(e) => Some(format!("{pod}: {e}")),
        })
        .collect();
    if behind.is_empty() && lacking.is_empty() {
        Check::ok(
            CATEGORY,
            ROTATION,
            "step 2 of 3 (switch-issuer) done: every proxy holds a certificate from the new issuer; next: cnimesh identity rotate drop-old",
        )
    } else {
        Check::new(
            CATEGORY,
            ROTATION,
            Status::Warn,
            format!(
                "step 2 of 3 (switch-issuer): {} not renewed under the new issuer yet",
                plural(behind.len() + lacking.len(), "proxy")
            ),
        )
        .hint(format!(
            "proxies renew at 70% of their certificate's life; wait, or restart these workloads, before drop-old ({ROTATION_DOC})"
        ))
        .details(capped(behind.into_iter().chain(lacking.into_iter().map(|p| format!("{p}: lacks the new anchor"))).collect()))
    }
}

async fn versions(client: &kube::Client, proxies: &Result<Vec<Proxy>, String>, checks: &mut Vec<Check>) {
    const CATEGORY: &Category = &Category::MeshedPods;
    let Ok(proxies) = proxies else {
        return checks.push(Check::skip(CATEGORY, VERSIONS, "skipped: pods could not be listed"));
    };
    let api: Api<Deployment> = Api::namespaced(client.clone(), CONTROL_NAMESPACE);
    let image = api.get_opt(CONTROL_NAME).await.ok().flatten().and_then(|d| {
        let containers = d.spec?.template.spec?.containers;
        containers.into_iter().find(|c| c.name == CONTROL_NAME).and_then(|c| c.image)
    });
    let Some(version) = image.as_deref().and_then(image_tag).map(str::to_string) else {
        return checks.push(Check::skip(
            CATEGORY,
            VERSIONS,
            "skipped: the control plane's image has no tag to compare",
        ));
    };
    let differing: Vec<String> = proxies
        .iter()
        .filter_map(|p| {
            let tag = p.image.as_deref().and_then(image_tag).unwrap_or("untagged");
            (tag != version).then(|| format!("{}: {tag}", p.pod))
        })
        .collect();
    checks.push(if differing.is_empty() {
        Check::ok(CATEGORY, VERSIONS, format!("{} at {version}", plural(proxies.len(), "proxy")))
    } else {
        Check::warn(
            CATEGORY,
            VERSIONS,
            format!("{} run a version other than the control plane's {version}", plural(differing.len(), "proxy")),
            "restart these workloads (kubectl rollout restart) to run the current proxy; which older proxies keep working: docs/install/rotation.md#version-skew",
        )
        .details(capped(differing))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_tags_are_read_with_registries_ports_and_digests() {
        assert_eq!(image_tag("ghcr.io/cnimesh/cnimesh-proxy:0.1.0"), Some("0.1.0"));
        assert_eq!(image_tag("registry:5000/cnimesh-proxy:0.2.0@sha256:abc"), Some("0.2.0"));
        assert_eq!(image_tag("registry:5000/cnimesh-proxy"), None);
        assert_eq!(image_tag("cnimesh-proxy@sha256:abc"), None);
    }
}
