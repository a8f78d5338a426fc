//! `cnimesh authz` against the mocked API server: `web` has a Server on 8080 whose one
//! AuthorizationPolicy requires a MeshTLSAuthentication naming the `client` ServiceAccount, and
//! an unselected port 9090 under the default policy; `client` may reach 8080, `other` may not.

use serde_json::{Value, json};

use super::{AuthzArgs, Output, report};
use crate::check::mock::MockApi;
use crate::query_error::QueryError;

const CLIENT_ID: &str = "client.shop.serviceaccount.identity.cnimesh.cluster.local";
const POLICY: &str = "/apis/policy.cnimesh.io/v1alpha1/namespaces/shop";

fn pod(name: &str, app: &str, ip: &str, ports: &[u16], meshed: bool) -> Value {
    let mut containers = vec![
        json!({"name": "app", "image": "app:1", "ports": ports.iter().map(|p| json!({"containerPort": p})).collect::<Vec<_>>()}),
    ];
    if meshed {
        containers.push(json!({"name": "cnimesh-proxy", "image": "proxy:1", "ports": [{"containerPort": 4191}]}));
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": app}},
        "spec": {"serviceAccountName": app, "containers": containers},
        "status": {"phase": "Running", "podIP": ip},
    })
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": format!("{kind}List"), "metadata": {"resourceVersion": "1"}, "items": items})
}

fn deployment(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}}},
    })
}

fn mock() -> MockApi {
    let mut api = MockApi::default();
    api.get("/api/v1/namespaces/shop", json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}))
        .get(
            "/api/v1/namespaces/shop/pods",
            list(
                "Pod",
                vec![
                    pod("web-1", "web", "10.244.0.11", &[8080, 9090], true),
                    pod("client-1", "client", "10.244.0.20", &[], true),
                    pod("other-1", "other", "10.244.0.30", &[], true),
                    pod("legacy-1", "legacy", "10.244.0.40", &[], false),
                ],
            ),
        )
        .get(
            "/api/v1/namespaces/shop/services",
            list(
                "Service",
                vec![json!({
                    "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
                    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
                })],
            ),
        )
        .get("/apis/apps/v1/namespaces/shop/deployments/web", deployment("web"))
        .get("/apis/apps/v1/namespaces/shop/deployments/client", deployment("client"))
        .get("/apis/apps/v1/namespaces/shop/deployments/other", deployment("other"))
        .get(
            &format!("{POLICY}/servers"),
            list(
                "Server",
                vec![json!({
                    "apiVersion": "policy.cnimesh.io/v1alpha1", "kind": "Server",
                    "metadata": {"name": "web-http", "namespace": "shop"},
                    "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": 8080, "proxyProtocol": "HTTP/1"},
                })],
            ),
        )
        .get(
            &format!("{POLICY}/authorizationpolicies"),
            list(
                "AuthorizationPolicy",
                vec![json!({
                    "apiVersion": "policy.cnimesh.io/v1alpha1", "kind": "AuthorizationPolicy",
                    "metadata": {"name": "web-from-client", "namespace": "shop"},
                    "spec": {
                        "targetRef": {"group": "policy.cnimesh.io", "kind": "Server", "name": "web-http"},
                        "requiredAuthenticationRefs": [{"group": "policy.cnimesh.io", "kind": "MeshTLSAuthentication", "name": "client-only"}],
                    },
                })],
            ),
        )
        .get(
            &format!("{POLICY}/meshtlsauthentications"),
            list(
                "MeshTLSAuthentication",
                vec![json!({
                    "apiVersion": "policy.cnimesh.io/v1alpha1", "kind": "MeshTLSAuthentication",
                    "metadata": {"name": "client-only", "namespace": "shop"},
                    "spec": {"identityRefs": [{"kind": "ServiceAccount", "name": "client"}]},
                })],
            ),
        )
        .get(&format!("{POLICY}/networkauthentications"), list("NetworkAuthentication", vec![]))
        .get(
            "/apis/gateway.networking.k8s.io/v1/namespaces/shop/httproutes",
            list(
                "HTTPRoute",
                vec![json!({
                    "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                    "metadata": {"name": "web-route", "namespace": "shop"},
                    "spec": {
                        "parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
                        "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}], "backendRefs": [{"name": "web", "port": 80}]}],
                    },
                })],
            ),
        )
        .get("/apis/gateway.networking.k8s.io/v1/namespaces/shop/grpcroutes", list("GRPCRoute", vec![]));
    api
}

fn args(resource: &str) -> AuthzArgs {
    AuthzArgs {
        resource: resource.into(),
        namespace: "shop".into(),
        identity: None,
        from: None,
        from_namespace: None,
        trust_domain: "cluster.local".into(),
        output: Output::Table,
        local: None,
    }
}

#[tokio::test]
async fn a_workloads_servers_policies_and_routes_are_listed_with_the_default_for_an_unselected_port() {
    let text = report(&mock().client(), &args("deploy/web")).await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("PORT") && lines[0].contains("AUTHORIZATION"), "{text}");
    assert!(
        lines[1].starts_with("8080") && lines[1].contains("server/web-http") && lines[1].contains("http1"),
        "{text}"
    );
    assert!(lines[1].contains("authorizationpolicy/web-from-client (meshtlsauthentication/client-only)"), "{text}");
    assert!(lines[1].contains(&format!("mTLS: {CLIENT_ID}")), "{text}");
    assert!(lines[2].starts_with("9090") && lines[2].contains("default/all-unauthenticated"), "{text}");
    assert!(lines[2].contains("any client"), "{text}");
    assert!(text.contains("httproute/web-route → svc/web:80"), "{text}");

    let json: Value = serde_json::from_str(
        &report(&mock().client(), &AuthzArgs { output: Output::Json, ..args("deploy/web") }).await.unwrap(),
    )
    .unwrap();
    assert_eq!(json["ports"][0]["server"], "server/web-http");
    assert_eq!(json["ports"][0]["authorizations"][0]["requires"][0], "meshtlsauthentication/client-only");
    assert_eq!(json["ports"][1]["server"], "default/all-unauthenticated");
    assert_eq!(json["routes"][0]["route"], "httproute/web-route");
}

#[tokio::test]
async fn the_allowed_service_account_may_reach_the_server_and_another_may_not() {
    let allowed = report(&mock().client(), &AuthzArgs { from: Some("deploy/client".into()), ..args("deploy/web") })
        .await
        .unwrap();
    let verdicts: Vec<&str> = allowed.lines().skip_while(|l| !l.starts_with("From ")).collect();
    assert_eq!(verdicts[0], format!("From deploy/client ({CLIENT_ID}):"), "{allowed}");
    assert!(
        verdicts[2].starts_with("8080")
            && verdicts[2].contains("yes")
            && verdicts[2].contains("allowed by authorizationpolicy/web-from-client"),
        "{allowed}"
    );
    assert!(
        verdicts[3].starts_with("9090")
            && verdicts[3].contains("yes  ")
            && verdicts[3].contains("default/all-unauthenticated"),
        "{allowed}"
    );

    let denied = report(&mock().client(), &AuthzArgs { identity: Some("other.shop".into()), ..args("deploy/web") })
        .await
        .unwrap();
    let line =
        denied.lines().find(|l| l.starts_with("8080") && l.contains("denied")).unwrap_or_else(|| panic!("{denied}"));
    assert!(
        line.contains("no  ")
            && line.contains("authorizationpolicy/web-from-client does not list other.shop.serviceaccount"),
        "{denied}"
    );

    let plain =
        report(&mock().client(), &AuthzArgs { from: Some("pod/legacy-1".into()), ..args("pod/web-1") }).await.unwrap();
    assert!(plain.contains("pod/legacy-1 (not meshed: no identity)"), "{plain}");
    assert!(plain.contains("web-from-client needs mTLS and pod/legacy-1 is not meshed"), "{plain}");
}

/// Each failure is typed (what the dashboard decides on) and names what was wrong.
#[tokio::test]
async fn bad_resources_and_identities_are_named_and_typed() {
    let e = report(&mock().client(), &args("web")).await.unwrap_err();
    assert!(matches!(&e, QueryError::BadQuery(text) if text.contains("\"web\": expected KIND/NAME")), "{e:?}");
    let e = report(&mock().client(), &args("job/web")).await.unwrap_err();
    assert!(matches!(&e, QueryError::BadQuery(text) if text.contains("unknown kind \"job\"")), "{e:?}");
    let e = report(&mock().client(), &args("deploy/nope")).await.unwrap_err();
    assert!(matches!(e, QueryError::NotFound { .. }), "{e:?}");
    assert_eq!(e.to_string(), "deployment shop/nope: not found");
    let e = report(&mock().client(), &AuthzArgs { identity: Some("other".into()), ..args("deploy/web") })
        .await
        .unwrap_err();
    assert!(matches!(&e, QueryError::BadQuery(text) if text.contains("--identity \"other\"")), "{e:?}");
}

/// A refusal by the API server stays a refusal (the RBAC hint's cause), whatever its message.
#[tokio::test]
async fn a_refused_list_is_a_typed_refusal() {
    let mut api = mock();
    api.fail("/api/v1/namespaces/shop/pods", 403, "pods is forbidden");
    let e = report(&api.client(), &args("deploy/web")).await.unwrap_err();
    assert!(matches!(e, QueryError::Forbidden { .. }), "{e:?}");
    assert!(e.to_string().starts_with("listing pods in shop: pods is forbidden"), "{e}");
}

#[tokio::test]
async fn missing_policy_crds_read_as_none_and_are_noted() {
    let mut api = mock();
    api.remove(&format!("{POLICY}/servers")).remove(&format!("{POLICY}/authorizationpolicies"));
    let text = report(&api.client(), &args("deploy/web")).await.unwrap();
    assert!(text.contains("note: servers.policy.cnimesh.io could not be listed"), "{text}");
    assert!(text.lines().nth(1).unwrap().contains("default/all-unauthenticated"), "{text}");
}

/// The Server in audit mode; web-1's proxy has let `other` through only by audit.
#[tokio::test]
async fn a_server_in_audit_mode_shows_its_would_be_denials_from_the_proxies_metrics() {
    let mut api = mock();
    api.json_mut(&format!("{POLICY}/servers"))["items"][0]["spec"]["accessPolicy"] = json!("audit");
    let other = "other.shop.serviceaccount.identity.cnimesh.cluster.local";
    api.get_text(
        "/api/v1/namespaces/shop/pods/web-1:4191/proxy/metrics",
        &format!(
            "inbound_http_authz_allow_total{{target_addr=\"10.244.0.11:8080\",srv_group=\"policy.cnimesh.io\",srv_kind=\"server\",srv_name=\"web-http\",route_group=\"\",route_kind=\"default\",route_name=\"default\",authz_group=\"\",authz_kind=\"audit\",authz_name=\"audit\",tls=\"true\",client_id=\"{other}\"}} 7\n"
        ),
    );
    let text =
        report(&api.client(), &AuthzArgs { identity: Some("other.shop".into()), ..args("deploy/web") }).await.unwrap();
    assert!(text.contains("Audit mode on port 8080"), "{text}");
    let row = text.lines().find(|l| l.starts_with("web-1") && l.contains(other)).unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains("server/web-http") && row.contains("http") && row.trim_end().ends_with('7'), "{text}");
    let verdict = text.lines().find(|l| l.starts_with("8080") && l.contains("yes")).unwrap_or_else(|| panic!("{text}"));
    assert!(verdict.contains("let through by audit mode, a would-be denial"), "{text}");
}
