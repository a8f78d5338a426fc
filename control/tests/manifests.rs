//! Checks the control plane's manifests, `daemonset/control-*.yaml` (repository root).
//!
//! Every document is deserialised into its typed k8s-openapi struct and serialised back; the
//! result must equal the document. k8s-openapi drops fields it does not know, so a misspelt field
//! (which the API server would drop or reject just as silently) fails here. Then the properties
//! the control plane and the webhook rely on are asserted: flags and variables that exist, probe
//! ports, the webhook paths the handler serves, exact RBAC.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use cnimesh_common::names::{CONTROL_ADMIN_PORT, CONTROL_NAMESPACE, TAP_SERVICE_ACCOUNT};
use cnimesh_control::inject::{INJECT_PATH, OPT_IN_PATH};
use cnimesh_model::inject::{CONTROL_NAME, CONTROL_PORT, WEBHOOK_SERVICE};
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

#[derive(Default)]
struct Manifests {
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    namespaced_roles: Vec<Role>,
    namespaced_bindings: Vec<RoleBinding>,
    services: Vec<Service>,
    budgets: Vec<PodDisruptionBudget>,
    deployments: Vec<Deployment>,
    webhooks: Vec<MutatingWebhookConfiguration>,
}

#[path = "../../tests/src/manifest_check.rs"]
mod manifest_check;

use manifest_check::strict;

fn load() -> Manifests {
    let mut m = Manifests::default();
    let mut errors = Vec::new();
    for path in manifest_check::yaml_files(|name| name.starts_with("control-")) {
        for doc in manifest_check::documents(&path) {
            let kind = doc["kind"].as_str().unwrap_or("?").to_string();
            let result = match kind.as_str() {
                "Namespace" => strict(&doc).map(|t| m.namespaces.push(t)),
                "ServiceAccount" => strict(&doc).map(|t| m.service_accounts.push(t)),
                "ClusterRole" => strict(&doc).map(|t| m.roles.push(t)),
                "ClusterRoleBinding" => strict(&doc).map(|t| m.bindings.push(t)),
                "Role" => strict(&doc).map(|t| m.namespaced_roles.push(t)),
                "RoleBinding" => strict(&doc).map(|t| m.namespaced_bindings.push(t)),
                "Service" => strict(&doc).map(|t| m.services.push(t)),
                "PodDisruptionBudget" => strict(&doc).map(|t| m.budgets.push(t)),
                "Deployment" => strict(&doc).map(|t| m.deployments.push(t)),
                "MutatingWebhookConfiguration" => strict(&doc).map(|t| m.webhooks.push(t)),
                // Generated from the Rust types and checked against them by tests/policy_crds.rs.
                "CustomResourceDefinition" => strict::<CustomResourceDefinition>(&doc).map(drop),
                other => Err(format!("unknown kind {other:?} (teach control/tests/manifests.rs about it)")),
            };
            if let Err(e) = result {
                errors.push(format!(
                    "{} {kind} {}:\n  {e}",
                    path.display(),
                    doc.pointer("/metadata/name").unwrap_or(&Value::Null)
                ));
            }
        }
    }
    assert!(errors.is_empty(), "manifest errors:\n{}", errors.join("\n"));
    m
}

/// All of control/src and model/src (where the webhook's flags, `WebhookArgs`, live beside the
/// mutation they configure), for "is this flag / variable read anywhere".
fn control_source() -> String {
    let control = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_check::source_of(&control.join("src")) + &manifest_check::source_of(&control.join("../model/src"))
}

fn env<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.as_deref())
}

fn port_of(addr: &str) -> i32 {
    addr.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{addr}: no port"))
}

fn control_deployment(m: &Manifests) -> (&Deployment, &Container) {
    let d = m.deployments.iter().find(|d| d.metadata.name.as_deref() == Some(CONTROL_NAME)).expect("the Deployment");
    let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.containers.len(), 1);
    (d, &pod.containers[0])
}

#[test]
fn every_document_round_trips_through_k8s_openapi() {
    load();
}

#[test]
fn the_deployment_only_uses_flags_and_variables_that_exist() {
    let m = load();
    let source = control_source();
    let (_, c) = control_deployment(&m);
    for e in c.env.iter().flatten() {
        assert!(
            source.contains(&format!("\"{}\"", e.name)),
            "env {} is not read anywhere in control/src or model/src",
            e.name
        );
    }
    let args = c.args.as_deref().unwrap_or_default();
    assert_eq!(args.first().map(String::as_str), Some("serve"));
    for flag in args.iter().filter_map(|a| a.strip_prefix("--")) {
        let field = flag.split('=').next().unwrap().replace('-', "_");
        assert!(
            source.contains(&format!("    {field}: ")),
            "flag --{flag} is not a field of a clap struct in control/src or model/src"
        );
    }
}

#[test]
fn the_deployment_is_highly_available_locked_down_and_probed_on_the_admin_port() {
    let m = load();
    let (d, c) = control_deployment(&m);
    let ns = d.metadata.namespace.as_deref().unwrap();
    assert!(m.namespaces.iter().any(|n| n.metadata.name.as_deref() == Some(ns)), "namespace {ns} not created");
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.as_ref().unwrap();
    let anti = pod.affinity.as_ref().and_then(|a| a.pod_anti_affinity.as_ref()).expect("pod anti-affinity");
    let terms = anti.preferred_during_scheduling_ignored_during_execution.iter().flatten();
    assert!(terms.into_iter().any(|t| t.pod_affinity_term.topology_key == "kubernetes.io/hostname"));
    assert_ne!(pod.host_network, Some(true));

    let sc = c.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert!(caps.add.is_none());
    assert!(c.resources.as_ref().and_then(|r| r.requests.as_ref()).is_some(), "resource requests");

    let admin = port_of(env(c, "CNIMESH_CONTROL_ADMIN_ADDR").unwrap_or("0.0.0.0:9990"));
    assert_eq!(admin, 9990);
    for (probe, path) in [(&c.readiness_probe, "/ready"), (&c.liveness_probe, "/live")] {
        let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("HTTP probe");
        assert_eq!((get.path.as_deref(), &get.port), (Some(path), &IntOrString::Int(admin)));
    }

    // Secrets mounted where the flags say.
    let volumes: BTreeMap<&str, &str> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| Some((v.name.as_str(), v.secret.as_ref()?.secret_name.as_deref()?)))
        .collect();
    let mounted = |dir_var: &str| {
        let dir = env(c, dir_var).unwrap_or_else(|| panic!("{dir_var} not set"));
        let mount = c.volume_mounts.iter().flatten().find(|m| m.mount_path == dir).expect("mounted");
        volumes[mount.name.as_str()]
    };
    assert_eq!(mounted("CNIMESH_CONTROL_ISSUER_DIR"), "cnimesh-identity-issuer");
    assert_eq!(mounted("CNIMESH_CONTROL_WEBHOOK_TLS_DIR"), "cnimesh-webhook-tls");

    let sa = pod.service_account_name.as_deref().unwrap();
    assert!(
        m.service_accounts
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some(sa) && s.metadata.namespace.as_deref() == Some(ns))
    );
    let bound = m.bindings.iter().any(|b| {
        b.role_ref.name == CONTROL_NAME
            && b.subjects.iter().flatten().any(|s| s.name == sa && s.namespace.as_deref() == Some(ns))
    });
    assert!(bound, "ClusterRole {CONTROL_NAME} is bound to {ns}/{sa}");
    let pdb = m.budgets.iter().find(|b| b.metadata.namespace.as_deref() == Some(ns)).expect("a PodDisruptionBudget");
    let labels = spec.template.metadata.as_ref().unwrap().labels.clone().unwrap();
    let pdb_selector = pdb.spec.as_ref().unwrap().selector.as_ref().unwrap().match_labels.clone().unwrap();
    assert!(pdb_selector.iter().all(|(k, v)| labels.get(k) == Some(v)));
}

/// The Service `name` selects the control plane's pods and maps `port` to `target`.
fn check_service(m: &Manifests, name: &str, port: i32, target: i32) {
    let (d, c) = control_deployment(m);
    let svc = m
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("Service {name}"));
    assert_eq!(svc.metadata.namespace, d.metadata.namespace);
    let spec = svc.spec.as_ref().unwrap();
    let labels = d.spec.as_ref().unwrap().template.metadata.as_ref().unwrap().labels.clone().unwrap();
    assert!(spec.selector.iter().flatten().all(|(k, v)| labels.get(k) == Some(v)), "{name} selects the pods");
    let p = spec.ports.iter().flatten().find(|p| p.port == port).unwrap_or_else(|| panic!("{name} port {port}"));
    assert_eq!(p.target_port, Some(IntOrString::Int(target)));
    assert!(c.ports.iter().flatten().any(|cp| cp.container_port == target), "container port {target}");
}

#[test]
fn services_reach_the_listeners() {
    let m = load();
    let (_, c) = control_deployment(&m);
    let grpc = port_of(env(c, "CNIMESH_CONTROL_ADDR").unwrap_or("0.0.0.0:4190"));
    check_service(&m, CONTROL_NAME, i32::from(CONTROL_PORT), grpc);
    let webhook = port_of(env(c, "CNIMESH_CONTROL_WEBHOOK_ADDR").expect("the webhook listens"));
    check_service(&m, WEBHOOK_SERVICE, 443, webhook);
    // `cnimesh tap` reaches the relay at services/cnimesh-control:admin/proxy/tap.
    let admin = port_of(env(c, "CNIMESH_CONTROL_ADMIN_ADDR").unwrap_or("0.0.0.0:9990"));
    assert_eq!(admin, i32::from(CONTROL_ADMIN_PORT));
    check_service(&m, CONTROL_NAME, admin, admin);
    let svc = m.services.iter().find(|s| s.metadata.name.as_deref() == Some(CONTROL_NAME)).unwrap();
    let named = svc.spec.as_ref().unwrap().ports.iter().flatten().find(|p| p.port == admin).unwrap();
    assert_eq!(named.name.as_deref(), Some("admin"), "the port name the tap command uses");
}

fn selector_values(w: &MutatingWebhook, key: &str) -> (String, Vec<String>) {
    let exprs = w.namespace_selector.as_ref().and_then(|s| s.match_expressions.as_ref()).expect("matchExpressions");
    let e = exprs.iter().find(|e| e.key == key).unwrap_or_else(|| panic!("{}: no selector on {key}", w.name));
    (e.operator.clone(), e.values.clone().unwrap_or_default())
}

#[test]
fn the_webhook_calls_the_paths_the_handler_serves_with_the_right_policies() {
    let m = load();
    assert_eq!(m.webhooks.len(), 1);
    let (d, _) = control_deployment(&m);
    let ns = d.metadata.namespace.clone().unwrap();
    let entries = m.webhooks[0].webhooks.as_deref().unwrap_or_default();
    let mut paths = BTreeSet::new();
    for w in entries {
        let svc = w.client_config.service.as_ref().expect("a Service, not a URL");
        assert_eq!((svc.name.as_str(), svc.namespace.as_str(), svc.port), (WEBHOOK_SERVICE, ns.as_str(), Some(443)));
        assert!(w.client_config.url.is_none());
        let path = svc.path.clone().unwrap_or_default();
        paths.insert(path.clone());
        assert_eq!(w.side_effects, "None");
        assert_eq!(w.admission_review_versions, ["v1"]);
        assert!(w.timeout_seconds.is_some_and(|t| (1..=10).contains(&t)));
        assert!(w.object_selector.is_none(), "injection is decided per pod by its annotation");
        let rules = w.rules.as_deref().unwrap_or_default();
        assert_eq!(rules.len(), 1);
        let r = &rules[0];
        assert_eq!(r.operations.as_deref(), Some(&["CREATE".to_string()][..]));
        assert_eq!(r.resources.as_deref(), Some(&["pods".to_string()][..]));
        assert_eq!(r.api_groups.as_deref(), Some(&[String::new()][..]));
        let (op, never) = selector_values(w, "kubernetes.io/metadata.name");
        assert_eq!(op, "NotIn");
        assert_eq!(
            never,
            ["kube-system".to_string(), ns.clone()],
            "{}: never kube-system or the control plane",
            w.name
        );
        let (op, values) = selector_values(w, "cnimesh.io/inject");
        assert_eq!(values, ["enabled"]);
        match path.as_str() {
            INJECT_PATH => {
                assert_eq!(op, "In", "{INJECT_PATH} answers for labelled namespaces");
                assert_eq!(w.failure_policy.as_deref(), Some("Fail"), "labelled namespaces fail closed");
            }
            OPT_IN_PATH => {
                assert_eq!(op, "NotIn", "{OPT_IN_PATH} answers for all other namespaces");
                assert_eq!(w.failure_policy.as_deref(), Some("Ignore"), "never block the whole cluster");
            }
            other => panic!("{}: path {other:?} is not served by the webhook", w.name),
        }
    }
    assert_eq!(paths, [INJECT_PATH.to_string(), OPT_IN_PATH.to_string()].into());
}

/// The ClusterRole operators are given for `cnimesh diagnostics` and `cnimesh authz`.
const DIAGNOSTICS_ROLE: &str = "cnimesh-diagnostics";

#[test]
fn rbac_grants_exactly_what_the_control_plane_uses() {
    let m = load();
    // The operators' read-only diagnostics ClusterRole is bound to no one by the install (its
    // grants are tested in cli/src/diagnostics_role.rs); the control plane's is the other one.
    let roles: Vec<&ClusterRole> =
        m.roles.iter().filter(|r| r.metadata.name.as_deref() != Some(DIAGNOSTICS_ROLE)).collect();
    assert_eq!(roles.len(), 1);
    assert!(
        !m.bindings.iter().any(|b| b.role_ref.name == DIAGNOSTICS_ROLE),
        "the diagnostics ClusterRole is bound by the operator, never by the install"
    );
    let role = roles[0];
    assert!(role.aggregation_rule.is_none());
    // Resource names are part of the grant: the caBundle patch reaches one configuration only.
    let rules = role.rules.iter().flatten().map(|r| (r, None)).chain(
        m.namespaced_roles
            .iter()
            .filter(|r| r.metadata.name.as_deref() != Some(TAP_SERVICE_ACCOUNT))
            .flat_map(|r| r.rules.iter().flatten().map(|rule| (rule, r.metadata.namespace.clone()))),
    );
    // Every namespaced Role but the operators' tap Role (checked in its own test) is bound to the control
    // plane's ServiceAccount in its namespace.
    for role in m.namespaced_roles.iter().filter(|r| r.metadata.name.as_deref() != Some(TAP_SERVICE_ACCOUNT)) {
        let bound = m.namespaced_bindings.iter().any(|b| {
            b.role_ref.kind == "Role"
                && Some(&b.role_ref.name) == role.metadata.name.as_ref()
                && b.metadata.namespace == role.metadata.namespace
                && b.subjects.iter().flatten().any(|s| s.kind == "ServiceAccount" && s.name == CONTROL_NAME)
        });
        assert!(bound, "Role {:?} is bound", role.metadata.name);
    }
    assert_eq!(grants_of(rules), expected_control_grants());
}

/// `scope:group/resource[names]:verb` for every grant of `rules` (scope: a Role's namespace).
fn grants_of<'a>(rules: impl Iterator<Item = (&'a PolicyRule, Option<String>)>) -> BTreeSet<String> {
    let mut grants = BTreeSet::new();
    for (rule, namespace) in rules {
        assert!(rule.non_resource_urls.is_none());
        let names = rule.resource_names.as_ref().map(|n| format!("[{}]", n.join(","))).unwrap_or_default();
        let scope = namespace.map(|ns| format!("{ns}:")).unwrap_or_default();
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    grants.insert(format!("{scope}{group}/{resource}{names}:{verb}"));
                }
            }
        }
    }
    grants
}

#[test]
fn the_tap_role_grants_a_token_for_the_tap_account_and_the_relay_only_and_is_bound_to_nobody() {
    let m = load();
    let (d, _) = control_deployment(&m);
    let ns = d.metadata.namespace.clone().unwrap();
    assert_eq!(ns, CONTROL_NAMESPACE);
    let sa = m
        .service_accounts
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(TAP_SERVICE_ACCOUNT))
        .expect("the tap ServiceAccount");
    assert_eq!(sa.metadata.namespace.as_deref(), Some(ns.as_str()));
    assert_eq!(sa.automount_service_account_token, Some(false), "no pod runs as it");
    let role = m
        .namespaced_roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(TAP_SERVICE_ACCOUNT))
        .expect("the tap Role");
    let grants = grants_of(role.rules.iter().flatten().map(|r| (r, role.metadata.namespace.clone())));
    let expected: BTreeSet<String> = [
        format!("{ns}:/serviceaccounts/token[{TAP_SERVICE_ACCOUNT}]:create"),
        format!("{ns}:/services/proxy[{CONTROL_NAME}:admin]:get"),
    ]
    .into();
    assert_eq!(grants, expected);
    let bound = m.namespaced_bindings.iter().any(|b| b.role_ref.name == TAP_SERVICE_ACCOUNT)
        || m.bindings.iter().any(|b| b.role_ref.name == TAP_SERVICE_ACCOUNT);
    assert!(!bound, "operators bind it to whom may tap");
}

fn expected_control_grants() -> BTreeSet<String> {
    [
        "/services:get",
        "/services:list",
        "/services:watch",
        "/pods:get",
        "/pods:list",
        "/pods:watch",
        "discovery.k8s.io/endpointslices:get",
        "discovery.k8s.io/endpointslices:list",
        "discovery.k8s.io/endpointslices:watch",
        "authentication.k8s.io/tokenreviews:create",
        // The endorsed trust bundle in every namespace: applied (patch) under its one name; a
        // create cannot be limited to a name.
        "/configmaps:create",
        "/configmaps[cnimesh-trust-bundle]:patch",
        "/namespaces:get",
        "/namespaces:list",
        "/namespaces:watch",
        "policy.cnimesh.io/servers:get",
        "policy.cnimesh.io/servers:list",
        "policy.cnimesh.io/servers:watch",
        "policy.cnimesh.io/authorizationpolicies:get",
        "policy.cnimesh.io/authorizationpolicies:list",
        "policy.cnimesh.io/authorizationpolicies:watch",
        "policy.cnimesh.io/meshtlsauthentications:get",
        "policy.cnimesh.io/meshtlsauthentications:list",
        "policy.cnimesh.io/meshtlsauthentications:watch",
        "policy.cnimesh.io/networkauthentications:get",
        "policy.cnimesh.io/networkauthentications:list",
        "policy.cnimesh.io/networkauthentications:watch",
        // Rate limiting
        "policy.cnimesh.io/httplocalratelimitpolicies:get",
        "policy.cnimesh.io/httplocalratelimitpolicies:list",
        "policy.cnimesh.io/httplocalratelimitpolicies:watch",
        // Egress
        "policy.cnimesh.io/egressnetworks:get",
        "policy.cnimesh.io/egressnetworks:list",
        "policy.cnimesh.io/egressnetworks:watch",
        "gateway.networking.k8s.io/tlsroutes:get",
        "gateway.networking.k8s.io/tlsroutes:list",
        "gateway.networking.k8s.io/tlsroutes:watch",
        "gateway.networking.k8s.io/tcproutes:get",
        "gateway.networking.k8s.io/tcproutes:list",
        "gateway.networking.k8s.io/tcproutes:watch",
        // ExternalWorkloads
        "workload.cnimesh.io/externalworkloads:get",
        "workload.cnimesh.io/externalworkloads:list",
        "workload.cnimesh.io/externalworkloads:watch",
        "gateway.networking.k8s.io/httproutes:get",
        "gateway.networking.k8s.io/httproutes:list",
        "gateway.networking.k8s.io/httproutes:watch",
        "gateway.networking.k8s.io/grpcroutes:get",
        "gateway.networking.k8s.io/grpcroutes:list",
        "gateway.networking.k8s.io/grpcroutes:watch",
        "gateway.networking.k8s.io/referencegrants:get",
        "gateway.networking.k8s.io/referencegrants:list",
        "gateway.networking.k8s.io/referencegrants:watch",
        "admissionregistration.k8s.io/mutatingwebhookconfigurations[cnimesh-proxy-injector]:get",
        "admissionregistration.k8s.io/mutatingwebhookconfigurations[cnimesh-proxy-injector]:patch",
        "cnimesh:coordination.k8s.io/leases:get",
        "cnimesh:coordination.k8s.io/leases:create",
        "cnimesh:coordination.k8s.io/leases:update",
        // The webhook's Secret, by name: no other Secret of the namespace (the Links'
        // credentials are the mirror's alone).
        "cnimesh:/secrets:create",
        "cnimesh:/secrets[cnimesh-webhook-tls]:get",
        "cnimesh:/secrets[cnimesh-webhook-tls]:list",
        "cnimesh:/secrets[cnimesh-webhook-tls]:watch",
        "cnimesh:/secrets[cnimesh-webhook-tls]:update",
        // The join tokens' Secret, by name: read and used up by Identity.
        "cnimesh:/secrets[cnimesh-join-tokens]:get",
        "cnimesh:/secrets[cnimesh-join-tokens]:update",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

mod strictness {
    use super::*;

    #[test]
    fn a_misspelt_field_is_caught_and_integers_compare_by_value() {
        let good: Value = serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
            "spec": {"ports": [{"port": 443, "targetPort": 8443}]}});
        strict::<Service>(&good).unwrap();
        let mut bad = good.clone();
        bad["spec"]["ports"][0]["targetPrt"] = Value::from(8443);
        let e = strict::<Service>(&bad).unwrap_err();
        assert!(e.contains("/spec/ports/0/targetPrt"), "{e}");
        let mut odd = good;
        odd["spec"]["clusterIP"] = Value::from(7);
        assert!(strict::<Service>(&odd).is_err(), "a number is not a string");
    }
}
