//! Destination end to end over the Kubernetes source: objects (written as YAML manifests) applied
//! to the in-process API server, watched by [`KubeSource`], a real tonic server on 127.0.0.1, and
//! the generated client.

use std::io::Write;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use std::time::Duration;

use linkerd2_proxy_api::destination::destination_client::DestinationClient;
use linkerd2_proxy_api::destination::protocol_hint::Protocol;
use linkerd2_proxy_api::destination::update::Update as Up;
use linkerd2_proxy_api::destination::{DestinationProfile, GetDestination, NoEndpoints, Update, WeightedAddr};
use tonic::Streaming;
use tonic::transport::Channel;

use cnimesh_apiserver::ClusterApi;
use cnimesh_control::grpc::destination::DestinationService;
use cnimesh_control::sources::{KubeSource, Source};
use cnimesh_model::destination::{Config, Index};

/// Only guards against a hung test; nothing here measures time.
const PATIENCE: Duration = Duration::from_secs(20);

struct Harness {
    api: Arc<ClusterApi>,
    client: DestinationClient<Channel>,
}

impl Harness {
    /// The manifests (name, YAML) are applied before the source starts, so the first answers see
    /// them.
    async fn start(manifests: &[(&str, &str)]) -> Self {
        let api = ClusterApi::new();
        for (name, text) in manifests {
            api.apply_yaml(name, text).unwrap();
        }
        let index = Index::new();
        let source = KubeSource::new(api.client()).run(index.clone());
        tokio::spawn(async move { source.await.expect("kube source") });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        DestinationService::new(index.clone(), Config::default()).spawn_plaintext(listener);
        let client = DestinationClient::connect(format!("http://{addr}")).await.unwrap();
        tokio::time::timeout(PATIENCE, index.ready()).await.expect("every kind listed");
        Self { api, client }
    }

    /// `kubectl apply -f <name>`: what the manifest no longer holds is deleted.
    fn write(&self, name: &str, text: &str) {
        self.api.apply_yaml(name, text).unwrap();
    }

    /// `kubectl delete -f <name>`.
    fn remove(&self, name: &str) {
        self.api.delete_applied(name);
    }

    async fn get(&self, path: &str) -> Streaming<Update> {
        let request = GetDestination { path: path.to_string(), ..Default::default() };
        self.client.clone().get(request).await.unwrap().into_inner()
    }

    async fn profile(&self, path: &str) -> Streaming<DestinationProfile> {
        let request = GetDestination { path: path.to_string(), ..Default::default() };
        self.client.clone().get_profile(request).await.unwrap().into_inner()
    }
}

async fn next<T>(stream: &mut Streaming<T>) -> T {
    tokio::time::timeout(PATIENCE, stream.message()).await.expect("a message in time").unwrap().expect("stream open")
}

async fn next_update(stream: &mut Streaming<Update>) -> Up {
    next(stream).await.update.expect("update set")
}

fn added(update: Up) -> Vec<WeightedAddr> {
    match update {
        Up::Add(set) => set.addrs,
        other => panic!("expected add, got {other:?}"),
    }
}

fn addr_str(a: Option<linkerd2_proxy_api::net::TcpAddress>) -> String {
    std::net::SocketAddr::try_from(a.unwrap()).unwrap().to_string()
}

fn sorted_addrs(addrs: &[WeightedAddr]) -> Vec<String> {
    let mut out: Vec<String> = addrs.iter().map(|a| addr_str(a.addr)).collect();
    out.sort();
    out
}

fn removed(update: Up) -> Vec<String> {
    match update {
        Up::Remove(set) => {
            let mut out: Vec<String> = set.addrs.iter().map(|a| addr_str(Some(*a))).collect();
            out.sort();
            out
        }
        other => panic!("expected remove, got {other:?}"),
    }
}

fn identity(a: &WeightedAddr) -> Option<String> {
    use linkerd2_proxy_api::destination::tls_identity::Strategy;
    match a.tls_identity.as_ref()?.strategy.as_ref()? {
        Strategy::DnsLikeIdentity(d) => Some(d.name.clone()),
        Strategy::UriLikeIdentity(_) => None,
    }
}

fn hint(a: &WeightedAddr) -> Option<Protocol> {
    a.protocol_hint.and_then(|h| h.protocol)
}

// ---- YAML builders -------------------------------------------------------------------------------

fn service(ns: &str, name: &str, cluster_ip: &str, ports: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  clusterIP: {cluster_ip}\n  ports: {ports}\n"
    )
}

/// `endpoints`: (ip, pod name, ready).
fn slice(ns: &str, name: &str, svc: &str, family: &str, ports: &str, endpoints: &[(&str, &str, bool)]) -> String {
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: {svc}}}\naddressType: {family}\nports: {ports}\nendpoints:\n"
    );
    for (ip, pod, ready) in endpoints {
        s += &format!(
            "- addresses: ['{ip}']\n  conditions: {{ready: {ready}}}\n  targetRef: {{kind: Pod, name: {pod}, namespace: {ns}}}\n"
        );
    }
    s
}

fn pod(ns: &str, name: &str, ip: &str, sa: &str, meshed: bool, extra: &str) -> String {
    let proxy = if meshed { "\n  - name: cnimesh-proxy" } else { "" };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n{extra}spec:\n  serviceAccountName: {sa}\n  containers:\n  - name: app\n    ports: [{{name: web, containerPort: 9090}}]{proxy}\nstatus: {{podIP: '{ip}', podIPs: [{{ip: '{ip}'}}]}}\n"
    )
}

fn docs(parts: &[String]) -> String {
    parts.join("---\n")
}

const WEB: &str = "web.shop.svc.cluster.local:80";
const HTTP_PORT: &str = "[{name: http, port: 80, targetPort: 8080}]";
const SLICE_HTTP: &str = "[{name: http, port: 8080}]";

fn web_pods(n: usize) -> String {
    docs(
        &(1..=n).map(|i| pod("shop", &format!("web-{i}"), &format!("10.1.0.{i}"), "web", true, "")).collect::<Vec<_>>(),
    )
}

fn web_slice(ips: &[usize]) -> String {
    let eps: Vec<(String, String)> = ips.iter().map(|i| (format!("10.1.0.{i}"), format!("web-{i}"))).collect();
    let eps: Vec<(&str, &str, bool)> = eps.iter().map(|(ip, p)| (ip.as_str(), p.as_str(), true)).collect();
    slice("shop", "web-a", "web", "IPv4", SLICE_HTTP, &eps)
}

// ---- tests ---------------------------------------------------------------------------------------

#[tokio::test]
async fn get_follows_endpoints_as_objects_change() {
    let svc = service("shop", "web", "10.96.0.10", HTTP_PORT);
    let h =
        Harness::start(&[("svc.yaml", &svc), ("pods.yaml", &web_pods(4)), ("slice.yaml", &web_slice(&[1, 2]))]).await;
    let mut get = h.get(WEB).await;

    // First message: an add, at once, with identities and the H2 hint.
    let first = added(next_update(&mut get).await);
    assert_eq!(sorted_addrs(&first), ["10.1.0.1:8080", "10.1.0.2:8080"]);
    for a in &first {
        assert_eq!(identity(a).as_deref(), Some("web.shop.serviceaccount.identity.cnimesh.cluster.local"));
        assert!(matches!(hint(a), Some(Protocol::H2(_))));
    }

    h.write("slice.yaml", &web_slice(&[1, 2, 3]));
    assert_eq!(sorted_addrs(&added(next_update(&mut get).await)), ["10.1.0.3:8080"]);

    h.write("slice.yaml", &web_slice(&[2, 3]));
    assert_eq!(removed(next_update(&mut get).await), ["10.1.0.1:8080"]);

    // Not ready means gone, without deleting anything.
    let eps = [("10.1.0.2", "web-2", true), ("10.1.0.3", "web-3", false)];
    h.write("slice.yaml", &slice("shop", "web-a", "web", "IPv4", SLICE_HTTP, &eps));
    assert_eq!(removed(next_update(&mut get).await), ["10.1.0.3:8080"]);

    // A second slice of the same service adds to it.
    let second = slice("shop", "web-b", "web", "IPv4", SLICE_HTTP, &[("10.1.0.4", "web-4", true)]);
    h.write("slice-b.yaml", &second);
    assert_eq!(sorted_addrs(&added(next_update(&mut get).await)), ["10.1.0.4:8080"]);

    // The service going away: its endpoints are removed and the client may fall back to DNS.
    h.remove("svc.yaml");
    assert_eq!(removed(next_update(&mut get).await), ["10.1.0.2:8080", "10.1.0.4:8080"]);
    assert_eq!(next_update(&mut get).await, Up::NoEndpoints(NoEndpoints { exists: false }));
}

#[tokio::test]
async fn named_target_ports_resolve_through_slice_or_pod() {
    // Port 80 → targetPort "web": the slice's port named like the service port ("http") wins.
    let named = "[{name: http, port: 80, targetPort: web}]";
    let svc = service("shop", "web", "10.96.0.10", named);
    // A hand-written slice without ports: the pod's container port named "web" (9090) is used.
    let bare = slice("shop", "api-a", "api", "IPv4", "[]", &[("10.1.0.2", "web-2", true)]);
    let manifests = [
        ("svc.yaml", docs(&[svc, service("shop", "api", "10.96.0.11", named)])),
        ("pods.yaml", web_pods(2)),
        ("slices.yaml", docs(&[web_slice(&[1]), bare])),
    ];
    let manifests: Vec<(&str, &str)> = manifests.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let h = Harness::start(&manifests).await;
    let mut web = h.get(WEB).await;
    assert_eq!(sorted_addrs(&added(next_update(&mut web).await)), ["10.1.0.1:8080"]);
    let mut api = h.get("api.shop.svc.cluster.local:80").await;
    assert_eq!(sorted_addrs(&added(next_update(&mut api).await)), ["10.1.0.2:9090"]);
    // A port the service does not have: the service exists, with nothing to offer there.
    let mut other = h.get("web.shop.svc.cluster.local:81").await;
    assert_eq!(next_update(&mut other).await, Up::NoEndpoints(NoEndpoints { exists: true }));
}

#[tokio::test]
async fn an_object_that_does_not_read_as_its_kind_is_reported_and_its_last_good_version_kept() {
    let logs = capture_logs();
    let svc = service("shop", "web", "10.96.0.10", HTTP_PORT);
    let h =
        Harness::start(&[("svc.yaml", &svc), ("pods.yaml", &web_pods(3)), ("slice.yaml", &web_slice(&[1, 2]))]).await;
    let mut get = h.get(WEB).await;
    assert_eq!(added(next_update(&mut get).await).len(), 2);

    // What a schema would refuse: `endpoints` is no list.
    let bad = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-a, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: unclosed\n";
    h.write("slice.yaml", bad);
    let line = tokio::time::timeout(PATIENCE, async {
        loop {
            let logged = String::from_utf8(logs.lock().clone()).unwrap();
            if let Some(line) = logged.lines().find(|l| l.contains("EndpointSlice") && l.contains("name=web-a")) {
                return line.to_string();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the bad object is logged");
    assert!(line.contains("WARN") && line.contains("refused"), "{line}");
    let mut again = h.get(WEB).await;
    assert_eq!(sorted_addrs(&added(next_update(&mut again).await)), ["10.1.0.1:8080", "10.1.0.2:8080"]);

    // Fixed, the object counts again.
    h.write("slice.yaml", &web_slice(&[1, 2, 3]));
    assert_eq!(sorted_addrs(&added(next_update(&mut get).await)), ["10.1.0.3:8080"]);
}

#[tokio::test]
async fn unknown_service_is_no_endpoints_then_adds_when_it_appears() {
    let h = Harness::start(&[("pods.yaml", &web_pods(1))]).await;
    let mut get = h.get("web.shop.svc:80").await;
    assert_eq!(next_update(&mut get).await, Up::NoEndpoints(NoEndpoints { exists: false }));
    h.write("svc.yaml", &docs(&[service("shop", "web", "10.96.0.10", HTTP_PORT), web_slice(&[1])]));
    assert_eq!(sorted_addrs(&added(next_update(&mut get).await)), ["10.1.0.1:8080"]);
}

#[tokio::test]
async fn invalid_paths_are_invalid_argument() {
    let h = Harness::start(&[]).await;
    for path in ["web", "web.shop.svc.cluster.local:http", "web:80", "10.0.0.1:80"] {
        let request = GetDestination { path: path.to_string(), ..Default::default() };
        let status = h.client.clone().get(request).await.expect_err(path);
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{path}");
        assert!(status.message().contains(path), "{path}: {}", status.message());
    }
}

#[tokio::test]
async fn opaque_ports_unmeshed_pods_and_ipv6() {
    let opaque = "  annotations: {config.cnimesh.io/opaque-ports: '8080'}\n";
    let pods = docs(&[
        pod("shop", "db", "fd00::1", "db", true, opaque),
        pod("shop", "plain", "fd00::2", "default", false, ""),
    ]);
    let eps = [("fd00::1", "db", true), ("fd00::2", "plain", true)];
    let manifests = [
        ("svc.yaml", service("shop", "web", "fd00:96::10", HTTP_PORT)),
        ("pods.yaml", pods),
        ("slice.yaml", slice("shop", "web-v6", "web", "IPv6", SLICE_HTTP, &eps)),
    ];
    let manifests: Vec<(&str, &str)> = manifests.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let h = Harness::start(&manifests).await;
    let mut get = h.get(WEB).await;
    let mut addrs = added(next_update(&mut get).await);
    addrs.sort_by_key(|a| addr_str(a.addr));
    assert_eq!(sorted_addrs(&addrs), ["[fd00::1]:8080", "[fd00::2]:8080"]);
    assert_eq!(identity(&addrs[0]).as_deref(), Some("db.shop.serviceaccount.identity.cnimesh.cluster.local"));
    assert!(matches!(hint(&addrs[0]), Some(Protocol::Opaque(_))));
    assert_eq!((identity(&addrs[1]), hint(&addrs[1])), (None, None));
}

#[tokio::test]
async fn get_profile_for_cluster_ip_pod_ip_and_unknown_ip() {
    let svc = service("shop", "web", "10.96.0.10", HTTP_PORT);
    let h = Harness::start(&[("svc.yaml", &svc), ("pods.yaml", &web_pods(1)), ("slice.yaml", &web_slice(&[1]))]).await;

    let mut by_cluster_ip = h.profile("10.96.0.10:80").await;
    let profile = next(&mut by_cluster_ip).await;
    assert_eq!(profile.fully_qualified_name, "web.shop.svc.cluster.local");
    assert!(profile.endpoint.is_none() && !profile.opaque_protocol);

    let mut by_name = h.profile(WEB).await;
    assert_eq!(next(&mut by_name).await.fully_qualified_name, "web.shop.svc.cluster.local");

    let mut by_pod_ip = h.profile("10.1.0.1:8080").await;
    let profile = next(&mut by_pod_ip).await;
    assert_eq!(profile.fully_qualified_name, "");
    let endpoint = profile.endpoint.expect("a pod IP is an endpoint");
    assert_eq!(addr_str(endpoint.addr), "10.1.0.1:8080");
    assert_eq!(identity(&endpoint).as_deref(), Some("web.shop.serviceaccount.identity.cnimesh.cluster.local"));
    assert!(matches!(hint(&endpoint), Some(Protocol::H2(_))));

    let mut unknown = h.profile("192.0.2.7:443").await;
    assert_eq!(next(&mut unknown).await, DestinationProfile::default());
    // Live: the address turns into a pod, and the profile follows.
    h.write("late.yaml", &pod("shop", "late", "192.0.2.7", "late", true, ""));
    let endpoint = next(&mut unknown).await.endpoint.expect("now a pod");
    assert_eq!(identity(&endpoint).as_deref(), Some("late.shop.serviceaccount.identity.cnimesh.cluster.local"));
}

/// The mirror of `web` from cluster `west` (the contract's shapes, written by hand as
/// the mirror controller would), port 80 named http plus an opaque port 3306.
fn mirror_service(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: shop\n  labels: {{mirror.cnimesh.io/mirrored-service: 'true', mirror.cnimesh.io/cluster-name: west}}\n  annotations: {{mirror.cnimesh.io/remote-svc-fq-name: web.shop.svc.west.local}}\nspec:\n  clusterIP: 10.96.9.9\n  ports: [{{name: http, port: 80}}, {{name: db, port: 3306, appProtocol: cnimesh.io/opaque}}]\n"
    )
}

fn mirror_slice(service: &str, annotations: &str, ports: &str, ips: &[&str]) -> String {
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-m\n  namespace: shop\n  labels: {{kubernetes.io/service-name: {service}, mirror.cnimesh.io/mirrored-service: 'true', mirror.cnimesh.io/cluster-name: west}}\n  annotations: {annotations}\naddressType: IPv4\nports: {ports}\nendpoints:\n"
    );
    for ip in ips {
        s += &format!("- addresses: ['{ip}']\n");
    }
    s
}

const GATEWAY_ID: &str = "cnimesh-gateway.cnimesh-multicluster.serviceaccount.identity.cnimesh.west.local";

#[tokio::test]
async fn a_gateway_mirror_is_served_as_the_gateway_with_the_remote_authority_and_opaque_transport() {
    let slice = mirror_slice(
        "web-west",
        &format!("{{mirror.cnimesh.io/remote-gateway-identity: {GATEWAY_ID}}}"),
        "[{name: http, port: 4143}, {name: db, port: 4143}]",
        &["192.0.2.10"],
    );
    // A local pod at the gateway's address must not lend it its identity.
    let manifests = [
        ("m.yaml", docs(&[mirror_service("web-west"), slice])),
        ("p.yaml", pod("shop", "x", "192.0.2.10", "x", true, "")),
    ];
    let manifests: Vec<(&str, &str)> = manifests.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let h = Harness::start(&manifests).await;
    let mut http = h.get("web-west.shop.svc.cluster.local:80").await;
    let http = added(next_update(&mut http).await);
    assert_eq!(sorted_addrs(&http), ["192.0.2.10:4143"]);
    let gateway = &http[0];
    assert_eq!(identity(gateway).as_deref(), Some(GATEWAY_ID));
    assert!(matches!(hint(gateway), Some(Protocol::H2(_))));
    let transport = gateway.protocol_hint.and_then(|h| h.opaque_transport).expect("opaque transport");
    assert_eq!(transport.inbound_port, 4143);
    assert_eq!(gateway.authority_override.as_ref().unwrap().authority_override, "web.shop.svc.west.local:80");
    assert_eq!(gateway.metric_labels["target_cluster_name"], "west");
    assert!(!gateway.metric_labels.contains_key("pod"), "not a local pod: {:?}", gateway.metric_labels);

    // The opaque port: the Opaque hint, its own port in the override.
    let mut db = h.get("web-west.shop.svc.cluster.local:3306").await;
    let db = added(next_update(&mut db).await);
    assert!(matches!(hint(&db[0]), Some(Protocol::Opaque(_))));
    assert_eq!(db[0].authority_override.as_ref().unwrap().authority_override, "web.shop.svc.west.local:3306");
}

#[tokio::test]
async fn a_remote_discovery_mirror_is_served_as_the_remote_pods_with_their_identity() {
    let meshed = mirror_slice(
        "web-flat",
        "{mirror.cnimesh.io/remote-identity: web.shop.serviceaccount.identity.cnimesh.west.local, mirror.cnimesh.io/remote-opaque-ports: '3306'}",
        "[{name: http, port: 8080}, {name: db, port: 3306}]",
        &["10.2.0.5"],
    );
    let plain = mirror_slice("web-flat", "{}", "[{name: http, port: 8080}]", &["10.2.0.6"])
        .replace("web-flat-m\n", "web-flat-p\n");
    let manifests = [("m.yaml", docs(&[mirror_service("web-flat"), meshed, plain]))];
    let manifests: Vec<(&str, &str)> = manifests.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let h = Harness::start(&manifests).await;
    let mut get = h.get("web-flat.shop.svc.cluster.local:80").await;
    let mut addrs = added(next_update(&mut get).await);
    addrs.sort_by_key(|a| addr_str(a.addr));
    assert_eq!(sorted_addrs(&addrs), ["10.2.0.5:8080", "10.2.0.6:8080"]);
    assert_eq!(identity(&addrs[0]).as_deref(), Some("web.shop.serviceaccount.identity.cnimesh.west.local"));
    assert!(matches!(hint(&addrs[0]), Some(Protocol::H2(_))));
    assert!(addrs[0].authority_override.is_none() && addrs[0].protocol_hint.unwrap().opaque_transport.is_none());
    assert_eq!((identity(&addrs[1]), hint(&addrs[1])), (None, None), "an unmeshed remote pod: plaintext");
    for a in &addrs {
        assert_eq!(a.metric_labels["target_cluster_name"], "west");
    }
    let mut db = h.get("web-flat.shop.svc.cluster.local:3306").await;
    let db = added(next_update(&mut db).await);
    assert!(matches!(hint(&db[0]), Some(Protocol::Opaque(_))), "the remote pod's opaque port");
}

#[tokio::test]
async fn a_gateway_mirror_without_its_remote_name_offers_no_endpoint() {
    let svc = mirror_service("web-west")
        .replace("  annotations: {mirror.cnimesh.io/remote-svc-fq-name: web.shop.svc.west.local}\n", "");
    let slice = mirror_slice(
        "web-west",
        &format!("{{mirror.cnimesh.io/remote-gateway-identity: {GATEWAY_ID}}}"),
        "[{name: http, port: 4143}]",
        &["192.0.2.10"],
    );
    let manifests = [("m.yaml", docs(&[svc, slice]))];
    let manifests: Vec<(&str, &str)> = manifests.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let h = Harness::start(&manifests).await;
    let mut get = h.get("web-west.shop.svc.cluster.local:80").await;
    assert_eq!(next_update(&mut get).await, Up::NoEndpoints(NoEndpoints { exists: true }));
}

static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

/// Warnings and errors of the whole test process, as text.
fn capture_logs() -> Arc<Mutex<Vec<u8>>> {
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || LogSink(sink.clone()))
            .try_init();
        logs
    })
    .clone()
}

struct LogSink(Arc<Mutex<Vec<u8>>>);

impl Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// ---- What a multicluster gateway sees --------------------------------------------------

/// The `context_token` a proxy in gateway mode sends.
fn gateway_token() -> String {
    use cnimesh_common::names::{CONTEXT_TOKEN_CALLER_KEY, CONTEXT_TOKEN_GATEWAY};
    serde_json::json!({ CONTEXT_TOKEN_CALLER_KEY: CONTEXT_TOKEN_GATEWAY }).to_string()
}

/// A Service of `shop` on port 80 selecting pod `web-<n>`'s ip, with `export` as its
/// `mirror.cnimesh.io/exported` label (none when `None`), and its slice.
fn exportable(name: &str, n: usize, export: Option<&str>) -> String {
    let labels = export.map(|e| format!("\n  labels: {{mirror.cnimesh.io/exported: '{e}'}}")).unwrap_or_default();
    let svc = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: shop{labels}\nspec:\n  clusterIP: 10.96.0.{n}\n  ports: {HTTP_PORT}\n"
    );
    let (ip, pod) = (format!("10.1.0.{n}"), format!("web-{n}"));
    docs(&[svc, slice("shop", &format!("{name}-a"), name, "IPv4", SLICE_HTTP, &[(&ip, &pod, true)])])
}

impl Harness {
    async fn get_as(&self, path: &str, context_token: &str) -> Streaming<Update> {
        let request =
            GetDestination { path: path.to_string(), context_token: context_token.to_string(), ..Default::default() };
        self.client.clone().get(request).await.unwrap().into_inner()
    }

    async fn profile_as(&self, path: &str, context_token: &str) -> DestinationProfile {
        let request =
            GetDestination { path: path.to_string(), context_token: context_token.to_string(), ..Default::default() };
        next(&mut self.client.clone().get_profile(request).await.unwrap().into_inner()).await
    }
}

#[tokio::test]
async fn a_gateway_sees_only_the_services_exported_through_it_and_a_proxy_sees_them_all() {
    let h = Harness::start(&[
        ("pods.yaml", &web_pods(3)),
        ("exported.yaml", &exportable("web", 1, Some("true"))),
        ("secret.yaml", &exportable("secret", 2, None)),
        ("flat.yaml", &exportable("flat", 3, Some("remote-discovery"))),
    ])
    .await;
    let gateway = gateway_token();
    // The gateway: the exported Service with its endpoints; the others exactly as unknown names.
    let mut web = h.get_as(WEB, &gateway).await;
    assert_eq!(sorted_addrs(&added(next_update(&mut web).await)), ["10.1.0.1:8080"]);
    for name in ["secret", "flat", "nope"] {
        let mut get = h.get_as(&format!("{name}.shop.svc.cluster.local:80"), &gateway).await;
        assert_eq!(next_update(&mut get).await, Up::NoEndpoints(NoEndpoints { exists: false }), "{name}");
    }
    assert_eq!(h.profile_as(WEB, &gateway).await.fully_qualified_name, "web.shop.svc.cluster.local");
    assert_eq!(h.profile_as("10.96.0.1:80", &gateway).await.fully_qualified_name, "web.shop.svc.cluster.local");
    for hidden in ["secret.shop.svc.cluster.local:80", "flat.shop.svc.cluster.local:80", "10.96.0.2:80", "10.96.0.3:80"]
    {
        assert_eq!(h.profile_as(hidden, &gateway).await, DestinationProfile::default(), "{hidden}");
    }
    // Not even a pod IP of an exported Service: the gateway forwards to Service names only.
    assert_eq!(h.profile_as("10.1.0.1:8080", &gateway).await, DestinationProfile::default());

    // Any other caller (no token, Linkerd's token, garbage) sees every Service, as before.
    for token in ["", r#"{"ns":"shop","nodeName":"n1"}"#, "gateway"] {
        for (name, ip) in [("web", "10.1.0.1:8080"), ("secret", "10.1.0.2:8080"), ("flat", "10.1.0.3:8080")] {
            let mut get = h.get_as(&format!("{name}.shop.svc.cluster.local:80"), token).await;
            assert_eq!(sorted_addrs(&added(next_update(&mut get).await)), [ip], "{name} for {token:?}");
        }
        assert_eq!(h.profile_as("10.96.0.2:80", token).await.fully_qualified_name, "secret.shop.svc.cluster.local");
        assert!(h.profile_as("10.1.0.2:8080", token).await.endpoint.is_some(), "{token:?}");
    }
}

#[tokio::test]
async fn exporting_and_unexporting_a_service_reaches_an_open_gateway_stream_and_no_other_callers() {
    let h = Harness::start(&[("pods.yaml", &web_pods(2)), ("secret.yaml", &exportable("secret", 2, None))]).await;
    let path = "secret.shop.svc.cluster.local:80";
    // Opened on the same shared watch: a gateway's stream and a proxy's.
    let mut gateway = h.get_as(path, &gateway_token()).await;
    let mut proxy = h.get_as(path, "").await;
    assert_eq!(next_update(&mut gateway).await, Up::NoEndpoints(NoEndpoints { exists: false }));
    assert_eq!(sorted_addrs(&added(next_update(&mut proxy).await)), ["10.1.0.2:8080"]);

    h.write("secret.yaml", &exportable("secret", 2, Some("true")));
    assert_eq!(sorted_addrs(&added(next_update(&mut gateway).await)), ["10.1.0.2:8080"], "exported");
    h.write("secret.yaml", &exportable("secret", 2, Some("remote-discovery")));
    assert_eq!(removed(next_update(&mut gateway).await), ["10.1.0.2:8080"], "unexported");
    assert_eq!(next_update(&mut gateway).await, Up::NoEndpoints(NoEndpoints { exists: false }));

    // The proxy's stream heard nothing of the label changes: its next message is the next real
    // change of the endpoints.
    h.write("secret.yaml", &exportable("secret", 1, None));
    assert_eq!(removed(next_update(&mut proxy).await), ["10.1.0.2:8080"]);
    assert_eq!(sorted_addrs(&added(next_update(&mut proxy).await)), ["10.1.0.1:8080"]);
}

// ---- ExternalWorkloads ---------------------------------------------------------------------------

fn external_workload(ips: &str, labels: &str) -> String {
    format!(
        "apiVersion: workload.cnimesh.io/v1alpha1\nkind: ExternalWorkload\nmetadata: {{name: db-vm, namespace: shop, labels: {labels}}}\nspec:\n  workloadIPs: {ips}\n  ports: [{{name: pg, port: 15432}}]\n  serviceAccountName: db\n"
    )
}

#[tokio::test]
async fn a_service_selecting_an_external_workload_serves_its_addresses_with_its_identity() {
    let db = "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec:\n  clusterIP: 10.96.0.20\n  selector: {app: db}\n  ports: [{name: pg, port: 5432, targetPort: pg}]\n";
    let h = Harness::start(&[("db.yaml", db), ("ew.yaml", &external_workload("['192.0.2.10']", "{app: db}"))]).await;
    let mut get = h.get("db.shop.svc.cluster.local:5432").await;
    let addrs = added(next_update(&mut get).await);
    assert_eq!(sorted_addrs(&addrs), ["192.0.2.10:15432"], "its address on its named port");
    assert_eq!(identity(&addrs[0]).as_deref(), Some("db.shop.serviceaccount.identity.cnimesh.cluster.local"));
    assert_eq!(hint(&addrs[0]), Some(Protocol::H2(Default::default())), "a proxy is there: mTLS and H2");
    assert_eq!(addrs[0].metric_labels.get("external_workload").map(String::as_str), Some("db-vm"));

    let mut profile = h.profile("192.0.2.10:15432").await;
    let endpoint = next(&mut profile).await.endpoint.expect("its address is its one endpoint");
    assert_eq!(identity(&endpoint).as_deref(), Some("db.shop.serviceaccount.identity.cnimesh.cluster.local"));

    // A version that does not check (an address that is none) is refused; the last good stays.
    h.write("ew.yaml", &external_workload("['192.0.2.300']", "{app: db}"));
    h.write("db2.yaml", &db.replace("name: db,", "name: db2,").replace("10.96.0.20", "10.96.0.21"));
    let mut get2 = h.get("db2.shop.svc.cluster.local:5432").await;
    assert_eq!(sorted_addrs(&added(next_update(&mut get2).await)), ["192.0.2.10:15432"]);

    // Deleted, it is no endpoint any more.
    h.remove("ew.yaml");
    assert_eq!(removed(next_update(&mut get).await), ["192.0.2.10:15432"]);
}
