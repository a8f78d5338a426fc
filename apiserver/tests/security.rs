//! The server's edges: it listens on loopback unless a token is required, with a token configured every request
//! without it (or with a token this server issued for another audience) is a 401 whatever it
//! asks for, TokenReview authenticates only tokens it issued, for their audiences, and the
//! kubeconfig file it writes (which holds the token) is readable by its owner only.

use std::os::unix::fs::PermissionsExt;

use cnimesh_apiserver::{ClusterApi, Served};
use serde_json::{Value, json};

const TOKEN: &str = "admin-token";

/// A kube client for `served` that trusts its CA and sends `token` (none: no Authorization).
fn client(served: &Served, token: Option<&str>) -> kube::Client {
    let mut config = kube::Config::new(served.server().parse().unwrap());
    let ca = cnimesh_identity::pem::certs(served.ca_pem.as_bytes(), "the server's CA").unwrap();
    config.root_cert = Some(ca.into_iter().map(|c| c.to_vec()).collect());
    if let Some(token) = token {
        config.auth_info.token = Some(token.to_string().into());
    }
    kube::Client::try_from(config).unwrap()
}

/// The status code of `method path` with `body`.
async fn code(client: &kube::Client, method: &str, path: &str, body: Value) -> u16 {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    match client.request_text(request).await {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

/// One request of every kind the server answers.
const REQUESTS: &[(&str, &str)] = &[
    ("GET", "/version"),
    ("GET", "/api"),
    ("GET", "/apis"),
    ("GET", "/api/v1"),
    ("GET", "/openapi/v2"),
    ("GET", "/api/v1/pods"),
    ("GET", "/api/v1/namespaces/shop/secrets/db"),
    ("GET", "/api/v1/pods?watch=true"),
    ("POST", "/api/v1/namespaces/shop/configmaps"),
    ("DELETE", "/api/v1/namespaces/shop/secrets/db"),
    ("POST", "/api/v1/namespaces/shop/serviceaccounts/web/token"),
    ("POST", "/apis/authentication.k8s.io/v1/tokenreviews"),
    ("GET", "/api/v1/namespaces/shop/pods/web:4191/proxy/metrics"),
    ("GET", "/nothing/here"),
];

#[tokio::test]
async fn the_server_listens_on_loopback_only() {
    let served = ClusterApi::new().serve().await;
    assert_eq!(served.addr.ip(), std::net::Ipv4Addr::LOCALHOST);
    assert!(served.server().starts_with("https://127.0.0.1:"));
}

#[tokio::test]
async fn serving_on_an_address_other_processes_reach_is_refused_until_a_token_is_required() {
    let api = ClusterApi::new();
    let pod_address: std::net::SocketAddr = "10.250.0.1:0".parse().unwrap();
    let refused = api.try_serve_at(pod_address).await.err().expect("refused without a token");
    assert!(matches!(refused, cnimesh_apiserver::ServeError::Unauthenticated(a) if a == pod_address), "{refused}");
    let unspecified = api.try_serve_at("0.0.0.0:0".parse().unwrap()).await.err().expect("refused");
    assert!(matches!(unspecified, cnimesh_apiserver::ServeError::Unspecified(_)), "{unspecified}");
}

#[tokio::test]
async fn served_at_another_address_its_certificate_names_that_address_and_the_token_is_asked() {
    let api = ClusterApi::new();
    api.require_token(TOKEN);
    let served = api.try_serve_at("127.0.0.2:0".parse().unwrap()).await.unwrap();
    assert!(served.server().starts_with("https://127.0.0.2:"), "{}", served.server());
    assert_eq!(code(&client(&served, Some(TOKEN)), "GET", "/api/v1/pods", json!({})).await, 200);
    assert_eq!(code(&client(&served, None), "GET", "/api/v1/pods", json!({})).await, 401);
}

#[tokio::test]
async fn with_a_token_every_request_without_it_is_refused_401_and_changes_nothing() {
    let api = ClusterApi::new();
    api.put(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": "shop"}, "data": {"k": "dg=="}}));
    api.put(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "web", "namespace": "shop"}}));
    api.require_token(TOKEN);
    let other_audience = api.issue_token("shop", "web", &["identity.cnimesh.io"]).unwrap();
    let served = api.serve().await;
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "planted"},
        "spec": {"token": other_audience}});
    for token in [None, Some("wrong"), Some(other_audience.as_str()), Some("")] {
        let client = client(&served, token);
        for (method, path) in REQUESTS {
            assert_eq!(code(&client, method, path, body.clone()).await, 401, "{method} {path} with token {token:?}");
        }
    }
    // Faults in force (conflicts, unserved kinds) show to authenticated callers only, and are not
    // used up by the others.
    api.set_faults(|f| {
        f.conflicting_writes = 1;
        f.unserved = vec!["secrets".into()];
    });
    let stranger = client(&served, None);
    for (method, path) in REQUESTS {
        assert_eq!(code(&stranger, method, path, body.clone()).await, 401, "{method} {path} with faults in force");
    }
    let admin = client(&served, Some(TOKEN));
    assert_eq!(
        code(&admin, "POST", "/api/v1/namespaces/shop/configmaps", body.clone()).await,
        409,
        "the conflict is still due"
    );
    api.set_faults(|f| f.unserved.clear());
    assert!(api.get("v1", "Secret", "shop", "db").is_some(), "the DELETE without the token deleted nothing");
    assert!(api.get("v1", "ConfigMap", "shop", "planted").is_none(), "the POST without the token created nothing");
    // The token opens it.
    assert_eq!(code(&admin, "GET", "/api/v1/namespaces/shop/secrets/db", Value::Null).await, 200);
}

#[tokio::test]
async fn a_token_review_authenticates_only_tokens_the_server_issued_for_the_audiences_asked() {
    let api = ClusterApi::new();
    api.put(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "web", "namespace": "shop"}}));
    api.require_token(TOKEN);
    let served = api.serve().await;
    let admin = client(&served, Some(TOKEN));
    // Issued through the token request subresource, as the kubelet asks for a projected token.
    let request = http::Request::post("/api/v1/namespaces/shop/serviceaccounts/web/token")
        .header("content-type", "application/json")
        .body(
            serde_json::to_vec(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": ["identity.cnimesh.io"]}}))
            .unwrap(),
        )
        .unwrap();
    let issued: Value = admin.request(request).await.unwrap();
    let token = issued["status"]["token"].as_str().unwrap().to_string();
    let review = |token: &str, audience: &str| {
        let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]}});
        let request = http::Request::post("/apis/authentication.k8s.io/v1/tokenreviews")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap();
        let admin = admin.clone();
        async move { admin.request::<Value>(request).await.unwrap()["status"].clone() }
    };
    let ok = review(&token, "identity.cnimesh.io").await;
    assert_eq!(ok["authenticated"], true);
    assert_eq!(ok["user"]["username"], "system:serviceaccount:shop:web");
    assert_eq!(review(&token, "tap.cnimesh.io").await["authenticated"], false, "another audience");
    assert_eq!(review(TOKEN, "identity.cnimesh.io").await["authenticated"], false, "the admin token is no account's");
    // The issued token with its last hex digit changed.
    let last = if token.ends_with('0') { '1' } else { '0' };
    let forged = format!("{}{last}", &token[..token.len() - 1]);
    assert_eq!(review(&forged, "identity.cnimesh.io").await["authenticated"], false, "a forged token");
    // A token for no audience is the API's own: it opens the API.
    let api_token = api.issue_token("shop", "web", &[]).unwrap();
    assert_eq!(code(&client(&served, Some(&api_token)), "GET", "/api/v1/pods", Value::Null).await, 200);
    // No account, no token.
    let request = http::Request::post("/api/v1/namespaces/shop/serviceaccounts/ghost/token")
        .header("content-type", "application/json")
        .body(b"{}".to_vec())
        .unwrap();
    match admin.request_text(request).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 404),
        other => panic!("a token for a missing account: {other:?}"),
    }
}

#[tokio::test]
async fn the_kubeconfig_file_is_written_owner_only_even_over_a_world_readable_one() {
    let served = ClusterApi::new().serve().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, "planted").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    served.write_kubeconfig(&path, "local", TOKEN).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the kubeconfig holds the token");
    assert!(std::fs::read_to_string(&path).unwrap().contains(&format!("token: {TOKEN}")));
}
