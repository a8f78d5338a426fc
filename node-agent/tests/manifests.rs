//! Checks the operator manifests in `daemonset/` (repository root).
//!
//! Every document of every `*.yaml` file is parsed with serde-saphyr into a `serde_json::Value`,
//! deserialised into the typed k8s-openapi struct for its `kind`, serialised back, and compared
//! with the original. k8s-openapi silently drops fields it does not know, so a misspelt field name
//! (`hostNetwrok: true`) makes the round trip differ and fails the test — the API server would
//! have dropped it the same way (or rejected it), and the operator would never notice.
//!
//! On top of that strictness check, the properties the node agent relies on are asserted
//! (hostNetwork, tolerations, priority, probes, capabilities, RBAC, service account).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

#[path = "../../tests/src/manifest_check.rs"]
mod manifest_check;

/// The node agent's manifests; the control plane's have their own test (control/tests).
fn yaml_files() -> Vec<PathBuf> {
    manifest_check::yaml_files(|name| !name.starts_with("control"))
}

/// The strictness check (`manifest_check::strict`) for the kinds this file holds.
fn check_document(doc: &Value) -> Result<Manifest, String> {
    let kind = doc.get("kind").and_then(Value::as_str).ok_or("document has no string `kind`")?;
    let manifest = match kind {
        "Namespace" => Manifest::Namespace(Box::new(manifest_check::strict(doc)?)),
        "ServiceAccount" => Manifest::ServiceAccount(Box::new(manifest_check::strict(doc)?)),
        "ClusterRole" => Manifest::ClusterRole(Box::new(manifest_check::strict(doc)?)),
        "ClusterRoleBinding" => Manifest::ClusterRoleBinding(Box::new(manifest_check::strict(doc)?)),
        "DaemonSet" => Manifest::DaemonSet(Box::new(manifest_check::strict(doc)?)),
        "ValidatingAdmissionPolicy" => Manifest::Policy(Box::new(manifest_check::strict(doc)?)),
        "ValidatingAdmissionPolicyBinding" => Manifest::PolicyBinding(Box::new(manifest_check::strict(doc)?)),
        other => return Err(format!("unknown kind {other:?} (teach node-agent/tests/manifests.rs about it)")),
    };
    Ok(manifest)
}

/// A manifest document that survived the strict round trip.
#[derive(Debug)]
enum Manifest {
    Namespace(Box<Namespace>),
    ServiceAccount(Box<ServiceAccount>),
    ClusterRole(Box<ClusterRole>),
    ClusterRoleBinding(Box<ClusterRoleBinding>),
    DaemonSet(Box<DaemonSet>),
    Policy(Box<ValidatingAdmissionPolicy>),
    PolicyBinding(Box<ValidatingAdmissionPolicyBinding>),
}

/// Loads one file: every document must pass the strictness check.
fn load_file(path: &Path) -> Vec<Manifest> {
    let mut manifests = Vec::new();
    let mut errors = String::new();
    for (i, doc) in manifest_check::documents(path).iter().enumerate() {
        let what = manifest_check::describe(path, i, doc);
        match check_document(doc) {
            Ok(m) => manifests.push(m),
            Err(e) => {
                let _ = writeln!(errors, "{what}: {e}");
            }
        }
    }
    assert!(errors.is_empty(), "manifest errors:\n{errors}");
    manifests
}

#[test]
fn every_manifest_round_trips_through_k8s_openapi_and_is_sound() {
    let files = yaml_files();
    assert!(!files.is_empty(), "no *.yaml in {}", manifest_check::daemonset_dir().display());
    let mut agent_daemonsets = 0;
    for path in &files {
        let manifests = load_file(path);
        assert!(!manifests.is_empty(), "{}: no documents", path.display());
        check_file(path, &manifests);
        agent_daemonsets += manifests
            .iter()
            .filter(|m| matches!(m, Manifest::DaemonSet(ds) if ds.metadata.name.as_deref() == Some("cnimesh-node")))
            .count();
    }
    assert_eq!(agent_daemonsets, 1, "exactly one cnimesh-node DaemonSet across {files:?}");
}

fn check_file(path: &Path, manifests: &[Manifest]) {
    let file = path.display();
    let service_accounts: BTreeSet<(String, String)> = manifests
        .iter()
        .filter_map(|m| match m {
            Manifest::ServiceAccount(sa) => {
                Some((sa.metadata.namespace.clone().unwrap_or_default(), sa.metadata.name.clone().unwrap_or_default()))
            }
            _ => None,
        })
        .collect();
    let namespaces: BTreeSet<String> = manifests
        .iter()
        .filter_map(|m| match m {
            Manifest::Namespace(ns) => ns.metadata.name.clone(),
            _ => None,
        })
        .collect();

    for m in manifests {
        match m {
            Manifest::ClusterRole(role) => check_cluster_role(&file.to_string(), role),
            Manifest::DaemonSet(ds) => check_daemonset(&file.to_string(), ds, &service_accounts, &namespaces),
            Manifest::ClusterRoleBinding(binding) => {
                for s in binding.subjects.iter().flatten().filter(|s| s.kind == "ServiceAccount") {
                    let key = (s.namespace.clone().unwrap_or_default(), s.name.clone());
                    assert!(
                        service_accounts.contains(&key),
                        "{file}: ClusterRoleBinding {:?} binds ServiceAccount {key:?}, not defined in this file",
                        binding.metadata.name
                    );
                }
            }
            Manifest::Namespace(_) | Manifest::ServiceAccount(_) | Manifest::Policy(_) | Manifest::PolicyBinding(_) => {
            }
        }
    }
}

/// The agent's admission policy: bound, failing closed, on the agent's own ServiceAccount, and
/// covering every verb its ClusterRole grants beyond reading. What the expressions must mention is
/// checked here; tests/admission_policy.rs evaluates them against attack requests.
#[test]
fn the_node_agents_admission_policy_scopes_its_writes_to_its_own_node() {
    let path = manifest_check::daemonset_dir().join("cnimesh-node-admission.yaml");
    let manifests = load_file(&path);
    let policy = manifests
        .iter()
        .find_map(|m| match m {
            Manifest::Policy(p) => Some(p),
            _ => None,
        })
        .expect("a ValidatingAdmissionPolicy");
    let binding = manifests
        .iter()
        .find_map(|m| match m {
            Manifest::PolicyBinding(b) => Some(b),
            _ => None,
        })
        .expect("its binding");
    let name = policy.metadata.name.clone().unwrap();
    let bspec = binding.spec.as_ref().unwrap();
    assert_eq!(bspec.policy_name.as_deref(), Some(name.as_str()), "the binding binds the policy");
    assert_eq!(bspec.validation_actions.as_deref(), Some(&["Deny".to_string()][..]), "violations are denied");
    assert!(bspec.param_ref.is_none() && bspec.match_resources.is_none(), "bound everywhere, without params");

    let spec = policy.spec.as_ref().unwrap();
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"), "an evaluation error denies");
    let rules = spec.match_constraints.as_ref().and_then(|m| m.resource_rules.clone()).unwrap_or_default();
    for (resource, operation) in [("pods", "DELETE"), ("pods", "UPDATE"), ("nodes", "UPDATE"), ("nodes", "DELETE")] {
        assert!(
            rules.iter().any(|r| r.resources.iter().flatten().any(|x| x == resource)
                && r.operations.iter().flatten().any(|o| o == operation)
                && r.api_groups.iter().flatten().any(|g| g.is_empty())),
            "the policy does not cover {operation} {resource}"
        );
    }
    // Only the agent's requests are judged, and by its real ServiceAccount (from cnimesh-node.yaml).
    let agent = load_file(&manifest_check::daemonset_dir().join("cnimesh-node.yaml"))
        .into_iter()
        .find_map(|m| match m {
            Manifest::ServiceAccount(sa) => {
                Some(format!("system:serviceaccount:{}:{}", sa.metadata.namespace?, sa.metadata.name?))
            }
            _ => None,
        })
        .expect("the agent's ServiceAccount");
    let conditions = spec.match_conditions.clone().unwrap_or_default();
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].expression, format!("request.userInfo.username == '{agent}'"));

    let variables: String = spec.variables.iter().flatten().map(|v| v.expression.clone()).collect();
    assert!(variables.contains("request.userInfo.extra['authentication.kubernetes.io/node-name']"), "{variables}");
    let validations: Vec<String> = spec.validations.iter().flatten().map(|v| v.expression.clone()).collect();
    let all = validations.join("\n");
    assert!(validations.iter().any(|v| v == "variables.nodeName != ''"), "a token without the claim is refused");
    for needle in [
        "oldObject.spec.nodeName == variables.nodeName",
        "object.metadata.name == variables.nodeName",
        "object.spec == oldObject.spec",
    ] {
        assert!(all.contains(needle), "no validation says {needle:?}:\n{all}");
    }
    // The taint and label the agent writes, spelt as its source spells them.
    let source = manifest_check::source_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    for (constant, value) in
        [("NOT_READY_TAINT", "cnimesh.io/agent-not-ready"), ("UNCAPTURED_LABEL", "cnimesh.io/uncaptured")]
    {
        assert!(source.contains(&format!("{constant}: &str = \"{value}\"")), "{constant} is no longer {value}");
        assert!(all.contains(&format!("'{value}'")), "the policy does not name {value}");
    }
    for v in spec.validations.iter().flatten() {
        assert!(v.message.as_deref().is_some_and(|m| m.starts_with("cnimesh-node")), "{v:?} says why");
    }
}

fn check_cluster_role(file: &str, role: &ClusterRole) {
    let name = role.metadata.name.as_deref().unwrap_or("?");
    let rules = role.rules.as_deref().unwrap_or_default();
    assert!(role.aggregation_rule.is_none(), "{file}: ClusterRole {name} must not aggregate other roles");
    for rule in rules {
        let lists = [
            ("verbs", Some(&rule.verbs)),
            ("resources", rule.resources.as_ref()),
            ("apiGroups", rule.api_groups.as_ref()),
        ];
        for (what, list) in lists {
            assert!(
                !list.is_some_and(|l| l.iter().any(|s| s.contains('*'))),
                "{file}: ClusterRole {name} grants `*` {what}: {rule:?}"
            );
        }
        assert!(rule.non_resource_urls.is_none(), "{file}: ClusterRole {name} grants non-resource URLs: {rule:?}");
    }
    if name == "cnimesh-node" {
        let grants = |group: &str, resource: &str, verb: &str| {
            rules.iter().any(|r| {
                r.api_groups.iter().flatten().any(|g| g == group)
                    && r.resources.iter().flatten().any(|res| res == resource)
                    && r.verbs.iter().any(|v| v == verb)
            })
        };
        for (group, resource, verb) in [
            ("", "pods", "get"),
            ("", "pods", "list"),
            ("", "pods", "watch"),
            ("", "pods", "delete"),
            ("", "events", "create"),
            ("", "nodes", "get"),
            ("", "nodes", "patch"),
        ] {
            assert!(grants(group, resource, verb), "{file}: ClusterRole cnimesh-node lacks {verb} {resource:?}");
        }
        // Pod `patch` only serves CNIMESH_REPAIR=label; the shipped default deletes.
        assert!(!grants("", "pods", "patch"), "{file}: ClusterRole cnimesh-node grants pod patch in delete mode");
        // Least privilege: nothing beyond what the agent does.
        let allowed: BTreeSet<&str> = ["pods", "events", "nodes"].into();
        for r in rules {
            for res in r.resources.iter().flatten() {
                assert!(allowed.contains(res.as_str()), "{file}: ClusterRole cnimesh-node grants {res:?}");
            }
            for v in &r.verbs {
                assert!(
                    ["get", "list", "watch", "delete", "patch", "create"].contains(&v.as_str()),
                    "{file}: ClusterRole cnimesh-node grants verb {v:?}"
                );
            }
        }
    }
}

fn check_daemonset(
    file: &str,
    ds: &DaemonSet,
    service_accounts: &BTreeSet<(String, String)>,
    namespaces: &BTreeSet<String>,
) {
    let name = ds.metadata.name.as_deref().unwrap_or("?");
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let ctx = format!("{file}: DaemonSet {ns}/{name}");
    assert!(namespaces.contains(&ns), "{ctx}: namespace {ns:?} is not created in this file");

    let spec = ds.spec.as_ref().unwrap_or_else(|| panic!("{ctx}: no spec"));
    let selector = spec.selector.match_labels.clone().unwrap_or_default();
    assert!(!selector.is_empty(), "{ctx}: empty selector");
    let template_labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    for (k, v) in &selector {
        assert_eq!(template_labels.get(k), Some(v), "{ctx}: selector {k}={v} does not match the pod template labels");
    }

    let pod = spec.template.spec.as_ref().unwrap_or_else(|| panic!("{ctx}: no pod spec"));
    assert_eq!(pod.host_network, Some(true), "{ctx}: must use hostNetwork (docs/architecture.md, lesson 3)");
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"), "{ctx}: dnsPolicy");
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"), "{ctx}: priorityClassName");
    let tolerates_everything =
        pod.tolerations.iter().flatten().any(|t| {
            t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none() && t.value.is_none()
        });
    assert!(tolerates_everything, "{ctx}: must tolerate every taint (a bare `operator: Exists`)");

    let sa = pod.service_account_name.clone().unwrap_or_else(|| panic!("{ctx}: no serviceAccountName"));
    assert!(
        service_accounts.contains(&(ns.clone(), sa.clone())),
        "{ctx}: ServiceAccount {ns}/{sa} is not defined in the same file"
    );

    let volumes: BTreeSet<&str> = pod.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
    for c in pod.init_containers.iter().flatten().chain(&pod.containers) {
        let cctx = format!("{ctx} container {}", c.name);
        check_container(&cctx, c);
        for m in c.volume_mounts.iter().flatten() {
            assert!(volumes.contains(m.name.as_str()), "{cctx}: mounts undefined volume {:?}", m.name);
        }
    }

    if name == "cnimesh-node" {
        assert_eq!(pod.containers.len(), 1, "{ctx}: one container");
        let c = &pod.containers[0];
        let probe_path = c.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref()).and_then(|h| h.path.as_deref());
        assert_eq!(probe_path, Some("/ready"), "{ctx}: readiness probe path");
        let live_path = c.liveness_probe.as_ref().and_then(|p| p.http_get.as_ref()).and_then(|h| h.path.as_deref());
        assert_eq!(live_path, Some("/live"), "{ctx}: liveness probe path");
        let seccomp = |p: Option<&k8s_openapi::api::core::v1::SeccompProfile>| p.map(|p| p.type_.clone());
        let pod_seccomp = seccomp(pod.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref()));
        assert_eq!(pod_seccomp.as_deref(), Some("RuntimeDefault"), "{ctx}: pod seccompProfile");
        let c_seccomp = seccomp(c.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref()));
        assert_eq!(c_seccomp.as_deref(), Some("RuntimeDefault"), "{ctx}: container seccompProfile");
        let ready_addr = env_value(c, "CNIMESH_READY_ADDR").unwrap_or("127.0.0.1:4192");
        // hostNetwork: every address would include the pod network's gateway (any pod could
        // read the agent's status and metrics); the node's own address is what its clients dial.
        assert!(
            !ready_addr.starts_with("0.0.0.0:") && !ready_addr.starts_with("[::]:"),
            "{ctx}: the admin listener must not be open on every address: {ready_addr}"
        );
        let ready_port: i32 =
            ready_addr.rsplit(':').next().and_then(|p| p.parse().ok()).expect("CNIMESH_READY_ADDR port");
        for probe in [&c.readiness_probe, &c.liveness_probe] {
            let port = probe.as_ref().and_then(|p| p.http_get.as_ref()).map(|h| &h.port);
            assert_eq!(port, Some(&IntOrString::Int(ready_port)), "{ctx}: probes must hit CNIMESH_READY_ADDR");
        }
        let node_name =
            c.env.iter().flatten().find(|e| e.name == "NODE_NAME").unwrap_or_else(|| panic!("{ctx}: no NODE_NAME"));
        let field = node_name.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).map(|f| f.field_path.as_str());
        assert_eq!(field, Some("spec.nodeName"), "{ctx}: NODE_NAME must come from the downward API spec.nodeName");
        assert_eq!(
            c.command.as_deref(),
            Some(&["/usr/local/bin/cnimesh-node".to_string(), "run".to_string()][..]),
            "{ctx}: command"
        );
        check_env_names_known(&ctx, c);
    }
}

fn env_value<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.as_deref())
}

fn check_container(ctx: &str, c: &Container) {
    let sc = c.security_context.as_ref().unwrap_or_else(|| panic!("{ctx}: no securityContext"));
    assert_ne!(sc.privileged, Some(true), "{ctx}: must not run privileged");
    assert_eq!(sc.allow_privilege_escalation, Some(false), "{ctx}: allowPrivilegeEscalation");
    assert_eq!(sc.read_only_root_filesystem, Some(true), "{ctx}: readOnlyRootFilesystem");
    let caps = sc.capabilities.as_ref().unwrap_or_else(|| panic!("{ctx}: no capabilities"));
    assert!(caps.drop.iter().flatten().any(|d| d == "ALL"), "{ctx}: must drop ALL capabilities");
    for add in caps.add.iter().flatten() {
        assert!(
            ["NET_ADMIN", "SYS_ADMIN", "DAC_OVERRIDE"].contains(&add.as_str()),
            "{ctx}: unexpected capability {add}"
        );
    }
}

/// A misspelt env name is invisible to Kubernetes: every `CNIMESH_*` / `NODE_NAME` variable the
/// manifest sets must be one the agent's source actually reads.
fn check_env_names_known(ctx: &str, c: &Container) {
    let source = manifest_check::source_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    // A variable only there to be expanded into another's value (`$(HOST_IP)`) is used by the kubelet.
    let expanded = |name: &str| {
        c.env.iter().flatten().any(|e| e.value.as_deref().is_some_and(|v| v.contains(&format!("$({name})"))))
    };
    for e in c.env.iter().flatten().filter(|e| !expanded(&e.name)) {
        assert!(
            source.contains(&format!("\"{}\"", e.name)),
            "{ctx}: env {} is not read anywhere in node-agent/src",
            e.name
        );
    }
}

mod strictness {
    use super::*;

    const DAEMONSET: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: example
  namespace: default
spec:
  selector:
    matchLabels:
      app: example
  template:
    metadata:
      labels:
        app: example
    spec:
      hostNetwork: true
      terminationGracePeriodSeconds: 30
      containers:
        - name: example
          image: example:1
          ports:
            - containerPort: 4192
          readinessProbe:
            httpGet:
              path: /ready
              port: 4192
            periodSeconds: 5
"#;

    fn single(yaml: &str) -> Value {
        let mut docs = manifest_check::parse(yaml).expect("parses");
        assert_eq!(docs.len(), 1);
        docs.remove(0)
    }

    #[test]
    fn a_correct_document_passes_with_integers_intact() {
        let doc = single(DAEMONSET);
        assert_eq!(doc.pointer("/spec/template/spec/terminationGracePeriodSeconds"), Some(&Value::from(30)));
        let Manifest::DaemonSet(ds) = check_document(&doc).expect("valid DaemonSet") else { panic!("not a DaemonSet") };
        assert_eq!(ds.spec.unwrap().template.spec.unwrap().host_network, Some(true));
    }

    #[test]
    fn a_misspelt_field_is_rejected() {
        let doc = single(&DAEMONSET.replace("hostNetwork: true", "hostNetwrok: true"));
        let err = check_document(&doc).expect_err("typo must be rejected");
        assert!(err.contains("/spec/template/spec/hostNetwrok"), "{err}");
    }

    #[test]
    fn a_misspelt_nested_field_in_a_list_is_rejected() {
        let doc = single(&DAEMONSET.replace("periodSeconds: 5", "periodSecond: 5"));
        let err = check_document(&doc).expect_err("typo must be rejected");
        assert!(err.contains("/spec/template/spec/containers/0/readinessProbe/periodSecond"), "{err}");
    }

    #[test]
    fn a_wrongly_typed_value_is_rejected() {
        let doc = single(&DAEMONSET.replace("hostNetwork: true", "hostNetwork: \"yes\""));
        check_document(&doc).expect_err("a string is not a bool");
    }

    #[test]
    fn an_unknown_kind_is_rejected() {
        let doc = single("apiVersion: v1\nkind: ConfigMapp\nmetadata:\n  name: x\n");
        let err = check_document(&doc).expect_err("unknown kind");
        assert!(err.contains("ConfigMapp"), "{err}");
    }

    #[test]
    fn a_duplicated_key_is_rejected_by_the_parser() {
        let yaml = DAEMONSET.replace("hostNetwork: true", "hostNetwork: true\n      hostNetwork: false");
        manifest_check::parse(&yaml).expect_err("duplicate key must not be silently resolved");
    }

    #[test]
    fn multi_document_files_split_and_skip_empty_documents() {
        let yaml = "# comment only\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n---\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n";
        let docs = manifest_check::parse(yaml).expect("parses");
        let names: Vec<_> = docs.iter().map(|d| d.pointer("/metadata/name").and_then(Value::as_str).unwrap()).collect();
        assert_eq!(names, ["a", "b"]);
        for d in &docs {
            check_document(d).expect("valid Namespace");
        }
    }
}
