//! Destination over the Kubernetes source: kube-rs watchers against the in-process API server
//! (list, changes as watch events, a watch ending, a 410 Gone after a compaction), answers read
//! over real gRPC with the generated client.

use std::time::Duration;

use cnimesh_control::grpc::destination::DestinationService;
use cnimesh_control::sources::{KubeSource, Source};
use cnimesh_e2e::kube_api::ClusterApi;
use cnimesh_model::destination::{Config, Index};
use linkerd2_proxy_api::destination::destination_client::DestinationClient;
use linkerd2_proxy_api::destination::update::Update as Up;
use linkerd2_proxy_api::destination::{GetDestination, NoEndpoints, Update, WeightedAddr};
use serde_json::{Value, json};
use tonic::Streaming;

const SERVICES: &str = "/api/v1/services";
const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";
const PODS: &str = "/api/v1/pods";
/// Only guards against a hung test; nothing here measures time.
const PATIENCE: Duration = Duration::from_secs(30);

fn service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "shop", "name": "web"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80, "targetPort": "web"}]}})
}

fn slice(hosts: &[u8]) -> Value {
    let endpoints: Vec<Value> = hosts
        .iter()
        .map(|h| {
            json!({"addresses": [format!("10.1.0.{h}")], "conditions": {"ready": true},
            "targetRef": {"kind": "Pod", "namespace": "shop", "name": format!("web-{h}")}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "shop", "name": "web-abc", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": endpoints})
}

fn pod(host: u8, meshed: bool) -> Value {
    let mut containers = vec![json!({"name": "app", "ports": [{"name": "web", "containerPort": 8080}]})];
    if meshed {
        containers.push(json!({"name": "cnimesh-proxy"}));
    }
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "shop", "name": format!("web-{host}")},
        "spec": {"serviceAccountName": "web", "containers": containers},
        "status": {"phase": "Running", "podIP": format!("10.1.0.{host}"), "podIPs": [{"ip": format!("10.1.0.{host}")}]}})
}

async fn next(stream: &mut Streaming<Update>) -> Up {
    let message = tokio::time::timeout(PATIENCE, stream.message()).await.expect("a message in time");
    message.unwrap().expect("stream open").update.expect("update set")
}

fn addrs(update: Up) -> Vec<String> {
    let mut out: Vec<String> = match update {
        Up::Add(set) => set.addrs.iter().map(|a: &WeightedAddr| a.addr.unwrap()).map(to_string).collect(),
        Up::Remove(set) => set.addrs.into_iter().map(to_string).collect(),
        Up::NoEndpoints(n) => panic!("expected endpoints, got {n:?}"),
    };
    out.sort();
    out
}

fn to_string(a: linkerd2_proxy_api::net::TcpAddress) -> String {
    std::net::SocketAddr::try_from(a).unwrap().to_string()
}

fn identity_of(update: &Up) -> Option<String> {
    use linkerd2_proxy_api::destination::tls_identity::Strategy;
    let Up::Add(set) = update else { panic!("expected add, got {update:?}") };
    match set.addrs[0].tls_identity.as_ref()?.strategy.as_ref()? {
        Strategy::DnsLikeIdentity(d) => Some(d.name.clone()),
        Strategy::UriLikeIdentity(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_resume_relist_after_gone_and_stream_changes() {
    let api = ClusterApi::new();
    api.put(service());
    api.put(slice(&[1, 2]));
    for host in 1..=4 {
        api.put(pod(host, true));
    }
    let listed = api.resource_version();

    let index = Index::new();
    let source = KubeSource::new(api.client()).run(index.clone());
    tokio::spawn(async move { source.await.expect("kube source") });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    DestinationService::new(index.clone(), Config::default()).spawn_plaintext(listener);
    let mut client = DestinationClient::connect(format!("http://{addr}")).await.unwrap();

    // Once every watch is open, every list has been applied.
    for path in [SERVICES, SLICES, PODS] {
        let watch = api.nth_watch(path, 1).await;
        assert_eq!(watch.param("resourceVersion"), Some(listed.as_str()), "{path}");
    }
    let request = GetDestination { path: "web.shop.svc.cluster.local:80".into(), ..Default::default() };
    let mut get = client.get(request).await.unwrap().into_inner();
    let first = next(&mut get).await;
    assert_eq!(identity_of(&first).as_deref(), Some("web.shop.serviceaccount.identity.cnimesh.cluster.local"));
    assert_eq!(addrs(first), ["10.1.0.1:8080", "10.1.0.2:8080"]);

    // A change, seen as a watch event.
    let modified = api.put(slice(&[1, 2, 3]));
    assert_eq!(addrs(next(&mut get).await), ["10.1.0.3:8080"]);

    // The watch ends: the watcher resumes from the last version it saw, without a list.
    api.end_watches("endpointslices");
    let resumed = api.nth_watch(SLICES, 2).await;
    assert_eq!(resumed.param("resourceVersion"), modified["metadata"]["resourceVersion"].as_str());
    assert_eq!(api.lists_of(SLICES), 1);

    // 410 Gone: while the slices cannot be watched, web-1 leaves and the history is compacted;
    // the watcher's resume is told 410, it lists again, and what changed meanwhile shows.
    api.restart_losing_history("endpointslices", |api| {
        api.put(slice(&[2, 3]));
    });
    let relisted = api.resource_version();
    assert_eq!(addrs(next(&mut get).await), ["10.1.0.1:8080"]);
    assert_eq!(api.lists_of(SLICES), 2);
    api.watch_from(SLICES, &relisted).await;

    // A pod losing its proxy: the endpoint is re-sent without identity.
    api.put(pod(2, false));
    let update = next(&mut get).await;
    assert_eq!(identity_of(&update), None);
    assert_eq!(addrs(update), ["10.1.0.2:8080"]);

    // GetProfile by ClusterIP names the service.
    let request = GetDestination { path: "10.96.0.10:80".into(), ..Default::default() };
    let mut profile = client.get_profile(request).await.unwrap().into_inner();
    let first = tokio::time::timeout(PATIENCE, profile.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.fully_qualified_name, "web.shop.svc.cluster.local");

    // The service deleted: endpoints removed, then "does not exist".
    api.remove("v1", "Service", "shop", "web");
    assert_eq!(addrs(next(&mut get).await), ["10.1.0.2:8080", "10.1.0.3:8080"]);
    assert_eq!(next(&mut get).await, Up::NoEndpoints(NoEndpoints { exists: false }));
    let gone = tokio::time::timeout(PATIENCE, profile.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(gone.fully_qualified_name, "");
}
