//! The kustomize base (`daemonset/kustomization.yml`) and its cert-manager overlay
//! (`deploy/cert-manager/`), rendered by the real `kubectl kustomize`:
//!
//! - the base renders the objects `cnimesh install` prints, minus the generated Secrets and
//!   ConfigMap and the webhook's caBundle, each object equal to install's but for the
//!   `app.kubernetes.io/*` labels the base adds to every object (CRDs too);
//! - an overlay's `images:` entry for the proxy changes the image the injector writes into
//!   meshed pods (the control plane's `CNIMESH_CONTROL_PROXY_IMAGE`, read back through the
//!   control plane's own flags);
//! - the cert-manager overlay renders Certificates whose Secrets are the ones the control plane
//!   mounts and watches, in the key layout it reads.
//!
//! `kubectl` must be installed (`scripts/setup.sh` checks for it); a missing one fails the test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::{Args, FromArgMatches};
use serde_json::Value;

use cnimesh_cli::{install, manifests, yaml};
use cnimesh_model::inject::{
    WEBHOOK_CA_FILE, WEBHOOK_CERT_FILE, WEBHOOK_KEY_FILE, WEBHOOK_SECRET, WebhookArgs, webhook_dns_names,
};

const LABELS: [&str; 4] = [
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
];
const COMPONENTS: [&str; 4] = ["control-plane", "node", "crds", "webhook"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("cli/ has a parent").to_path_buf()
}

/// `kubectl kustomize DIR`, parsed.
fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl").arg("kustomize").arg(dir).output().unwrap_or_else(|e| {
        panic!("running kubectl kustomize {}: {e} (kubectl is needed: scripts/setup.sh checks for it)", dir.display())
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl kustomize {} failed: {stderr}", dir.display());
    let text = String::from_utf8(out.stdout).expect("kustomize prints UTF-8");
    yaml::documents(&text, "kubectl kustomize").expect("kustomize prints YAML")
}

fn key(doc: &Value) -> (String, String, String) {
    let get = |p: &str| doc.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
    (get("/kind"), get("/metadata/namespace"), get("/metadata/name"))
}

fn label<'a>(doc: &'a Value, name: &str) -> Option<&'a str> {
    doc.pointer("/metadata/labels").and_then(|l| l.get(name)).and_then(Value::as_str)
}

/// `target` as a path relative to `dir`: kustomize refuses absolute paths to a base.
fn relative_to(dir: &Path, target: &Path) -> String {
    let up = "../".repeat(dir.canonicalize().unwrap().components().count() - 1);
    let target = target.canonicalize().unwrap();
    format!("{up}{}", target.strip_prefix("/").unwrap().display())
}

/// What kustomize's YAML round trip changes without changing meaning: numbers (`65535.0` where
/// the file says `65535`), and the line breaks of folded (`>-`) CEL expressions with
/// more-indented lines, where it adds blank lines (CEL ignores whitespace; the node agent's
/// admission policy has two such expressions). Everything else must be equal.
fn normalise(v: &mut Value) {
    match v {
        Value::Number(n) => *v = Value::from(n.as_f64().unwrap()),
        Value::Array(items) => items.iter_mut().for_each(normalise),
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match value {
                    Value::String(text) if key == "expression" => {
                        *text = text.split_whitespace().collect::<Vec<_>>().join(" ");
                    }
                    _ => normalise(value),
                }
            }
        }
        _ => {}
    }
}

/// The object without the labels the base adds, nor the caBundle install fills in.
fn comparable(doc: &Value) -> Value {
    let mut doc = doc.clone();
    if let Some(labels) = doc.pointer_mut("/metadata/labels").and_then(Value::as_object_mut) {
        for name in LABELS {
            labels.remove(name);
        }
        if labels.is_empty() {
            doc["metadata"].as_object_mut().unwrap().remove("labels");
        }
    }
    for webhook in doc.get_mut("webhooks").and_then(Value::as_array_mut).into_iter().flatten() {
        webhook["clientConfig"].as_object_mut().unwrap().remove("caBundle");
    }
    normalise(&mut doc);
    doc
}

fn by_key(docs: &[Value]) -> BTreeMap<(String, String, String), &Value> {
    docs.iter().map(|d| (key(d), d)).collect()
}

#[test]
fn the_base_renders_the_objects_install_prints_without_its_generated_secrets() {
    let base = kustomize(&root().join("daemonset"));
    let shipped = manifests::documents();
    let (base, shipped) = (by_key(&base), by_key(&shipped));
    let missing: Vec<_> = shipped.keys().filter(|k| !base.contains_key(*k)).collect();
    let extra: Vec<_> = base.keys().filter(|k| !shipped.contains_key(*k)).collect();
    assert!(missing.is_empty() && extra.is_empty(), "the base lacks {missing:?} and adds {extra:?}");
    let generated = [install::ISSUER_SECRET, install::TRUST_ANCHORS_CONFIG_MAP, WEBHOOK_SECRET];
    for (key, doc) in &base {
        assert!(!generated.contains(&key.2.as_str()), "the base holds no generated object, yet it has {key:?}");
        assert_eq!(comparable(doc), comparable(shipped[key]), "{key:?} differs between the base and install");
    }
}

#[test]
fn every_object_of_the_base_carries_the_app_kubernetes_io_labels() {
    for doc in kustomize(&root().join("daemonset")) {
        let what = key(&doc);
        assert_eq!(label(&doc, "app.kubernetes.io/part-of"), Some("cnimesh"), "{what:?}");
        assert_eq!(label(&doc, "app.kubernetes.io/managed-by"), Some("cnimesh"), "{what:?}");
        assert_eq!(label(&doc, "app.kubernetes.io/version"), Some(env!("CARGO_PKG_VERSION")), "{what:?}");
        let component = label(&doc, "app.kubernetes.io/component");
        assert!(component.is_some_and(|c| COMPONENTS.contains(&c)), "{what:?}: component {component:?}");
        if what.0 == "CustomResourceDefinition" {
            assert_eq!(component, Some("crds"), "{what:?}");
        }
        // Labels the shipped files carry themselves (install prints them) must agree.
        let shipped = manifests::documents().into_iter().find(|d| key(d) == what).unwrap();
        for name in LABELS {
            if let Some(theirs) = label(&shipped, name) {
                assert_eq!(label(&doc, name), Some(theirs), "{what:?}: {name} differs from install's");
            }
        }
        // The selectors stay as install wrote them: an apply over install's objects must not
        // change an immutable selector.
        if let Some(selector) = doc.pointer("/spec/selector/matchLabels") {
            assert!(LABELS.iter().all(|l| selector.get(*l).is_none()), "{what:?}: selector {selector}");
        }
    }
}

/// The control plane's webhook flags, as its container's environment sets them.
fn webhook_args(deployment: &Value) -> WebhookArgs {
    let cmd = WebhookArgs::augment_args(clap::Command::new("serve").no_binary_name(true));
    let env = deployment.pointer("/spec/template/spec/containers/0/env").and_then(Value::as_array).unwrap();
    let mut argv = Vec::new();
    for var in env {
        let (Some(name), Some(value)) = (var["name"].as_str(), var["value"].as_str()) else { continue };
        if let Some(arg) = cmd.get_arguments().find(|a| a.get_env().is_some_and(|e| e == name)) {
            argv.push(format!("--{}={value}", arg.get_long().unwrap()));
        }
    }
    let matches = cmd.try_get_matches_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    WebhookArgs::from_arg_matches(&matches).unwrap()
}

fn control_plane(docs: &[Value]) -> &Value {
    docs.iter().find(|d| key(d).0 == "Deployment" && key(d).2 == "cnimesh-control").expect("the control plane")
}

#[test]
fn the_before_1_30_component_leaves_out_exactly_what_install_leaves_out_on_such_a_server() {
    let overlay = tempfile::tempdir().unwrap();
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n  - {}\n",
        relative_to(overlay.path(), &root().join("daemonset")),
        relative_to(overlay.path(), &root().join("deploy/before-1.30"))
    );
    std::fs::write(overlay.path().join("kustomization.yaml"), kustomization).unwrap();
    let rendered = kustomize(overlay.path());
    let base = kustomize(&root().join("daemonset"));
    let kinds = |docs: &[Value]| -> Vec<(String, String, String)> {
        docs.iter().filter(|d| install::guard::POLICY_KINDS.iter().any(|k| d["kind"] == *k)).map(key).collect()
    };
    assert_eq!(kinds(&rendered), Vec::<(String, String, String)>::new());
    assert_eq!(kinds(&base).len(), 2, "the base has the policy and its binding");
    let (rendered, base) = (by_key(&rendered), by_key(&base));
    for (key, doc) in &base {
        if install::guard::POLICY_KINDS.contains(&key.0.as_str()) {
            continue;
        }
        assert_eq!(rendered.get(key), Some(doc), "{key:?}: the component changes nothing else");
    }

    // What `cnimesh install` renders for Kubernetes 1.24: the same set of objects, less the generated ones.
    let args = install::InstallArgs {
        kubernetes_version: Some(install::guard::parse_version("1.24").unwrap()),
        ignore_cluster: true,
        ..Default::default()
    };
    let mut options = args.options().unwrap();
    options.fit(args.kubernetes_version).unwrap();
    let certs = install::Certificates::from_args(&args).unwrap();
    let installed: Vec<Value> = install::documents(&certs, &options).unwrap();
    let generated =
        [install::ISSUER_SECRET, install::TRUST_ANCHORS_CONFIG_MAP, WEBHOOK_SECRET, install::VALUES_CONFIG_MAP];
    let mut from_install: Vec<_> = installed.iter().map(key).filter(|k| !generated.contains(&k.2.as_str())).collect();
    let mut from_kustomize: Vec<_> = rendered.keys().cloned().collect();
    from_install.sort();
    from_kustomize.sort();
    assert_eq!(from_kustomize, from_install);
}

#[test]
fn an_images_override_changes_the_proxy_image_the_injector_writes() {
    let base = kustomize(&root().join("daemonset"));
    let before = webhook_args(control_plane(&base)).inject_config("cluster.local").unwrap().proxy_image;
    assert_eq!(before, cnimesh_model::inject::DEFAULT_PROXY_IMAGE);

    let overlay = tempfile::tempdir().unwrap();
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\nimages:\n  \
         - name: ghcr.io/cnimesh/cnimesh-proxy\n    newName: registry.example/mesh/cnimesh-proxy\n    newTag: 9.9.9\n  \
         - name: ghcr.io/cnimesh/cnimesh-control\n    newName: registry.example/mesh/cnimesh-control\n",
        relative_to(overlay.path(), &root().join("daemonset"))
    );
    std::fs::write(overlay.path().join("kustomization.yaml"), kustomization).unwrap();
    let rendered = kustomize(overlay.path());
    let deployment = control_plane(&rendered);
    let after = webhook_args(deployment).inject_config("cluster.local").unwrap().proxy_image;
    assert_eq!(after, "registry.example/mesh/cnimesh-proxy:9.9.9");
    let image = deployment.pointer("/spec/template/spec/containers/0/image").and_then(Value::as_str).unwrap();
    assert!(image.starts_with("registry.example/mesh/cnimesh-control:"), "{image}");

    // Nothing else in the environment moved: only values naming the proxy image change.
    let env = |d: &Value| d.pointer("/spec/template/spec/containers/0/env").cloned().unwrap();
    let (mut old, new) = (env(control_plane(&base)), env(deployment));
    for var in old.as_array_mut().unwrap() {
        if var["name"] == "CNIMESH_CONTROL_PROXY_IMAGE" {
            var["value"] = Value::from(after.clone());
        }
    }
    assert_eq!(old, new);
}

#[test]
fn the_cert_manager_overlay_issues_the_secrets_the_control_plane_reads() {
    let docs = kustomize(&root().join("deploy/cert-manager"));
    let of_kind = |kind: &'static str| docs.iter().filter(move |d| key(d).0 == kind);
    let certificate = |secret: &str| {
        of_kind("Certificate")
            .find(|c| c.pointer("/spec/secretName").and_then(Value::as_str) == Some(secret))
            .unwrap_or_else(|| panic!("no Certificate writes Secret {secret}"))
    };
    let issuer_of = |cert: &Value| {
        let name = cert.pointer("/spec/issuerRef/name").and_then(Value::as_str).unwrap();
        assert_eq!(cert.pointer("/spec/issuerRef/kind").and_then(Value::as_str), Some("Issuer"));
        of_kind("Issuer").find(|i| key(i).2 == name).unwrap_or_else(|| panic!("no Issuer {name}")).clone()
    };
    for cert in of_kind("Certificate") {
        assert_eq!(cert["apiVersion"], "cert-manager.io/v1", "{:?}", key(cert));
        assert_eq!(key(cert).1, "cnimesh", "{:?}: in the control plane's namespace", key(cert));
        assert_eq!(cert.pointer("/spec/privateKey/algorithm").and_then(Value::as_str), Some("ECDSA"));
        assert_eq!(cert.pointer("/spec/privateKey/encoding").and_then(Value::as_str), Some("PKCS8"));
        issuer_of(cert);
    }

    // The identity issuer: a CA signed by the trust anchor, into the Secret the control plane
    // mounts as its issuer directory. cert-manager writes ca.crt (the anchor), tls.crt, tls.key:
    // exactly the file names the control plane reads there.
    let identity = certificate(install::ISSUER_SECRET);
    assert_eq!(identity["spec"]["isCA"], true);
    let anchor_issuer = issuer_of(identity);
    let anchor_secret = anchor_issuer.pointer("/spec/ca/secretName").and_then(Value::as_str).unwrap();
    let anchor = certificate(anchor_secret);
    assert_eq!(anchor["spec"]["isCA"], true);
    assert!(issuer_of(anchor).pointer("/spec/selfSigned").is_some(), "the anchor is a self-signed root");
    use cnimesh_model::identity::issuer::{ANCHORS_FILE, ISSUER_CERT_FILE, ISSUER_KEY_FILE};
    assert_eq!((ANCHORS_FILE, ISSUER_CERT_FILE, ISSUER_KEY_FILE), ("ca.crt", "tls.crt", "tls.key"));
    let deployment = control_plane(&docs);
    let volumes = deployment.pointer("/spec/template/spec/volumes").and_then(Value::as_array).unwrap();
    let mounted: Vec<&str> = volumes.iter().filter_map(|v| v.pointer("/secret/secretName")?.as_str()).collect();
    assert!(mounted.contains(&install::ISSUER_SECRET) && mounted.contains(&WEBHOOK_SECRET), "{mounted:?}");

    // The webhook: a serving certificate for the webhook Service's names, in the Secret the
    // control plane watches (--webhook-certs secret), its CA injected into the caBundle.
    let webhook = certificate(WEBHOOK_SECRET);
    let names: Vec<&str> = webhook["spec"]["dnsNames"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for name in webhook_dns_names("cnimesh", "cluster.local") {
        assert!(names.contains(&name.as_str()), "{name} in {names:?}");
    }
    assert!(issuer_of(webhook).pointer("/spec/ca/secretName").is_some(), "the webhook's issuer is a CA");
    assert_eq!((WEBHOOK_CA_FILE, WEBHOOK_CERT_FILE, WEBHOOK_KEY_FILE), ("ca.crt", "tls.crt", "tls.key"));
    let injector = of_kind("MutatingWebhookConfiguration").next().expect("the injector");
    let inject_from = injector.pointer("/metadata/annotations/cert-manager.io~1inject-ca-from").and_then(Value::as_str);
    assert_eq!(inject_from, Some(format!("cnimesh/{}", key(webhook).2).as_str()));
    let env = deployment.pointer("/spec/template/spec/containers/0/env").and_then(Value::as_array).unwrap();
    let mode = env.iter().find(|v| v["name"] == "CNIMESH_CONTROL_WEBHOOK_CERTS").and_then(|v| v["value"].as_str());
    assert_eq!(mode, Some("secret"), "the webhook reloads what cert-manager renews");
}
