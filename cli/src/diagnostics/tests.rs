//! The diagnostics commands against the mocked API server: a meshed pod whose proxied admin
//! pages are served by the mock, a plain pod, and the control plane's `/destination.json` built
//! by the control plane's own read code from a real Destination index.

use serde_json::{Value, json};

use super::fetch::{Reach, Target};
use super::{Output, Page, report};
use crate::check::mock::MockApi;
use crate::query_error::QueryError;

const WEB_ID: &str = "web.shop.serviceaccount.identity.cnimesh.cluster.local";
const CLIENT_ID: &str = "client.shop.serviceaccount.identity.cnimesh.cluster.local";
const ADMIN: &str = "/api/v1/namespaces/shop/pods/web-1:4191/proxy";
const DESTINATION: &str = "/api/v1/namespaces/cnimesh/services/cnimesh-control:admin/proxy/destination.json";

fn pod(name: &str, meshed: bool) -> Value {
    let mut containers = vec![json!({"name": "app", "image": "app:1"})];
    if meshed {
        containers.push(json!({"name": "cnimesh-proxy", "image": "proxy:1"}));
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"serviceAccountName": "web", "containers": containers},
        "status": {"phase": "Running", "podIP": "10.244.0.11"},
    })
}

/// `/policy.json` as the proxy serves it (proxy/src/app/admin/status.rs): 8080 answered with a
/// Server admitting `client`, 9090 on the default.
fn policy_page() -> Value {
    json!({
        "discovery": true,
        "default": {"policy": {"protocol": "detect", "server": {"group": "", "kind": "default", "name": "deny"}, "authorizations": [], "routes": []}, "source": "as injected", "stated_unix": null},
        "undeclared_watched": 0,
        "ports": [
            {"port": 8080, "declared": true, "source": "discovered", "last_answer_unix": 1_700_000_000u64, "last_answer_age_seconds": 4,
             "protocol": "http1", "server": {"group": "policy.cnimesh.io", "kind": "server", "name": "web-http"},
             "authorizations": [{"authorization": {"group": "policy.cnimesh.io", "kind": "authorizationpolicy", "name": "web-from-client"},
                                 "networks": [{"net": "0.0.0.0/0", "except": []}],
                                 "authentication": {"mesh_tls": {"identities": [CLIENT_ID], "suffixes": []}}}],
             "routes": []},
            {"port": 9090, "declared": true, "source": "default", "last_answer_unix": null, "last_answer_age_seconds": null,
             "protocol": "detect", "server": {"group": "", "kind": "default", "name": "deny"}, "authorizations": [], "routes": []},
        ],
    })
}

fn mock() -> MockApi {
    let mut api = MockApi::default();
    api.get("/api/v1/namespaces/shop/pods/web-1", pod("web-1", true))
        .get("/api/v1/namespaces/shop/pods/legacy", pod("legacy", false))
        .get(&format!("{ADMIN}/policy.json"), policy_page())
        .get(
            &format!("{ADMIN}/identity.json"),
            json!({
                "configured": true, "name": WEB_ID, "trust_anchors": 1,
                "anchors": [{"spki_sha256": "ab".repeat(32)}],
                "certificate": {"subject": format!("CN={WEB_ID}"), "identity": WEB_ID, "issuer": {"subject": "CN=identity.cnimesh.cluster.local", "serial": "01:02"},
                                "not_after_unix": 1_700_086_400u64, "expires_in_seconds": 86_000, "chain_length": 2},
            }),
        )
        .get(
            &format!("{ADMIN}/endpoints.json"),
            json!({
                "discovery": true,
                "profiles": [{"addr": "10.96.0.20:80", "answered": true, "service": "api.shop.svc.cluster.local:80", "endpoint": null}],
                "services": [{"authority": "api.shop.svc.cluster.local:80", "known": true, "exists": true,
                              "endpoints": [{"addr": "10.244.0.31:8080", "identity": "api.shop.serviceaccount.identity.cnimesh.cluster.local", "pending": 0, "ewma_ms": 1.25}]}],
            }),
        )
        .get_text(
            &format!("{ADMIN}/metrics"),
            "# HELP request_total Requests.\n# TYPE request_total counter\nrequest_total{direction=\"inbound\"} 7\n# EOF\n",
        );
    api
}

async fn run(api: &MockApi, page: Page, target: &str, output: Output) -> Result<String, QueryError> {
    let reach = Reach::Cluster(api.client());
    report(&reach, page, &Target::parse(target)?, "shop", None, output).await
}

#[tokio::test]
async fn policy_shows_each_port_its_server_who_may_connect_and_where_it_came_from() {
    let text = run(&mock(), Page::Policy, "web-1", Output::Human).await.unwrap();
    assert!(text.contains("port 8080 (declared): from the control plane, answered 4s ago"), "{text}");
    assert!(text.contains("server server/web-http, protocol http1"), "{text}");
    assert!(
        text.contains(&format!("allow: authorizationpolicy/web-from-client — mTLS: {CLIENT_ID} from 0.0.0.0/0")),
        "{text}"
    );
    assert!(text.contains("port 9090 (declared): the default: the control plane has not answered"), "{text}");
    assert!(text.contains("allow: nobody (denied)"), "{text}");
    assert!(text.contains("other ports: default deny (as injected)"), "{text}");
    let json = run(&mock(), Page::Policy, "pod/web-1", Output::Json).await.unwrap();
    assert_eq!(serde_json::from_str::<Value>(&json).unwrap(), policy_page(), "-o json is the page as served");
}

#[tokio::test]
async fn identity_endpoints_and_metrics_read_the_proxy_through_the_pod_proxy() {
    let identity = run(&mock(), Page::Identity, "web-1", Output::Human).await.unwrap();
    assert!(identity.contains(&format!("name:          {WEB_ID}")), "{identity}");
    assert!(identity.contains("issuer:        CN=identity.cnimesh.cluster.local"), "{identity}");
    assert!(identity.contains("expires in:    23h"), "{identity}");
    assert!(identity.contains(&format!("sha256 (public key) {}", "ab".repeat(32))), "{identity}");

    let endpoints = run(&mock(), Page::Endpoints, "web-1", Output::Human).await.unwrap();
    let lines: Vec<&str> = endpoints.lines().collect();
    assert!(lines[0].starts_with("TARGET") && lines[0].ends_with("EWMA"), "{endpoints}");
    assert!(lines[1].contains("10.244.0.31:8080") && lines[1].contains("1.2ms"), "{endpoints}");
    assert!(lines[2].contains("10.96.0.20:80") && lines[2].contains("(service api.shop"), "{endpoints}");

    let metrics = run(&mock(), Page::Metrics, "web-1", Output::Human).await.unwrap();
    assert_eq!(metrics, "request_total{direction=\"inbound\"} 7\n");
    let json: Value = serde_json::from_str(&run(&mock(), Page::Metrics, "web-1", Output::Json).await.unwrap()).unwrap();
    assert_eq!(json[0]["name"], "request_total");
    assert_eq!(json[0]["labels"]["direction"], "inbound");
    assert_eq!(json[0]["value"], 7.0);
}

#[tokio::test]
async fn a_missing_or_unmeshed_pod_and_a_failing_proxy_are_named_and_typed() {
    let e = run(&mock(), Page::Policy, "nope", Output::Human).await.unwrap_err();
    assert!(matches!(e, QueryError::NotFound { .. }), "{e:?}");
    assert_eq!(e.to_string(), "pod shop/nope: not found");
    let e = run(&mock(), Page::Policy, "legacy", Output::Human).await.unwrap_err();
    assert!(matches!(&e, QueryError::BadQuery(t) if t.contains("shop/legacy has no cnimesh-proxy container")), "{e:?}");
    let mut api = mock();
    api.fail(&format!("{ADMIN}/policy.json"), 503, "error trying to reach service: connection refused");
    let e = run(&api, Page::Policy, "web-1", Output::Human).await.unwrap_err().to_string();
    assert!(e.contains("policy.json of shop/web-1's proxy") && e.contains("connection refused"), "{e}");
    let mut api = mock();
    api.fail("/api/v1/namespaces/shop/pods/web-1", 403, "pods \"web-1\" is forbidden");
    let e = run(&api, Page::Policy, "web-1", Output::Human).await.unwrap_err();
    assert!(matches!(e, QueryError::Forbidden { .. }), "{e:?}");
    let e = Target::parse("deploy/web").unwrap_err();
    assert!(matches!(&e, QueryError::BadQuery(t) if t.contains("\"deploy\"")), "{e:?}");
}

/// `web` in `shop` as the control plane's Destination index holds it: port 80 → 8080, one meshed
/// pod; the page is what its admin server's `/destination.json` answers.
fn destination_page(authority: &str) -> Value {
    use cnimesh_model::destination::{Change, Config, Index, Kind, Object};
    let index = Index::new();
    let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80, "targetPort": 8080}, {"port": 9090}]},
    }))
    .unwrap();
    let slice: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "web-a", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.0.11"], "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "shop"}}],
    }))
    .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod("web-1", true)).unwrap();
    // Each kind listed in full, as a source delivers it: the index is ready.
    index.apply([
        Change::Reset(Kind::Service, vec![Object::from(service)]),
        Change::Reset(Kind::EndpointSlice, vec![Object::from(slice)]),
        Change::Reset(Kind::Pod, vec![Object::from(pod)]),
    ]);
    let served = cnimesh_model::destination::read::served(&index, authority, &std::sync::Arc::new(Config::default()));
    serde_json::to_value(served.unwrap()).unwrap()
}

#[tokio::test]
async fn a_services_endpoints_are_what_destination_serves() {
    let mut api = mock();
    api.get(
        "/api/v1/namespaces/shop/services/web",
        json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": {"ports": [{"port": 80}, {"port": 9090}]}}),
    )
    .get(DESTINATION, destination_page("web.shop:80"));
    let reach = Reach::Cluster(api.client());
    let svc = Target::parse("svc/web").unwrap();
    let text = report(&reach, Page::Endpoints, &svc, "shop", Some(80), Output::Human).await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "web.shop.svc.cluster.local:80", "{text}");
    assert!(lines[1].starts_with("ENDPOINT") && lines[1].contains("IDENTITY"), "{text}");
    assert!(
        lines[2].starts_with("10.244.0.11:8080") && lines[2].contains("web-1") && lines[2].contains(WEB_ID),
        "{text}"
    );
    assert!(lines[2].contains("h2") && lines[2].ends_with("10000"), "{text}");
    let json = report(&reach, Page::Endpoints, &svc, "shop", Some(80), Output::Json).await.unwrap();
    assert_eq!(serde_json::from_str::<Value>(&json).unwrap()["endpoints"][0]["identity"], WEB_ID);

    let e = report(&reach, Page::Endpoints, &svc, "shop", None, Output::Human).await.unwrap_err().to_string();
    assert!(e.contains("has ports 80, 9090: say which with --port"), "{e}");
    let e = report(&reach, Page::Endpoints, &svc, "shop", Some(81), Output::Human).await.unwrap_err().to_string();
    assert!(e.contains("has no port 81 (its ports: 80, 9090)"), "{e}");
    let e = report(&reach, Page::Endpoints, &Target::parse("svc/nope").unwrap(), "shop", Some(80), Output::Human)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(e, "service shop/nope: not found");
}
