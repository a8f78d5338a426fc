//! RBAC, when enforced: a service account's token may do only what the Roles and ClusterRoles
//! bound to it grant (by verb, API group, resource and subresource, name and namespace), is
//! answered 403 with a Kubernetes `Status` otherwise and changes nothing; its own access reviews
//! answer truthfully; the admin token may still do everything; not enforced, nothing changes.

use cnimesh_apiserver::{ClusterApi, Served};
use serde_json::{Value, json};

const TOKEN: &str = "admin-token";

/// A kube client for `served` that trusts its CA and sends `token`.
fn client(served: &Served, token: &str) -> kube::Client {
    let mut config = kube::Config::new(served.server().parse().unwrap());
    let ca = cnimesh_identity::pem::certs(served.ca_pem.as_bytes(), "the server's CA").unwrap();
    config.root_cert = Some(ca.into_iter().map(|c| c.to_vec()).collect());
    config.auth_info.token = Some(token.to_string().into());
    kube::Client::try_from(config).unwrap()
}

/// The status code of `method path` with `body`, and the answer's `Status` when refused.
async fn call(client: &kube::Client, method: &str, path: &str, body: Value) -> (u16, Option<kube::core::Status>) {
    let content_type = if method == "PATCH" { "application/merge-patch+json" } else { "application/json" };
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    match client.request_text(request).await {
        Ok(_) => (200, None),
        Err(kube::Error::Api(status)) => (status.code, Some(*status)),
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

async fn code(client: &kube::Client, method: &str, path: &str, body: Value) -> u16 {
    call(client, method, path, body).await.0
}

/// A cluster with the mirror's kind of roles: `cnimesh/mirror` may read Links, patch their
/// status, read the Secret `link-west` (only), and write EndpointSlices everywhere (through its
/// ClusterRole); `cnimesh/control` may only read EndpointSlices.
fn cluster() -> std::sync::Arc<ClusterApi> {
    let api = ClusterApi::new();
    for object in [
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "mirror", "namespace": "cnimesh"}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "control", "namespace": "cnimesh"}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "link-west", "namespace": "cnimesh"}, "data": {"k": "dg=="}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "issuer", "namespace": "cnimesh"}, "data": {"k": "dg=="}}),
        json!({"apiVersion": "multicluster.cnimesh.io/v1alpha1", "kind": "Link", "metadata": {"name": "west", "namespace": "cnimesh"}, "spec": {}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "mirror", "namespace": "cnimesh"},
        "rules": [
            {"apiGroups": ["multicluster.cnimesh.io"], "resources": ["links"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["multicluster.cnimesh.io"], "resources": ["links/status"], "verbs": ["patch"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"], "resourceNames": ["link-west"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "mirror", "namespace": "cnimesh"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mirror"},
            "subjects": [{"kind": "ServiceAccount", "name": "mirror"}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "slices-write"},
            "rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["*"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "mirror"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "slices-write"},
            "subjects": [{"kind": "ServiceAccount", "name": "mirror", "namespace": "cnimesh"}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "slices-read"},
            "rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "control"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "slices-read"},
            "subjects": [{"kind": "Group", "name": "system:serviceaccounts:cnimesh"}]}),
    ] {
        api.put(object);
    }
    api.require_token(TOKEN);
    api.enforce_rbac(true);
    api
}

fn slice(name: &str) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": name},
        "addressType": "IPv4", "endpoints": []})
}

#[tokio::test]
async fn a_service_accounts_token_may_do_only_what_its_roles_grant() {
    let api = cluster();
    let served = api.serve().await;
    let mirror = client(&served, &api.issue_token("cnimesh", "mirror", &[]).unwrap());
    let slices = "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices";
    assert_eq!(code(&mirror, "POST", slices, slice("web-west")).await, 200, "a ClusterRole's grant, any namespace");
    assert_eq!(code(&mirror, "GET", "/api/v1/namespaces/cnimesh/secrets/link-west", Value::Null).await, 200);
    assert_eq!(
        code(&mirror, "GET", "/api/v1/namespaces/cnimesh/secrets/issuer", Value::Null).await,
        403,
        "another Secret than the one named"
    );
    assert_eq!(code(&mirror, "GET", "/api/v1/namespaces/cnimesh/secrets", Value::Null).await, 403, "a list of them");
    assert_eq!(code(&mirror, "GET", "/api/v1/namespaces/shop/secrets/link-west", Value::Null).await, 403, "elsewhere");
    let links = "/apis/multicluster.cnimesh.io/v1alpha1/namespaces/cnimesh/links";
    assert_eq!(code(&mirror, "GET", links, Value::Null).await, 200);
    let status = json!({"status": {"state": "up"}});
    assert_eq!(code(&mirror, "PATCH", &format!("{links}/west/status"), status.clone()).await, 200, "links/status");
    assert_eq!(
        code(&mirror, "PATCH", &format!("{links}/west"), json!({"spec": {"x": 1}})).await,
        403,
        "the Link itself"
    );
    assert_eq!(code(&mirror, "DELETE", &format!("{links}/west"), Value::Null).await, 403);
    assert_eq!(code(&mirror, "POST", "/api/v1/namespaces/shop/services", json!({})).await, 403, "no Service write");
    // Discovery is open to every authenticated caller.
    assert_eq!(code(&mirror, "GET", "/apis", Value::Null).await, 200);
    assert!(api.get("multicluster.cnimesh.io/v1alpha1", "Link", "cnimesh", "west").unwrap()["spec"].get("x").is_none());
}

#[tokio::test]
async fn a_refused_request_is_a_403_kubernetes_status_naming_the_account_and_changes_nothing() {
    let api = cluster();
    let served = api.serve().await;
    let control = client(&served, &api.issue_token("cnimesh", "control", &[]).unwrap());
    let slices = "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices";
    assert_eq!(code(&control, "GET", slices, Value::Null).await, 200, "granted to its namespace's group");
    let (code, status) = call(&control, "POST", slices, slice("planted")).await;
    assert_eq!(code, 403);
    let status = status.unwrap();
    assert_eq!(status.reason, "Forbidden");
    assert!(
        status.message.contains("system:serviceaccount:cnimesh:control")
            && status.message.contains("create")
            && status.message.contains("endpointslices"),
        "{}",
        status.message
    );
    assert!(api.get("discovery.k8s.io/v1", "EndpointSlice", "shop", "planted").is_none());
}

#[tokio::test]
async fn the_admin_token_may_do_everything_with_rbac_enforced() {
    let api = cluster();
    let served = api.serve().await;
    let admin = client(&served, TOKEN);
    assert_eq!(code(&admin, "GET", "/api/v1/namespaces/cnimesh/secrets/issuer", Value::Null).await, 200);
    assert_eq!(code(&admin, "POST", "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices", slice("a")).await, 200);
}

#[tokio::test]
async fn a_self_subject_access_review_answers_by_the_callers_roles() {
    let api = cluster();
    let served = api.serve().await;
    let review = |token: String, verb: &str, resource: &str, subresource: &str, name: &str| {
        let client = client(&served, &token);
        let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": "cnimesh", "verb": verb, "group": "",
                "resource": resource, "subresource": subresource, "name": name}}});
        async move {
            let request = http::Request::post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&body).unwrap())
                .unwrap();
            client.request::<Value>(request).await.unwrap()["status"]["allowed"].clone()
        }
    };
    let mirror = || api.issue_token("cnimesh", "mirror", &[]).unwrap();
    let control = || api.issue_token("cnimesh", "control", &[]).unwrap();
    assert_eq!(review(mirror(), "get", "secrets", "", "link-west").await, true);
    assert_eq!(review(mirror(), "get", "secrets", "", "issuer").await, false);
    assert_eq!(review(control(), "get", "secrets", "", "link-west").await, false);
    assert_eq!(review(TOKEN.to_string(), "delete", "secrets", "", "issuer").await, true, "the administrator");
}

#[tokio::test]
async fn without_rbac_enforced_a_service_accounts_token_may_do_everything() {
    let api = cluster();
    api.enforce_rbac(false);
    let served = api.serve().await;
    let control = client(&served, &api.issue_token("cnimesh", "control", &[]).unwrap());
    assert_eq!(code(&control, "GET", "/api/v1/namespaces/cnimesh/secrets/issuer", Value::Null).await, 200);
}

#[tokio::test]
async fn a_list_of_one_name_is_allowed_by_a_rule_naming_it_and_a_list_of_all_is_not() {
    let api = cluster();
    let served = api.serve().await;
    let mirror = client(&served, &api.issue_token("cnimesh", "mirror", &[]).unwrap());
    let secrets = "/api/v1/namespaces/cnimesh/secrets";
    let one = format!("{secrets}?fieldSelector=metadata.name%3Dlink-west");
    assert_eq!(code(&mirror, "GET", &one, Value::Null).await, 200);
    let other = format!("{secrets}?fieldSelector=metadata.name%3Dissuer");
    assert_eq!(code(&mirror, "GET", &other, Value::Null).await, 403);
    assert_eq!(code(&mirror, "GET", secrets, Value::Null).await, 403);
}
