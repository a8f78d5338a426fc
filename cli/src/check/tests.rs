//! `cnimesh check` against a mocked API server: a healthy cluster built in code (real
//! certificates from the mesh's own generators), then one variant per failure the check must
//! name. The table output of the healthy cluster and of one broken cluster is pinned in golden
//! files; `UPDATE_GOLDEN=1 cargo test -p cnimesh-control --lib check` rewrites them.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cnimesh_identity::ca::{CaPem, new_issuer, new_trust_anchor};
use k8s_openapi::ByteString;
use serde_json::{Value, json};

use super::mock::MockApi;
use super::*;
use cnimesh_model::inject::{generate_webhook_cert, webhook_dns_names};

const DAY: Duration = Duration::from_secs(86400);

const VERSION: &str = "/version";
const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/cnimesh/deployments/cnimesh-control";
const CONTROL_PODS: &str = "/api/v1/namespaces/cnimesh/pods";
const WEBHOOK_CONFIG: &str =
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/cnimesh-proxy-injector";
const WEBHOOK_SECRET: &str = "/api/v1/namespaces/cnimesh/secrets/cnimesh-webhook-tls";
const ISSUER_SECRET: &str = "/api/v1/namespaces/cnimesh/secrets/cnimesh-identity-issuer";
const ANCHORS_CM: &str = "/api/v1/namespaces/cnimesh/configmaps/cnimesh-identity-trust-anchors";
const DAEMONSET: &str = "/apis/apps/v1/namespaces/cnimesh-system/daemonsets/cnimesh-node";
const NODES: &str = "/api/v1/nodes";
const AGENT_PODS: &str = "/api/v1/namespaces/cnimesh-system/pods";
const ALL_PODS: &str = "/api/v1/pods";
const CONTROL_NS: &str = "/api/v1/namespaces/cnimesh";
const TRUST_JSON: &str = "/api/v1/namespaces/cnimesh/pods/cnimesh-control-7d9f:9990/proxy/trust.json";

fn status_path(pod: &str) -> String {
    format!("/api/v1/namespaces/cnimesh-system/pods/{pod}:4192/proxy/status")
}

fn metrics_path(ns: &str, pod: &str) -> String {
    format!("/api/v1/namespaces/{ns}/pods/{pod}:4191/proxy/metrics")
}

fn b64(bytes: &[u8]) -> Value {
    serde_json::to_value(ByteString(bytes.to_vec())).unwrap()
}

/// A webhook CA and serving certificate valid for `lifetime`: (ca.crt, tls.crt, tls.key).
fn webhook_pki(lifetime: Duration) -> (String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    generate_webhook_cert(dir.path(), &webhook_dns_names("cnimesh", "cluster.local"), lifetime, false).unwrap();
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
    (read("ca.crt"), read("tls.crt"), read("tls.key"))
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items})
}

fn container_status(name: &str, ready: bool) -> Value {
    json!({"name": name, "ready": ready, "image": "img", "imageID": "img@sha256:0", "restartCount": 0})
}

/// A running pod. `containers` are regular containers; `init` are native sidecars.
fn pod(ns: &str, name: &str, node: &str, containers: &[&str], init: &[&str], ready: bool) -> Value {
    let spec_containers: Vec<Value> = containers.iter().map(|c| json!({"name": c, "image": "img"})).collect();
    let spec_init: Vec<Value> =
        init.iter().map(|c| json!({"name": c, "image": "img", "restartPolicy": "Always"})).collect();
    json!({
        "metadata": {"namespace": ns, "name": name, "labels": {"app.kubernetes.io/name": name.rsplit_once('-').map_or(name, |(a, _)| a)}},
        "spec": {"nodeName": node, "containers": spec_containers, "initContainers": spec_init},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "containerStatuses": containers.iter().map(|c| container_status(c, ready)).collect::<Vec<_>>(),
            "initContainerStatuses": init.iter().map(|c| container_status(c, ready)).collect::<Vec<_>>(),
        }
    })
}

fn agent_status(node: &str, verify: Value) -> Value {
    json!({
        "node": node, "ready": true, "pending": [],
        "status": {
            "plugin_binary": "/host/opt/cni/bin/cnimesh-cni", "plugin_installed": true,
            "plugin_versions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
            "primary_config": "/host/etc/cni/net.d/10-bridge.conflist",
            "chained_in": "/host/etc/cni/net.d/10-bridge.conflist",
            "agent_socket": "/var/run/cnimesh/node.sock", "agent_socket_present": true,
            "kube": "in-cluster", "captured_pods": verify.as_array().map_or(0, Vec::len)
        },
        "healthy": true, "mount_propagation": "shared", "verify": verify
    })
}

fn verified(pod: &str, id: &str) -> Value {
    json!({"pod": pod, "container_id": id, "ok": true, "drift": []})
}

fn metrics(expiry: Option<i64>) -> String {
    let mut text = "# HELP process_start_time_seconds Start.\n# TYPE process_start_time_seconds gauge\n\
                    process_start_time_seconds 1700000000\n"
        .to_string();
    if let Some(expiry) = expiry {
        text.push_str(&format!(
            "# HELP identity_cert_expiration_timestamp_seconds Expiry of the current certificate.\n\
             # TYPE identity_cert_expiration_timestamp_seconds gauge\n\
             identity_cert_expiration_timestamp_seconds {expiry}\n"
        ));
    }
    text
}

struct Fixture {
    mock: MockApi,
    /// An hour after the certificates were made, so that "in N days" never straddles a second.
    now: SystemTime,
    anchor: CaPem,
    /// The issuer the control plane signs with (the Secret's, at first).
    issuer: CaPem,
}

impl Fixture {
    fn secs(&self) -> i64 {
        self.now.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
    }

    fn healthy() -> Self {
        let anchor = new_trust_anchor("cluster.local", 365 * DAY).unwrap();
        let issuer = new_issuer(&anchor, "cluster.local", 180 * DAY).unwrap();
        let now = SystemTime::now() + Duration::from_secs(3600);
        let mut fixture = Fixture { mock: MockApi::default(), now, anchor: anchor.clone(), issuer: issuer.clone() };
        fixture.set_webhook_pki(&webhook_pki(365 * DAY), None);
        let leaf_expiry = fixture.secs() + 20 * 3600;
        let m = &mut fixture.mock;
        m.get(
            VERSION,
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0", "gitCommit": "0", "gitTreeState": "clean",
                   "buildDate": "2025-04-23T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}),
        );
        m.get(
            DEPLOYMENT,
            json!({
                "metadata": {"namespace": "cnimesh", "name": "cnimesh-control"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app.kubernetes.io/name": "cnimesh-control"}},
                    "template": {"spec": {"containers": [{"name": "cnimesh-control", "image": "ghcr.io/cnimesh/cnimesh-control:0.1.0",
                        "env": [{"name": "CNIMESH_CONTROL_NATIVE_SIDECARS", "value": "auto"}]}]}}
                },
                "status": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}
            }),
        );
        m.get(
            CONTROL_PODS,
            list("PodList", vec![pod("cnimesh", "cnimesh-control-7d9f", "node-1", &["cnimesh-control"], &[], true)]),
        );
        m.get(
            ISSUER_SECRET,
            json!({"metadata": {"namespace": "cnimesh", "name": "cnimesh-identity-issuer"}, "type": "kubernetes.io/tls",
                   "data": {"ca.crt": b64(anchor.cert_pem.as_bytes()), "tls.crt": b64(issuer.cert_pem.as_bytes()),
                            "tls.key": b64(issuer.key_pem.as_bytes())}}),
        );
        m.get(
            ANCHORS_CM,
            json!({"metadata": {"namespace": "cnimesh", "name": "cnimesh-identity-trust-anchors"}, "data": {"ca.crt": anchor.cert_pem}}),
        );
        m.get(
            DAEMONSET,
            json!({"metadata": {"namespace": "cnimesh-system", "name": "cnimesh-node"},
                   "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "cnimesh-node"}}, "template": {"spec": {"containers": [{"name": "cnimesh-node"}]}}},
                   "status": {"currentNumberScheduled": 2, "desiredNumberScheduled": 2, "numberMisscheduled": 0, "numberReady": 2}}),
        );
        m.get(
            NODES,
            list("NodeList", vec![json!({"metadata": {"name": "node-1"}}), json!({"metadata": {"name": "node-2"}})]),
        );
        let agent = |name: &str, node: &str| {
            let mut p = pod("cnimesh-system", name, node, &["cnimesh-node"], &[], true);
            p["metadata"]["labels"] = json!({"app.kubernetes.io/name": "cnimesh-node"});
            p
        };
        m.get(
            AGENT_PODS,
            list("PodList", vec![agent("cnimesh-node-aaaaa", "node-1"), agent("cnimesh-node-bbbbb", "node-2")]),
        );
        m.get(
            &status_path("cnimesh-node-aaaaa"),
            agent_status("node-1", json!([verified("shop/web-1", "a1b2c3d4e5f60718293a")])),
        );
        m.get(
            &status_path("cnimesh-node-bbbbb"),
            agent_status("node-2", json!([verified("shop/web-2", "f0e1d2c3b4a596877869")])),
        );
        m.get(
            ALL_PODS,
            list(
                "PodList",
                vec![
                    pod("cnimesh", "cnimesh-control-7d9f", "node-1", &["cnimesh-control"], &[], true),
                    agent("cnimesh-node-aaaaa", "node-1"),
                    agent("cnimesh-node-bbbbb", "node-2"),
                    pod("shop", "web-1", "node-1", &["web"], &["cnimesh-proxy"], true),
                    pod("shop", "web-2", "node-2", &["cnimesh-proxy", "web"], &[], true),
                    pod("shop", "db-0", "node-2", &["postgres"], &[], true),
                ],
            ),
        );
        m.get_text(&metrics_path("shop", "web-1"), &metrics(Some(leaf_expiry)));
        m.get_text(&metrics_path("shop", "web-2"), &metrics(Some(leaf_expiry)));
        let anchors = anchor.cert_pem.clone();
        fixture.set_proxies(&anchors, "ghcr.io/cnimesh/cnimesh-proxy:0.1.0");
        fixture.set_proxy_issuer(&issuer.cert_pem);
        let webhook_cert = fixture.webhook_secret_cert();
        fixture.set_in_use(&issuer.cert_pem, &webhook_cert);
        fixture
    }

    /// The webhook Secret's `tls.crt`, as PEM.
    fn webhook_secret_cert(&mut self) -> String {
        let b64 = self.mock.json_mut(WEBHOOK_SECRET)["data"]["tls.crt"].as_str().unwrap().to_string();
        String::from_utf8(base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64).unwrap()).unwrap()
    }

    /// What the control plane replica reports on `/trust.json`: the issuer it signs with and the
    /// webhook certificate its listener serves.
    fn set_in_use(&mut self, issuer_pem: &str, served_pem: &str) {
        let der = |pem: &str| -> Vec<Value> {
            cnimesh_identity::pem::certs(pem.as_bytes(), "pem").unwrap().iter().map(|c| b64(c)).collect()
        };
        self.mock.get(
            TRUST_JSON,
            json!({"issuer": {"chain": der(issuer_pem), "anchors_pem": ""}, "webhook": {"enabled": true, "served": der(served_pem)}}),
        );
    }

    /// Every meshed pod's proxy: the anchors the injector gave it and its image.
    fn set_proxies(&mut self, anchors_pem: &str, image: &str) {
        for item in self.mock.json_mut(ALL_PODS)["items"].as_array_mut().unwrap() {
            for list in ["containers", "initContainers"] {
                for c in item["spec"][list].as_array_mut().into_iter().flatten() {
                    if c["name"] == "cnimesh-proxy" {
                        c["image"] = json!(image);
                        c["env"] = json!([{"name": "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM", "value": anchors_pem}]);
                    }
                }
            }
        }
    }

    /// The issuer of every meshed proxy's certificate, on its `/identity.json`.
    fn set_proxy_issuer(&mut self, issuer_pem: &str) {
        let der = cnimesh_identity::pem::certs(issuer_pem.as_bytes(), "issuer").unwrap().remove(0);
        let serial = cnimesh_identity::tls::serial_of(&der).unwrap();
        for pod in ["web-1", "web-2"] {
            self.mock.get(
                &format!("/api/v1/namespaces/shop/pods/{pod}:4191/proxy/identity.json"),
                json!({"configured": true, "certificate": {"issuer": {"subject": "CN=identity.cnimesh.cluster.local", "serial": serial}}}),
            );
        }
    }

    /// The issuer Secret and the anchors ConfigMap as `cnimesh identity rotate` leaves them.
    fn set_stored_issuer(&mut self, anchors_pem: &str, issuer: &CaPem) {
        let data = &mut self.mock.json_mut(ISSUER_SECRET)["data"];
        data["ca.crt"] = b64(anchors_pem.as_bytes());
        data["tls.crt"] = b64(issuer.cert_pem.as_bytes());
        data["tls.key"] = b64(issuer.key_pem.as_bytes());
        self.mock.json_mut(ANCHORS_CM)["data"]["ca.crt"] = json!(anchors_pem);
    }

    /// Puts a webhook CA, serving certificate and key in the Secret; the caBundle gets
    /// `bundle` (default: the same CA).
    fn set_webhook_pki(&mut self, (ca, crt, key): &(String, String, String), bundle: Option<&str>) {
        self.mock.get(
            WEBHOOK_SECRET,
            json!({"metadata": {"namespace": "cnimesh", "name": "cnimesh-webhook-tls"}, "type": "kubernetes.io/tls",
                   "data": {"ca.crt": b64(ca.as_bytes()), "tls.crt": b64(crt.as_bytes()), "tls.key": b64(key.as_bytes())}}),
        );
        let bundle = b64(bundle.unwrap_or(ca).as_bytes());
        let webhook = |name: &str, path: &str| {
            json!({"name": name, "clientConfig": {"service": {"name": "cnimesh-webhook", "namespace": "cnimesh", "path": path, "port": 443},
                   "caBundle": bundle}, "sideEffects": "None", "admissionReviewVersions": ["v1"]})
        };
        self.mock.get(
            WEBHOOK_CONFIG,
            json!({"metadata": {"name": "cnimesh-proxy-injector"},
                   "webhooks": [webhook("namespace.inject.cnimesh.io", "/inject"), webhook("pod.inject.cnimesh.io", "/inject/opt-in")]}),
        );
        // The control plane reloads the Secret: it serves what the Secret holds.
        let issuer = self.issuer.cert_pem.clone();
        self.set_in_use(&issuer, crt);
    }

    async fn run(&self) -> Vec<Check> {
        run_checks(self.mock.client(), false, self.now).await
    }

    async fn run_pre(&self) -> Vec<Check> {
        run_checks(self.mock.client(), true, self.now).await
    }
}

fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
    checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no check {name:?} in\n{}", render_table(checks)))
}

/// Asserts that exactly the named checks failed, and that the run exits 1.
fn assert_fails(checks: &[Check], names: &[&str]) {
    let failed: Vec<&str> = checks.iter().filter(|c| c.status == Status::Fail).map(|c| c.name.as_str()).collect();
    assert_eq!(failed, names, "\n{}", render_table(checks));
    assert_eq!(exit_code(checks), 1);
    for check in checks.iter().filter(|c| matches!(c.status, Status::Fail | Status::Warn)) {
        assert!(check.hint.is_some(), "{check:?} has no hint");
    }
}

/// Dates follow the wall clock the certificates were made with: the golden files say YYYY-MM-DD.
fn stable(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let date = bytes.len() - i >= 10
            && bytes[i..i + 10]
                .iter()
                .enumerate()
                .all(|(k, b)| if k == 4 || k == 7 { *b == b'-' } else { b.is_ascii_digit() });
        if date {
            out.push_str("YYYY-MM-DD");
            i += 10;
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    let actual = stable(actual);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert!(expected == actual, "{} differs (UPDATE_GOLDEN=1 rewrites it); got:\n{actual}", path.display());
}

#[tokio::test]
async fn a_healthy_cluster_passes_every_check() {
    let fixture = Fixture::healthy();
    let checks = fixture.run().await;
    let not_ok: Vec<&Check> = checks.iter().filter(|c| c.status != Status::Ok).collect();
    assert!(not_ok.is_empty(), "{}", render_table(&checks));
    assert_eq!(exit_code(&checks), 0);
    assert_eq!(
        find(&checks, "meshed pods' proxies hold a certificate").message,
        "2 meshed pods, all ready with certificates"
    );
    assert_eq!(
        find(&checks, "sidecar mode fits the server version").message,
        "auto: native sidecars (Kubernetes 1.33 ≥ 1.29)"
    );
    golden("check-healthy.txt", &render_table(&checks));
}

#[tokio::test]
async fn the_json_report_reads_back_with_the_same_statuses() {
    let mut fixture = Fixture::healthy();
    fixture.mock.json_mut(&status_path("cnimesh-node-aaaaa"))["mount_propagation"] = json!("private");
    let checks = fixture.run().await;
    let report: Report = serde_json::from_str(&render(Output::Json, &checks)).unwrap();
    assert_eq!(report.checks, checks);
    assert!(!report.success);
    let value: Value = serde_json::from_str(&render_json(&checks)).unwrap();
    let mount =
        value["checks"].as_array().unwrap().iter().find(|c| c["name"] == "the host root mount is shared on every node");
    assert_eq!(mount.unwrap()["status"], "fail");
}

#[tokio::test]
async fn a_broken_cluster_names_each_problem() {
    let mut fixture = Fixture::healthy();
    // Warn: the webhook's certificate expires in 30 days.
    fixture.set_webhook_pki(&webhook_pki(30 * DAY), None);
    // Fail: node-1's root mount is private; web-2's rules on node-2 drifted.
    fixture.mock.json_mut(&status_path("cnimesh-node-aaaaa"))["mount_propagation"] = json!("private");
    fixture.mock.json_mut(&status_path("cnimesh-node-bbbbb"))["verify"] = json!([{
        "pod": "shop/web-2", "container_id": "f0e1d2c3b4a596877869", "ok": false,
        "drift": ["chain inbound rule 2: missing `tcp dport 4191 counter return`",
                  "chain outbound rule 1: missing `meta skuid 2102 counter return`",
                  "chain outbound rule 4: unexpected `tcp dport 80 counter accept`",
                  "chain outbound rule 5: missing `tcp redirect to :4140`"]
    }]);
    // Fail: web-2's proxy has no certificate.
    fixture.mock.get_text(&metrics_path("shop", "web-2"), &metrics(None));
    let checks = fixture.run().await;
    assert_fails(
        &checks,
        &[
            "the host root mount is shared on every node",
            "live capture rules match the desired rules",
            "meshed pods' proxies hold a certificate",
        ],
    );
    let drift = find(&checks, "live capture rules match the desired rules");
    assert_eq!(drift.details.len(), 5);
    assert_eq!(drift.details[0], "node-2 shop/web-2 (container f0e1d2c3b4a5) drifted:");
    assert_eq!(drift.details[1], "  chain inbound rule 2: missing `tcp dport 4191 counter return`");
    assert_eq!(drift.details[4], "  … 1 more");
    assert!(drift.hint.as_ref().unwrap().contains("kubectl -n shop delete pod web-2"));
    assert_eq!(find(&checks, "webhook serving certificate is valid").status, Status::Warn);
    golden("check-broken.txt", &render_table(&checks));
}

#[tokio::test]
async fn a_ca_bundle_of_another_ca_fails() {
    let mut fixture = Fixture::healthy();
    let other = webhook_pki(365 * DAY);
    fixture.set_webhook_pki(&webhook_pki(365 * DAY), Some(&other.0));
    let checks = fixture.run().await;
    // What is stored and what is served both fail: the API server refuses what the replica serves.
    assert_fails(&checks, &["the caBundle verifies the serving certificate", super::trust::SERVED]);
    assert_eq!(find(&checks, "the caBundle verifies the serving certificate").details.len(), 2);
}

#[tokio::test]
async fn an_empty_ca_bundle_fails() {
    let mut fixture = Fixture::healthy();
    fixture.mock.json_mut(WEBHOOK_CONFIG)["webhooks"][1]["clientConfig"]["caBundle"] = json!("");
    let checks = fixture.run().await;
    // The API server cannot verify the replica for that webhook either: both lines fail.
    assert_fails(&checks, &["every webhook has a caBundle", super::trust::SERVED]);
    assert_eq!(find(&checks, "every webhook has a caBundle").message, "empty caBundle: pod.inject.cnimesh.io");
}

#[tokio::test]
async fn a_missing_webhook_registration_fails_and_skips_what_depends_on_it() {
    let mut fixture = Fixture::healthy();
    fixture.mock.remove(WEBHOOK_CONFIG);
    let checks = fixture.run().await;
    assert_fails(&checks, &["the proxy injector is registered"]);
    assert_eq!(find(&checks, "the caBundle verifies the serving certificate").status, Status::Skip);
}

#[tokio::test]
async fn a_webhook_certificate_expiring_in_3_days_fails_in_30_days_warns() {
    let mut fixture = Fixture::healthy();
    fixture.set_webhook_pki(&webhook_pki(3 * DAY), None);
    let checks = fixture.run().await;
    assert_fails(&checks, &["webhook serving certificate is valid", "webhook CA is valid"]);
    assert!(find(&checks, "webhook serving certificate is valid").message.ends_with("(in 2 days)"));

    fixture.set_webhook_pki(&webhook_pki(30 * DAY), None);
    let checks = fixture.run().await;
    let warned: Vec<&str> = checks.iter().filter(|c| c.status == Status::Warn).map(|c| c.name.as_str()).collect();
    assert_eq!(warned, ["webhook serving certificate is valid", "webhook CA is valid"]);
    assert_eq!(exit_code(&checks), 0, "warnings alone exit 0");
}

#[tokio::test]
async fn an_expired_webhook_certificate_fails() {
    let mut fixture = Fixture::healthy();
    fixture.now += 400 * DAY;
    fixture.mock.get_text(&metrics_path("shop", "web-1"), &metrics(Some(fixture.secs() + 3600)));
    fixture.mock.get_text(&metrics_path("shop", "web-2"), &metrics(Some(fixture.secs() + 3600)));
    let checks = fixture.run().await;
    assert_fails(
        &checks,
        &[
            "trust anchors are valid",
            "issuer certificate is valid",
            "webhook serving certificate is valid",
            "webhook CA is valid",
        ],
    );
    assert!(find(&checks, "issuer certificate is valid").message.starts_with("expired on "));
}

#[tokio::test]
async fn an_issuer_from_another_anchor_does_not_chain() {
    let mut fixture = Fixture::healthy();
    let stranger = new_trust_anchor("cluster.local", 365 * DAY).unwrap();
    let issuer = new_issuer(&stranger, "cluster.local", 180 * DAY).unwrap();
    fixture.mock.json_mut(ISSUER_SECRET)["data"]["tls.crt"] = b64(issuer.cert_pem.as_bytes());
    let checks = fixture.run().await;
    assert_fails(&checks, &["issuer chains to a trust anchor"]);
}

#[tokio::test]
async fn trust_anchors_in_the_config_map_must_match_the_secret() {
    let mut fixture = Fixture::healthy();
    let next = new_trust_anchor("cluster.local", 730 * DAY).unwrap();
    // Two anchors in the Secret (a rotation under way), one in the ConfigMap.
    let both = format!("{}{}", fixture.anchor.cert_pem, next.cert_pem);
    fixture.mock.json_mut(ISSUER_SECRET)["data"]["ca.crt"] = b64(both.as_bytes());
    let checks = fixture.run().await;
    assert_fails(&checks, &["trust anchors ConfigMap matches the Secret"]);
    assert_eq!(find(&checks, "trust anchors are valid").details.len(), 2);

    fixture.mock.json_mut(ANCHORS_CM)["data"]["ca.crt"] = json!(both);
    let checks = fixture.run().await;
    assert_eq!(exit_code(&checks), 0, "{}", render_table(&checks));
}

#[tokio::test]
async fn a_node_without_an_agent_fails_naming_the_node() {
    let mut fixture = Fixture::healthy();
    let pods = fixture.mock.json_mut(AGENT_PODS);
    pods["items"].as_array_mut().unwrap().remove(1);
    let checks = fixture.run().await;
    assert_fails(&checks, &["a ready agent runs on every node"]);
    assert_eq!(find(&checks, "a ready agent runs on every node").details, ["node-2: no agent pod"]);
    // The other node is still checked.
    assert_eq!(find(&checks, "agents answer on their status endpoint").message, "1 agent answered");
}

#[tokio::test]
async fn an_agent_that_does_not_answer_fails() {
    let mut fixture = Fixture::healthy();
    let error = "error trying to reach service: dial tcp 10.0.0.2:4192: connect: connection refused";
    fixture.mock.fail(&status_path("cnimesh-node-bbbbb"), 503, error);
    let checks = fixture.run().await;
    assert_fails(&checks, &["agents answer on their status endpoint"]);
    assert_eq!(
        find(&checks, "agents answer on their status endpoint").details,
        [format!("node-2 (cnimesh-node-bbbbb): {error} (503 ServiceUnavailable)")]
    );
    // The node that answered is still checked.
    assert_eq!(
        find(&checks, "live capture rules match the desired rules").message,
        "1 captured pod on 1 node verified against their desired rules"
    );
}

#[tokio::test]
async fn a_plugin_not_chained_fails_naming_node_and_conf_dir() {
    let mut fixture = Fixture::healthy();
    fixture.mock.json_mut(&status_path("cnimesh-node-bbbbb"))["status"]["chained_in"] = Value::Null;
    let checks = fixture.run().await;
    assert_fails(&checks, &["the CNI plugin is installed and chained on every node"]);
    assert_eq!(
        find(&checks, "the CNI plugin is installed and chained on every node").details,
        ["node-2: not chained into any config in /host/etc/cni/net.d"]
    );

    let mut fixture = Fixture::healthy();
    fixture.mock.json_mut(&status_path("cnimesh-node-aaaaa"))["status"]["plugin_installed"] = json!(false);
    let checks = fixture.run().await;
    assert_eq!(
        find(&checks, "the CNI plugin is installed and chained on every node").details,
        ["node-1: plugin /host/opt/cni/bin/cnimesh-cni is not installed"]
    );
}

#[tokio::test]
async fn a_private_root_mount_fails_with_the_host_command() {
    let mut fixture = Fixture::healthy();
    fixture.mock.json_mut(&status_path("cnimesh-node-aaaaa"))["mount_propagation"] = json!("private");
    let checks = fixture.run().await;
    assert_fails(&checks, &["the host root mount is shared on every node"]);
    let check = find(&checks, "the host root mount is shared on every node");
    assert_eq!(check.details, ["node-1: mount propagation private"]);
    assert!(check.hint.as_ref().unwrap().contains("mount --make-rshared /"));
}

#[tokio::test]
async fn a_drifted_pod_fails_naming_node_pod_and_drift() {
    let mut fixture = Fixture::healthy();
    fixture.mock.json_mut(&status_path("cnimesh-node-aaaaa"))["verify"] = json!([
        verified("shop/web-1", "a1b2c3d4e5f60718293a"),
        {"pod": "shop/web-3", "container_id": "def", "ok": false, "drift": ["chain inbound rule 2: missing `tcp dport 4191 counter return`"]}
    ]);
    let checks = fixture.run().await;
    assert_fails(&checks, &["live capture rules match the desired rules"]);
    let check = find(&checks, "live capture rules match the desired rules");
    assert_eq!(
        check.details,
        [
            "node-1 shop/web-3 (container def) drifted:",
            "  chain inbound rule 2: missing `tcp dport 4191 counter return`"
        ]
    );
    assert!(check.message.starts_with("1 of 3 captured pods have drifted"), "{}", check.message);
    let hint = check.hint.as_ref().unwrap();
    assert!(hint.contains("cnimesh-node repairs") && hint.contains("kubectl -n shop delete pod web-3"), "{hint}");
}

#[tokio::test]
async fn a_meshed_pod_without_a_certificate_fails() {
    let mut fixture = Fixture::healthy();
    fixture.mock.get_text(&metrics_path("shop", "web-1"), &metrics(None));
    fixture.mock.get_text(&metrics_path("shop", "web-2"), &metrics(Some(0)));
    let checks = fixture.run().await;
    assert_fails(&checks, &["meshed pods' proxies hold a certificate"]);
    assert_eq!(
        find(&checks, "meshed pods' proxies hold a certificate").details,
        [
            "shop/web-1: no identity_cert_expiration_timestamp_seconds in its metrics: no certificate yet",
            "shop/web-2: no certificate (expiry 0)"
        ]
    );
}

#[tokio::test]
async fn many_unready_proxies_are_listed_up_to_a_cap() {
    let mut fixture = Fixture::healthy();
    let pods: Vec<Value> =
        (0..13).map(|i| pod("shop", &format!("api-{i:02}"), "node-1", &["cnimesh-proxy"], &[], false)).collect();
    fixture.mock.get(ALL_PODS, list("PodList", pods));
    let checks = fixture.run().await;
    assert_fails(&checks, &["meshed pods' proxies are ready"]);
    let check = find(&checks, "meshed pods' proxies are ready");
    assert_eq!(check.message, "13 of 13 meshed pods have a proxy that is not ready");
    assert_eq!(check.details.len(), 11);
    assert_eq!(check.details[10], "… and 3 more");
    assert_eq!(find(&checks, "meshed pods' proxies hold a certificate").status, Status::Skip);
}

#[tokio::test]
async fn native_sidecars_on_a_1_24_server_fail() {
    let mut fixture = Fixture::healthy();
    let version = fixture.mock.json_mut(VERSION);
    version["minor"] = json!("24");
    version["gitVersion"] = json!("v1.24.17");
    fixture.mock.json_mut(DEPLOYMENT)["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = json!("true");
    let checks = fixture.run().await;
    assert_fails(&checks, &["sidecar mode fits the server version"]);
    assert_eq!(
        find(&checks, "sidecar mode fits the server version").message,
        "native sidecars need Kubernetes ≥ 1.29 (SidecarContainers); this server is 1.24: set auto or false"
    );

    fixture.mock.json_mut(DEPLOYMENT)["spec"]["template"]["spec"]["containers"][0]["env"] = json!([]);
    let checks = fixture.run().await;
    assert_eq!(exit_code(&checks), 0);
    assert_eq!(
        find(&checks, "sidecar mode fits the server version").message,
        "auto: proxies are regular containers (Kubernetes 1.24 < 1.29)"
    );
}

#[tokio::test]
async fn control_plane_replicas_ready_below_desired_warn_and_none_fail() {
    let mut fixture = Fixture::healthy();
    fixture.mock.json_mut(DEPLOYMENT)["spec"]["replicas"] = json!(2);
    let checks = fixture.run().await;
    assert_eq!(find(&checks, "control plane replicas are ready").status, Status::Warn);
    assert_eq!(exit_code(&checks), 0);

    fixture.mock.json_mut(DEPLOYMENT)["status"]["readyReplicas"] = json!(0);
    fixture.mock.json_mut(CONTROL_PODS)["items"][0]["status"]["conditions"][0]["status"] = json!("False");
    let checks = fixture.run().await;
    assert_fails(&checks, &["control plane replicas are ready", "control plane pods are ready"]);
    assert_eq!(find(&checks, "control plane pods are ready").message, "1 of 1 pods not ready: cnimesh-control-7d9f");
}

#[tokio::test]
async fn missing_permissions_are_named() {
    let mut fixture = Fixture::healthy();
    fixture.mock.denied.insert("get pods/proxy *".into());
    let checks = fixture.run().await;
    assert_fails(&checks, &["can reach pods through the API server proxy"]);
    assert_eq!(
        find(&checks, "can reach pods through the API server proxy").message,
        "not allowed to get pods/proxy cluster-wide"
    );
}

/// A failed read's hint is chosen by the error's type: the grant to add for a refusal, the API
/// server's health for another error, whatever either message says.
#[tokio::test]
async fn a_failed_reads_hint_is_chosen_by_the_errors_type() {
    let mut fixture = Fixture::healthy();
    fixture.mock.fail(DEPLOYMENT, 403, "deployments.apps is forbidden");
    let checks = fixture.run().await;
    let check = checks.iter().find(|c| c.category == Category::ControlPlane && c.status == Status::Fail).unwrap();
    assert_eq!(check.hint.as_deref(), Some("allow reading deployments in the control plane's namespace"), "{check:?}");
    let mut fixture = Fixture::healthy();
    fixture.mock.fail(DEPLOYMENT, 500, "forbidden words in an etcd error");
    let checks = fixture.run().await;
    let check = checks.iter().find(|c| c.category == Category::ControlPlane && c.status == Status::Fail).unwrap();
    assert!(check.hint.as_deref().is_some_and(|h| h.contains("not a permission problem")), "{check:?}");
}

#[tokio::test]
async fn an_unreachable_api_server_is_a_clear_failure() {
    let mut fixture = Fixture::healthy();
    fixture.mock.unreachable = true;
    let checks = fixture.run().await;
    assert_fails(&checks, &["can query the Kubernetes API"]);
    let check = find(&checks, "can query the Kubernetes API");
    assert!(
        check.message.starts_with("the API server did not answer: ") && check.message.contains("connection refused"),
        "{}",
        check.message
    );
    assert!(checks[1..].iter().all(|c| c.status == Status::Skip));
    let pre = fixture.run_pre().await;
    assert_eq!(exit_code(&pre), 1);
}

#[tokio::test]
async fn pre_install_on_a_fresh_cluster_passes() {
    let fixture = Fixture::healthy();
    let checks = fixture.run_pre().await;
    assert!(checks.iter().all(|c| c.status == Status::Ok), "{}", render_table(&checks));
    assert_eq!(checks.len(), 2 + 1 + 7 + 2, "{}", render_table(&checks));
}

#[tokio::test]
async fn pre_install_judges_versions_permissions_nodes_and_an_existing_install() {
    let mut fixture = Fixture::healthy();
    fixture.mock.json_mut(VERSION)["minor"] = json!("27");
    fixture.mock.get(CONTROL_NS, json!({"metadata": {"name": "cnimesh"}}));
    let checks = fixture.run_pre().await;
    let warned: Vec<&str> = checks.iter().filter(|c| c.status == Status::Warn).map(|c| c.name.as_str()).collect();
    assert_eq!(
        warned,
        [
            "is running a supported version",
            "the node agents' tokens are limited to their node",
            "the control plane namespace does not exist yet"
        ]
    );
    assert_eq!(exit_code(&checks), 0);

    fixture.mock.json_mut(VERSION)["minor"] = json!("23");
    fixture.mock.denied.insert("create secrets cnimesh-system".into());
    fixture.mock.get(NODES, list("NodeList", vec![]));
    let checks = fixture.run_pre().await;
    assert_fails(&checks, &["is running a supported version", "can create secrets", "the cluster has nodes"]);
    assert_eq!(
        find(&checks, "can create secrets").message,
        "not allowed to create secrets in namespace cnimesh-system"
    );
}

#[tokio::test]
async fn pre_install_says_which_guard_the_node_agents_get_on_1_24_and_1_30() {
    let name = "the node agents' tokens are limited to their node";
    let mut fixture = Fixture::healthy();
    fixture.mock.json_mut(VERSION)["minor"] = json!("30");
    let checks = fixture.run_pre().await;
    let check = find(&checks, name);
    assert_eq!(check.status, Status::Ok, "{}", render_table(&checks));
    assert!(check.message.contains("adds the ValidatingAdmissionPolicy"), "{}", check.message);

    fixture.mock.json_mut(VERSION)["minor"] = json!("24");
    let checks = fixture.run_pre().await;
    let check = find(&checks, name);
    assert_eq!(check.status, Status::Warn, "{}", render_table(&checks));
    assert!(check.message.contains("Kubernetes 1.24") && check.message.contains("left out"), "{}", check.message);
    assert!(check.message.contains("delete any pod"), "the residual risk: {}", check.message);
    assert_eq!(exit_code(&checks), 0, "a supported cluster: a warning, not a failure");
}

#[test]
fn golden_dates_are_normalised() {
    assert_eq!(stable("expires 2027-11-23 (in 364 days) √"), "expires YYYY-MM-DD (in 364 days) √");
}

/// The webhook Secret and the caBundle were replaced together (a re-run install),
/// the running control plane still serves the old certificate: the stored objects agree, what
/// is served does not, and the API server rejects every pod creation.
#[tokio::test]
async fn a_control_plane_still_serving_the_old_webhook_certificate_under_a_new_ca_bundle_fails() {
    let mut fixture = Fixture::healthy();
    let old_served = fixture.webhook_secret_cert();
    fixture.set_webhook_pki(&webhook_pki(365 * DAY), None);
    let issuer = fixture.issuer.cert_pem.clone();
    fixture.set_in_use(&issuer, &old_served);
    let checks = fixture.run().await;
    assert_fails(&checks, &[super::trust::SERVED]);
    let check = find(&checks, super::trust::SERVED);
    assert!(check.message.contains("certificate signed by unknown authority"), "{}", check.message);
    assert!(check.details[0].starts_with("cnimesh/cnimesh-control-7d9f: serves"), "{:?}", check.details);
    assert!(check.hint.as_ref().unwrap().contains("rollout restart"), "{:?}", check.hint);

    // Once the replica reloads the Secret, the check passes.
    let new_served = fixture.webhook_secret_cert();
    assert_ne!(old_served, new_served);
    let issuer = fixture.issuer.cert_pem.clone();
    fixture.set_in_use(&issuer, &new_served);
    assert_eq!(exit_code(&fixture.run().await), 0);
}

/// The plain install one-liner re-run replaced the anchors and the issuer; the
/// control plane signs with the new issuer, running proxies hold only the old anchor.
#[tokio::test]
async fn anchors_replaced_under_running_proxies_fail_naming_the_proxies() {
    let mut fixture = Fixture::healthy();
    let anchor = new_trust_anchor("cluster.local", 365 * DAY).unwrap();
    let issuer = new_issuer(&anchor, "cluster.local", 180 * DAY).unwrap();
    fixture.set_stored_issuer(&anchor.cert_pem, &issuer);
    let served = fixture.webhook_secret_cert();
    fixture.set_in_use(&issuer.cert_pem, &served);
    let checks = fixture.run().await;
    assert_fails(&checks, &[super::trust::ISSUER_TRUSTED]);
    let check = find(&checks, super::trust::ISSUER_TRUSTED);
    assert!(check.message.starts_with("2 proxies do not trust the issuer in use"), "{}", check.message);
    assert!(check.details.iter().any(|d| d.starts_with("shop/web-1: holds 1 anchor")), "{:?}", check.details);
    assert!(check.hint.as_ref().unwrap().contains("cnimesh identity rotate bundle"), "{:?}", check.hint);
}

fn rotation(checks: &[Check]) -> Check {
    find(checks, super::trust::ROTATION).clone()
}

/// `check` follows a rotation step by step: which step is done, and what is still missing.
#[tokio::test]
async fn check_reports_each_step_of_a_rotation() {
    let mut fixture = Fixture::healthy();
    assert_eq!(rotation(&fixture.run().await).message, "no rotation in progress: 1 trust anchor");

    let (old_anchor, old_issuer) = (fixture.anchor.clone(), fixture.issuer.clone());
    let anchor = new_trust_anchor("cluster.local", 365 * DAY).unwrap();
    let issuer = new_issuer(&anchor, "cluster.local", 180 * DAY).unwrap();
    let bundle = format!("{}{}", old_anchor.cert_pem, anchor.cert_pem);
    fixture.set_stored_issuer(&bundle, &old_issuer);
    let check = rotation(&fixture.run().await);
    assert_eq!(
        (check.status, check.message.as_str()),
        (Status::Warn, "step 1 of 3 (bundle): 2 proxies still without the new anchor")
    );

    fixture.set_proxies(&bundle, "ghcr.io/cnimesh/cnimesh-proxy:0.1.0");
    let checks = fixture.run().await;
    assert!(rotation(&checks).message.starts_with("step 1 of 3 (bundle) done"), "{}", rotation(&checks).message);
    assert_eq!(exit_code(&checks), 0, "{}", render_table(&checks));

    fixture.set_stored_issuer(&bundle, &issuer);
    let served = fixture.webhook_secret_cert();
    fixture.set_in_use(&issuer.cert_pem, &served);
    let check = rotation(&fixture.run().await);
    assert_eq!(check.message, "step 2 of 3 (switch-issuer): 2 proxies not renewed under the new issuer yet");
    assert_eq!(
        check.details,
        ["shop/web-1: certificate from the previous issuer", "shop/web-2: certificate from the previous issuer"]
    );

    fixture.set_proxy_issuer(&issuer.cert_pem);
    let checks = fixture.run().await;
    assert!(rotation(&checks).message.starts_with("step 2 of 3 (switch-issuer) done"), "{}", rotation(&checks).message);
    assert_eq!(exit_code(&checks), 0);

    fixture.set_stored_issuer(&anchor.cert_pem, &issuer);
    let checks = fixture.run().await;
    assert_eq!(rotation(&checks).message, "no rotation in progress: 1 trust anchor");
    assert_eq!(exit_code(&checks), 0, "proxies holding the bundle trust the new issuer: {}", render_table(&checks));
}

#[tokio::test]
async fn proxies_of_another_version_than_the_control_plane_are_listed() {
    let mut fixture = Fixture::healthy();
    let pem = fixture.anchor.cert_pem.clone();
    fixture.set_proxies(&pem, "ghcr.io/cnimesh/cnimesh-proxy:0.0.9");
    let checks = fixture.run().await;
    let check = find(&checks, super::trust::VERSIONS);
    assert_eq!(check.status, Status::Warn);
    assert_eq!(check.message, "2 proxies run a version other than the control plane's 0.1.0");
    assert_eq!(check.details, ["shop/web-1: 0.0.9", "shop/web-2: 0.0.9"]);
    assert_eq!(exit_code(&checks), 0, "the previous release's proxies are supported: a warning");
}

#[test]
fn counts_read_as_english_for_nouns_ending_in_y() {
    use super::report::plural;
    assert_eq!(plural(1, "proxy"), "1 proxy");
    assert_eq!(plural(2, "proxy"), "2 proxies");
    assert_eq!(plural(3, "day"), "3 days");
    assert_eq!(plural(2, "pod"), "2 pods");
}

fn trust_json_of(pod: &str) -> String {
    format!("/api/v1/namespaces/cnimesh/pods/{pod}:9990/proxy/trust.json")
}

/// A rollout's old replica: terminating (a `deletionTimestamp`), no longer answering.
fn add_control_pod(fixture: &mut Fixture, name: &str, ready: bool, terminating: bool) {
    let mut old = pod("cnimesh", name, "node-2", &["cnimesh-control"], &[], ready);
    if terminating {
        old["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    fixture.mock.json_mut(CONTROL_PODS)["items"].as_array_mut().unwrap().push(old);
}

#[tokio::test]
async fn terminating_control_plane_pods_are_a_rollout_not_a_failure_and_their_webhook_is_not_asked() {
    // Healthy: the old replica terminates (ready or not) and answers nothing; the new one serves.
    for ready in [true, false] {
        let mut fixture = Fixture::healthy();
        add_control_pod(&mut fixture, "cnimesh-control-old1", ready, true);
        let checks = fixture.run().await;
        let pods = find(&checks, "control plane pods are ready");
        assert_eq!(pods.status, Status::Warn, "{}", render_table(&checks));
        assert!(pods.message.starts_with("rolling out: 1 pod ready, 1 terminating"), "{}", pods.message);
        assert_eq!(find(&checks, super::trust::SERVED).status, Status::Ok, "{}", render_table(&checks));
        assert_eq!(exit_code(&checks), 0, "`rollout status && cnimesh check` passes: {}", render_table(&checks));
    }

    // Broken: the same pod, not terminating and not ready, outside a rollout: a failure.
    let mut fixture = Fixture::healthy();
    add_control_pod(&mut fixture, "cnimesh-control-old1", false, false);
    let checks = fixture.run().await;
    assert_fails(&checks, &["control plane pods are ready"]);

    // During a rollout (the surge pod is not ready yet), not yet ready is a warning.
    fixture.mock.json_mut(DEPLOYMENT)["status"]["updatedReplicas"] = json!(0);
    let checks = fixture.run().await;
    let pods = find(&checks, "control plane pods are ready");
    assert_eq!(pods.status, Status::Warn, "{}", render_table(&checks));
    assert!(pods.message.starts_with("rolling out: 1 of 2 pods ready"), "{}", pods.message);
}

#[tokio::test]
async fn a_replica_that_does_not_answer_is_named_as_such_never_as_an_x509_failure() {
    // One of two ready replicas refuses: a warning naming the refusal, the other one serves.
    let mut fixture = Fixture::healthy();
    add_control_pod(&mut fixture, "cnimesh-control-b2", true, false);
    fixture.mock.get(
        &trust_json_of("cnimesh-control-b2"),
        json!({"webhook": {"enabled": true, "error": "connection refused"}}),
    );
    let checks = fixture.run().await;
    let served = find(&checks, super::trust::SERVED);
    assert_eq!(served.status, Status::Warn, "{}", render_table(&checks));
    assert!(served.message.contains("did not answer (not a certificate problem)"), "{}", served.message);
    assert!(served.details[0].contains("connection refused"), "{:?}", served.details);
    assert!(!served.message.contains("x509"), "{}", served.message);

    // The only replica refuses: a failure that says so, not x509.
    let mut fixture = Fixture::healthy();
    fixture.mock.get(TRUST_JSON, json!({"webhook": {"enabled": true, "error": "connection refused"}}));
    let checks = fixture.run().await;
    let served = find(&checks, super::trust::SERVED);
    assert_eq!(served.status, Status::Fail, "{}", render_table(&checks));
    assert!(served.message.contains("connection refused") && !served.message.contains("x509"), "{}", served.message);
}

#[tokio::test]
async fn a_wrong_webhook_secret_fails_both_webhook_lines_while_one_replica_still_serves_the_old_certificate() {
    let mut fixture = Fixture::healthy();
    let old_served = fixture.webhook_secret_cert();
    add_control_pod(&mut fixture, "cnimesh-control-b2", true, false);
    let issuer = fixture.issuer.cert_pem.clone();
    let der = |pem: &str| -> Vec<Value> {
        cnimesh_identity::pem::certs(pem.as_bytes(), "pem").unwrap().iter().map(|c| b64(c)).collect()
    };
    // The Secret is replaced by one of another CA; the caBundle stays. The first replica reloads
    // it, the second still serves the old certificate, which the caBundle verifies.
    let bundle = String::from_utf8(
        base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            fixture.mock.json_mut(WEBHOOK_CONFIG)["webhooks"][0]["clientConfig"]["caBundle"].as_str().unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    fixture.set_webhook_pki(&webhook_pki(365 * DAY), Some(&bundle));
    fixture.mock.get(
        &trust_json_of("cnimesh-control-b2"),
        json!({"issuer": {"chain": der(&issuer), "anchors_pem": ""}, "webhook": {"enabled": true, "served": der(&old_served)}}),
    );
    let checks = fixture.run().await;
    assert_fails(&checks, &["the caBundle verifies the serving certificate", super::trust::SERVED]);
    let served = find(&checks, super::trust::SERVED);
    assert!(served.message.contains("some replicas"), "{}", served.message);
    assert!(served.details.iter().any(|d| d.contains("the Secret's certificate")), "{:?}", served.details);
}

#[tokio::test]
async fn a_managed_webhook_certificate_warns_only_once_its_renewal_is_overdue_with_a_hint_for_its_mode() {
    let name = "webhook serving certificate is valid";
    let mut fixture = Fixture::healthy();
    fixture.set_webhook_pki(&webhook_pki(30 * DAY), None);
    // Files mode: 30 days left is under the 60-day threshold, and renewing is the operator's job.
    let checks = fixture.run().await;
    let check = find(&checks, name);
    assert_eq!(check.status, Status::Warn);
    assert!(check.hint.as_deref().unwrap().contains("cnimesh upgrade --renew-webhook-certificate"), "{:?}", check.hint);

    // Managed: the control plane renews a 30-day certificate at 20 days; fresh, it is healthy.
    let env = &mut fixture.mock.json_mut(DEPLOYMENT)["spec"]["template"]["spec"]["containers"][0]["env"];
    env.as_array_mut().unwrap().push(json!({"name": "CNIMESH_CONTROL_WEBHOOK_CERTS", "value": "managed"}));
    let checks = fixture.run().await;
    let check = find(&checks, name);
    assert_eq!(check.status, Status::Ok, "{}", check.message);
    assert!(check.message.contains("renews it at 2/3 of its life"), "{}", check.message);

    // Broken: 22 days in, the renewal is two days overdue: a warning naming the Lease to look at.
    fixture.now += 21 * DAY;
    let checks = fixture.run().await;
    let check = find(&checks, name);
    assert_eq!(check.status, Status::Warn, "{}", check.message);
    assert!(check.message.contains("is overdue"), "{}", check.message);
    assert!(check.hint.as_deref().unwrap().contains("cnimesh-control-webhook-write"), "{:?}", check.hint);

    // cert-manager's Secret mode: the hint sends the operator to the Certificate.
    let env = &mut fixture.mock.json_mut(DEPLOYMENT)["spec"]["template"]["spec"]["containers"][0]["env"];
    env.as_array_mut().unwrap().last_mut().unwrap()["value"] = json!("secret");
    let checks = fixture.run().await;
    assert!(find(&checks, name).hint.as_deref().unwrap().contains("describe certificate"));
}

#[test]
fn every_category_renders_to_the_text_operators_and_scripts_match_on() {
    let names: Vec<String> = Category::FIXED.iter().map(Category::to_string).collect();
    assert_eq!(
        names,
        [
            "kubernetes-api",
            "kubernetes-version",
            "permissions",
            "pre-install",
            "control-plane",
            "webhook",
            "certificates",
            "node-agents",
            "meshed-pods",
            "multicluster",
        ]
    );
    assert_eq!(Category::Link("west".to_string()).to_string(), "link west");
}

#[test]
fn a_category_is_a_plain_string_in_json_and_reads_back() {
    let mut all = Category::FIXED.to_vec();
    all.push(Category::Link("east-1".to_string()));
    for category in all {
        let json = serde_json::to_value(&category).unwrap();
        assert_eq!(json, Value::String(category.to_string()));
        assert_eq!(serde_json::from_value::<Category>(json).unwrap(), category);
    }
    let unknown = serde_json::from_value::<Category>(json!("gateways")).unwrap_err();
    assert!(unknown.to_string().contains("unknown check category \"gateways\""), "{unknown}");
}
