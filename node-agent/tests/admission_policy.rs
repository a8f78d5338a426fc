//! Attack test for the node agent's ValidatingAdmissionPolicy (daemonset/cnimesh-node-admission.yaml).
//!
//! RBAC cannot say "only on my node", so a stolen agent token is held to its node by that policy's
//! CEL alone. Here the policy's own expressions, read from the shipped file, are evaluated by a real
//! CEL runtime (Google's cel-cpp, via the `cel-expr-python` package that scripts/setup.sh installs)
//! in the order the API server uses (tests/vap_eval.py), against admission requests shaped like
//! the API server's: realistic pods and nodes, and the claims a pod-bound token carries.
//! Only the API server is missing; its admission bookkeeping is what vap_eval.py re-implements.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

#[path = "../../tests/src/manifest_check.rs"]
mod manifest_check;

const AGENT: &str = "system:serviceaccount:cnimesh-system:cnimesh-node";
const NODE_NAME_CLAIM: &str = "authentication.kubernetes.io/node-name";
const NOT_READY_TAINT: &str = "cnimesh.io/agent-not-ready";
const UNCAPTURED_LABEL: &str = "cnimesh.io/uncaptured";

/// The ValidatingAdmissionPolicy document, exactly as shipped.
fn shipped_policy() -> Value {
    let path = manifest_check::daemonset_dir().join("cnimesh-node-admission.yaml");
    manifest_check::documents(&path)
        .into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .unwrap_or_else(|| panic!("{}: no ValidatingAdmissionPolicy", path.display()))
}

/// True when python3 and the CEL runtime are installed. Under `CI=true` their absence fails the
/// test (the house rule for missing prerequisites); elsewhere it is skipped, loudly.
fn require_cel_runtime(test: &str) -> bool {
    let probe = Command::new("python3").args(["-c", "from cel_expr_python import cel"]).output();
    let why = match probe {
        Ok(out) if out.status.success() => return true,
        Ok(out) => format!("python3 cannot import cel_expr_python ({})", String::from_utf8_lossy(&out.stderr).trim()),
        Err(e) => format!("python3 is not runnable ({e})"),
    };
    let why = format!("{why}; run scripts/setup.sh");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: {why}; CI=true, so this is a failure, not a skip");
    }
    eprintln!("\n!!! SKIPPED {test}: {why}. !!!\n");
    false
}

/// What the API server would answer to one admission request.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// The policy does not judge this request (not the agent, or not a covered operation).
    NotJudged,
    Allowed,
    /// Denied; the messages of the failing validations.
    Denied(Vec<String>),
}

/// Runs tests/vap_eval.py on `cases` (name, request, object, oldObject) under `policy`.
fn decide(policy: Option<&Value>, cases: &[Case]) -> Vec<Verdict> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vap_eval.py");
    let query = json!({
        "policy": policy,
        "cases": cases.iter().map(|c| json!({
            "name": c.name, "request": c.request, "object": c.object, "oldObject": c.old_object,
        })).collect::<Vec<_>>(),
    });
    let mut child = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", script.display()));
    child.stdin.take().expect("stdin").write_all(query.to_string().as_bytes()).expect("writing the cases");
    let out = child.wait_with_output().expect("vap_eval.py output");
    assert!(out.status.success(), "vap_eval.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let answers: Vec<Value> = serde_json::from_slice(&out.stdout).expect("vap_eval.py answers JSON");
    assert_eq!(answers.len(), cases.len(), "one answer per case");
    answers
        .iter()
        .zip(cases)
        .map(|(a, c)| {
            assert_eq!(a["name"], c.name, "answers in case order");
            match (a["matched"].as_bool(), a["allowed"].as_bool()) {
                (Some(false), Some(true)) => Verdict::NotJudged,
                (Some(true), Some(true)) => Verdict::Allowed,
                (Some(true), Some(false)) => Verdict::Denied(
                    a["messages"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|m| m.as_str().map(String::from))
                        .collect(),
                ),
                _ => panic!("unexpected answer {a}"),
            }
        })
        .collect()
}

/// One admission request and what must come of it.
struct Case {
    name: &'static str,
    request: Value,
    object: Value,
    old_object: Value,
    expect: Expect,
}

#[derive(Debug)]
enum Expect {
    NotJudged,
    Allowed,
    /// Denied, with a message containing this text.
    DeniedSaying(&'static str),
}

/// The user of a pod-bound token of the agent's pod on `node`, as the API server fills it in.
fn agent_on(node: &str) -> Value {
    json!({
        "username": AGENT,
        "uid": "5d1f3c1e-6a52-4a8e-9a5e-0b7b3c2d4e6f",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:cnimesh-system", "system:authenticated"],
        "extra": {
            "authentication.kubernetes.io/credential-id": ["JTI=7c9b2a54-2f1e-4c8a-8d0e-3f6a1b9c5e21"],
            NODE_NAME_CLAIM: [node],
            "authentication.kubernetes.io/node-uid": [format!("{node}-uid")],
            "authentication.kubernetes.io/pod-name": [format!("cnimesh-node-{node}")],
            "authentication.kubernetes.io/pod-uid": ["0e6d1c9b-3a2f-4b7e-8c5d-9f1a2b3c4d5e"],
        },
    })
}

/// The agent's ServiceAccount through a token without the node-name claim (a legacy Secret token).
fn agent_without_node_claim() -> Value {
    json!({
        "username": AGENT,
        "uid": "5d1f3c1e-6a52-4a8e-9a5e-0b7b3c2d4e6f",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:cnimesh-system", "system:authenticated"],
    })
}

/// A meshed workload pod scheduled on `node`.
fn pod(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "shop",
            "uid": format!("{name}-uid"),
            "resourceVersion": "48213",
            "labels": {"app": "checkout", "pod-template-hash": "7d9f8b6c5"},
            "annotations": {"cnimesh.io/inject": "enabled"},
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "checkout-7d9f8b6c5",
                "uid": "b3a1f0e2-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": "checkout",
            "containers": [{"name": "app", "image": "registry.example/checkout:1.4.2", "ports": [{"containerPort": 8080}]}],
            "initContainers": [{"name": "cnimesh-proxy", "image": "cnimesh/proxy:0.1", "restartPolicy": "Always"}],
        },
        "status": {"phase": "Running", "podIP": "10.244.1.17"},
    })
}

/// A node with the agent's not-ready taint and the usual kubelet-set metadata.
fn node(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": format!("{name}-uid"),
            "resourceVersion": "90127",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "podCIDR": "10.244.1.0/24",
            "podCIDRs": ["10.244.1.0/24"],
            "providerID": format!("kind://docker/kind/{name}"),
            "taints": [
                {"key": "dedicated", "value": "payments", "effect": "NoSchedule"},
                {"key": NOT_READY_TAINT, "effect": "NoSchedule"},
            ],
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    })
}

/// `node` without the agent's taint: what its readiness patch produces.
fn without_not_ready_taint(mut node: Value) -> Value {
    node["spec"]["taints"].as_array_mut().unwrap().retain(|t| t["key"] != NOT_READY_TAINT);
    node
}

fn request(user: &Value, operation: &str, resource: &str, kind: &str, obj: &Value) -> Value {
    let gvr = json!({"group": "", "version": "v1", "resource": resource});
    let gvk = json!({"group": "", "version": "v1", "kind": kind});
    let mut r = json!({
        "uid": "2f0e1d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
        "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": obj["metadata"]["name"],
        "operation": operation,
        "userInfo": user,
        "dryRun": false,
        "options": if operation == "DELETE" {
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"})
        } else {
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PatchOptions", "fieldManager": "cnimesh-node"})
        },
    });
    if let Some(ns) = obj["metadata"].get("namespace") {
        r["namespace"] = ns.clone();
    }
    r
}

fn delete(name: &'static str, user: Value, resource: &str, kind: &str, old: Value, expect: Expect) -> Case {
    // On DELETE the API server passes no `object`; `oldObject` is the object as it is.
    Case { name, request: request(&user, "DELETE", resource, kind, &old), object: Value::Null, old_object: old, expect }
}

fn update(name: &'static str, user: Value, resource: &str, kind: &str, old: Value, new: Value, expect: Expect) -> Case {
    // A patch reaches admission as an UPDATE carrying the patched object.
    Case { name, request: request(&user, "UPDATE", resource, kind, &new), object: new, old_object: old, expect }
}

/// Every attack a stolen agent token could try, and what the agent itself must still be allowed.
fn cases() -> Vec<Case> {
    use Expect::*;
    let a = || agent_on("node-a");
    let pod_a = || pod("checkout-a", "node-a");
    let pod_b = || pod("checkout-b", "node-b");
    let with = |mut v: Value, pointer: &str, value: Value| {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        v.pointer_mut(parent).unwrap_or_else(|| panic!("{parent}"))[key] = value;
        v
    };
    let uncaptured = |p: Value| {
        let mut p = p;
        p["metadata"]["labels"][UNCAPTURED_LABEL] = json!("true");
        p
    };
    let own_pods_only = "only pods scheduled on its own node";
    let pod_label_only = "may only set the cnimesh.io/uncaptured label";
    let own_node_only = "may change only its own node";
    let taint_only = "may only remove the cnimesh.io/agent-not-ready taint";
    let no_claim = "no node-name claim";
    vec![
        // Attacks from node A's token.
        delete("node A deletes a pod on node B", a(), "pods", "Pod", pod_b(), DeniedSaying(own_pods_only)),
        delete(
            "node A deletes a pending pod (no nodeName yet)",
            a(),
            "pods",
            "Pod",
            {
                let mut p = pod("pending", "x");
                p["spec"].as_object_mut().unwrap().remove("nodeName");
                p
            },
            DeniedSaying(own_pods_only),
        ),
        update(
            "node A labels a pod on node B uncaptured",
            a(),
            "pods",
            "Pod",
            pod_b(),
            uncaptured(pod_b()),
            DeniedSaying(own_pods_only),
        ),
        update(
            "node A changes another label of its own pod",
            a(),
            "pods",
            "Pod",
            pod_a(),
            with(pod_a(), "/metadata/labels/app", json!("payments")),
            DeniedSaying(pod_label_only),
        ),
        update(
            "node A removes a label of its own pod",
            a(),
            "pods",
            "Pod",
            pod_a(),
            {
                let mut p = pod_a();
                p["metadata"]["labels"].as_object_mut().unwrap().remove("app");
                p
            },
            DeniedSaying(pod_label_only),
        ),
        update(
            "node A adds an annotation to its own pod",
            a(),
            "pods",
            "Pod",
            pod_a(),
            with(pod_a(), "/metadata/annotations/cnimesh.io~1inject", json!("disabled")),
            DeniedSaying(pod_label_only),
        ),
        update(
            "node A swaps its own pod's image",
            a(),
            "pods",
            "Pod",
            pod_a(),
            with(pod_a(), "/spec/containers/0/image", json!("attacker.example/backdoor:1")),
            DeniedSaying(pod_label_only),
        ),
        update(
            "node A adds a finalizer to its own pod",
            a(),
            "pods",
            "Pod",
            pod_a(),
            with(pod_a(), "/metadata/finalizers", json!(["attacker.example/never"])),
            DeniedSaying(pod_label_only),
        ),
        update(
            "node A removes the not-ready taint of node B",
            a(),
            "nodes",
            "Node",
            node("node-b"),
            without_not_ready_taint(node("node-b")),
            DeniedSaying(own_node_only),
        ),
        update(
            "node A adds a taint to its own node",
            a(),
            "nodes",
            "Node",
            node("node-a"),
            {
                let mut n = node("node-a");
                n["spec"]["taints"].as_array_mut().unwrap().push(json!({"key": "evict", "effect": "NoExecute"}));
                n
            },
            DeniedSaying(taint_only),
        ),
        update(
            "node A adds a second not-ready taint to its own node",
            a(),
            "nodes",
            "Node",
            node("node-a"),
            {
                let mut n = node("node-a");
                n["spec"]["taints"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"key": NOT_READY_TAINT, "effect": "NoExecute"}));
                n
            },
            DeniedSaying(taint_only),
        ),
        update(
            "node A removes another taint of its own node",
            a(),
            "nodes",
            "Node",
            node("node-a"),
            {
                let mut n = node("node-a");
                n["spec"]["taints"].as_array_mut().unwrap().retain(|t| t["key"] != "dedicated");
                n
            },
            DeniedSaying(taint_only),
        ),
        update(
            "node A changes a label of its own node",
            a(),
            "nodes",
            "Node",
            node("node-a"),
            with(node("node-a"), "/metadata/labels/node-role.kubernetes.io~1control-plane", json!("")),
            DeniedSaying(taint_only),
        ),
        update(
            "node A cordons its own node",
            a(),
            "nodes",
            "Node",
            node("node-a"),
            with(node("node-a"), "/spec/unschedulable", json!(true)),
            DeniedSaying(taint_only),
        ),
        update(
            // The garbage collector deletes an object whose owners are all gone: an invented owner
            // would delete the Node, which the policy never allows directly.
            "node A gives its own node an owner that does not exist",
            a(),
            "nodes",
            "Node",
            node("node-a"),
            with(
                node("node-a"),
                "/metadata/ownerReferences",
                json!([{"apiVersion": "v1", "kind": "Namespace", "name": "gone", "uid": "00000000-0000-0000-0000-000000000000"}]),
            ),
            DeniedSaying(taint_only),
        ),
        update(
            "node A adds a finalizer to its own node",
            a(),
            "nodes",
            "Node",
            node("node-a"),
            with(node("node-a"), "/metadata/finalizers", json!(["attacker.example/never"])),
            DeniedSaying(taint_only),
        ),
        delete("node A deletes its own node", a(), "nodes", "Node", node("node-a"), DeniedSaying(own_node_only)),
        delete(
            "a token without the node-name claim deletes a pod",
            agent_without_node_claim(),
            "pods",
            "Pod",
            pod_a(),
            DeniedSaying(no_claim),
        ),
        delete(
            "a token with two node-name claims deletes a pod",
            {
                let mut u = agent_on("node-a");
                u["extra"][NODE_NAME_CLAIM] = json!(["node-a", "node-b"]);
                u
            },
            "pods",
            "Pod",
            pod_a(),
            DeniedSaying(no_claim),
        ),
        update(
            "a token without the node-name claim removes the taint",
            agent_without_node_claim(),
            "nodes",
            "Node",
            node("node-a"),
            without_not_ready_taint(node("node-a")),
            DeniedSaying(no_claim),
        ),
        // What the agent does on its own node.
        delete("node A deletes its own pod", a(), "pods", "Pod", pod_a(), Allowed),
        update("node A labels its own pod uncaptured", a(), "pods", "Pod", pod_a(), uncaptured(pod_a()), Allowed),
        update(
            "node A clears the uncaptured label of its own pod",
            a(),
            "pods",
            "Pod",
            uncaptured(pod_a()),
            pod_a(),
            Allowed,
        ),
        update(
            "node A removes its own not-ready taint",
            a(),
            "nodes",
            "Node",
            node("node-a"),
            without_not_ready_taint(node("node-a")),
            Allowed,
        ),
        // Other users are not this policy's business.
        delete(
            "the ReplicaSet controller deletes a pod on node B",
            json!({"username": "system:serviceaccount:kube-system:replicaset-controller", "groups": ["system:serviceaccounts"]}),
            "pods",
            "Pod",
            pod_b(),
            NotJudged,
        ),
        update(
            "a node's kubelet patches its node",
            json!({"username": "system:node:node-b", "groups": ["system:nodes", "system:authenticated"]}),
            "nodes",
            "Node",
            node("node-b"),
            with(node("node-b"), "/metadata/labels/topology.kubernetes.io~1zone", json!("b")),
            NotJudged,
        ),
    ]
}

#[test]
fn a_stolen_node_agent_token_cannot_touch_another_nodes_pods_or_taints() {
    let test = "a_stolen_node_agent_token_cannot_touch_another_nodes_pods_or_taints";
    if !require_cel_runtime(test) {
        return;
    }
    let policy = shipped_policy();
    let cases = cases();
    let verdicts = decide(Some(&policy), &cases);
    let mut wrong = Vec::new();
    for (case, verdict) in cases.iter().zip(&verdicts) {
        let ok = match (&case.expect, verdict) {
            (Expect::NotJudged, Verdict::NotJudged) | (Expect::Allowed, Verdict::Allowed) => true,
            (Expect::DeniedSaying(text), Verdict::Denied(messages)) => messages.iter().any(|m| m.contains(text)),
            _ => false,
        };
        if !ok {
            wrong.push(format!("{}: expected {:?}, got {verdict:?}", case.name, case.expect));
        }
    }
    assert!(wrong.is_empty(), "the admission policy decided wrongly:\n{}", wrong.join("\n"));
}

/// The evaluator itself follows the API server where the shipped policy relies on it: an
/// expression that errors denies under `failurePolicy: Fail` (and only then), and a false
/// matchCondition leaves the request alone. Otherwise the test above could pass on an evaluator
/// that allowed what the API server denies, or the reverse.
#[test]
fn an_expression_that_errors_denies_only_when_the_policy_fails_closed() {
    let test = "an_expression_that_errors_denies_only_when_the_policy_fails_closed";
    if !require_cel_runtime(test) {
        return;
    }
    let policy = |failure_policy: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "probe"},
            "spec": {
                "failurePolicy": failure_policy,
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["*"], "operations": ["DELETE"], "resources": ["pods"],
                }]},
                "matchConditions": [{"name": "agent", "expression": format!("request.userInfo.username == '{AGENT}'")}],
                "variables": [{"name": "broken", "expression": "request.userInfo.extra['no-such-claim'][0]"}],
                "validations": [
                    {"expression": "oldObject.spec.noSuchField == 'x'", "message": "field error"},
                    {"expression": "variables.broken == 'x'", "message": "variable error"},
                ],
            },
        })
    };
    let cases = [
        delete("the agent", agent_on("node-a"), "pods", "Pod", pod("p", "node-a"), Expect::Allowed),
        delete(
            "someone else",
            json!({"username": "system:serviceaccount:shop:checkout"}),
            "pods",
            "Pod",
            pod("p", "node-a"),
            Expect::NotJudged,
        ),
    ];
    let fail = decide(Some(&policy("Fail")), &cases);
    match &fail[0] {
        Verdict::Denied(messages) => {
            assert!(messages.iter().any(|m| m.starts_with("field error (expression error")), "{messages:?}");
            assert!(messages.iter().any(|m| m.starts_with("variable error (expression error")), "{messages:?}");
        }
        other => panic!("an erroring validation under Fail must deny, got {other:?}"),
    }
    assert_eq!(fail[1], Verdict::NotJudged, "a false matchCondition skips the policy");
    let ignore = decide(Some(&policy("Ignore")), &cases);
    assert_eq!(ignore[0], Verdict::Allowed, "under Ignore an erroring validation does not deny");
}
