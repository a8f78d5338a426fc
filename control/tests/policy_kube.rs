//! Policy over the Kubernetes source: kube-rs watchers for Namespaces and the policy resources
//! (and the one Pod watch Destination shares) against the in-process API server: list, changes as
//! watch events,
//! an invalid resource ignored with its last good version kept, a 410 Gone re-list that drops
//! what the API server no longer has; the same for Gateway API routes, whose CRDs may be missing
//! (404) without holding policy back. Answers read from the policy index's watch channels.

use std::time::Duration;

use cnimesh_control::sources::{KubeSource, Source};
use cnimesh_model::destination::{self};
use cnimesh_model::egress;
use cnimesh_model::meta::NsName;
use cnimesh_model::outbound::{self, Parent};
use cnimesh_model::policy::index::{InboundView, ServerMeta};
use cnimesh_model::policy::model::Protocol;
use cnimesh_model::policy::{self, DefaultPolicy};
use serde_json::{Value, json};
use tokio::sync::watch;

use cnimesh_apiserver::ClusterApi;

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
        "metadata": {"namespace": "shop", "name": "api-0", "labels": {"app": "api"}},
        "spec": {"containers": [{"name": "app", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"podIP": "10.1.0.5"}})
}

fn namespace(policy: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "shop",
            "annotations": {"config.cnimesh.io/default-inbound-policy": policy}}})
}

fn server(port: Value, protocol: &str) -> Value {
    json!({"apiVersion": "policy.cnimesh.io/v1alpha1", "kind": "Server",
        "metadata": {"namespace": "shop", "name": "api"},
        "spec": {"podSelector": {"matchLabels": {"app": "api"}}, "port": port, "proxyProtocol": protocol}})
}

async fn changed(rx: &mut watch::Receiver<InboundView>) -> (ServerMeta, Protocol) {
    tokio::time::timeout(PATIENCE, rx.changed()).await.expect("an update in time").unwrap();
    let view = rx.borrow_and_update().clone().expect("pod known");
    (view.meta.clone(), view.protocol)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_resources_are_listed_watched_and_relisted() {
    let api = ClusterApi::new();
    api.put(pod());
    api.put(namespace("deny"));
    let index = destination::Index::new();
    let policy = policy::Index::new(policy::Config::default());
    let source = KubeSource::new(api.client()).with_policy(policy.clone()).run(index.clone());
    tokio::spawn(async move { source.await.expect("kube source") });
    for path in [PODS, NAMESPACES].into_iter().chain(POLICY_PATHS) {
        api.nth_watch(path, 1).await;
    }
    tokio::time::timeout(PATIENCE, policy.ready()).await.expect("ready once every kind is listed");
    assert!(index.is_ready(), "the shared Pod watch fed Destination too");

    // The namespace's annotation applies to a port no Server names.
    let key = NsName::new("shop", "api-0");
    let mut rx = policy.watch_inbound(&key, 8080);
    let first = rx.borrow_and_update().clone().expect("pod listed");
    assert_eq!(first.meta, ServerMeta::Default(DefaultPolicy::Deny));

    // A Server arrives by watch event.
    api.put(server(json!("http"), "opaque"));
    assert_eq!(changed(&mut rx).await, (ServerMeta::Server("api".into()), Protocol::Opaque));

    // A bad edit that got past the schema is ignored; the next good one applies.
    api.put(server(json!("Not_A_Port_Name"), "HTTP/1"));
    api.put(server(json!(8080), "HTTP/2"));
    assert_eq!(changed(&mut rx).await, (ServerMeta::Server("api".into()), Protocol::Http2));

    // 410 Gone: the re-list no longer has the Server, so the default is back.
    api.restart_losing_history("servers", |api| api.remove("policy.cnimesh.io/v1alpha1", "Server", "shop", "api"));
    let (meta, protocol) = changed(&mut rx).await;
    assert_eq!((meta, protocol), (ServerMeta::Default(DefaultPolicy::Deny), Protocol::Detect));
    assert!(api.lists_of(SERVERS) >= 2, "re-listed");
}

const HTTP_ROUTES: &str = "/apis/gateway.networking.k8s.io/v1/httproutes";
const GRPC_ROUTES: &str = "/apis/gateway.networking.k8s.io/v1/grpcroutes";

fn http_route(path_regex: &str) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"namespace": "shop", "name": "api-split"},
        "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "api"}],
            "rules": [{"matches": [{"path": {"type": "RegularExpression", "value": path_regex}}],
                "backendRefs": [{"name": "api", "port": 80, "weight": 9}, {"name": "api-v2", "port": 80, "weight": 1}]}]}})
}

async fn routes_changed(rx: &mut watch::Receiver<cnimesh_model::routes::ServiceRoutes>) -> Vec<String> {
    tokio::time::timeout(PATIENCE, rx.changed()).await.expect("an update in time").unwrap();
    let routes = rx.borrow_and_update().clone();
    routes.iter().map(|r| format!("{}/{}", r.kind.as_str(), r.key)).collect()
}

fn path_regex(routes: &cnimesh_model::routes::ServiceRoutes) -> String {
    let cnimesh_model::routes::model::Matches::Http(matches) = &routes[0].rules[0].matches else { panic!() };
    match &matches[0].path {
        Some(cnimesh_model::routes::model::PathMatch::Regex(r)) => r.clone(),
        other => panic!("{other:?}"),
    }
}

/// Routes over the Kubernetes source: HTTPRoutes listed and watched (a bad edit ignored, its last
/// good version kept; a 410 re-list that drops it), and GRPCRoutes whose CRD is not installed
/// (404) counted as none, so policy is ready, then picked up once the API server serves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_are_watched_and_a_missing_gateway_api_counts_as_no_routes() {
    let api = ClusterApi::new();
    // The Gateway API's GRPCRoute CRD is not installed.
    api.set_faults(|f| f.unserved = vec!["grpcroutes".into()]);
    api.put(http_route("^/v1/.*"));
    let index = destination::Index::new();
    let policy = policy::Index::new(policy::Config::default());
    // The routes are the outbound index's (keyed by parent), fed by the same source.
    let outbound = outbound::Index::new(egress::Index::new(egress::Config::new(Vec::new())));
    let source =
        KubeSource::new(api.client()).with_policy(policy.clone()).with_index(outbound.clone()).run(index.clone());
    tokio::spawn(async move { source.await.expect("kube source") });
    tokio::time::timeout(PATIENCE, policy.ready()).await.expect("policy ready");
    tokio::time::timeout(PATIENCE, outbound.ready()).await.expect("ready without the GRPCRoute CRD");
    assert!(api.lists_of(GRPC_ROUTES) > 0, "GRPCRoutes were asked for (404)");

    let service = NsName::new("shop", "api");
    let mut rx = outbound.watch(&Parent::Service(service.clone()));
    assert_eq!(path_regex(&rx.borrow_and_update()), "^/v1/.*");

    // A regular expression that does not compile is refused; the next good edit applies.
    api.nth_watch(HTTP_ROUTES, 1).await;
    api.put(http_route("(["));
    api.put(http_route("^/v2/.*"));
    assert_eq!(routes_changed(&mut rx).await, ["HTTPRoute/shop/api-split"]);
    assert_eq!(path_regex(&rx.borrow()), "^/v2/.*");

    // 410 Gone and a re-list without it: no routes.
    api.restart_losing_history("httproutes", |api| {
        api.remove("gateway.networking.k8s.io/v1", "HTTPRoute", "shop", "api-split");
    });
    assert!(routes_changed(&mut rx).await.is_empty());

    // The Gateway API's GRPCRoute CRD gets installed: the retrying watcher lists it.
    let grpc = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
        "metadata": {"namespace": "shop", "name": "items"},
        "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "api"}]}});
    api.put(grpc);
    api.set_faults(|f| f.unserved.clear());
    assert_eq!(routes_changed(&mut rx).await, ["GRPCRoute/shop/items"]);
}

/// An object that does not read as its kind (what a CRD's schema refuses, were one missing) is
/// refused alone, counted by kind: the rest of its kind still lists and updates, and the version
/// of it the index held stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_does_not_read_as_its_kind_is_refused_alone_and_its_last_good_version_stays() {
    let unreadable = |name: &str| {
        let mut server = server(json!({"not": "a port"}), "HTTP/1");
        server["metadata"]["name"] = json!(name);
        server
    };
    let api = ClusterApi::new();
    api.put(pod());
    api.put(namespace("deny"));
    api.put(server(json!("http"), "opaque"));
    api.put(unreadable("broken"));
    let metrics = std::sync::Arc::new(cnimesh_model::metrics::Metrics::default());
    let index = destination::Index::new();
    let policy = policy::Index::new(policy::Config::default());
    let source =
        KubeSource::new(api.client()).with_policy(policy.clone()).with_metrics(metrics.clone()).run(index.clone());
    tokio::spawn(async move { source.await.expect("kube source") });
    tokio::time::timeout(PATIENCE, policy.ready()).await.expect("the list is read despite the unreadable Server");
    let mut rx = policy.watch_inbound(&NsName::new("shop", "api-0"), 8080);
    let first = rx.borrow_and_update().clone().expect("pod listed");
    assert_eq!((first.meta.clone(), first.protocol), (ServerMeta::Server("api".into()), Protocol::Opaque));

    // An unreadable edit of `api` changes nothing; the next readable one applies.
    api.put(unreadable("api"));
    api.put(server(json!(8080), "HTTP/2"));
    assert_eq!(changed(&mut rx).await, (ServerMeta::Server("api".into()), Protocol::Http2));
    let text = metrics.encode();
    assert!(text.contains("cluster_objects_rejected_total{kind=\"Server\"} 2"), "{text}");
}

/// Egress over the Kubernetes source: EgressNetworks, TLSRoutes and TCPRoutes are egress's
/// alone; an HTTPRoute with an EgressNetwork parent reaches the egress index too. An
/// EgressNetwork without its required `trafficPolicy` does not read as its kind: refused alone,
/// counted, and the rest still listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_kinds_and_routes_with_an_egress_network_parent_reach_the_egress_index() {
    let world = json!([{"group": "policy.cnimesh.io", "kind": "EgressNetwork", "name": "world"}]);
    let object = |api_version: &str, kind: &str, name: &str, spec: Value| json!({"apiVersion": api_version, "kind": kind, "metadata": {"namespace": "shop", "name": name}, "spec": spec});
    let api = ClusterApi::new();
    api.put(object("policy.cnimesh.io/v1alpha1", "EgressNetwork", "world", json!({"trafficPolicy": "Deny"})));
    api.put(object("policy.cnimesh.io/v1alpha1", "EgressNetwork", "broken", json!({})));
    api.put(object("gateway.networking.k8s.io/v1alpha2", "TLSRoute", "t", json!({"parentRefs": world})));
    api.put(object("gateway.networking.k8s.io/v1alpha2", "TCPRoute", "c", json!({"parentRefs": world})));
    api.put(object("gateway.networking.k8s.io/v1", "HTTPRoute", "h", json!({"parentRefs": world})));
    let metrics = std::sync::Arc::new(cnimesh_model::metrics::Metrics::default());
    let (index, policy) = (destination::Index::new(), policy::Index::new(policy::Config::default()));
    let egress = cnimesh_model::egress::Index::new(cnimesh_model::egress::Config::new(Vec::new()));
    let source = KubeSource::new(api.client())
        .with_policy(policy.clone())
        .with_index(egress.clone())
        .with_metrics(metrics.clone())
        .run(index.clone());
    tokio::spawn(async move { source.await.expect("kube source") });
    tokio::time::timeout(PATIENCE, egress.ready()).await.expect("every egress kind listed");
    let mut rx = egress.watch();
    let keys = |keys: Vec<&NsName>| keys.into_iter().map(|k| k.name.clone()).collect::<Vec<_>>();
    let snapshot = tokio::time::timeout(PATIENCE, rx.wait_for(|s| s.networks.len() == 1 && s.streams.len() == 2))
        .await
        .expect("the egress objects in time")
        .unwrap()
        .clone();
    assert_eq!(keys(snapshot.networks.iter().map(|n| &n.key).collect()), ["world"]);
    let mut streams = keys(snapshot.streams.iter().map(|s| &s.key).collect());
    streams.sort();
    assert_eq!(streams, ["c", "t"]);
    assert_eq!(keys(snapshot.routes.iter().map(|r| &r.key).collect()), ["h"]);
    let text = metrics.encode();
    assert!(text.contains("cluster_objects_rejected_total{kind=\"EgressNetwork\"} 1"), "{text}");
}

/// A proxy running as an ExternalWorkload names itself as Linkerd's do, and gets the Servers
/// that select the ExternalWorkload's labels, with the identities their policies allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_selecting_an_external_workload_applies_to_its_proxy_and_allows_only_its_identities() {
    use cnimesh_control::grpc::inbound::InboundService;
    use linkerd2_proxy_api::inbound::PortSpec;
    use linkerd2_proxy_api::inbound::inbound_server_policies_server::InboundServerPolicies;

    let api = ClusterApi::new();
    api.put(json!({"apiVersion": "workload.cnimesh.io/v1alpha1", "kind": "ExternalWorkload",
        "metadata": {"namespace": "shop", "name": "db-vm", "labels": {"app": "api"}},
        "spec": {"workloadIPs": ["192.0.2.10"], "ports": [{"name": "http", "port": 8080}], "serviceAccountName": "db"}}));
    api.put(server(json!("http"), "HTTP/1"));
    api.put(json!({"apiVersion": "policy.cnimesh.io/v1alpha1", "kind": "MeshTLSAuthentication",
        "metadata": {"namespace": "shop", "name": "web"},
        "spec": {"identityRefs": [{"kind": "ServiceAccount", "name": "web"}]}}));
    api.put(json!({"apiVersion": "policy.cnimesh.io/v1alpha1", "kind": "AuthorizationPolicy",
        "metadata": {"namespace": "shop", "name": "web-to-db"},
        "spec": {"targetRef": {"group": "policy.cnimesh.io", "kind": "Server", "name": "api"},
            "requiredAuthenticationRefs": [{"group": "policy.cnimesh.io", "kind": "MeshTLSAuthentication", "name": "web"}]}}));
    let index = destination::Index::new();
    let policy = policy::Index::new(policy::Config::default());
    let source = KubeSource::new(api.client()).with_policy(policy.clone()).run(index.clone());
    tokio::spawn(async move { source.await.expect("kube source") });
    api.nth_watch("/apis/workload.cnimesh.io/v1alpha1/externalworkloads", 1).await;
    tokio::time::timeout(PATIENCE, policy.ready()).await.expect("ready");

    let service = InboundService::new(policy.clone());
    let ask = |workload: &str| PortSpec { workload: workload.to_string(), port: 8080 };
    let answer = service
        .get_port(tonic::Request::new(ask(r#"{"ns":"shop","kind":"external_workload","name":"db-vm"}"#)))
        .await
        .expect("the ExternalWorkload's port")
        .into_inner();
    assert_eq!(answer.labels.get("name").map(String::as_str), Some("api"), "the Server selecting its labels");
    let identities: Vec<String> = answer
        .authorizations
        .iter()
        .flat_map(|a| match a.authentication.as_ref().and_then(|x| x.permit.as_ref()) {
            Some(linkerd2_proxy_api::inbound::authn::Permit::MeshTls(m)) => match &m.clients {
                Some(linkerd2_proxy_api::inbound::authn::permit_mesh_tls::Clients::Identities(ids)) => {
                    ids.identities.iter().map(|i| i.name.clone()).collect()
                }
                _ => Vec::new(),
            },
            _ => vec!["<unauthenticated>".to_string()],
        })
        .collect();
    assert_eq!(
        identities,
        ["web.shop.serviceaccount.identity.cnimesh.cluster.local"],
        "every other identity is denied"
    );

    // No pod of that name: the pod form does not reach it, and an unknown one is NotFound.
    let err = service
        .get_port(tonic::Request::new(ask(r#"{"ns":"shop","kind":"external_workload","name":"other"}"#)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
    let err = service.get_port(tonic::Request::new(ask("shop:db-vm"))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
}
