//! Real clients against the server over HTTPS with its kubeconfig: kube-rs (list, watch, resume,
//! server-side apply, status) and the `kubectl` binary (get, apply twice, apply --server-side,
//! delete, a CRD's kind), asserting what the server stored.
//!
//! `kubectl` must be installed (`scripts/setup.sh` checks for it); a missing one fails the test.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use cnimesh_apiserver::{ClusterApi, PATIENCE, Served};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

const TOKEN: &str = "admin-token";

/// A served API server requiring [`TOKEN`], and its kubeconfig written to a temp dir.
async fn cluster() -> (Arc<ClusterApi>, Served, tempfile::TempDir) {
    let api = ClusterApi::new();
    api.require_token(TOKEN);
    let served = api.serve().await;
    let dir = tempfile::tempdir().unwrap();
    served.write_kubeconfig(&dir.path().join("kubeconfig"), "local", TOKEN).unwrap();
    (api, served, dir)
}

/// A kube-rs client from the kubeconfig, as a program given `--kubeconfig` builds one.
async fn client(served: &Served) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&served.kubeconfig("local", TOKEN)).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await.unwrap();
    kube::Client::try_from(config).unwrap()
}

/// Runs `kubectl --kubeconfig DIR/kubeconfig ARGS` off the runtime's threads.
async fn kubectl_output(dir: &Path, args: &[&str]) -> std::process::Output {
    let mut command = Command::new("kubectl");
    command.arg("--kubeconfig").arg(dir.join("kubeconfig")).args(args).current_dir(dir);
    let shown = format!("kubectl {}", args.join(" "));
    tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("running {shown}: {e} (kubectl is needed: scripts/setup.sh checks for it)"))
}

/// [`kubectl_output`]: its stdout, or a panic with its stderr.
async fn kubectl(dir: &Path, args: &[&str]) -> String {
    let out = kubectl_output(dir, args).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl {} failed: {stderr}", args.join(" "));
    String::from_utf8(out.stdout).unwrap()
}

fn write(dir: &Path, name: &str, yaml: &str) -> String {
    std::fs::write(dir.join(name), yaml).unwrap();
    name.to_string()
}

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: nginx:1
        ports: [{containerPort: 80}]
";

const SERVER: &str = "apiVersion: policy.cnimesh.io/v1alpha1
kind: Server
metadata: {name: web-http, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  port: 8080
  proxyProtocol: HTTP/1
";

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_lists_pods_in_every_namespace_and_prints_a_service_as_yaml() {
    let (api, _served, dir) = cluster().await;
    for ns in ["shop", "bank"] {
        api.put(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("{ns}-pod"), "namespace": ns}}));
    }
    api.put(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": "shop"},
        "spec": {"ports": [{"port": 80}]}}));
    let pods = kubectl(dir.path(), &["get", "pods", "-A"]).await;
    assert!(pods.contains("shop-pod") && pods.contains("bank-pod"), "kubectl get pods -A printed:\n{pods}");
    let services = kubectl(dir.path(), &["get", "svc", "-n", "shop", "-o", "yaml"]).await;
    let listed: Value = serde_saphyr::from_str(&services).unwrap();
    assert_eq!(listed["items"][0]["metadata"]["name"], "api");
    let ip = listed["items"][0]["spec"]["clusterIP"].as_str().unwrap_or_default();
    assert!(ip.starts_with("10.96."), "the server gave it a ClusterIP: {services}");
    assert_eq!(kubectl(dir.path(), &["get", "po", "-n", "bank", "-o", "name"]).await.trim(), "pod/bank-pod");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_creates_then_updates_a_deployment_and_a_mesh_server_keeping_what_the_update_leaves_alone() {
    let (api, _served, dir) = cluster().await;
    let deployment = write(dir.path(), "deployment.yaml", DEPLOYMENT);
    let server = write(dir.path(), "server.yaml", SERVER);
    assert!(kubectl(dir.path(), &["apply", "-f", &deployment, "-f", &server]).await.contains("created"));
    let created = api.get("apps/v1", "Deployment", "shop", "web").expect("the Deployment is stored");
    assert_eq!(created["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:1");

    write(
        dir.path(),
        "deployment.yaml",
        &DEPLOYMENT.replace("nginx:1", "nginx:2").replace("replicas: 1", "replicas: 3"),
    );
    write(dir.path(), "server.yaml", &SERVER.replace("8080", "9090"));
    let out = kubectl(dir.path(), &["apply", "-f", &deployment, "-f", &server]).await;
    assert_eq!(out.matches("configured").count(), 2, "kubectl apply printed:\n{out}");
    let updated = api.get("apps/v1", "Deployment", "shop", "web").unwrap();
    assert_eq!(updated["spec"]["replicas"], 3);
    let container = &updated["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "nginx:2");
    assert_eq!(container["ports"], json!([{"containerPort": 80}]), "the strategic patch merged the container by name");
    assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"], "an update, not a new object");
    let server = api.get("policy.cnimesh.io/v1alpha1", "Server", "shop", "web-http").unwrap();
    assert_eq!(server["spec"]["port"], 9090);
    assert_eq!(server["spec"]["proxyProtocol"], "HTTP/1");
    // Re-applying what is stored changes nothing.
    assert!(kubectl(dir.path(), &["apply", "-f", &deployment]).await.contains("unchanged"));
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_server_side_apply_creates_then_updates_under_its_field_manager() {
    let (api, _served, dir) = cluster().await;
    let file = write(dir.path(), "deployment.yaml", DEPLOYMENT);
    assert!(kubectl(dir.path(), &["apply", "--server-side", "-f", &file]).await.contains("serverside-applied"));
    write(dir.path(), "deployment.yaml", &DEPLOYMENT.replace("replicas: 1", "replicas: 2"));
    kubectl(dir.path(), &["apply", "--server-side", "-f", &file]).await;
    let stored = api.get("apps/v1", "Deployment", "shop", "web").unwrap();
    assert_eq!(stored["spec"]["replicas"], 2);
    assert_eq!(stored["metadata"]["managedFields"][0]["manager"], "kubectl");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_delete_removes_the_object_and_a_watch_sees_it_go() {
    let (api, served, dir) = cluster().await;
    let file = write(dir.path(), "server.yaml", SERVER);
    kubectl(dir.path(), &["apply", "-f", &file]).await;
    let servers: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client(&served).await,
        "shop",
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("policy.cnimesh.io", "v1alpha1", "Server"),
            "servers",
        ),
    );
    let version = servers.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut watch = servers.watch(&WatchParams::default(), &version).await.unwrap().boxed();
    assert!(kubectl(dir.path(), &["delete", "-f", &file]).await.contains("deleted"));
    assert_eq!(api.get("policy.cnimesh.io/v1alpha1", "Server", "shop", "web-http"), None);
    match tokio::time::timeout(PATIENCE, watch.try_next()).await.expect("the deletion is watched").unwrap() {
        Some(WatchEvent::Deleted(object)) => assert_eq!(object.metadata.name.as_deref(), Some("web-http")),
        other => panic!("expected the deletion, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crd_applied_with_kubectl_makes_its_kind_served() {
    let (api, _served, dir) = cluster().await;
    let crd = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.io}
spec:
  group: example.io
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget, shortNames: [wdg]}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
";
    let crd = write(dir.path(), "crd.yaml", crd);
    kubectl(dir.path(), &["apply", "-f", &crd]).await;
    let widget = write(
        dir.path(),
        "widget.yaml",
        "apiVersion: example.io/v1\nkind: Widget\nmetadata: {name: w, namespace: shop}\nspec: {size: 3}\n",
    );
    kubectl(dir.path(), &["apply", "-f", &widget]).await;
    assert_eq!(api.get("example.io/v1", "Widget", "shop", "w").unwrap()["spec"]["size"], 3);
    assert_eq!(kubectl(dir.path(), &["get", "wdg", "-n", "shop", "-o", "name"]).await.trim(), "widget.example.io/w");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kube_client_lists_watches_resumes_applies_and_writes_status_over_https() {
    let (api, served, _dir) = cluster().await;
    let client = client(&served).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "shop");
    let apply = PatchParams::apply("test-manager");
    let map = |name: &str, value: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": value}});
    maps.patch("a", &apply, &Patch::Apply(map("a", "1"))).await.unwrap();
    let listed = maps.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    let version = listed.metadata.resource_version.unwrap();

    // Changes made while nobody watches are replayed to a watch resumed from the list's version.
    maps.patch("a", &apply, &Patch::Apply(map("a", "2"))).await.unwrap();
    maps.patch("b", &apply, &Patch::Apply(map("b", "1"))).await.unwrap();
    let mut watch = maps.watch(&WatchParams::default(), &version).await.unwrap().boxed();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let next = tokio::time::timeout(PATIENCE, watch.try_next()).await;
        match next.expect("the resumed watch replays the changes").unwrap() {
            Some(WatchEvent::Modified(m)) => seen.push(format!("modified {}", m.metadata.name.unwrap())),
            Some(WatchEvent::Added(m)) => seen.push(format!("added {}", m.metadata.name.unwrap())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["modified a", "added b"]);

    // Status is its own subresource: a status patch leaves the spec, an apply of the object the status.
    let deployments: Api<Deployment> = Api::namespaced(client, "shop");
    let body: Value = serde_saphyr::from_str(DEPLOYMENT).unwrap();
    deployments.patch("web", &apply, &Patch::Apply(body.clone())).await.unwrap();
    let status = json!({"status": {"readyReplicas": 1}});
    deployments.patch_status("web", &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
    deployments.patch("web", &apply, &Patch::Apply(body)).await.unwrap();
    let stored = api.get("apps/v1", "Deployment", "shop", "web").unwrap();
    assert_eq!((stored["status"]["readyReplicas"].as_i64(), stored["spec"]["replicas"].as_i64()), (Some(1), Some(1)));
    assert_eq!(deployments.get_status("web").await.unwrap().status.unwrap().ready_replicas, Some(1));
}

#[tokio::test]
async fn a_watch_resumed_from_before_a_compaction_is_told_410_gone_and_one_from_after_it_is_not() {
    let api = ClusterApi::new();
    let map =
        |name: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "shop"}});
    api.put(map("a"));
    let before = api.resource_version();
    api.put(map("b"));
    api.compact();
    let maps: Api<ConfigMap> = Api::namespaced(api.client(), "shop");
    let mut stale = maps.watch(&WatchParams::default(), &before).await.unwrap().boxed();
    match tokio::time::timeout(PATIENCE, stale.try_next()).await.unwrap().unwrap() {
        Some(WatchEvent::Error(status)) => assert_eq!(status.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
    let mut fresh = maps.watch(&WatchParams::default(), &api.resource_version()).await.unwrap().boxed();
    api.put(map("c"));
    match tokio::time::timeout(PATIENCE, fresh.try_next()).await.unwrap().unwrap() {
        Some(WatchEvent::Added(m)) => assert_eq!(m.metadata.name.as_deref(), Some("c")),
        other => panic!("expected c added, got {other:?}"),
    }
}

#[tokio::test]
async fn a_list_with_a_limit_comes_in_pages_of_one_version_that_together_hold_every_object() {
    let api = ClusterApi::new();
    let map = |ns: &str, name: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}});
    for name in ["a", "b", "c", "d", "e"] {
        api.put(map("shop", name));
    }
    api.put(map("other", "z"));
    let maps: Api<ConfigMap> = Api::all(api.client());
    let first = maps.list(&ListParams::default().limit(2)).await.unwrap();
    let version = first.metadata.resource_version.clone().unwrap();
    let mut names: Vec<String> = first.items.iter().filter_map(|m| m.metadata.name.clone()).collect();
    assert_eq!(names.len(), 2, "one page of 2");
    // A write between pages moves the server's version on; every page still says the first one's,
    // so the watch that follows the list replays the write.
    api.put(map("shop", "f"));
    let mut token = first.metadata.continue_;
    while let Some(next) = token.filter(|t| !t.is_empty()) {
        let page = maps.list(&ListParams::default().limit(2).continue_token(&next)).await.unwrap();
        assert_eq!(page.metadata.resource_version.as_deref(), Some(version.as_str()));
        assert!(page.items.len() <= 2);
        names.extend(page.items.iter().filter_map(|m| m.metadata.name.clone()));
        token = page.metadata.continue_;
    }
    names.sort();
    assert_eq!(names, ["a", "b", "c", "d", "e", "f", "z"], "every object once, over the pages");
    let whole = maps.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        (whole.items.len(), whole.metadata.continue_.filter(|t| !t.is_empty())),
        (7, None),
        "no limit: one page"
    );

    // A token from before a compaction is gone, as on a real server: the client lists again.
    let stale = maps.list(&ListParams::default().limit(2)).await.unwrap().metadata.continue_.unwrap();
    api.put(map("shop", "g"));
    api.compact();
    match maps.list(&ListParams::default().limit(2).continue_token(&stale)).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pod_and_service_proxies_reach_the_pod_with_the_path_query_and_headers_but_not_the_credentials() {
    // The "pod": an HTTP server on 127.0.0.1 that answers with the request line it saw, a header
    // of the client's and whether the client's credentials for the API server reached it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                let header = |name: &str| req.headers().get(name).map(|v| v.to_str().unwrap().to_string());
                let seen = format!(
                    "{} {} token={:?} authorization={:?}",
                    req.method(),
                    req.uri(),
                    header("x-tap-token"),
                    header("authorization")
                );
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                    hyper::body::Bytes::from(seen),
                )))
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    let (api, served, _dir) = cluster().await;
    api.put(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "ports": [{"name": "admin", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"}}));
    api.put(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "admin", "port": 9990, "targetPort": "admin"}]}}));
    let client = client(&served).await;
    for path in [
        format!("/api/v1/namespaces/shop/pods/web:{port}/proxy/metrics?format=text"),
        "/api/v1/namespaces/shop/services/web:admin/proxy/metrics?format=text".to_string(),
    ] {
        let request = http::Request::get(&path).header("x-tap-token", "t0k3n").body(Vec::new()).unwrap();
        let answer = client.request_text(request).await.unwrap();
        assert_eq!(answer, "GET /metrics?format=text token=Some(\"t0k3n\") authorization=None", "{path}");
    }
    let missing =
        http::Request::get(format!("/api/v1/namespaces/shop/pods/ghost:{port}/proxy/")).body(Vec::new()).unwrap();
    match client.request_text(missing).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 404),
        other => panic!("a pod that is not there: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_patch_with_a_json_patch_and_a_merge_patch_changes_the_stored_object() {
    let (api, _served, dir) = cluster().await;
    api.put(serde_saphyr::from_str(DEPLOYMENT).unwrap());
    let json_patch = r#"[{"op": "replace", "path": "/spec/replicas", "value": 4}]"#;
    kubectl(dir.path(), &["patch", "deploy", "web", "-n", "shop", "--type=json", "-p", json_patch]).await;
    kubectl(
        dir.path(),
        &[
            "patch",
            "deploy",
            "web",
            "-n",
            "shop",
            "--type=merge",
            "-p",
            r#"{"metadata": {"labels": {"tier": "front"}}}"#,
        ],
    )
    .await;
    let stored = api.get("apps/v1", "Deployment", "shop", "web").unwrap();
    assert_eq!(
        (stored["spec"]["replicas"].as_i64(), stored["metadata"]["labels"]["tier"].as_str()),
        (Some(4), Some("front"))
    );
    let failing = r#"[{"op": "test", "path": "/spec/replicas", "value": 9}, {"op": "replace", "path": "/spec/replicas", "value": 1}]"#;
    let out = kubectl_output(dir.path(), &["patch", "deploy", "web", "-n", "shop", "--type=json", "-p", failing]).await;
    assert!(!out.status.success(), "a failing test operation refuses the whole patch");
    assert_eq!(api.get("apps/v1", "Deployment", "shop", "web").unwrap()["spec"]["replicas"], 4);
}
