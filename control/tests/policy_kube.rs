//! Policy over the Kubernetes source: kube-rs watchers for Namespaces and the policy resources
//! (and the one Pod watch Destination shares) against a scripted API server: list, watch events,
//! an invalid resource ignored with its last good version kept, a 410 Gone re-list that drops
//! what the API server no longer has. Answers read from the policy index's watch channels.

use std::time::Duration;

use cnimesh_control::destination::{self, NsName};
use cnimesh_control::policy::index::{InboundView, ServerMeta};
use cnimesh_control::policy::model::Protocol;
use cnimesh_control::policy::{self, DefaultPolicy};
use cnimesh_control::sources::{KubeSource, Source};
use serde_json::{Value, json};
use tokio::sync::watch;

#[allow(dead_code)]
#[path = "../../tests/src/kube_mock.rs"]
mod kube_mock;

use kube_mock::ListWatchApi;

const PODS: &str = "/api/v1/pods";
const NAMESPACES: &str = "/api/v1/namespaces";
const SERVERS: &str = "/apis/policy.cnimesh.io/v1alpha1/servers";
const POLICY_PATHS: [&str; 4] = [
    SERVERS,
    "/apis/policy.cnimesh.io/v1alpha1/authorizationpolicies",
    "/apis/policy.cnimesh.io/v1alpha1/meshtlsauthentications",
    "/apis/policy.cnimesh.io/v1alpha1/networkauthentications",
];
/// Only guards against a hung test; nothing here measures time.
const PATIENCE: Duration = Duration::from_secs(30);

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "shop", "name": "api-0", "resourceVersion": "3", "labels": {"app": "api"}},
        "spec": {"containers": [{"name": "app", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"podIP": "10.1.0.5"}})
}

fn namespace(policy: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "shop", "resourceVersion": "4",
            "annotations": {"config.cnimesh.io/default-inbound-policy": policy}}})
}

fn server(port: Value, protocol: &str, rv: &str) -> Value {
    json!({"apiVersion": "policy.cnimesh.io/v1alpha1", "kind": "Server",
        "metadata": {"namespace": "shop", "name": "api", "resourceVersion": rv},
        "spec": {"podSelector": {"matchLabels": {"app": "api"}}, "port": port, "proxyProtocol": protocol}})
}

async fn changed(rx: &mut watch::Receiver<InboundView>) -> (ServerMeta, Protocol) {
    tokio::time::timeout(PATIENCE, rx.changed()).await.expect("an update in time").unwrap();
    let view = rx.borrow_and_update().clone().expect("pod known");
    (view.meta.clone(), view.protocol)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_resources_are_listed_watched_and_relisted() {
    let api = ListWatchApi::new();
    for path in ["/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices"].into_iter().chain(POLICY_PATHS) {
        api.set_list(path, Vec::new(), "10");
    }
    api.set_list(PODS, vec![pod()], "10");
    api.set_list(NAMESPACES, vec![namespace("deny")], "10");

    let index = destination::Index::new();
    let policy = policy::Index::new(policy::Config::default());
    let source = KubeSource::new(api.client()).with_policy(policy.clone()).run(index.clone());
    tokio::spawn(async move { source.await.expect("kube source") });
    for path in [PODS, NAMESPACES].into_iter().chain(POLICY_PATHS) {
        api.wait_watches(path, 1).await;
    }
    tokio::time::timeout(PATIENCE, policy.ready()).await.expect("ready once every kind is listed");
    assert!(index.is_ready(), "the shared Pod watch fed Destination too");

    // The namespace's annotation applies to a port no Server names.
    let key = NsName::new("shop", "api-0");
    let mut rx = policy.watch_inbound(&key, 8080);
    let first = rx.borrow_and_update().clone().expect("pod listed");
    assert_eq!(first.meta, ServerMeta::Default(DefaultPolicy::Deny));

    // A Server arrives by watch event.
    api.send(SERVERS, "ADDED", server(json!("http"), "opaque", "11"));
    assert_eq!(changed(&mut rx).await, (ServerMeta::Server("api".into()), Protocol::Opaque));

    // A bad edit that got past the schema is ignored; the next good one applies.
    api.send(SERVERS, "MODIFIED", server(json!("Not_A_Port_Name"), "HTTP/1", "12"));
    api.send(SERVERS, "MODIFIED", server(json!(8080), "HTTP/2", "13"));
    assert_eq!(changed(&mut rx).await, (ServerMeta::Server("api".into()), Protocol::Http2));

    // 410 Gone: the re-list no longer has the Server, so the default is back.
    api.set_list(SERVERS, Vec::new(), "20");
    api.gone(SERVERS);
    let (meta, protocol) = changed(&mut rx).await;
    assert_eq!((meta, protocol), (ServerMeta::Default(DefaultPolicy::Deny), Protocol::Detect));
    assert!(api.requests(SERVERS, false).len() >= 2, "re-listed");
}
