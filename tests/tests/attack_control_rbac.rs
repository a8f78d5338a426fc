//! The control plane compromised: an attacker holding the control plane's ServiceAccount token
//! (the process that also holds the identity issuer's key) tries to redirect traffic by writing
//! EndpointSlices or Services, or to take a linked cluster's credentials from a Link's Secret.
//! What `cnimesh install`, `cnimesh multicluster install` and `cnimesh multicluster link` print
//! is applied to the in-process API server with RBAC enforced, and requests are made with tokens
//! for `cnimesh/cnimesh-control` and `cnimesh/cnimesh-mirror`: the control plane is refused
//! (403), the mirror may do what mirroring needs and no more. The one write the control plane
//! keeps outside its namespace, the endorsed trust bundle in every namespace, reaches no other
//! ConfigMap.

use std::sync::Arc;

use cnimesh_apiserver::{ClusterApi, Served};
use serde_json::{Value, json};

const ADMIN: &str = "admin-token";

/// Everything the three commands print, applied; RBAC enforced.
fn installed() -> Arc<ClusterApi> {
    let args = cnimesh_cli::install::InstallArgs::default();
    let certs = cnimesh_cli::install::Certificates::from_args(&args).unwrap();
    let mut docs = cnimesh_cli::install::documents(&certs, &args.options().unwrap()).unwrap();
    let multicluster = cnimesh_cli::multicluster::install::InstallArgs::default();
    docs.extend(cnimesh_cli::multicluster::install::render(&multicluster, &certs.anchors, "cluster.local").unwrap());
    let west = cnimesh_cli::multicluster::link::Target {
        cluster_name: "west".into(),
        cluster_domain: "cluster.local".into(),
        trust_domain: "west.local".into(),
        gateway: Some(("192.0.2.10".into(), 4143)),
        server: "https://192.0.2.1:6443".into(),
        ca_pem: Some(certs.anchors.clone().into_bytes()),
        token: Some("west-reader-token".into()),
    };
    docs.extend(cnimesh_cli::multicluster::link::render(&west).unwrap());
    let api = ClusterApi::new();
    for doc in docs {
        api.put(doc);
    }
    api.require_token(ADMIN);
    api.enforce_rbac(true);
    api
}

fn client(served: &Served, token: &str) -> kube::Client {
    let mut config = kube::Config::new(served.server().parse().unwrap());
    let ca = cnimesh_identity::pem::certs(served.ca_pem.as_bytes(), "the server's CA").unwrap();
    config.root_cert = Some(ca.into_iter().map(|c| c.to_vec()).collect());
    config.auth_info.token = Some(token.to_string().into());
    kube::Client::try_from(config).unwrap()
}

/// The status code of `method path` with `body` (a merge patch for PATCH).
async fn code(client: &kube::Client, method: &str, path: &str, body: Value) -> u16 {
    let content_type = if method == "PATCH" { "application/merge-patch+json" } else { "application/json" };
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    match client.request_text(request).await {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices";
const SERVICES: &str = "/api/v1/namespaces/shop/services";
const LINK_SECRET: &str = "/api/v1/namespaces/cnimesh/secrets/cluster-credentials-west";

fn slice(name: &str) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "endpoints": [{"addresses": ["203.0.113.66"]}]})
}

fn service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "shop"},
        "spec": {"ports": [{"port": 80}]}})
}

#[tokio::test]
async fn a_compromised_control_plane_cannot_write_endpoint_slices_or_services_nor_read_a_links_credentials() {
    let api = installed();
    api.put(slice("web-abc"));
    api.put(service("web"));
    let served = api.serve().await;
    let control = client(&served, &api.issue_token("cnimesh", "cnimesh-control", &[]).unwrap());
    // What Destination needs it still may: read them.
    assert_eq!(code(&control, "GET", SLICES, Value::Null).await, 200, "Destination reads EndpointSlices");
    let refused = [
        ("POST", SLICES.to_string(), slice("planted")),
        ("PATCH", format!("{SLICES}/web-abc"), json!({"endpoints": [{"addresses": ["203.0.113.66"]}]})),
        ("DELETE", format!("{SLICES}/web-abc"), Value::Null),
        ("POST", SERVICES.to_string(), service("planted")),
        ("PATCH", format!("{SERVICES}/web"), json!({"spec": {"externalName": "evil.example"}})),
        ("GET", LINK_SECRET.to_string(), Value::Null),
        ("GET", "/api/v1/namespaces/cnimesh/secrets".to_string(), Value::Null),
    ];
    for (method, path, body) in refused {
        assert_eq!(code(&control, method, &path, body).await, 403, "{method} {path} as cnimesh-control");
    }
    assert!(api.get("discovery.k8s.io/v1", "EndpointSlice", "shop", "planted").is_none());
    assert!(api.get("v1", "Service", "shop", "planted").is_none());
    let kept = api.get("discovery.k8s.io/v1", "EndpointSlice", "shop", "web-abc").unwrap();
    assert_eq!(kept["endpoints"][0]["addresses"][0], "203.0.113.66");
}

#[tokio::test]
async fn the_mirror_may_write_mirrors_follow_links_and_read_its_links_credentials_only() {
    let api = installed();
    let served = api.serve().await;
    let mirror = client(&served, &api.issue_token("cnimesh", "cnimesh-mirror", &[]).unwrap());
    assert_eq!(code(&mirror, "POST", SLICES, slice("web-west-1")).await, 200);
    assert_eq!(code(&mirror, "POST", SERVICES, service("web-west")).await, 200);
    assert_eq!(code(&mirror, "DELETE", &format!("{SLICES}/web-west-1"), Value::Null).await, 200);
    let links = "/apis/multicluster.cnimesh.io/v1alpha1/namespaces/cnimesh/links";
    assert_eq!(code(&mirror, "GET", links, Value::Null).await, 200);
    assert_eq!(code(&mirror, "PATCH", &format!("{links}/west/status"), json!({"status": {}})).await, 200);
    assert_eq!(code(&mirror, "PATCH", &format!("{links}/west"), json!({"spec": {}})).await, 403, "the Link itself");
    assert_eq!(code(&mirror, "GET", LINK_SECRET, Value::Null).await, 200);
    let one = "/api/v1/namespaces/cnimesh/secrets?fieldSelector=metadata.name%3Dcluster-credentials-west";
    assert_eq!(code(&mirror, "GET", one, Value::Null).await, 200, "a watch's list of its Secret");
    // Not the issuer's key, nor any other Secret of the namespace.
    for secret in ["cnimesh-identity-issuer", "cnimesh-webhook-tls"] {
        let path = format!("/api/v1/namespaces/cnimesh/secrets/{secret}");
        assert_eq!(code(&mirror, "GET", &path, Value::Null).await, 403, "{path} as cnimesh-mirror");
    }
    assert_eq!(code(&mirror, "GET", "/api/v1/namespaces/cnimesh/secrets", Value::Null).await, 403);
    let lease = "/apis/coordination.k8s.io/v1/namespaces/cnimesh/leases";
    let body = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "cnimesh-control-mirror-write"}, "spec": {}});
    assert_eq!(code(&mirror, "POST", lease, body).await, 200, "its writer Lease");
}

const CONFIG_MAPS: &str = "/api/v1/namespaces/shop/configmaps";

fn config_map(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "shop"},
        "data": {"ca.crt": "planted"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_writes_the_trust_bundle_in_every_namespace_and_no_other_config_map() {
    let api = installed();
    api.put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}));
    api.put(config_map("app-config"));
    let served = api.serve().await;
    let control = client(&served, &api.issue_token("cnimesh", "cnimesh-control", &[]).unwrap());

    // The writer itself, with the control plane's token: it may watch namespaces and apply its
    // one ConfigMap.
    let dir = tempfile::tempdir().unwrap();
    let day = std::time::Duration::from_secs(86400);
    let anchor = cnimesh_identity::ca::new_trust_anchor("cluster.local", day).unwrap();
    let issuer = cnimesh_identity::ca::new_issuer(&anchor, "cluster.local", day).unwrap();
    for (file, pem) in [("ca.crt", &anchor.cert_pem), ("tls.crt", &issuer.cert_pem), ("tls.key", &issuer.key_pem)] {
        std::fs::write(dir.path().join(file), pem).unwrap();
    }
    let loaded = cnimesh_model::identity::Issuer::load(dir.path()).unwrap();
    let (_issuer_tx, issuer_rx) = tokio::sync::watch::channel(Some(Arc::new(loaded)));
    let name = cnimesh_identity::Name::for_service_account("cnimesh-control", "cnimesh", "cluster.local").unwrap();
    let own = cnimesh_model::identity::own_cert::issue_from_dir(dir.path(), &name, day).unwrap();
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let leadership = cnimesh_runtime::leader::Leadership::always(cnimesh_control::trust_bundle::TRUST_BUNDLE_WRITE);
    tokio::spawn(cnimesh_control::trust_bundle::run(control.clone(), leadership, issuer_rx, own, stopped));
    let written = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            if let Some(bundle) = api.get("v1", "ConfigMap", "shop", "cnimesh-trust-bundle") {
                return bundle;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the control plane's writer applied the bundle through RBAC");
    assert_eq!(written["data"]["ca.crt"], anchor.cert_pem.as_str());

    // Every other ConfigMap is out of its reach: no read, no write, no delete.
    let app = format!("{CONFIG_MAPS}/app-config");
    let refused = [
        ("GET", app.clone(), Value::Null),
        ("PATCH", app.clone(), json!({"data": {"ca.crt": "planted"}})),
        ("PUT", app.clone(), config_map("app-config")),
        ("DELETE", app.clone(), Value::Null),
        ("GET", CONFIG_MAPS.to_string(), Value::Null),
        ("DELETE", format!("{CONFIG_MAPS}/cnimesh-trust-bundle"), Value::Null),
    ];
    for (method, path, body) in refused {
        assert_eq!(code(&control, method, &path, body).await, 403, "{method} {path} as cnimesh-control");
    }
    assert_eq!(api.get("v1", "ConfigMap", "shop", "app-config").unwrap()["data"]["ca.crt"], "planted");
}

const JOIN_SECRET: &str = "/api/v1/namespaces/cnimesh/secrets/cnimesh-join-tokens";

/// The join tokens' Secret: the operator writes it (`cnimesh external-workload join`), the
/// control plane reads and uses it up through its Role (by name), and a meshed workload's
/// ServiceAccount can neither read it nor list the namespace's Secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_control_plane_reads_and_uses_up_join_tokens_and_a_meshed_workload_cannot_read_them() {
    use cnimesh_model::external::join_store::JoinStore;
    use cnimesh_model::identity::join::{JoinToken, Pending};

    let api = installed();
    api.put(json!({"apiVersion": "workload.cnimesh.io/v1alpha1", "kind": "ExternalWorkload",
        "metadata": {"namespace": "shop", "name": "db-vm"},
        "spec": {"workloadIPs": ["192.0.2.10"], "serviceAccountName": "db"}}));
    let served = api.serve().await;
    let operator = JoinStore::new(client(&served, ADMIN), "cnimesh");
    let (workload, record) = operator.workload("shop", "db-vm").await.unwrap();
    let token = JoinToken::generate("shop", "db-vm").unwrap();
    let uid = workload.metadata.uid.unwrap();
    let ttl = std::time::Duration::from_secs(600);
    operator.put(&token, &Pending::new(&token, &uid, &record.service_account, ttl)).await.unwrap();

    let web = client(&served, &api.issue_token("shop", "web", &[]).unwrap());
    for (method, path) in [("GET", JOIN_SECRET), ("GET", "/api/v1/namespaces/cnimesh/secrets"), ("DELETE", JOIN_SECRET)]
    {
        assert_eq!(code(&web, method, path, Value::Null).await, 403, "{method} {path} as shop/web");
    }

    let control = client(&served, &api.issue_token("cnimesh", "cnimesh-control", &[]).unwrap());
    JoinStore::new(control.clone(), "cnimesh").consume(&token, "shop", "db").await.expect("its Role suffices");
    assert_eq!(code(&control, "DELETE", JOIN_SECRET, Value::Null).await, 403, "read and update only");
}
