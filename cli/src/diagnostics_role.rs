//! The shipped ClusterRole `cnimesh-diagnostics` (daemonset/control-plane.yaml) lets a user who
//! holds nothing else run every `cnimesh diagnostics` and `cnimesh authz` command: each command
//! runs against the mocked API server enforcing that role's rules, as the API server's RBAC
//! authorizer would, and no request may be refused. The rules the docs used to list are refused
//! some of them (the broken state the test also holds).

use serde_json::{Value, json};

use crate::authz::{self, AuthzArgs};
use crate::check::mock::MockApi;
use crate::diagnostics::fetch::{Reach, Target};
use crate::diagnostics::{self, Page};

const POLICY: &str = "/apis/policy.cnimesh.io/v1alpha1/namespaces/shop";
const ADMIN: &str = "/api/v1/namespaces/shop/pods/web-1:4191/proxy";

/// The rules of the shipped ClusterRole.
fn shipped_rules() -> Vec<Value> {
    let role = crate::manifests::documents()
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "cnimesh-diagnostics")
        .expect("daemonset/ ships the ClusterRole cnimesh-diagnostics");
    role["rules"].as_array().unwrap().clone()
}

/// What docs/tasks/diagnostics.md granted before the role was shipped.
fn documented_before() -> Vec<Value> {
    vec![
        json!({"apiGroups": [""], "resources": ["pods", "pods/proxy"], "verbs": ["get", "list"]}),
        json!({"apiGroups": [""], "resources": ["services/proxy"], "verbs": ["get"]}),
        json!({"apiGroups": ["policy.cnimesh.io"], "resources": ["*"], "verbs": ["list"]}),
        json!({"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes", "grpcroutes"], "verbs": ["list"]}),
    ]
}

fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items})
}

fn pod(name: &str, app: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": app}},
        "spec": {"serviceAccountName": app, "containers": [
            {"name": "app", "image": "app:1", "ports": [{"containerPort": 8080}]},
            {"name": "cnimesh-proxy", "image": "proxy:1", "ports": [{"containerPort": 4191}]}]},
        "status": {"phase": "Running", "podIP": "10.244.0.11"},
    })
}

fn deployment(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "shop"},
        "spec": {"selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}}},
    })
}

/// A namespace with two meshed workloads, a Service and empty policy and route lists.
fn cluster(rules: Vec<Value>) -> MockApi {
    let mut api = MockApi::default();
    api.rbac = Some(rules);
    api.get("/api/v1/namespaces/shop", json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}))
        .get("/api/v1/namespaces/shop/pods", list(vec![pod("web-1", "web"), pod("client-1", "client")]))
        .get("/api/v1/namespaces/shop/pods/web-1", pod("web-1", "web"))
        .get(
            "/api/v1/namespaces/shop/services",
            list(vec![json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
                             "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})]),
        )
        .get(
            "/api/v1/namespaces/shop/services/web",
            json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": {"ports": [{"port": 80}]}}),
        )
        .get(
            "/api/v1/namespaces/cnimesh/services/cnimesh-control:admin/proxy/destination.json",
            json!({"authority": "web.shop:80", "endpoints": []}),
        )
        .get("/apis/apps/v1/namespaces/shop/deployments/web", deployment("web"))
        .get("/apis/apps/v1/namespaces/shop/deployments/client", deployment("client"))
        .get(&format!("{ADMIN}/policy.json"), json!({"ports": []}))
        .get(&format!("{ADMIN}/identity.json"), json!({"configured": false}))
        .get(&format!("{ADMIN}/endpoints.json"), json!({"discovery": true, "profiles": [], "services": []}))
        .get_text(&format!("{ADMIN}/metrics"), "# EOF\n");
    for kind in [
        "servers",
        "authorizationpolicies",
        "meshtlsauthentications",
        "networkauthentications",
        "httplocalratelimitpolicies",
    ] {
        api.get(&format!("{POLICY}/{kind}"), list(vec![]));
    }
    for kind in ["httproutes", "grpcroutes"] {
        api.get(&format!("/apis/gateway.networking.k8s.io/v1/namespaces/shop/{kind}"), list(vec![]));
    }
    api
}

/// Every diagnostics and authz command, run as the holder of `rules`: the requests refused, and
/// the commands' errors.
async fn refused(rules: Vec<Value>) -> (Vec<String>, Vec<String>) {
    let api = cluster(rules);
    let mut errors = Vec::new();
    let mut note = |what: &str, result: Result<String, crate::query_error::QueryError>| {
        if let Err(e) = result {
            errors.push(format!("{what}: {e:#}"));
        }
    };
    let reach = Reach::Cluster(api.client());
    let pod = Target::parse("web-1").unwrap();
    for page in [Page::Policy, Page::Identity, Page::Endpoints, Page::Metrics] {
        note(page.path(), diagnostics::report(&reach, page, &pod, "shop", None, diagnostics::Output::Json).await);
    }
    let service = Target::parse("svc/web").unwrap();
    note(
        "endpoints svc/web",
        diagnostics::report(&reach, Page::Endpoints, &service, "shop", Some(80), diagnostics::Output::Json).await,
    );
    let args = |resource: &str, from: Option<&str>| AuthzArgs {
        resource: resource.into(),
        namespace: "shop".into(),
        identity: None,
        from: from.map(Into::into),
        from_namespace: None,
        trust_domain: "cluster.local".into(),
        output: authz::Output::Table,
        local: None,
    };
    let client = api.client();
    for args in [args("deploy/web", None), args("deploy/web", Some("deploy/client")), args("ns/shop", None)] {
        note(&format!("authz {} --from {:?}", args.resource, args.from), authz::report(&client, &args).await);
    }
    let refused = api.forbidden.lock().clone();
    (refused, errors)
}

#[tokio::test]
async fn a_user_holding_only_the_diagnostics_role_runs_every_diagnostics_and_authz_command() {
    let (refused, errors) = refused(shipped_rules()).await;
    assert_eq!(refused, Vec::<String>::new(), "the shipped role is refused these requests");
    assert_eq!(errors, Vec::<String>::new(), "every command ran through");
}

#[tokio::test]
async fn the_permissions_the_docs_listed_before_are_refused_some_requests() {
    let (refused, errors) = refused(documented_before()).await;
    assert!(refused.iter().any(|r| r.contains("namespaces")), "{refused:?}");
    assert!(refused.iter().any(|r| r.contains("/services web")), "{refused:?}");
    assert!(errors.len() >= 3, "{errors:#?}");
}

#[test]
fn the_diagnostics_role_only_reads() {
    for rule in shipped_rules() {
        let verbs: Vec<&str> = rule["verbs"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        assert!(verbs.iter().all(|v| ["get", "list"].contains(v)), "{rule}");
        assert!(!rule["resources"].as_array().unwrap().iter().any(|r| r == "secrets" || r == "*"), "{rule}");
    }
}
