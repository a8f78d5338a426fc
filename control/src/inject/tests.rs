//! Admission reviews in, JSON patches out, applied to real pod objects; the patched pods are read
//! back as typed `Pod`s and checked field by field. Plus the HTTPS endpoint end to end.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde_json::{Value, json};

use super::*;
use cnimesh_model::inject::*;

const UID: &str = "705ab4f5-6393-11e8-b7cc-42010a800002";

/// The default configuration with the anchors a running webhook has from its issuer.
fn config() -> InjectConfig {
    static ANCHORS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let anchors = ANCHORS.get_or_init(|| {
        cnimesh_identity::ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap().cert_pem
    });
    InjectConfig { trust_anchors_pem: anchors.clone(), ..Default::default() }
}

/// A serialised review's response, with its `patch` decoded from base64 by coreutils'
/// `base64 -d`: an independent decoder, not the encoder's own library.
fn decode_response(out: &[u8]) -> (Value, Option<json_patch::Patch>) {
    let review: Value = serde_json::from_slice(out).unwrap();
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    let response = review["response"].clone();
    let patch = response.get("patch").map(|p| {
        let text = p.as_str().unwrap_or_else(|| panic!("admission.k8s.io/v1 patch is base64 bytes, got {p}"));
        let mut child = std::process::Command::new("base64")
            .arg("-d")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("coreutils base64");
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
        let decoded = child.wait_with_output().unwrap();
        assert!(decoded.status.success(), "base64 -d rejected {text:?}");
        serde_json::from_slice(&decoded.stdout).expect("the decoded patch is a JSON patch")
    });
    (response, patch)
}

fn review(pod: &Value, namespace: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": UID,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod.pointer("/metadata/name").cloned().unwrap_or(json!("")),
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller", "groups": ["system:serviceaccounts"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

fn request(review: &Value) -> AdmissionRequest<DynamicObject> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(review.clone()).expect("a valid review");
    review.try_into().expect("has a request")
}

/// The pod after the API server applied the response's patch (the pod itself if none).
fn apply(pod: &Value, response: &AdmissionResponse) -> Value {
    assert!(response.allowed, "never denies: {response:?}");
    let mut patched = pod.clone();
    if let Some(patch) = &response.patch {
        let patch: json_patch::Patch = serde_json::from_slice(patch).expect("a JSON patch");
        json_patch::patch(&mut patched, &patch).unwrap_or_else(|e| panic!("patch does not apply: {e}\n{patch:?}"));
    }
    patched
}

/// Runs the webhook on `pod` in `namespace`; returns the response and the patched pod.
fn run(pod: &Value, namespace: &str, ns: NamespaceInjection, config: &InjectConfig) -> (AdmissionResponse, Value) {
    let response = mutate(&request(&review(pod, namespace)), ns, &NamespaceDefault::NotLooked, config);
    assert_eq!(response.uid, UID);
    let patched = apply(pod, &response);
    (response, patched)
}

fn typed(pod: &Value) -> Pod {
    serde_json::from_value(pod.clone()).expect("the patched pod is a valid Pod")
}

fn deployment_pod() -> Value {
    // What a ReplicaSet controller sends: no name, no namespace, no volumes, no init containers.
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "web-7d4b9c-", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}]}
    })
}

fn pod_with(extra: Value) -> Value {
    let mut pod = deployment_pod();
    merge(&mut pod, extra);
    pod
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

fn warnings(response: &AdmissionResponse) -> String {
    response.warnings.clone().unwrap_or_default().join("\n")
}

fn unchanged(pod: &Value, namespace: &str, ns: NamespaceInjection, config: &InjectConfig) -> AdmissionResponse {
    let (response, patched) = run(pod, namespace, ns, config);
    assert!(response.patch.is_none(), "no patch expected: {response:?}");
    assert_eq!(&patched, pod);
    response
}

/// The proxy's source: every variable we set must be one it reads.
fn proxy_config_source() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proxy/src/app/config.rs");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn env<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.as_deref())
}

/// Everything an injected proxy must have, whatever the mode.
fn check_proxy(c: &Container, identity: &str, config: &InjectConfig) {
    assert_eq!(c.name, PROXY_CONTAINER);
    assert_eq!(c.image.as_deref(), Some(config.proxy_image.as_str()));
    let sc = c.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.run_as_user, Some(2102));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.privileged, None);
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert!(caps.add.is_none(), "adds no capability: {caps:?}");

    let source = proxy_config_source();
    for e in c.env.iter().flatten() {
        // The downward-API inputs of CNIMESH_PROXY_POLICY_WORKLOAD, expanded by the kubelet.
        if e.value_from.is_some() {
            assert!(["CNIMESH_POD_NAMESPACE", "CNIMESH_POD_NAME"].contains(&e.name.as_str()), "{}", e.name);
            continue;
        }
        assert!(e.name.starts_with("CNIMESH_PROXY_"), "{} is not a proxy variable", e.name);
        // The proxy's clap arguments name their variables in full (`env = "CNIMESH_PROXY_…"`).
        assert!(source.contains(&format!("\"{}\"", e.name)), "{} is not read by proxy/src/app/config.rs", e.name);
        assert!(e.value_from.is_none());
    }
    assert_eq!(env(c, "CNIMESH_PROXY_IDENTITY_NAME"), Some(identity));
    assert_eq!(env(c, TRUST_ANCHORS_ENV), Some(config.trust_anchors_pem.as_str()), "the anchors travel as PEM");
    assert_eq!(env(c, "CNIMESH_PROXY_IDENTITY_TOKEN_FILE"), Some(TOKEN_FILE));
    let control = "cnimesh-control.cnimesh.svc.cluster.local:4190";
    assert_eq!(env(c, "CNIMESH_PROXY_IDENTITY_ADDR"), Some(control));
    assert_eq!(env(c, "CNIMESH_PROXY_DESTINATION_ADDR"), Some(control));
    assert_eq!(env(c, "CNIMESH_PROXY_POLICY_WORKLOAD"), Some("$(CNIMESH_POD_NAMESPACE):$(CNIMESH_POD_NAME)"));
    assert_eq!(
        env(c, "CNIMESH_PROXY_IDENTITY_SVC_NAME"),
        Some("cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local")
    );

    let http = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        let get = p.as_ref().and_then(|p| p.http_get.as_ref()).expect("an HTTP probe");
        (get.path.clone().unwrap_or_default(), get.port.clone())
    };
    assert_eq!(http(&c.readiness_probe), ("/ready".into(), IntOrString::Int(4191)));
    assert_eq!(http(&c.liveness_probe), ("/live".into(), IntOrString::Int(4191)));

    let mounts: Vec<(&str, &str, Option<bool>)> =
        c.volume_mounts.iter().flatten().map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only)).collect();
    assert_eq!(
        mounts,
        [
            ("cnimesh-identity-token", "/var/run/secrets/tokens", Some(true)),
            ("cnimesh-trust-bundle", "/var/run/cnimesh/trust-bundle", Some(true))
        ]
    );
    assert_eq!(env(c, TRUST_ANCHORS_FILE_ENV), Some("/var/run/cnimesh/trust-bundle/ca.crt"));
    assert_eq!(
        env(c, TRUST_ANCHORS_ENDORSED_BY_ENV),
        Some("cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local"),
        "the namespace's bundle is taken only with the control plane's endorsement"
    );
    let since: u64 = env(c, TRUST_ANCHORS_ENDORSED_SINCE_ENV).expect("since").parse().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(since < now, "bundles endorsed before admission are passed over: {since}");
    let resources = c.resources.as_ref().expect("resources");
    let requests = resources.requests.as_ref().expect("requests");
    assert_eq!(requests["cpu"].0, "20m");
    assert_eq!(requests["memory"].0, "32Mi");
    let limits = resources.limits.as_ref().expect("limits");
    assert_eq!(limits["memory"].0, "256Mi");
    assert!(!limits.contains_key("cpu"), "no CPU limit by default");
}

/// The pod-level view: volumes, annotation, and no capture machinery anywhere.
fn check_pod(pod: &Pod, config: &InjectConfig) {
    let spec = pod.spec.as_ref().unwrap();
    let token = spec.volumes.iter().flatten().find(|v| v.name == "cnimesh-identity-token").expect("token volume");
    let sources = token.projected.as_ref().and_then(|p| p.sources.as_ref()).expect("projected");
    assert_eq!(sources.len(), 1);
    let sat = sources[0].service_account_token.as_ref().expect("a service account token");
    assert_eq!(sat.audience.as_deref(), Some("identity.cnimesh.io"));
    assert_eq!(sat.expiration_seconds, Some(86400));
    assert_eq!(format!("/var/run/secrets/tokens/{}", sat.path), TOKEN_FILE);
    // The namespace's trust bundle, optional: a namespace it has not reached yet still starts
    // pods, their proxies on the anchors from the environment.
    let bundles: Vec<_> =
        spec.volumes.iter().flatten().filter_map(|v| v.config_map.as_ref().map(|c| (&v.name, c))).collect();
    assert_eq!(bundles.len(), 1, "{bundles:?}");
    assert_eq!((bundles[0].0.as_str(), bundles[0].1.name.as_str()), ("cnimesh-trust-bundle", "cnimesh-trust-bundle"));
    assert_eq!(bundles[0].1.optional, Some(true));
    let proxy = spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == PROXY_CONTAINER);
    assert!(env(proxy.unwrap(), TRUST_ANCHORS_ENV).is_some_and(|pem| pem == config.trust_anchors_pem));
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get(INJECTED_ANNOTATION).map(String::as_str), Some(env!("CARGO_PKG_VERSION")));

    // Capture is the CNI plugin's: no NET_ADMIN / NET_RAW / privileged anywhere, no other container added.
    let everything = serde_json::to_string(pod).unwrap();
    for forbidden in ["NET_ADMIN", "NET_RAW", "\"privileged\":true", "iptables"] {
        assert!(!everything.contains(forbidden), "{forbidden} in the injected pod: {everything}");
    }
    let proxies = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    assert_eq!(proxies.filter(|c| c.name.starts_with("cnimesh")).count(), 1, "exactly one cnimesh container");
}

#[test]
fn the_proxy_token_file_is_the_one_the_proxy_reads_by_default() {
    let source = proxy_config_source();
    assert!(
        source.contains(&format!("pub const DEFAULT_TOKEN_FILE: &str = \"{TOKEN_FILE}\";")),
        "DEFAULT_TOKEN_FILE moved"
    );
}

#[test]
fn a_deployment_template_pod_gets_a_native_sidecar_first() {
    let config = config();
    let pod = deployment_pod();
    let (response, patched) = run(&pod, "shop", NamespaceInjection::Enabled, &config);
    assert!(response.warnings.is_none(), "{response:?}");
    let typed = typed(&patched);
    assert_eq!(typed.metadata.namespace, None, "the pod's own metadata is left alone");
    let spec = typed.spec.as_ref().unwrap();
    let init = spec.init_containers.as_ref().expect("initContainers created");
    assert_eq!(init.len(), 1, "only the proxy; no iptables init container");
    let proxy = &init[0];
    check_proxy(proxy, "default.shop.serviceaccount.identity.cnimesh.cluster.local", &config);
    assert_eq!(proxy.restart_policy.as_deref(), Some("Always"), "a native sidecar");
    let startup = proxy.startup_probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("startup probe");
    assert_eq!((startup.path.as_deref(), &startup.port), (Some("/ready"), &IntOrString::Int(4191)));
    assert_eq!(env(proxy, "CNIMESH_PROXY_LOG"), Some("info"));
    assert_eq!(env(proxy, "CNIMESH_PROXY_OPAQUE_PORTS"), None, "the proxy's defaults");
    assert_eq!(spec.containers.len(), 1);
    assert_eq!(spec.containers[0], serde_json::from_value(pod["spec"]["containers"][0].clone()).unwrap());
    assert_eq!(spec.volumes.as_ref().map(Vec::len), Some(2), "the token and trust bundle volumes created");
    check_pod(&typed, &config);
}

#[test]
fn existing_init_containers_volumes_and_annotations_are_kept_and_the_proxy_goes_first() {
    let config = config();
    let pod = pod_with(json!({
        "metadata": {"name": "web-0", "namespace": "shop", "annotations": {
            "config.cnimesh.io/skip-inbound-ports": "9000", "example.com/keep": "me"}},
        "spec": {
            "serviceAccountName": "web",
            "initContainers": [{"name": "migrate", "image": "migrate:1"}, {"name": "warm", "image": "warm:1"}],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{"name": "web", "image": "nginx", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]
        }
    }));
    let (_, patched) = run(&pod, "shop", NamespaceInjection::Enabled, &config);
    let typed = typed(&patched);
    let spec = typed.spec.as_ref().unwrap();
    let init: Vec<&str> = spec.init_containers.iter().flatten().map(|c| c.name.as_str()).collect();
    assert_eq!(init, [PROXY_CONTAINER, "migrate", "warm"]);
    check_proxy(
        &spec.init_containers.as_ref().unwrap()[0],
        "web.shop.serviceaccount.identity.cnimesh.cluster.local",
        &config,
    );
    let volumes: Vec<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
    assert_eq!(volumes, ["data", "cnimesh-identity-token", "cnimesh-trust-bundle"]);
    let annotations = typed.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations["config.cnimesh.io/skip-inbound-ports"], "9000",
        "the node agent's annotations pass through"
    );
    assert_eq!(annotations["example.com/keep"], "me");
    check_pod(&typed, &config);
}

/// What `cnimesh stat`, the scrape config and the dashboards aggregate by: the owner, with a
/// Deployment's ReplicaSet resolved by its pods' `pod-template-hash`, and the namespace.
#[test]
fn meshed_pods_get_their_owner_and_namespace_as_labels() {
    let config = config();
    let owned = |kind: &str, name: &str, labels: Value| {
        pod_with(json!({"metadata": {"labels": labels, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u1", "controller": true}
        ]}}))
    };
    let labels_of = |pod: &Value| {
        let (response, patched) = run(pod, "shop", NamespaceInjection::Enabled, &config);
        assert!(response.warnings.is_none(), "{response:?}");
        typed(&patched).metadata.labels.unwrap_or_default()
    };
    let labels = labels_of(&owned("ReplicaSet", "web-7d4b9c", json!({"app": "web", "pod-template-hash": "7d4b9c"})));
    assert_eq!(labels["cnimesh.io/proxy-deployment"], "web");
    assert_eq!(labels["cnimesh.io/workload-ns"], "shop");
    assert_eq!(labels["app"], "web", "the pod's own labels stay");
    let labels = labels_of(&owned("StatefulSet", "db", json!({"app": "db"})));
    assert_eq!(labels["cnimesh.io/proxy-statefulset"], "db");
    // No labels at all yet: the map is created.
    let mut bare = owned("DaemonSet", "agent", Value::Null);
    bare["metadata"].as_object_mut().unwrap().remove("labels");
    let labels = labels_of(&bare);
    assert_eq!(labels["cnimesh.io/proxy-daemonset"], "agent");
    assert_eq!(labels.len(), 2, "{labels:?}");
    // A pod nobody owns still gets its namespace.
    assert_eq!(labels_of(&deployment_pod()).get("cnimesh.io/workload-ns").map(String::as_str), Some("shop"));
}

#[test]
fn null_volumes_and_annotations_are_created_rather_than_appended_to() {
    let config = config();
    let pod = pod_with(json!({"metadata": {"annotations": null}, "spec": {"volumes": null, "initContainers": null}}));
    let (_, patched) = run(&pod, "shop", NamespaceInjection::Enabled, &config);
    check_pod(&typed(&patched), &config);
}

#[test]
fn classic_mode_adds_the_first_regular_container() {
    let config = InjectConfig { native_sidecars: false, ..config() };
    let pod = pod_with(json!({"spec": {"initContainers": [{"name": "migrate", "image": "migrate:1"}]}}));
    let (_, patched) = run(&pod, "shop", NamespaceInjection::Enabled, &config);
    let typed = typed(&patched);
    let spec = typed.spec.as_ref().unwrap();
    let containers: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(containers, [PROXY_CONTAINER, "web"]);
    let proxy = &spec.containers[0];
    check_proxy(proxy, "default.shop.serviceaccount.identity.cnimesh.cluster.local", &config);
    assert_eq!(proxy.restart_policy, None, "regular containers cannot have a restart policy");
    assert!(proxy.startup_probe.is_none());
    let init: Vec<&str> = spec.init_containers.iter().flatten().map(|c| c.name.as_str()).collect();
    assert_eq!(init, ["migrate"], "init containers untouched");
    check_pod(&typed, &config);
}

#[test]
fn annotations_override_opaque_ports_and_log_level() {
    let config = config();
    let pod = pod_with(json!({"metadata": {"annotations": {
        "config.cnimesh.io/opaque-ports": " 5432, 7000,",
        "config.cnimesh.io/proxy-log-level": "warn,cnimesh_proxy=debug"}}}));
    let (_, patched) = run(&pod, "shop", NamespaceInjection::Enabled, &config);
    let typed = typed(&patched);
    let proxy = &typed.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
    assert_eq!(env(proxy, "CNIMESH_PROXY_OPAQUE_PORTS"), Some("5432,7000"));
    assert_eq!(env(proxy, "CNIMESH_PROXY_LOG"), Some("warn,cnimesh_proxy=debug"));
}

/// Asserts that the webhook refused `pod` (no patch, not allowed) and returns the reason.
fn refused(pod: &Value, namespace: &str, ns: NamespaceInjection, config: &InjectConfig) -> String {
    let response = mutate(&request(&review(pod, namespace)), ns, &NamespaceDefault::NotLooked, config);
    assert!(!response.allowed && response.patch.is_none(), "refused expected: {response:?}");
    let message = response.result.message.clone();
    assert!(message.starts_with("cnimesh: cnimesh-proxy cannot be injected: "), "{message}");
    message
}

#[test]
fn a_bad_opaque_ports_or_inject_annotation_refuses_the_pod_with_the_reason() {
    let config = config();
    let cases = [
        ("config.cnimesh.io/opaque-ports", "5432,http", "opaque-ports"),
        ("config.cnimesh.io/opaque-ports", "70000", "opaque-ports"),
        ("config.cnimesh.io/opaque-ports", " , ", "opaque-ports"),
        ("cnimesh.io/inject", "true", "neither enabled, ingress nor disabled"),
    ];
    for (key, value, expected) in cases {
        let pod = pod_with(json!({"metadata": {"annotations": {key: value}}}));
        let message = refused(&pod, "shop", NamespaceInjection::Enabled, &config);
        assert!(message.contains(expected), "{key}={value:?}: {message}");
    }
    // A misspelt inject annotation is refused even where the namespace does not mesh pods: it
    // may have meant `enabled`.
    let pod = pod_with(json!({"metadata": {"annotations": {"cnimesh.io/inject": "true"}}}));
    refused(&pod, "shop", NamespaceInjection::NotEnabled, &config);
}

#[test]
fn a_bad_log_level_annotation_meshes_the_pod_at_the_default_level_with_a_warning() {
    let config = config();
    let pod = pod_with(json!({"metadata": {"annotations": {"config.cnimesh.io/proxy-log-level": "debug\nEVIL=1"}}}));
    let (response, proxy) = injected(&pod, &NamespaceDefault::NotLooked, &config);
    assert_eq!(
        env(&proxy, "CNIMESH_PROXY_LOG"),
        Some(config.log_level.as_str()),
        "the bad filter never reaches the proxy"
    );
    let w = warnings(&response);
    assert!(w.contains("config.cnimesh.io/proxy-log-level") && w.contains("ignored, the proxy logs at"), "{w}");
}

/// The attack: a typo in any of the pod's mesh annotations, or a
/// clash the owner can fix, in a meshed namespace used to admit the pod without its proxy, with
/// a warning that nobody reads for a Deployment's pods. Whatever the annotation says, a pod
/// that asked for the mesh is either meshed or refused; it never starts unmeshed.
#[tokio::test]
async fn a_pod_that_asked_for_the_mesh_is_never_admitted_without_its_proxy() {
    let webhook = Webhook::new(traced_config(Some("collector:4317"), None)).unwrap();
    let cases = [
        json!({"metadata": {"annotations": {"config.cnimesh.io/opaque-ports": "5432,http"}}}),
        json!({"metadata": {"annotations": {"config.cnimesh.io/proxy-log-level": "debug\nEVIL=1"}}}),
        json!({"metadata": {"annotations": {"config.cnimesh.io/trace-collector": "grpc://collector:4317"}}}),
        json!({"metadata": {"annotations": {"config.cnimesh.io/trace-sampling": "10%"}}}),
        json!({"metadata": {"annotations": {"cnimesh.io/inject": "yes"}}}),
        json!({"spec": {"securityContext": {"runAsUser": 2102}}}),
        json!({"spec": {"volumes": [{"name": "cnimesh-identity-token", "emptyDir": {}}]}}),
        json!({"spec": {"serviceAccountName": "a.b"}}),
    ];
    for extra in cases {
        let pod = pod_with(extra.clone());
        let body = serde_json::to_vec(&review(&pod, "shop")).unwrap();
        let (response, patch) = decode_response(&webhook.review(INJECT_PATH, &body).unwrap());
        let meshed = patch.is_some_and(|patch| {
            let mut patched = pod.clone();
            json_patch::patch(&mut patched, &patch).unwrap();
            typed(&patched).spec.unwrap().init_containers.iter().flatten().any(|c| c.name == "cnimesh-proxy")
        });
        let refused = response["allowed"] == json!(false);
        assert!(meshed || refused, "admitted unmeshed: {extra}: {response}");
    }
}

#[test]
fn who_is_injected_namespace_label_and_pod_annotation() {
    let config = config();
    let enabled = pod_with(json!({"metadata": {"annotations": {"cnimesh.io/inject": "enabled"}}}));
    let disabled = pod_with(json!({"metadata": {"annotations": {"cnimesh.io/inject": "disabled"}}}));
    // disabled on the pod wins over the namespace label, quietly.
    let response = unchanged(&disabled, "shop", NamespaceInjection::Enabled, &config);
    assert!(response.warnings.is_none());
    // An unlabelled namespace: only pods that opt in.
    let response = unchanged(&deployment_pod(), "shop", NamespaceInjection::NotEnabled, &config);
    assert!(response.warnings.is_none());
    let (_, patched) = run(&enabled, "shop", NamespaceInjection::NotEnabled, &config);
    check_pod(&typed(&patched), &config);
    // Labels, for callers that have them.
    let labels = [("cnimesh.io/inject".to_string(), "enabled".to_string())].into();
    assert_eq!(NamespaceInjection::from_labels(&labels), NamespaceInjection::Enabled);
    assert_eq!(NamespaceInjection::from_labels(&Default::default()), NamespaceInjection::NotEnabled);
}

#[test]
fn a_second_pass_changes_nothing_and_a_displaced_sidecar_is_moved_back_first() {
    for native in [true, false] {
        let config = InjectConfig { native_sidecars: native, ..config() };
        let (_, once) = run(&deployment_pod(), "shop", NamespaceInjection::Enabled, &config);
        let response = unchanged(&once, "shop", NamespaceInjection::Enabled, &config);
        assert!(response.warnings.is_none());
    }
    // Another webhook put its init container in front of ours (reinvocationPolicy: IfNeeded).
    let config = config();
    let (_, mut once) = run(&deployment_pod(), "shop", NamespaceInjection::Enabled, &config);
    once["spec"]["initContainers"].as_array_mut().unwrap().insert(0, json!({"name": "vault-agent-init", "image": "v"}));
    let (_, twice) = run(&once, "shop", NamespaceInjection::Enabled, &config);
    let init: Vec<String> = typed(&twice).spec.unwrap().init_containers.unwrap().into_iter().map(|c| c.name).collect();
    assert_eq!(init, [PROXY_CONTAINER, "vault-agent-init"]);
    unchanged(&twice, "shop", NamespaceInjection::Enabled, &config);
    // A cnimesh-proxy init container that is not a sidecar is not ours to fix.
    let odd = pod_with(json!({"spec": {"initContainers": [{"name": "cnimesh-proxy", "image": "x"}]}}));
    let response = unchanged(&odd, "shop", NamespaceInjection::Enabled, &config);
    assert!(warnings(&response).contains("not a sidecar"));
}

#[test]
fn system_and_control_plane_namespaces_are_never_injected() {
    let config = InjectConfig { control_namespace: "mesh".into(), ..config() };
    let opted_in = pod_with(json!({"metadata": {"annotations": {"cnimesh.io/inject": "enabled"}}}));
    for ns in ["kube-system", "mesh"] {
        for pod in [deployment_pod(), opted_in.clone()] {
            let response = unchanged(&pod, ns, NamespaceInjection::Enabled, &config);
            assert!(warnings(&response).contains("never meshed"), "{ns}: {response:?}");
        }
        // The pod's own namespace counts when it has one.
        let own = pod_with(json!({"metadata": {"namespace": ns}}));
        unchanged(&own, "ignored", NamespaceInjection::Enabled, &config);
    }
}

#[test]
fn host_network_and_unreadable_pods_are_admitted_unmeshed_with_a_warning() {
    let config = config();
    let cases = [
        (json!({"spec": {"hostNetwork": true}}), "host network"),
        (json!({"spec": {"containers": "oops"}}), "cannot read the pod"),
    ];
    for (extra, expected) in cases {
        let pod = pod_with(extra);
        let response = unchanged(&pod, "shop", NamespaceInjection::Enabled, &config);
        assert!(warnings(&response).contains(expected), "{pod}: {response:?}");
    }
}

#[test]
fn uid_clashes_volume_clashes_and_dotted_service_accounts_refuse_the_pod_with_the_reason() {
    let config = config();
    let cases = [
        (json!({"spec": {"securityContext": {"runAsUser": 2102}}}), "runs as the proxy's UID"),
        (json!({"spec": {"volumes": [{"name": "cnimesh-identity-token", "emptyDir": {}}]}}), "volume named"),
        // The pod's own "bundle" where the proxy's would be mounted.
        (
            json!({"spec": {"volumes": [{"name": "cnimesh-trust-bundle", "configMap": {"name": "mine"}}]}}),
            "volume named cnimesh-trust-bundle",
        ),
        (json!({"spec": {"serviceAccountName": "a.b"}}), "contains a dot"),
    ];
    for (extra, expected) in cases {
        let pod = pod_with(extra);
        let message = refused(&pod, "shop", NamespaceInjection::Enabled, &config);
        assert!(message.contains(expected), "{pod}: {message}");
    }
}

#[test]
fn only_pod_creation_is_mutated() {
    let config = config();
    let mut update = review(&deployment_pod(), "shop");
    update["request"]["operation"] = json!("UPDATE");
    let response = mutate(&request(&update), NamespaceInjection::Enabled, &NamespaceDefault::NotLooked, &config);
    assert!(response.allowed && response.patch.is_none());
    let mut other = review(&json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}), "shop");
    other["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    let response = mutate(&request(&other), NamespaceInjection::Enabled, &NamespaceDefault::NotLooked, &config);
    assert!(response.allowed && response.patch.is_none() && response.warnings.is_none());
}

#[test]
fn the_endpoint_routes_by_path_and_rejects_what_is_not_a_review() {
    let webhook = Webhook::new(config()).unwrap();
    let body = serde_json::to_vec(&review(&deployment_pod(), "shop")).unwrap();
    let answer = |path: &str| decode_response(&webhook.review(path, &body).unwrap()).1;
    assert!(answer(INJECT_PATH).is_some());
    assert!(answer(OPT_IN_PATH).is_none(), "not annotated: only labelled namespaces inject it");
    assert_eq!(webhook.review("/mutate", &body).unwrap_err().0, http::StatusCode::NOT_FOUND);
    for bad in
        [&b"not json"[..], b"{}", br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#]
    {
        let (status, message) = webhook.review(INJECT_PATH, bad).unwrap_err();
        assert_eq!(status, http::StatusCode::BAD_REQUEST, "{message}");
    }
    // An object that does not parse still gets an answer for its uid: admitted, unchanged, warned.
    let mut weird = review(&deployment_pod(), "shop");
    weird["request"]["object"]["metadata"]["labels"] = json!({"app": 7});
    let out = webhook.review(INJECT_PATH, &serde_json::to_vec(&weird).unwrap()).unwrap();
    let out: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(out["response"]["uid"], UID);
    assert_eq!(out["response"]["allowed"], true);
    assert!(out["response"].get("patch").is_none());
    assert!(out["response"]["warnings"][0].as_str().unwrap().contains("cannot read"), "{out}");
}

/// A TLS client trusting the webhook's generated CA, speaking HTTP/1.1 to `addr`.
async fn client(addr: std::net::SocketAddr, ca: &Path) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let anchors = cnimesh_identity::pem::certs(&std::fs::read(ca).unwrap(), "ca").unwrap();
    let roots = cnimesh_identity::tls::roots(&anchors).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(cnimesh_identity::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("cnimesh-webhook.cnimesh.svc").unwrap();
    let tls = connector.connect(name, tcp).await.expect("the certificate verifies for the Service name");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    sender
}

async fn post(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    method: http::Method,
    content_type: &str,
    body: Vec<u8>,
) -> (http::StatusCode, Bytes) {
    let req = http::Request::builder()
        .method(method)
        .uri("/inject?timeout=10s")
        .header(http::header::HOST, "cnimesh-webhook.cnimesh.svc:443")
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(req).await.unwrap();
    let status = response.status();
    (status, response.into_body().collect().await.unwrap().to_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_review_over_real_tls() {
    let dir = tempfile::tempdir().unwrap();
    let names = webhook_dns_names("cnimesh", "cluster.local");
    generate_webhook_cert(dir.path(), &names, Duration::from_secs(3600), false).unwrap();
    let tls = load_webhook_tls(dir.path()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let webhook = Arc::new(Webhook::new(config()).unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_webhook(listener, tls, webhook, async {
        let _ = stopped.await;
    }));

    let mut sender = client(addr, &dir.path().join(WEBHOOK_CA_FILE)).await;
    let pod = deployment_pod();
    let body = serde_json::to_vec(&review(&pod, "shop")).unwrap();
    let (status, out) = post(&mut sender, http::Method::POST, "application/json", body.clone()).await;
    assert_eq!(status, http::StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    let (response, patch) = decode_response(&out);
    assert_eq!(serde_json::from_slice::<Value>(&out).unwrap()["kind"], "AdmissionReview");
    assert_eq!(response["uid"], UID);
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch.expect("a patch")).unwrap();
    check_pod(&typed(&patched), &config());

    // Same connection: wrong method. A request refused before its body is read may end its
    // connection (the server does not drain the body), so each of those gets its own.
    let (status, _) = post(&mut sender, http::Method::GET, "application/json", Vec::new()).await;
    assert_eq!(status, http::StatusCode::METHOD_NOT_ALLOWED);
    let ca = dir.path().join(WEBHOOK_CA_FILE);
    let (status, message) = post(&mut client(addr, &ca).await, http::Method::POST, "text/plain", body).await;
    assert_eq!(status, http::StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&message).contains("application/json"));
    let too_large = vec![b' '; MAX_BODY + 1];
    let (status, _) = post(&mut client(addr, &ca).await, http::Method::POST, "application/json", too_large).await;
    assert_eq!(status, http::StatusCode::PAYLOAD_TOO_LARGE);

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), server).await.expect("drains").unwrap();
}

#[test]
fn the_container_names_only_known_things() {
    // Guard against a new field silently widening what the sidecar may do.
    let settings = PodProxySettings {
        identity: "web.shop.serviceaccount.identity.cnimesh.cluster.local".parse().unwrap(),
        opaque_ports: None,
        log_level: "info".into(),
    };
    let c = serde_json::to_value(proxy_container(&config(), &settings).unwrap()).unwrap();
    let keys: BTreeSet<&str> = c.as_object().unwrap().keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = [
        "name",
        "image",
        "imagePullPolicy",
        "restartPolicy",
        "env",
        "ports",
        "startupProbe",
        "readinessProbe",
        "livenessProbe",
        "resources",
        "securityContext",
        "volumeMounts",
    ]
    .into();
    assert_eq!(keys, expected);
}

#[test]
fn auto_mode_follows_the_api_server_version() {
    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        webhook: WebhookArgs,
    }
    // The shipped default, as `serve` builds it.
    let args = <Cli as clap::Parser>::try_parse_from(["x"]).unwrap().webhook;
    assert_eq!(args.native_sidecars, SidecarMode::Auto);
    let pod = deployment_pod();
    let body = serde_json::to_vec(&review(&pod, "shop")).unwrap();
    for (version, native) in [(None, false), (Some((1, 24)), false), (Some((1, 28)), false), (Some((1, 29)), true)] {
        let version = version.map(|(major, minor)| ServerVersion { major, minor });
        let (_tx, versions) = tokio::sync::watch::channel(version);
        let config = InjectConfig {
            trust_anchors_pem: config().trust_anchors_pem,
            ..args.inject_config("cluster.local").unwrap()
        };
        let webhook = Webhook::new(config).unwrap().with_sidecar_mode(args.native_sidecars, versions);
        let (_, patch) = decode_response(&webhook.review(INJECT_PATH, &body).unwrap());
        let mut patched = pod.clone();
        json_patch::patch(&mut patched, &patch.unwrap()).unwrap();
        let spec = typed(&patched).spec.unwrap();
        let in_init = spec.init_containers.iter().flatten().any(|c| c.name == PROXY_CONTAINER);
        let in_containers = spec.containers.iter().any(|c| c.name == PROXY_CONTAINER);
        assert_eq!((in_init, in_containers), (native, !native), "server {version:?}");
        let proxy =
            spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == PROXY_CONTAINER);
        let proxy = proxy.unwrap();
        assert_eq!(proxy.restart_policy.is_some(), native);
        assert_eq!(proxy.startup_probe.is_some(), native, "probes on an init container only as a native sidecar");
    }
}

#[test]
fn a_sidecar_stripped_by_an_old_api_server_is_explained() {
    // What a 1.24 API server re-invokes the webhook with after dropping restartPolicy: Always.
    let pod = pod_with(json!({
        "metadata": {"annotations": {INJECTED_ANNOTATION: env!("CARGO_PKG_VERSION")}},
        "spec": {"initContainers": [{"name": PROXY_CONTAINER, "image": "x"}]}
    }));
    let response = unchanged(&pod, "shop", NamespaceInjection::Enabled, &config());
    let warning = warnings(&response);
    assert!(warning.contains("dropped `restartPolicy: Always`"), "{warning}");
    assert!(warning.contains("does not support native sidecars") && warning.contains("=auto"), "{warning}");
    // Someone else's init container of that name is still reported as such.
    let foreign = pod_with(json!({"spec": {"initContainers": [{"name": PROXY_CONTAINER, "image": "x"}]}}));
    let warning = warnings(&unchanged(&foreign, "shop", NamespaceInjection::Enabled, &config()));
    assert!(warning.contains("is not a sidecar"), "{warning}");
}

#[test]
fn without_trust_anchors_a_pod_that_must_be_meshed_is_refused() {
    let config = InjectConfig { trust_anchors_pem: String::new(), ..config() };
    let response = mutate(
        &request(&review(&deployment_pod(), "shop")),
        NamespaceInjection::Enabled,
        &NamespaceDefault::NotLooked,
        &config,
    );
    assert!(!response.allowed, "fail closed: {response:?}");
    assert!(response.result.message.contains("no trust anchors"), "{response:?}");
    assert!(response.patch.is_none());
}

/// The proxy container of a patched pod.
fn proxy_of(pod: &Pod) -> Container {
    let spec = pod.spec.as_ref().unwrap();
    spec.init_containers.iter().flatten().chain(&spec.containers).find(|c| c.name == PROXY_CONTAINER).unwrap().clone()
}

/// Injects `pod` in namespace `shop` with what the webhook read of the namespace.
fn injected(pod: &Value, ns_default: &NamespaceDefault, config: &InjectConfig) -> (AdmissionResponse, Container) {
    let response = mutate(&request(&review(pod, "shop")), NamespaceInjection::Enabled, ns_default, config);
    let patched = typed(&apply(pod, &response));
    (response, proxy_of(&patched))
}

#[test]
fn the_proxy_starts_with_the_effective_default_pod_over_namespace_over_cluster() {
    use cnimesh_model::policy::DefaultPolicy::*;
    let cluster_deny = InjectConfig { default_inbound_policy: Deny, ..config() };
    let plain = deployment_pod();
    let annotated = pod_with(
        json!({"metadata": {"annotations": {"config.cnimesh.io/default-inbound-policy": "all-authenticated"}}}),
    );
    let misspelt = pod_with(
        json!({"metadata": {"annotations": {"config.cnimesh.io/default-inbound-policy": "al-authenticated"}}}),
    );
    let cases = [
        // Without the variable every proxy would start all-unauthenticated.
        (&plain, NamespaceDefault::Read(None), &cluster_deny, "deny"),
        (&plain, NamespaceDefault::NotLooked, &cluster_deny, "deny"),
        (&plain, NamespaceDefault::Read(Some(ClusterAuthenticated)), &cluster_deny, "cluster-authenticated"),
        (&annotated, NamespaceDefault::Read(Some(Deny)), &cluster_deny, "all-authenticated"),
        (&misspelt, NamespaceDefault::Read(None), &config(), "deny"),
        (&plain, NamespaceDefault::Read(None), &config(), "all-unauthenticated"),
    ];
    for (pod, ns, config, want) in cases {
        let (_, proxy) = injected(pod, &ns, config);
        assert_eq!(
            env(&proxy, POLICY_DEFAULT_ENV),
            Some(want),
            "{ns:?} with cluster {:?}",
            config.default_inbound_policy
        );
    }
}

#[test]
fn an_unreadable_namespace_fails_closed_and_says_so() {
    let (response, proxy) = injected(
        &deployment_pod(),
        &NamespaceDefault::Unreadable("namespaces \"shop\" is forbidden".into()),
        &config(),
    );
    assert_eq!(env(&proxy, POLICY_DEFAULT_ENV), Some("deny"));
    let said = warnings(&response);
    assert!(said.contains("forbidden") && said.contains("deny"), "{said}");
}

#[test]
fn the_proxy_knows_the_declared_ports_and_the_cluster_networks_from_the_start() {
    let pod = pod_with(json!({"spec": {
        "initContainers": [{"name": "cache", "image": "redis", "restartPolicy": "Always", "ports": [{"containerPort": 6379}]}],
        "containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}, {"containerPort": 8080}, {"containerPort": 80, "protocol": "UDP"}]}],
    }}));
    let config = InjectConfig {
        cluster_networks: vec!["10.0.0.0/16".parse().unwrap(), "fd00::/8".parse().unwrap()],
        ..config()
    };
    let (_, proxy) = injected(&pod, &NamespaceDefault::NotLooked, &config);
    assert_eq!(env(&proxy, INBOUND_PORTS_ENV), Some("80,6379,8080"));
    assert_eq!(env(&proxy, CLUSTER_NETWORKS_ENV), Some("10.0.0.0/16,fd00::/8"));
    let (_, proxy) = injected(
        &pod_with(json!({"spec": {"containers": [{"name": "web", "image": "x", "ports": null}]}})),
        &NamespaceDefault::NotLooked,
        &config,
    );
    assert_eq!(env(&proxy, INBOUND_PORTS_ENV), None, "no ports declared: nothing to ask for up front");
}

#[test]
fn a_container_on_a_port_the_capture_skips_gets_a_kubectl_warning() {
    let pod = pod_with(json!({
        "metadata": {"annotations": {"config.cnimesh.io/skip-inbound-ports": "9000"}},
        "spec": {"containers": [{"name": "web", "image": "nginx", "ports": [{"containerPort": 4191}, {"containerPort": 9000}, {"containerPort": 8080}]}]},
    }));
    let response =
        mutate(&request(&review(&pod, "shop")), NamespaceInjection::Enabled, &NamespaceDefault::NotLooked, &config());
    assert!(response.patch.is_some(), "still injected");
    let said = warnings(&response);
    assert!(said.contains("container web port 4191"), "{said}");
    assert!(said.contains("container web port 9000") && said.contains("skip-inbound-ports"), "{said}");
    assert!(!said.contains("8080"), "{said}");
    // The review on the wire carries them where kubectl reads them.
    let out = Webhook::new(config())
        .unwrap()
        .review(INJECT_PATH, &serde_json::to_vec(&review(&pod, "shop")).unwrap())
        .unwrap();
    let (wire, _) = decode_response(&out);
    assert!(
        wire["warnings"].as_array().is_some_and(|w| w.iter().any(|w| w.as_str().unwrap().contains("port 4191"))),
        "{wire}"
    );
}

/// The namespaces of the YAML stream `yaml`, read from an in-process API server holding them.
fn namespaces_of(yaml: &str) -> Namespaces {
    let api = cnimesh_apiserver::ClusterApi::new();
    let namespaces: Vec<Value> = serde_saphyr::from_str_multiple(yaml).unwrap();
    for namespace in namespaces {
        api.put(namespace);
    }
    Namespaces::Kube(api.client())
}

#[tokio::test]
async fn the_served_review_reads_the_namespaces_annotation() {
    let namespaces = namespaces_of(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, annotations: {config.cnimesh.io/default-inbound-policy: deny}}\n",
    );
    let webhook = Webhook::new(config()).unwrap().with_namespaces(namespaces);
    let body = serde_json::to_vec(&review(&deployment_pod(), "shop")).unwrap();
    let (_, patch) = decode_response(&webhook.review_reading_namespace(INJECT_PATH, &body).await.unwrap());
    let mut patched = deployment_pod();
    json_patch::patch(&mut patched, &patch.unwrap()).unwrap();
    assert_eq!(
        env(&proxy_of(&typed(&patched)), POLICY_DEFAULT_ENV),
        Some("deny"),
        "the namespace's, over the cluster's"
    );
    // Another namespace has no annotation: the cluster setting.
    let body = serde_json::to_vec(&review(&deployment_pod(), "other")).unwrap();
    let (_, patch) = decode_response(&webhook.review_reading_namespace(INJECT_PATH, &body).await.unwrap());
    let mut patched = deployment_pod();
    json_patch::patch(&mut patched, &patch.unwrap()).unwrap();
    assert_eq!(env(&proxy_of(&typed(&patched)), POLICY_DEFAULT_ENV), Some("all-unauthenticated"));
}

/// A config whose cluster-wide tracing default is `collector` / `sampling` (the `serve` flags).
fn traced_config(collector: Option<&str>, sampling: Option<&str>) -> InjectConfig {
    InjectConfig { tracing: TraceSettings::cluster(collector, sampling).unwrap(), ..config() }
}

#[test]
fn the_proxy_traces_to_the_pods_collector_over_the_clusters_and_not_at_all_without_one() {
    let trace_env = |proxy: &Container| {
        (env(proxy, TRACE_COLLECTOR_ENV).map(String::from), env(proxy, TRACE_SAMPLING_ENV).map(String::from))
    };
    let s = |v: &str| Some(v.to_string());
    // No collector anywhere: tracing off, the proxy gets neither variable.
    let (_, proxy) = injected(&deployment_pod(), &NamespaceDefault::NotLooked, &config());
    assert_eq!(trace_env(&proxy), (None, None));
    // The cluster default reaches every proxy.
    let cluster = traced_config(Some("http://otel-collector.cnimesh-tracing:4317"), Some("0.1"));
    let (_, proxy) = injected(&deployment_pod(), &NamespaceDefault::NotLooked, &cluster);
    assert_eq!(trace_env(&proxy), (s("http://otel-collector.cnimesh-tracing:4317"), s("0.1")));
    // The pod's annotations win, each on its own.
    let annotated = pod_with(json!({"metadata": {"annotations": {
        "config.cnimesh.io/trace-collector": "https://collector.team.example:4317",
    }}}));
    let (_, proxy) = injected(&annotated, &NamespaceDefault::NotLooked, &cluster);
    assert_eq!(trace_env(&proxy), (s("https://collector.team.example:4317"), s("0.1")));
    let sampled = pod_with(json!({"metadata": {"annotations": {"config.cnimesh.io/trace-sampling": "1"}}}));
    let (_, proxy) = injected(&sampled, &NamespaceDefault::NotLooked, &cluster);
    assert_eq!(trace_env(&proxy), (s("http://otel-collector.cnimesh-tracing:4317"), s("1")));
    // A pod may opt out of a cluster default.
    let off = pod_with(json!({"metadata": {"annotations": {"config.cnimesh.io/trace-collector": "off"}}}));
    let (_, proxy) = injected(&off, &NamespaceDefault::NotLooked, &cluster);
    assert_eq!(trace_env(&proxy), (None, None));
    // Without a cluster default, an annotated pod alone traces.
    let (_, proxy) = injected(&annotated, &NamespaceDefault::NotLooked, &config());
    assert_eq!(trace_env(&proxy), (s("https://collector.team.example:4317"), None));
}

#[test]
fn a_bad_trace_annotation_meshes_the_pod_without_tracing_and_a_warning_naming_it() {
    let cluster = traced_config(Some("collector:4317"), None);
    let cases = [
        ("config.cnimesh.io/trace-collector", "collector", "no port"),
        ("config.cnimesh.io/trace-collector", "grpc://collector:4317", "scheme"),
        ("config.cnimesh.io/trace-collector", "collector:4317\nEVIL=1", "not 1-65535"),
        ("config.cnimesh.io/trace-sampling", "1.5", "sampling ratio"),
        ("config.cnimesh.io/trace-sampling", "10%", "sampling ratio"),
    ];
    for (key, value, why) in cases {
        let pod = pod_with(json!({"metadata": {"annotations": {key: value}}}));
        let (response, proxy) = injected(&pod, &NamespaceDefault::NotLooked, &cluster);
        assert_eq!(
            (env(&proxy, TRACE_COLLECTOR_ENV), env(&proxy, TRACE_SAMPLING_ENV)),
            (None, None),
            "{key}={value:?}: observability only, so the setting goes"
        );
        let w = warnings(&response);
        assert!(w.starts_with("cnimesh: annotation"), "{key}={value:?}: {w}");
        assert!(w.contains(key) && w.contains("of the pod") && w.contains(why), "{key}={value:?}: {w}");
        assert!(w.contains("ignored, the proxy does not trace"), "{key}={value:?}: {w}");
    }
}

#[test]
fn a_bad_cluster_tracing_flag_stops_serve_at_start() {
    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        webhook: WebhookArgs,
    }
    let parse = |extra: &[&str]| {
        let argv = [&["serve"], extra].concat();
        <Serve as clap::Parser>::try_parse_from(argv).unwrap().webhook.inject_config("cluster.local")
    };
    let config = parse(&["--proxy-trace-collector=collector.tracing:4317", "--proxy-trace-sampling=0.5"]).unwrap();
    assert_eq!(config.tracing, TraceSettings::cluster(Some("collector.tracing:4317"), Some("0.5")).unwrap());
    let error = parse(&["--proxy-trace-collector=collector.tracing"]).unwrap_err().to_string();
    assert!(error.contains("--proxy-trace-collector") && error.contains("\"collector.tracing\""), "{error}");
    let error = parse(&["--proxy-trace-sampling=2"]).unwrap_err().to_string();
    assert!(error.contains("--proxy-trace-sampling") && error.contains("\"2\""), "{error}");
    assert_eq!(parse(&[]).unwrap().tracing, TraceSettings::default(), "unset: no tracing");
}

#[tokio::test]
async fn the_served_review_takes_tracing_from_the_namespace_over_the_cluster_and_the_pod_over_both() {
    let namespaces = namespaces_of(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, annotations: {config.cnimesh.io/trace-collector: 'http://shop-collector:4317', config.cnimesh.io/trace-sampling: '0.25'}}\n\
         ---\napiVersion: v1\nkind: Namespace\nmetadata: {name: quiet, annotations: {config.cnimesh.io/trace-collector: 'off'}}\n\
         ---\napiVersion: v1\nkind: Namespace\nmetadata: {name: typo, annotations: {config.cnimesh.io/trace-sampling: 'lots'}}\n",
    );
    let cluster = traced_config(Some("cluster-collector:4317"), None);
    let webhook = Webhook::new(cluster).unwrap().with_namespaces(namespaces);
    let serve = async |pod: &Value, ns: &str| {
        let body = serde_json::to_vec(&review(pod, ns)).unwrap();
        let (response, patch) = decode_response(&webhook.review_reading_namespace(INJECT_PATH, &body).await.unwrap());
        let Some(patch) = patch else { return Err(response.to_string()) };
        let mut patched = pod.clone();
        json_patch::patch(&mut patched, &patch).unwrap();
        let proxy = proxy_of(&typed(&patched));
        let get = |name| env(&proxy, name).map(String::from);
        Ok((get(TRACE_COLLECTOR_ENV), get(TRACE_SAMPLING_ENV), response["warnings"].to_string()))
    };
    let trace =
        async |pod: &Value, ns: &str| serve(pod, ns).await.map(|(collector, sampling, _)| (collector, sampling));
    let s = |v: &str| Some(v.to_string());
    assert_eq!(trace(&deployment_pod(), "shop").await.unwrap(), (s("http://shop-collector:4317"), s("0.25")));
    let pod = pod_with(json!({"metadata": {"annotations": {"config.cnimesh.io/trace-sampling": "1"}}}));
    assert_eq!(trace(&pod, "shop").await.unwrap(), (s("http://shop-collector:4317"), s("1")));
    assert_eq!(trace(&deployment_pod(), "other").await.unwrap(), (s("cluster-collector:4317"), None));
    assert_eq!(trace(&deployment_pod(), "quiet").await.unwrap(), (None, None), "the namespace opts out");
    // A bad namespace annotation costs the pods their tracing, not their proxy.
    let (collector, sampling, warning) = serve(&deployment_pod(), "typo").await.unwrap();
    assert_eq!((collector, sampling), (None, None));
    assert!(
        warning.contains("annotation config.cnimesh.io/trace-sampling of namespace typo: \\\"lots\\\"")
            && warning.contains("the proxy does not trace"),
        "{warning}"
    );
}

/// `cnimesh.io/inject: ingress` (Linkerd's value for an ingress controller's pod) meshes the pod
/// even where its namespace does not, with the proxy in ingress mode for the cluster's domain;
/// `enabled` leaves the proxy a plain sidecar.
#[test]
fn an_ingress_controllers_pod_annotated_ingress_gets_its_proxy_in_ingress_mode() {
    let config = config();
    let ingress = pod_with(json!({"metadata": {"annotations": {"cnimesh.io/inject": "ingress"}}}));
    let (_, patched) = run(&ingress, "shop", NamespaceInjection::NotEnabled, &config);
    let patched = typed(&patched);
    check_pod(&patched, &config);
    let proxy = proxy_of(&patched);
    assert_eq!(env(&proxy, "CNIMESH_PROXY_MODE"), Some("ingress"));
    assert_eq!(env(&proxy, "CNIMESH_PROXY_CLUSTER_DOMAIN"), Some(config.cluster_domain.as_str()));
    assert_eq!(env(&proxy, "CNIMESH_PROXY_INGRESS_NAMESPACES"), None, "every namespace unless listed");
    let listed = pod_with(json!({"metadata": {"annotations": {
        "cnimesh.io/inject": "ingress", "config.cnimesh.io/ingress-namespaces": "shop,web"}}}));
    let (_, patched) = run(&listed, "shop", NamespaceInjection::NotEnabled, &config);
    assert_eq!(env(&proxy_of(&typed(&patched)), "CNIMESH_PROXY_INGRESS_NAMESPACES"), Some("shop,web"));
    let enabled = pod_with(json!({"metadata": {"annotations": {"cnimesh.io/inject": "enabled"}}}));
    let (_, proxy) = injected(&enabled, &NamespaceDefault::NotLooked, &config);
    assert_eq!(env(&proxy, "CNIMESH_PROXY_MODE"), None);
}
