//! `cnimesh inject` and `cnimesh uninject`: the webhook's pure mutation ([`cnimesh_model::inject::plan`])
//! applied to YAML offline, for CD pipelines that render manifests before they reach a cluster.
//!
//! Input is a stream of documents (files, directories, stdin); each workload's pod template
//! (Pods, Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs, CronJobs, and all of those
//! inside Lists) gets exactly the patch the webhook would give the pod. Documents that need no
//! change are printed byte for byte as they came, comments included; a changed document is
//! printed again from its parsed form (its comments are lost, field order is kept). Both
//! commands are idempotent, and `uninject` undoes `inject`.
//!
//! Layer: runtime (operator CLI).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use cnimesh_common::names::{OWNER_LABEL_PREFIX, WORKLOAD_NAMESPACE_LABEL};
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

use super::install::{TRUST_ANCHORS_CONFIG_MAP, TRUST_ANCHORS_KEY};
use super::{ClusterArgs, yaml};
use cnimesh_model::inject::{
    DEFAULT_CONTROL_NAMESPACE, DEFAULT_PROXY_IMAGE, INJECT_ANNOTATION, INJECTED_ANNOTATION, InjectConfig,
    NamespaceDefault, NamespaceInjection, PROXY_CONTAINER, ServerVersion, SidecarMode, Skip, TOKEN_VOLUME,
    TRUST_BUNDLE_CONFIG_MAP, plan,
};
use cnimesh_model::policy::DefaultPolicy;
use cnimesh_model::workload::Workload;

/// How long `auto` and the anchors lookup wait for a cluster before working without one.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, clap::Args)]
pub struct InjectArgs {
    /// Files or directories (*.yaml, *.yml, *.json, recursively); `-` or nothing reads stdin.
    pub paths: Vec<PathBuf>,
    /// The inbound policy proxies start with, until the control plane answers, for pods without
    /// a `config.cnimesh.io/default-inbound-policy` annotation: pass the control plane's
    /// `--default-inbound-policy` (or the namespace's annotation). Offline the cluster's value is
    /// unknown, so the default fails closed [default: deny].
    #[arg(long)]
    pub default_inbound_policy: Option<DefaultPolicy>,
    /// Trust anchors (PEM) for the proxies [default: the cluster's ConfigMap
    /// cnimesh/cnimesh-identity-trust-anchors, which `cnimesh install` creates].
    #[arg(long)]
    pub identity_trust_anchors_file: Option<PathBuf>,
    /// `auto`: native sidecars if the cluster (when reachable) is 1.29 or newer, else a regular
    /// container; `true` / `false` force either.
    #[arg(long, default_value = "auto")]
    pub native_sidecars: SidecarMode,
    #[arg(long, default_value = DEFAULT_PROXY_IMAGE)]
    pub proxy_image: String,
}

#[derive(Debug, clap::Args)]
pub struct UninjectArgs {
    /// Files or directories (*.yaml, *.yml, *.json, recursively); `-` or nothing reads stdin.
    pub paths: Vec<PathBuf>,
}

pub async fn inject_main(cluster: &ClusterArgs, args: InjectArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let inputs = read_inputs(&args.paths)?;
    let client = match (&args.identity_trust_anchors_file, args.native_sidecars) {
        (Some(_), mode) if mode.fixed().is_some() => None,
        _ => tokio::time::timeout(CLUSTER_TIMEOUT, cluster.client()).await.ok().and_then(Result::ok),
    };
    let trust_anchors_pem = match &args.identity_trust_anchors_file {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        None => cluster_anchors(client.clone()).await?,
    };
    let native_sidecars = match args.native_sidecars.fixed() {
        Some(native) => native,
        None => {
            let version = match client {
                Some(client) => {
                    tokio::time::timeout(CLUSTER_TIMEOUT, client.apiserver_version()).await.ok().and_then(Result::ok)
                }
                None => None,
            };
            let version = version.as_ref().and_then(ServerVersion::from_info);
            match version {
                Some(v) => eprintln!(
                    "cluster {v}: the proxy is {}",
                    if v.has_native_sidecars() { "a native sidecar" } else { "a regular container" }
                ),
                None => eprintln!(
                    "no cluster version to go by: the proxy is a regular container (--native-sidecars true for ≥ 1.29)"
                ),
            }
            args.native_sidecars.native_for(version)
        }
    };
    let default_inbound_policy = args.default_inbound_policy.unwrap_or_else(|| {
        eprintln!(
            "no --default-inbound-policy: proxies start with `deny` for unannotated pods until the control plane answers"
        );
        DefaultPolicy::Deny
    });
    let config = InjectConfig {
        proxy_image: args.proxy_image,
        native_sidecars,
        trust_anchors_pem,
        default_inbound_policy,
        ..Default::default()
    };
    config.validate()?;
    // Proxies would fail at start on anchors that do not parse: refuse them here instead.
    cnimesh_identity::pem::certs(config.trust_anchors_pem.as_bytes(), "the trust anchors")?;
    for (origin, text) in inputs {
        let rewritten =
            rewrite(&text, &origin, &mut |template, ns, what| inject_template(template, ns, what, &config))?;
        out.write_all(rewritten.as_bytes())?;
    }
    Ok(())
}

pub fn uninject_main(args: UninjectArgs, out: &mut impl Write) -> anyhow::Result<()> {
    for (origin, text) in read_inputs(&args.paths)? {
        out.write_all(rewrite(&text, &origin, &mut |template, _, what| uninject_template(template, what))?.as_bytes())?;
    }
    Ok(())
}

/// The trust anchors `cnimesh install` published in the control plane's namespace.
async fn cluster_anchors(client: Option<kube::Client>) -> anyhow::Result<String> {
    let hint = "pass --identity-trust-anchors-file FILE (the trust anchors' PEM)";
    let client = client.with_context(|| format!("no trust anchors: no cluster is reachable; {hint}"))?;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, DEFAULT_CONTROL_NAMESPACE);
    let map = tokio::time::timeout(CLUSTER_TIMEOUT, api.get(TRUST_ANCHORS_CONFIG_MAP))
        .await
        .map_err(|_| anyhow::anyhow!("the cluster did not answer"))
        .and_then(|r| r.map_err(Into::into))
        .with_context(|| format!("reading ConfigMap {DEFAULT_CONTROL_NAMESPACE}/{TRUST_ANCHORS_CONFIG_MAP}; {hint}"))?;
    map.data
        .and_then(|mut d| d.remove(TRUST_ANCHORS_KEY))
        .with_context(|| format!("ConfigMap {TRUST_ANCHORS_CONFIG_MAP} has no {TRUST_ANCHORS_KEY}; {hint}"))
}

/// `(origin, text)` of every input, in order: stdin for no path or `-`; a directory's YAML and
/// JSON files sorted by name, recursively.
fn read_inputs(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, String)>> {
    if paths.is_empty() || paths.iter().any(|p| p == Path::new("-")) {
        anyhow::ensure!(paths.len() <= 1, "`-` (stdin) cannot be mixed with files");
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("reading stdin")?;
        return Ok(vec![("stdin".into(), text)]);
    }
    let mut files = Vec::new();
    for path in paths {
        collect(path, &mut files)?;
    }
    files
        .into_iter()
        .map(|f| {
            Ok((
                f.display().to_string(),
                std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?,
            ))
        })
        .collect()
}

fn collect(path: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if !path.is_dir() {
        files.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading {}", path.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for entry in entries {
        let yaml = entry.extension().and_then(|e| e.to_str()).is_some_and(|e| ["yaml", "yml", "json"].contains(&e));
        if entry.is_dir() || yaml {
            collect(&entry, files)?;
        }
    }
    Ok(())
}

/// What happened to one pod template, reported on stderr like `deployment/web injected`.
type Edit<'a> = dyn FnMut(&mut Value, &str, &str) -> anyhow::Result<bool> + 'a;

/// Applies `edit` to every pod template of every document of `text`; a document whose
/// templates are all unchanged is kept as written.
fn rewrite(text: &str, origin: &str, edit: &mut Edit<'_>) -> anyhow::Result<String> {
    let mut out = String::new();
    for raw in split_documents(text) {
        let docs = yaml::documents(raw, origin)?;
        let Some(mut doc) = docs.into_iter().next() else {
            out.push_str(raw);
            continue;
        };
        if edit_object(&mut doc, None, edit).with_context(|| format!("{origin}: {}", yaml::describe(&doc)))? {
            let rendered = yaml::render(std::slice::from_ref(&doc));
            // `render` starts each document with `---`; keep the separator the input had.
            let body = rendered.strip_prefix("---\n").unwrap_or(&rendered);
            let separator = raw.lines().next().filter(|l| is_separator(l));
            if let Some(separator) = separator {
                out.push_str(separator);
                out.push('\n');
            }
            out.push_str(body);
        } else {
            out.push_str(raw);
        }
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

fn is_separator(line: &str) -> bool {
    line == "---" || line.starts_with("--- ") || line.starts_with("---\t")
}

/// The documents of a stream as written, each with the `---` line that opens it.
fn split_documents(text: &str) -> Vec<&str> {
    let mut starts = vec![0];
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if offset > 0 && is_separator(line.trim_end_matches(['\n', '\r'])) {
            starts.push(offset);
        }
        offset += line.len();
    }
    starts.push(text.len());
    starts.windows(2).map(|w| &text[w[0]..w[1]]).filter(|d| !d.is_empty()).collect()
}

/// Finds the pod templates of `doc` (recursing into Lists) and edits them; true if any changed.
fn edit_object(doc: &mut Value, namespace: Option<&str>, edit: &mut Edit<'_>) -> anyhow::Result<bool> {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("?").to_string();
    let ns = doc.pointer("/metadata/namespace").and_then(Value::as_str).or(namespace).unwrap_or("default").to_string();
    let what = format!("{}/{name}", kind.to_lowercase());
    let template = match kind.as_str() {
        "List" => {
            let mut changed = false;
            for item in doc.get_mut("items").and_then(Value::as_array_mut).into_iter().flatten() {
                changed |= edit_object(item, Some(&ns), edit)?;
            }
            return Ok(changed);
        }
        "Pod" => Some(doc),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "ReplicationController" | "Job" => {
            doc.pointer_mut("/spec/template")
        }
        "CronJob" => doc.pointer_mut("/spec/jobTemplate/spec/template"),
        _ => return Ok(false),
    };
    match template {
        Some(template) if template.is_object() => edit(template, &ns, &what),
        _ => Ok(false),
    }
}

fn inject_template(template: &mut Value, namespace: &str, what: &str, config: &InjectConfig) -> anyhow::Result<bool> {
    let workload =
        what.split_once('/').filter(|(kind, _)| *kind != "pod").map(|(kind, name)| Workload::new(kind, name));
    // Offline: the namespace's annotation is not known; the configured default stands.
    let ns_default = NamespaceDefault::NotLooked;
    match plan(template, Some(namespace), NamespaceInjection::Enabled, &ns_default, workload.as_ref(), config) {
        Ok(injection) if injection.patch.0.is_empty() => {
            eprintln!("{what} already injected");
            Ok(false)
        }
        Ok(injection) => {
            json_patch::patch(template, &injection.patch).context("applying the injection patch")?;
            eprintln!("{what} injected");
            // The same warnings the webhook hands kubectl.
            for warning in &injection.warnings {
                eprintln!("{what}: {warning}");
            }
            Ok(true)
        }
        Err(Skip::Quietly) => {
            eprintln!("{what} skipped: annotated {INJECT_ANNOTATION}: disabled");
            Ok(false)
        }
        Err(Skip::Warn(why)) => {
            eprintln!("{what} not injected: {why}");
            Ok(false)
        }
        // The webhook would refuse its pods: better said now than as a FailedCreate event later.
        Err(Skip::Refuse(why)) => anyhow::bail!("{what} cannot be injected: {why}"),
    }
}

/// Removes what injection adds: the proxy container (wherever it is), the token and trust-bundle volumes, the
/// `injected` annotation, an `inject: enabled` annotation and the owner labels.
fn uninject_template(template: &mut Value, what: &str) -> anyhow::Result<bool> {
    let mut changed = false;
    for list in ["containers", "initContainers"] {
        if let Some(Value::Array(items)) = template.pointer_mut(&format!("/spec/{list}")) {
            let before = items.len();
            items.retain(|c| c.get("name").and_then(Value::as_str) != Some(PROXY_CONTAINER));
            changed |= items.len() != before;
        }
    }
    if let Some(Value::Array(volumes)) = template.pointer_mut("/spec/volumes") {
        let before = volumes.len();
        let ours = [TOKEN_VOLUME, TRUST_BUNDLE_CONFIG_MAP];
        volumes.retain(|v| !v.get("name").and_then(Value::as_str).is_some_and(|name| ours.contains(&name)));
        changed |= volumes.len() != before;
    }
    if let Some(Value::Object(annotations)) = template.pointer_mut("/metadata/annotations") {
        changed |= annotations.remove(INJECTED_ANNOTATION).is_some();
        if annotations.get(INJECT_ANNOTATION).and_then(Value::as_str) == Some("enabled") {
            annotations.remove(INJECT_ANNOTATION);
            changed = true;
        }
    }
    if let Some(Value::Object(labels)) = template.pointer_mut("/metadata/labels") {
        let before = labels.len();
        labels.retain(|key, _| !key.starts_with(OWNER_LABEL_PREFIX) && key != WORKLOAD_NAMESPACE_LABEL);
        changed |= labels.len() != before;
    }
    // What injection created from nothing goes again: empty lists and maps.
    for pointer in ["/spec/initContainers", "/spec/volumes", "/metadata/annotations", "/metadata/labels", "/metadata"] {
        let empty = template.pointer(pointer).is_some_and(|v| {
            v.as_array().is_some_and(Vec::is_empty) || v.as_object().is_some_and(serde_json::Map::is_empty)
        });
        if empty && let Some((parent, key)) = pointer.rsplit_once('/') {
            let parent = if parent.is_empty() { Some(&mut *template) } else { template.pointer_mut(parent) };
            parent.and_then(Value::as_object_mut).map(|o| o.remove(key));
        }
    }
    eprintln!("{what} {}", if changed { "uninjected" } else { "has no proxy" });
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> InjectConfig {
        let anchor = cnimesh_identity::ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap();
        InjectConfig { trust_anchors_pem: anchor.cert_pem, native_sidecars: true, ..Default::default() }
    }

    const SAMPLE: &str = include_str!("../tests/golden/inject-input.yaml");

    fn inject(text: &str, config: &InjectConfig) -> String {
        rewrite(text, "sample", &mut |t, ns, what| inject_template(t, ns, what, config)).unwrap()
    }

    fn uninject(text: &str) -> String {
        rewrite(text, "sample", &mut |t, _, what| uninject_template(t, what)).unwrap()
    }

    fn proxies(doc: &Value) -> usize {
        let text = doc.to_string();
        text.matches(&format!("\"name\":\"{PROXY_CONTAINER}\"")).count()
    }

    #[test]
    fn every_workload_kind_gets_the_proxy_and_the_rest_is_kept_as_written() {
        let config = config();
        let out = inject(SAMPLE, &config);
        let docs = yaml::documents(&out, "out").unwrap();
        let by_name = |kind: &str, name: &str| {
            docs.iter()
                .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("{kind} {name}"))
        };
        for (kind, name) in [
            ("Deployment", "web"),
            ("StatefulSet", "db"),
            ("DaemonSet", "agent"),
            ("Job", "migrate"),
            ("CronJob", "report"),
            ("Pod", "debug"),
        ] {
            assert_eq!(proxies(by_name(kind, name)), 1, "{kind}/{name}");
        }
        let list = docs.iter().find(|d| d["kind"] == "List").unwrap();
        assert_eq!(proxies(&list["items"][0]), 1, "a Deployment inside a List");
        assert_eq!(proxies(by_name("Deployment", "opted-out")), 0, "inject: disabled is respected");
        assert_eq!(proxies(by_name("Service", "web")), 0);
        // Documents without a pod template, or opted out, are byte for byte what they were, comments too.
        assert!(out.contains("# The web Service: untouched, comment and all."));
        assert!(out.contains("kind: Service"));
        // The anchors travel in the environment, as the webhook puts them.
        assert!(out.contains("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM"));
        // The Deployment's pod gets the same patch as the webhook would give it.
        let web = &by_name("Deployment", "web")["spec"]["template"];
        let init = web["spec"]["initContainers"].as_array().unwrap();
        assert_eq!(init[0]["name"], PROXY_CONTAINER);
        assert_eq!(init[0]["restartPolicy"], "Always");
        assert_eq!(web["metadata"]["annotations"][INJECTED_ANNOTATION], env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn a_workload_the_webhook_would_refuse_fails_the_command_with_the_reason() {
        let text = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\nspec:\n  template:\n    \
                    metadata: {annotations: {config.cnimesh.io/opaque-ports: '5432,http'}}\n    \
                    spec: {containers: [{name: web, image: nginx}]}\n";
        let error = rewrite(text, "sample", &mut |t, ns, what| inject_template(t, ns, what, &config())).unwrap_err();
        let error = format!("{error:#}");
        assert!(error.contains("deployment/web cannot be injected") && error.contains("opaque-ports"), "{error}");
    }

    #[test]
    fn inject_is_idempotent_and_uninject_undoes_it() {
        for native in [true, false] {
            let config = InjectConfig { native_sidecars: native, ..config() };
            let once = inject(SAMPLE, &config);
            assert_eq!(inject(&once, &config), once, "injecting twice changes nothing");
            let back = uninject(&once);
            assert_eq!(yaml::documents(&back, "back").unwrap(), yaml::documents(SAMPLE, "sample").unwrap());
            assert_eq!(uninject(&back), back, "uninjecting twice changes nothing");
        }
    }

    #[test]
    fn golden_output() {
        // Deterministic anchors and mode: the golden file holds a placeholder PEM.
        let config = InjectConfig {
            trust_anchors_pem: "-----BEGIN CERTIFICATE-----\nMIIB...\n-----END CERTIFICATE-----\n".into(),
            native_sidecars: true,
            ..Default::default()
        };
        // The endorsement floor is the injection time: the golden file holds a placeholder.
        let mut after_since = false;
        let out: String = inject(SAMPLE, &config)
            .lines()
            .map(|line| {
                let line = if after_since {
                    format!("{}value: <injection time - 300>", &line[..line.find("value:").unwrap_or(0)])
                } else {
                    line.to_string()
                };
                after_since = line.contains("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_ENDORSED_SINCE");
                line + "\n"
            })
            .collect();
        let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/inject-output.yaml");
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&golden, &out).unwrap();
        }
        let expected = std::fs::read_to_string(&golden).unwrap();
        assert_eq!(out, expected, "UPDATE_GOLDEN=1 cargo nextest run -p cnimesh-control golden_output to refresh");
    }

    #[tokio::test]
    async fn anchors_that_are_not_certificates_are_refused_before_anything_is_printed() {
        let dir = tempfile::tempdir().unwrap();
        let (anchors, manifest) = (dir.path().join("ca.crt"), dir.path().join("pod.yaml"));
        std::fs::write(&anchors, "-----BEGIN CERTIFICATE-----\nMIIB...\n-----END CERTIFICATE-----\n").unwrap();
        std::fs::write(&manifest, "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a}]}\n")
            .unwrap();
        let args = |anchors: &Path| InjectArgs {
            paths: vec![manifest.clone()],
            identity_trust_anchors_file: Some(anchors.to_path_buf()),
            native_sidecars: SidecarMode::Regular,
            proxy_image: DEFAULT_PROXY_IMAGE.into(),
            default_inbound_policy: None,
        };
        let mut out = Vec::new();
        let error = inject_main(&ClusterArgs::default(), args(&anchors), &mut out).await.unwrap_err();
        assert!(format!("{error:#}").contains("the trust anchors"), "{error:#}");
        assert!(out.is_empty());
        std::fs::write(&anchors, config().trust_anchors_pem).unwrap();
        inject_main(&ClusterArgs::default(), args(&anchors), &mut out).await.unwrap();
        assert!(String::from_utf8(out).unwrap().contains(PROXY_CONTAINER));
    }

    #[test]
    fn streams_split_on_document_markers_only() {
        let text = "a: 1\n---\nb: |\n  --- not a marker\n--- # comment\nc: 3\n";
        let docs = split_documents(text);
        assert_eq!(docs, ["a: 1\n", "---\nb: |\n  --- not a marker\n", "--- # comment\nc: 3\n"]);
        assert!(
            rewrite("kind: Pod\nspec: [", "bad.yaml", &mut |_, _, _| Ok(false))
                .unwrap_err()
                .to_string()
                .contains("bad.yaml")
        );
    }
}
