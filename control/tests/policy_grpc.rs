//! Stock-proxy compatibility of the policy services, at the protocol level: a generated tonic
//! client (linkerd2-proxy-api 0.20) calls `InboundServerPolicies.GetPort`/`WatchPort` and
//! `OutboundPolicies.Get`/`Watch` on the control plane's real TLS gRPC listener (the one Identity
//! and Destination use), with cluster state from the in-process API server (watched by the
//! Kubernetes source, as in production), and checks each answer both
//! for its content and against what linkerd2-proxy refuses (its `server-policy` and
//! `client-policy` crates: a missing protocol, detect timeout, `name` label, network,
//! authentication, rule, queue or discovery makes the proxy reject the whole update).
//! Changes to the objects (a Server, an AuthorizationPolicy, a Service's opaque ports), applied
//! as `kubectl apply -f` would, must reach open watches.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cnimesh_apiserver::ClusterApi;
use cnimesh_control::{ClusterConfig, Config, Listeners};
use cnimesh_identity::{Name, ca};
use cnimesh_model::identity::Policy;
use futures::StreamExt;
use linkerd2_proxy_api::inbound::inbound_server_policies_client::InboundServerPoliciesClient;
use linkerd2_proxy_api::inbound::{self, PortSpec, authn, proxy_protocol as in_proto};
use linkerd2_proxy_api::meta::metadata;
use linkerd2_proxy_api::outbound::outbound_policies_client::OutboundPoliciesClient;
use linkerd2_proxy_api::outbound::{self, TrafficSpec, backend, proxy_protocol as out_proto, traffic_spec};
use tokio::net::TcpListener;
use tonic::transport::Channel;

const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Pod
metadata: {name: api-0, namespace: shop, labels: {app: api}}
spec:
  serviceAccountName: api
  containers:
  - name: app
    ports: [{name: http, containerPort: 8080}]
    readinessProbe: {httpGet: {port: http, path: /ready}}
  - name: cnimesh-proxy
status: {podIP: 10.0.0.5}
"#;

fn service(opaque_ports: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: api, namespace: shop, annotations: {{config.cnimesh.io/opaque-ports: '{opaque_ports}'}}}}\nspec: {{clusterIP: 10.96.0.10, ports: [{{name: http, port: 80, targetPort: 8080}}, {{name: db, port: 5432}}]}}\n"
    )
}

const SERVER: &str = r#"
apiVersion: policy.cnimesh.io/v1alpha1
kind: Server
metadata: {name: api-http, namespace: shop}
spec:
  podSelector: {matchLabels: {app: api}}
  port: http
  proxyProtocol: HTTP/1
"#;

const AUTHORIZATION: &str = r#"
apiVersion: policy.cnimesh.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: web-to-api, namespace: shop}
spec:
  targetRef: {group: policy.cnimesh.io, kind: Server, name: api-http}
  requiredAuthenticationRefs:
  - {group: policy.cnimesh.io, kind: MeshTLSAuthentication, name: web}
  - {group: policy.cnimesh.io, kind: NetworkAuthentication, name: pods}
---
apiVersion: policy.cnimesh.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: web, namespace: shop}
spec:
  identityRefs: [{kind: ServiceAccount, name: web}]
---
apiVersion: policy.cnimesh.io/v1alpha1
kind: NetworkAuthentication
metadata: {name: pods, namespace: shop}
spec:
  networks: [{cidr: 10.0.0.0/16, except: [10.0.9.0/24]}]
"#;

struct Running {
    grpc: SocketAddr,
    control: Name,
    roots: std::sync::Arc<rustls::RootCertStore>,
    api: Arc<ClusterApi>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    pki: tempfile::TempDir,
}

impl Running {
    /// `kubectl apply -f <name>`: what the manifest no longer holds is deleted.
    fn apply(&self, name: &str, text: &str) {
        self.api.apply_yaml(name, text).unwrap();
    }

    /// `kubectl delete -f <name>`.
    fn delete(&self, name: &str) {
        self.api.delete_applied(name);
    }
}

async fn start() -> Running {
    let pki = tempfile::tempdir().unwrap();
    let anchor = ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap();
    let issuer = ca::new_issuer(&anchor, "cluster.local", Duration::from_secs(3600)).unwrap();
    std::fs::write(pki.path().join("ca.crt"), &anchor.cert_pem).unwrap();
    std::fs::write(pki.path().join("tls.crt"), &issuer.cert_pem).unwrap();
    std::fs::write(pki.path().join("tls.key"), &issuer.key_pem).unwrap();
    let api = ClusterApi::new();
    api.apply_yaml("cluster.yaml", CLUSTER).unwrap();
    api.apply_yaml("service.yaml", &service("5432")).unwrap();

    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc.local_addr().unwrap();
    let control = Name::for_service_account("cnimesh-control", "cnimesh", "cluster.local").unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let policy = Policy {
        trust_domain: "cluster.local".into(),
        lifetime: Duration::from_secs(3600),
        clock_skew: Duration::from_secs(20),
    };
    let (tokens, listeners) = (ClusterApi::new().client(), Listeners { grpc: grpc.into(), admin: admin.into() });
    let shutdown = async {
        let _ = stopped.await;
    };
    let config = Config {
        cluster: Some(ClusterConfig { client: api.client(), inbound_policy: Default::default() }),
        ..Config::new(pki.path().to_path_buf(), control.clone(), policy, tokens, listeners, shutdown)
    };
    let task = tokio::spawn(cnimesh_control::run(config));
    let anchors = cnimesh_identity::pem::certs(anchor.cert_pem.as_bytes(), "anchor").unwrap();
    let roots = cnimesh_identity::tls::roots(&anchors).unwrap();
    Running { grpc: grpc_addr, control, roots, api, stop: Some(stop), task, pki }
}

/// The control plane's own certificate is issued right after start: retry briefly. The client
/// presents a mesh certificate (a proxy's, `shop/web`): policy is served to mesh identities only.
async fn channel(running: &Running) -> Channel {
    let name = Name::for_service_account("web", "shop", "cluster.local").unwrap();
    let cert = cnimesh_model::identity::own_cert::issue_from_dir(running.pki.path(), &name, Duration::from_secs(3600))
        .unwrap();
    for _ in 0..100 {
        let addr = running.grpc.to_string();
        if let Ok(channel) =
            cnimesh_identity::grpc_channel::connect(&addr, &running.control, running.roots.clone(), Some(cert.clone()))
                .await
        {
            return channel;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("could not connect to the control plane over TLS");
}

/// Waits for the next message of a stream, bounded so a missing update fails instead of hanging.
async fn next<T>(stream: &mut tonic::Streaming<T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), stream.next())
        .await
        .expect("an update within 20 s")
        .expect("the stream stays open")
        .expect("not an error")
}

/// What linkerd2-proxy's `server-policy` crate requires of an inbound `Server`.
fn stock_proxy_accepts_inbound(server: &inbound::Server) {
    let kind = server.protocol.as_ref().and_then(|p| p.kind.as_ref()).expect("protocol set");
    if let in_proto::Kind::Detect(detect) = kind {
        assert!(detect.timeout.is_some(), "Detect needs a timeout");
    }
    assert!(server.labels.contains_key("name"), "labels need `name`: {:?}", server.labels);
    let routes = match kind {
        in_proto::Kind::Detect(d) => d.http_routes.clone(),
        in_proto::Kind::Http1(h) => h.routes.clone(),
        in_proto::Kind::Http2(h) => h.routes.clone(),
        _ => Vec::new(),
    };
    let route_authzs = routes.iter().flat_map(|r| r.authorizations.iter());
    for authz in server.authorizations.iter().chain(route_authzs) {
        assert!(!authz.networks.is_empty() && authz.networks.iter().all(|n| n.net.is_some()), "{authz:?}");
        let permit = authz.authentication.as_ref().and_then(|a| a.permit.as_ref()).expect("authentication set");
        if let authn::Permit::MeshTls(tls) = permit {
            assert!(tls.clients.is_some(), "{authz:?}");
        }
        assert!(authz.metadata.is_some() || authz.labels.contains_key("name"), "{authz:?}");
    }
    for route in &routes {
        assert!(!route.rules.is_empty(), "a route needs a rule: {route:?}");
        assert!(route.metadata.is_some());
    }
}

/// What linkerd2-proxy's `client-policy` crate requires of an `OutboundPolicy` (and its
/// `http-route`/`grpc-route` conversions): any violation makes the proxy reject the whole update.
fn stock_proxy_accepts_outbound(policy: &outbound::OutboundPolicy) {
    assert!(policy.metadata.as_ref().and_then(|m| m.kind.as_ref()).is_some(), "metadata");
    let kind = policy.protocol.as_ref().and_then(|p| p.kind.as_ref()).expect("protocol set");
    match kind {
        out_proto::Kind::Detect(d) => {
            assert!(d.timeout.is_some(), "Detect needs a timeout");
            check_opaque(d.opaque.as_ref().expect("detect.opaque"));
            check_http(&d.http1.as_ref().expect("detect.http1").routes);
            check_http(&d.http2.as_ref().expect("detect.http2").routes);
        }
        out_proto::Kind::Opaque(o) => check_opaque(o),
        out_proto::Kind::Grpc(g) => check_grpc(&g.routes),
        other => panic!("unexpected protocol {other:?}"),
    }
}

fn check_backend(b: &outbound::Backend) {
    assert!(b.metadata.is_some() && b.queue.as_ref().is_some_and(|q| q.failfast_timeout.is_some()), "{b:?}");
    match b.kind.as_ref().expect("backend kind") {
        backend::Kind::Balancer(p2c) => {
            assert!(p2c.discovery.as_ref().and_then(|d| d.kind.as_ref()).is_some() && p2c.load.is_some())
        }
        backend::Kind::Forward(addr) => assert!(addr.addr.is_some()),
    }
}

fn check_opaque(o: &out_proto::Opaque) {
    assert!(!o.routes.is_empty());
    for r in &o.routes {
        assert!(r.metadata.is_some() && !r.rules.is_empty());
        for rule in &r.rules {
            let Some(outbound::opaque_route::distribution::Kind::FirstAvailable(first)) =
                rule.backends.as_ref().and_then(|d| d.kind.as_ref())
            else {
                panic!("{rule:?}")
            };
            first.backends.iter().for_each(|b| check_backend(b.backend.as_ref().expect("backend")));
        }
    }
}

/// The backends of an HTTP or gRPC rule's distribution with their weights (first-available:
/// 1 each), and whether it is random: one shape in two generated modules.
macro_rules! distribution_backends {
    ($distribution:expr, $module:ident) => {{
        use outbound::$module::distribution::Kind;
        match $distribution.as_ref().and_then(|d| d.kind.as_ref()).expect("distribution") {
            Kind::FirstAvailable(first) => {
                (first.backends.iter().map(|b| (1, b.backend.as_ref().expect("backend"))).collect::<Vec<_>>(), false)
            }
            Kind::RandomAvailable(random) => (
                random
                    .backends
                    .iter()
                    .map(|b| (b.weight, b.backend.as_ref().and_then(|b| b.backend.as_ref()).expect("backend")))
                    .collect(),
                true,
            ),
            Kind::Empty(_) => panic!("an empty distribution fails every request"),
        }
    }};
}

/// A distribution's backends, each with its weight (first-available counts as one each): never
/// empty, and a random one never all zero (the proxy's weighted index refuses that).
fn check_distribution(backends: Vec<(u32, &outbound::Backend)>, random: bool) {
    assert!(!backends.is_empty(), "a distribution needs backends");
    if random {
        assert!(backends.iter().any(|(w, _)| *w > 0), "weights all zero");
    }
    backends.iter().for_each(|(_, b)| check_backend(b));
}

fn check_header_names(names: impl IntoIterator<Item = String>) {
    for name in names {
        http::HeaderName::from_bytes(name.as_bytes()).unwrap_or_else(|_| panic!("header name {name:?}"));
    }
}

fn check_header_match(m: &linkerd2_proxy_api::http_route::HeaderMatch) {
    check_header_names([m.name.clone()]);
    match m.value.as_ref().expect("header match value") {
        linkerd2_proxy_api::http_route::header_match::Value::Exact(v) => {
            http::HeaderValue::from_bytes(v).expect("header value");
        }
        linkerd2_proxy_api::http_route::header_match::Value::Regex(r) => {
            regex::Regex::new(r).expect("header regex");
        }
    }
}

fn check_modifier(
    add: &Option<linkerd2_proxy_api::http_types::Headers>,
    set: &Option<linkerd2_proxy_api::http_types::Headers>,
    remove: &[String],
) {
    for h in add.iter().chain(set).flat_map(|h| &h.headers) {
        check_header_names([h.name.clone()]);
        http::HeaderValue::from_bytes(&h.value).expect("header value");
    }
    check_header_names(remove.iter().cloned());
}

fn check_retry_backoff(backoff: Option<&outbound::ExponentialBackoff>) {
    let b = backoff.expect("retries carry a backoff");
    let (min, max) = (b.min_backoff.expect("min"), b.max_backoff.expect("max"));
    assert!((min.seconds, min.nanos) <= (max.seconds, max.nanos), "{b:?}");
    assert!((0.0..=100.0).contains(&b.jitter_ratio));
}

fn check_http(routes: &[outbound::HttpRoute]) {
    use outbound::http_route::{distribution, filter};
    assert!(!routes.is_empty());
    for r in routes {
        assert!(r.metadata.is_some() && !r.rules.is_empty());
        for rule in &r.rules {
            for m in &rule.matches {
                if let Some(linkerd2_proxy_api::http_route::path_match::Kind::Regex(re)) =
                    m.path.as_ref().and_then(|p| p.kind.as_ref())
                {
                    regex::Regex::new(re).expect("path regex");
                }
                m.headers.iter().for_each(check_header_match);
                if let Some(method) = &m.method {
                    http::Method::try_from(method.clone()).expect("method");
                }
            }
            let filters = rule.filters.iter().chain(match rule.backends.as_ref().and_then(|d| d.kind.as_ref()) {
                Some(distribution::Kind::RandomAvailable(r)) => r
                    .backends
                    .iter()
                    .flat_map(|b| &b.backend.as_ref().expect("route backend").filters)
                    .collect::<Vec<_>>(),
                Some(distribution::Kind::FirstAvailable(f)) => f.backends.iter().flat_map(|b| &b.filters).collect(),
                _ => Vec::new(),
            });
            for f in filters {
                match f.kind.as_ref().expect("filter kind") {
                    filter::Kind::RequestHeaderModifier(m) => check_modifier(&m.add, &m.set, &m.remove),
                    filter::Kind::ResponseHeaderModifier(m) => check_modifier(&m.add, &m.set, &m.remove),
                    filter::Kind::Redirect(r) => assert!(r.status == 0 || (300..400).contains(&r.status), "{r:?}"),
                    filter::Kind::FailureInjector(f) => assert!((100..600).contains(&f.status), "{f:?}"),
                }
            }
            if let Some(retry) = &rule.retry {
                let conditions = retry.conditions.as_ref().expect("retry conditions must be set");
                assert!(conditions.status_ranges.iter().all(|r| r.start <= r.end && r.end < 600), "{retry:?}");
                check_retry_backoff(retry.backoff.as_ref());
            }
            let (backends, random) = distribution_backends!(rule.backends, http_route);
            check_distribution(backends, random);
        }
    }
}

fn check_grpc(routes: &[outbound::GrpcRoute]) {
    assert!(!routes.is_empty());
    for r in routes {
        assert!(r.metadata.is_some() && !r.rules.is_empty());
        for rule in &r.rules {
            rule.matches.iter().flat_map(|m| &m.headers).for_each(check_header_match);
            if let Some(retry) = &rule.retry {
                assert!(retry.conditions.is_some(), "retry conditions must be set");
                check_retry_backoff(retry.backoff.as_ref());
            }
            let (backends, random) = distribution_backends!(rule.backends, grpc_route);
            check_distribution(backends, random);
        }
    }
}

fn spec(workload: &str, port: u32) -> PortSpec {
    PortSpec { workload: workload.into(), port }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_answers_and_streams_policy_changes() {
    let mut running = start().await;
    let mut client = InboundServerPoliciesClient::new(channel(&running).await);

    // No Server: the default (all-unauthenticated), HTTP detected, the probe path routed.
    let server = client.get_port(spec("shop:api-0", 8080)).await.unwrap().into_inner();
    stock_proxy_accepts_inbound(&server);
    assert_eq!(server.labels["kind"], "default");
    assert_eq!(server.labels["name"], "all-unauthenticated");
    let Some(in_proto::Kind::Detect(detect)) = server.protocol.as_ref().and_then(|p| p.kind.clone()) else {
        panic!("{server:?}")
    };
    assert_eq!(detect.timeout, Some(prost_types::Duration { seconds: 10, nanos: 0 }));
    let probe = &detect.http_routes[0];
    assert_eq!(probe.metadata.as_ref().unwrap().kind, Some(metadata::Kind::Default("probe".into())));
    assert_eq!(probe.authorizations.len(), 1);
    let authz = &server.authorizations[0];
    assert_eq!(authz.networks.len(), 2, "0.0.0.0/0 and ::/0");
    assert!(matches!(authz.authentication.as_ref().unwrap().permit, Some(authn::Permit::Unauthenticated(_))));

    // Both workload forms; unknown pods and bad specs are refused with a clear code.
    let json = client.get_port(spec(r#"{"ns":"shop","pod":"api-0"}"#, 8080)).await.unwrap().into_inner();
    assert_eq!(json, server);
    assert_eq!(client.get_port(spec("shop:nope", 8080)).await.unwrap_err().code(), tonic::Code::NotFound);
    assert_eq!(client.get_port(spec("api-0", 8080)).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    assert_eq!(client.get_port(spec("shop:api-0", 70000)).await.unwrap_err().code(), tonic::Code::InvalidArgument);

    // An open WatchPort follows the objects: a Server (no policy yet: nothing authorized) ...
    let mut watch = client.watch_port(spec("shop:api-0", 8080)).await.unwrap().into_inner();
    assert_eq!(next(&mut watch).await, server);
    running.apply("server.yaml", SERVER);
    let server = next(&mut watch).await;
    stock_proxy_accepts_inbound(&server);
    assert_eq!((server.labels["group"].as_str(), server.labels["kind"].as_str()), ("policy.cnimesh.io", "server"));
    assert_eq!(server.labels["name"], "api-http");
    assert!(matches!(server.protocol.as_ref().unwrap().kind, Some(in_proto::Kind::Http1(_))));
    assert!(server.authorizations.is_empty(), "a Server alone authorizes nobody");

    // ... then an AuthorizationPolicy with its authentications.
    running.apply("authz.yaml", AUTHORIZATION);
    let server = next(&mut watch).await;
    stock_proxy_accepts_inbound(&server);
    assert_eq!(server.authorizations.len(), 1, "{server:?}");
    let authz = &server.authorizations[0];
    let Some(metadata::Kind::Resource(resource)) = authz.metadata.as_ref().and_then(|m| m.kind.clone()) else {
        panic!("{authz:?}")
    };
    assert_eq!((resource.kind.as_str(), resource.name.as_str()), ("authorizationpolicy", "web-to-api"));
    let net: ipnet::IpNet = authz.networks[0].net.unwrap().try_into().unwrap();
    assert_eq!(net, "10.0.0.0/16".parse::<ipnet::IpNet>().unwrap());
    assert_eq!(authz.networks[0].except.len(), 1);
    let Some(authn::Permit::MeshTls(tls)) = authz.authentication.as_ref().and_then(|a| a.permit.clone()) else {
        panic!("{authz:?}")
    };
    let Some(authn::permit_mesh_tls::Clients::Identities(ids)) = tls.clients else { panic!() };
    assert_eq!(ids.identities[0].name, "web.shop.serviceaccount.identity.cnimesh.cluster.local");

    // A bad edit (a CIDR that is none) is ignored: nothing is sent, the last good policy stays.
    running.apply("authz.yaml", &AUTHORIZATION.replace("10.0.0.0/16", "10.0.0.0/99"));
    running.apply("server.yaml", &SERVER.replace("HTTP/1", "HTTP/2"));
    let server = next(&mut watch).await;
    assert!(matches!(server.protocol.as_ref().unwrap().kind, Some(in_proto::Kind::Http2(_))));
    let net: ipnet::IpNet = server.authorizations[0].networks[0].net.unwrap().try_into().unwrap();
    assert_eq!(net, "10.0.0.0/16".parse::<ipnet::IpNet>().unwrap(), "the last good NetworkAuthentication");

    running.stop.take().unwrap().send(()).unwrap();
    drop(watch);
    tokio::time::timeout(Duration::from_secs(20), running.task).await.unwrap().unwrap().unwrap();
}

fn addr(ip: &str, port: u16) -> TrafficSpec {
    let addr: SocketAddr = SocketAddr::new(ip.parse().unwrap(), port);
    TrafficSpec { source_workload: "shop:web-0".into(), target: Some(traffic_spec::Target::Addr(addr.into())) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_answers_and_streams_protocol_changes() {
    let mut running = start().await;
    let mut client = OutboundPoliciesClient::new(channel(&running).await);

    // A ClusterIP port: HTTP detected, routes to the service's balancer via Destination.
    let policy = client.get(addr("10.96.0.10", 80)).await.unwrap().into_inner();
    stock_proxy_accepts_outbound(&policy);
    let Some(metadata::Kind::Resource(resource)) = policy.metadata.as_ref().and_then(|m| m.kind.clone()) else {
        panic!("{policy:?}")
    };
    assert_eq!((resource.kind.as_str(), resource.name.as_str(), resource.port), ("Service", "api", 80));
    let Some(out_proto::Kind::Detect(detect)) = policy.protocol.as_ref().and_then(|p| p.kind.clone()) else {
        panic!("{policy:?}")
    };
    let rule = &detect.http1.unwrap().routes[0].rules[0];
    let Some(outbound::http_route::distribution::Kind::FirstAvailable(first)) =
        rule.backends.as_ref().and_then(|d| d.kind.clone())
    else {
        panic!()
    };
    let Some(backend::Kind::Balancer(p2c)) = first.backends[0].backend.as_ref().and_then(|b| b.kind.clone()) else {
        panic!()
    };
    let Some(backend::endpoint_discovery::Kind::Dst(dst)) = p2c.discovery.and_then(|d| d.kind) else { panic!() };
    assert_eq!(dst.path, "api.shop.svc.cluster.local:80");

    // The opaque port, asked by authority: opaque, no detection.
    let by_name = TrafficSpec {
        source_workload: "shop:web-0".into(),
        target: Some(traffic_spec::Target::Authority("api.shop.svc.cluster.local:5432".into())),
    };
    let opaque = client.get(by_name).await.unwrap().into_inner();
    stock_proxy_accepts_outbound(&opaque);
    assert!(matches!(opaque.protocol.as_ref().unwrap().kind, Some(out_proto::Kind::Opaque(_))));

    // Not a Service port: NotFound (a stock proxy then forwards without policy).
    assert_eq!(client.get(addr("10.96.0.99", 80)).await.unwrap_err().code(), tonic::Code::NotFound);
    assert_eq!(client.get(addr("10.96.0.10", 81)).await.unwrap_err().code(), tonic::Code::NotFound);

    // An open Watch follows the Service's opaque-ports annotation.
    let mut watch = client.watch(addr("10.96.0.10", 80)).await.unwrap().into_inner();
    assert_eq!(next(&mut watch).await, policy);
    running.apply("service.yaml", &service("80,5432"));
    let changed = next(&mut watch).await;
    stock_proxy_accepts_outbound(&changed);
    assert!(matches!(changed.protocol.as_ref().unwrap().kind, Some(out_proto::Kind::Opaque(_))));

    running.stop.take().unwrap().send(()).unwrap();
    drop(watch);
    tokio::time::timeout(Duration::from_secs(20), running.task).await.unwrap().unwrap().unwrap();
}

const HTTP_ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: api-canary
  namespace: shop
  annotations: {retry.cnimesh.io/http: "5xx", retry.cnimesh.io/limit: "2", retry.cnimesh.io/timeout: 300ms}
spec:
  parentRefs: [{group: "", kind: Service, name: api, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /v1}, method: GET, headers: [{name: x-user, type: RegularExpression, value: "^a"}]}]
    filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-route, value: canary}]}}]
    backendRefs:
    - {name: api, port: 80, weight: 90}
    - {name: api-v2, port: 8080, weight: 10}
    timeouts: {request: 5s, backendRequest: 1s}
  - matches: [{path: {type: Exact, value: /old}}]
    filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplaceFullPath, replaceFullPath: /new}}}]
"#;

const GRPC_ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: items
  namespace: shop
  annotations: {retry.cnimesh.io/grpc: "unavailable"}
spec:
  parentRefs: [{group: "", kind: Service, name: api}]
  rules:
  - matches: [{method: {service: shop.Items, method: Get}}]
    backendRefs: [{name: api-v2, port: 8080}]
"#;

/// A consumer route: in another namespace than the Service, for that namespace's clients only.
const CONSUMER_ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: ops-view, namespace: ops}
spec:
  parentRefs: [{group: "", kind: Service, name: api, namespace: shop}]
  rules: [{backendRefs: [{name: api, namespace: shop, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: ops-routes, namespace: shop}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: ops}]
  to: [{group: "", kind: Service}]
"#;

fn http_routes(policy: &outbound::OutboundPolicy) -> Vec<outbound::HttpRoute> {
    stock_proxy_accepts_outbound(policy);
    let Some(out_proto::Kind::Detect(detect)) = policy.protocol.as_ref().and_then(|p| p.kind.clone()) else {
        panic!("{policy:?}")
    };
    assert_eq!(detect.http1.as_ref().unwrap().routes, detect.http2.as_ref().unwrap().routes);
    detect.http1.unwrap().routes
}

fn resource(meta: Option<&linkerd2_proxy_api::meta::Metadata>) -> linkerd2_proxy_api::meta::Resource {
    match meta.and_then(|m| m.kind.clone()) {
        Some(metadata::Kind::Resource(r)) => r,
        other => panic!("{other:?}"),
    }
}

fn weights(rule: &outbound::http_route::Rule) -> Vec<(u32, String)> {
    let Some(outbound::http_route::distribution::Kind::RandomAvailable(random)) =
        rule.backends.as_ref().and_then(|d| d.kind.clone())
    else {
        panic!("{rule:?}")
    };
    random
        .backends
        .iter()
        .map(|b| {
            let backend = b.backend.as_ref().and_then(|b| b.backend.clone()).unwrap();
            let Some(backend::Kind::Balancer(p2c)) = backend.kind else { panic!() };
            let Some(backend::endpoint_discovery::Kind::Dst(dst)) = p2c.discovery.and_then(|d| d.kind) else {
                panic!()
            };
            (b.weight, dst.path)
        })
        .collect()
}

fn from(workload: &str, ip: &str, port: u16) -> TrafficSpec {
    TrafficSpec { source_workload: workload.into(), ..addr(ip, port) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_serves_routes_and_streams_route_changes() {
    let mut running = start().await;
    running.apply("route.yaml", HTTP_ROUTE);
    let mut client = OutboundPoliciesClient::new(channel(&running).await);
    let mut watch = client.watch(addr("10.96.0.10", 80)).await.unwrap().into_inner();
    // The route may land after the first answer (the default route, whose metadata is
    // `Default`, not a resource): wait for the answer that has it.
    let mut policy = next(&mut watch).await;
    while !matches!(
        http_routes(&policy)[0].metadata.as_ref().and_then(|m| m.kind.as_ref()),
        Some(metadata::Kind::Resource(r)) if r.kind == "HTTPRoute"
    ) {
        policy = next(&mut watch).await;
    }
    let routes = http_routes(&policy);
    assert_eq!(routes.len(), 1);
    let meta = resource(routes[0].metadata.as_ref());
    assert_eq!(
        (meta.group.as_str(), meta.kind.as_str(), meta.namespace.as_str(), meta.name.as_str()),
        ("gateway.networking.k8s.io", "HTTPRoute", "shop", "api-canary")
    );
    let (split, redirect) = (&routes[0].rules[0], &routes[0].rules[1]);
    assert_eq!(
        weights(split),
        [(90, "api.shop.svc.cluster.local:80".to_string()), (10, "api-v2.shop.svc.cluster.local:8080".to_string())]
    );
    let timeouts = split.timeouts.unwrap();
    assert_eq!(timeouts.request, Some(prost_types::Duration { seconds: 5, nanos: 0 }));
    assert_eq!(timeouts.response, Some(prost_types::Duration { seconds: 1, nanos: 0 }));
    let retry = split.retry.as_ref().unwrap();
    assert_eq!((retry.max_retries, retry.max_request_bytes), (2, 64 * 1024));
    assert_eq!(retry.timeout, Some(prost_types::Duration { seconds: 0, nanos: 300_000_000 }));
    let ranges = &retry.conditions.as_ref().unwrap().status_ranges;
    assert_eq!((ranges[0].start, ranges[0].end), (500, 599));
    let Some(outbound::http_route::filter::Kind::Redirect(r)) = redirect.filters[0].kind.clone() else { panic!() };
    assert_eq!(r.status, 302, "the Gateway API's default redirect status");
    let Some(outbound::http_route::distribution::Kind::FirstAvailable(parent)) =
        redirect.backends.as_ref().and_then(|d| d.kind.clone())
    else {
        panic!("a rule without backendRefs goes to its parent")
    };
    assert_eq!(resource(parent.backends[0].backend.as_ref().unwrap().metadata.as_ref()).name, "api");

    // Another port of the Service is not attached: default route.
    let other = client.get(addr("10.96.0.10", 5432)).await.unwrap().into_inner();
    assert!(matches!(other.protocol.unwrap().kind, Some(out_proto::Kind::Opaque(_))));

    // A weight change streams.
    running.apply("route.yaml", &HTTP_ROUTE.replace("weight: 90", "weight: 50"));
    let routes = http_routes(&next(&mut watch).await);
    assert_eq!(weights(&routes[0].rules[0])[0].0, 50);

    // A bad edit is refused: nothing is sent, and the last good version stays (seen once the
    // GRPCRoute that took over the port is gone again).
    running.apply("route.yaml", &HTTP_ROUTE.replace("value: \"^a\"", "value: \"([\""));
    running.apply("grpc.yaml", GRPC_ROUTE);
    let grpc = next(&mut watch).await;
    stock_proxy_accepts_outbound(&grpc);
    let Some(out_proto::Kind::Grpc(g)) = grpc.protocol.as_ref().and_then(|p| p.kind.clone()) else {
        panic!("GRPCRoutes win over HTTPRoutes: {grpc:?}")
    };
    assert_eq!(resource(g.routes[0].metadata.as_ref()).kind, "GRPCRoute");
    let rpc = g.routes[0].rules[0].matches[0].rpc.clone().unwrap();
    assert_eq!((rpc.service.as_str(), rpc.method.as_str()), ("shop.Items", "Get"));
    assert!(g.routes[0].rules[0].retry.as_ref().unwrap().conditions.unwrap().unavailable);
    running.delete("grpc.yaml");
    let routes = http_routes(&next(&mut watch).await);
    assert_eq!(weights(&routes[0].rules[0])[0].0, 50, "the last good HTTPRoute");

    // A consumer route replaces the producer's for its own namespace's clients only.
    running.apply("consumer.yaml", CONSUMER_ROUTE);
    let mut ops = client.watch(from(r#"{"ns":"ops","pod":"tool-0"}"#, "10.96.0.10", 80)).await.unwrap().into_inner();
    let mut policy = next(&mut ops).await;
    while resource(http_routes(&policy)[0].metadata.as_ref()).namespace != "ops" {
        policy = next(&mut ops).await;
    }
    assert_eq!(http_routes(&policy).len(), 1);
    let shop = client.get(from("shop:web-0", "10.96.0.10", 80)).await.unwrap().into_inner();
    assert_eq!(resource(http_routes(&shop)[0].metadata.as_ref()).name, "api-canary");
    // Without the grant, the consumer route's backend in shop is not allowed: not served.
    running.apply("consumer.yaml", CONSUMER_ROUTE.split("---").next().unwrap());
    let policy = next(&mut ops).await;
    assert_eq!(resource(http_routes(&policy)[0].metadata.as_ref()).name, "api-canary");

    running.stop.take().unwrap().send(()).unwrap();
    drop((watch, ops));
    tokio::time::timeout(Duration::from_secs(20), running.task).await.unwrap().unwrap().unwrap();
}

/// The `api` Service with Linkerd-style retry and timeout annotations.
const ANNOTATED_SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: shop, annotations: {config.cnimesh.io/opaque-ports: '5432', retry.cnimesh.io/http: gateway-error, retry.cnimesh.io/limit: '3', timeout.cnimesh.io/request: 2s}}\nspec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80, targetPort: 8080}, {name: db, port: 5432}]}\n";

/// A route of `api` that sets no retry or timeout of its own.
const PLAIN_ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: api-plain, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: api, port: 80}]
  rules: [{matches: [{path: {type: PathPrefix, value: /v2}}]}]
"#;

/// A rule's retry (max retries, first status range) and request timeout (s).
type RetryAndTimeout = (Option<(u32, (u32, u32))>, Option<i64>);

fn retry_and_timeout(rule: &outbound::http_route::Rule) -> RetryAndTimeout {
    let retry = rule.retry.as_ref().map(|r| {
        let range = &r.conditions.as_ref().unwrap().status_ranges[0];
        (r.max_retries, (range.start, range.end))
    });
    (retry, rule.timeouts.and_then(|t| t.request).map(|d| d.seconds))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_services_retry_and_timeout_annotations_apply_where_its_routes_set_none() {
    let mut running = start().await;
    let mut client = OutboundPoliciesClient::new(channel(&running).await);
    let mut watch = client.watch(addr("10.96.0.10", 80)).await.unwrap().into_inner();
    let mut policy = next(&mut watch).await;
    running.apply("service.yaml", ANNOTATED_SERVICE);
    // The default route, with the Service's annotations.
    while http_routes(&policy)[0].rules[0].retry.is_none() {
        policy = next(&mut watch).await;
    }
    let default = &http_routes(&policy)[0];
    assert!(matches!(default.metadata.as_ref().and_then(|m| m.kind.as_ref()), Some(metadata::Kind::Default(_))));
    assert_eq!(retry_and_timeout(&default.rules[0]), (Some((3, (502, 504))), Some(2)));

    // Routes: the annotated one keeps its own retry (whole) and timeout; what it leaves unset
    // (the redirect rule's timeout) and the plain route take the Service's.
    running.apply("route.yaml", &format!("{HTTP_ROUTE}---{PLAIN_ROUTE}"));
    while http_routes(&policy).len() < 2 {
        policy = next(&mut watch).await;
    }
    let routes = http_routes(&policy);
    let named = |name: &str| routes.iter().find(|r| resource(r.metadata.as_ref()).name == name).unwrap();
    let canary = named("api-canary");
    assert_eq!(retry_and_timeout(&canary.rules[0]), (Some((2, (500, 599))), Some(5)));
    assert_eq!(retry_and_timeout(&canary.rules[1]), (Some((2, (500, 599))), Some(2)));
    assert_eq!(retry_and_timeout(&named("api-plain").rules[0]), (Some((3, (502, 504))), Some(2)));

    // A bad annotation is ignored (the Service stays served): the default route has none.
    running.delete("route.yaml");
    running.apply("service.yaml", &ANNOTATED_SERVICE.replace("'3'", "many"));
    while http_routes(&policy).len() > 1 || http_routes(&policy)[0].rules[0].retry.is_some() {
        policy = next(&mut watch).await;
    }
    assert_eq!(retry_and_timeout(&http_routes(&policy)[0].rules[0]), (None, None));

    running.stop.take().unwrap().send(()).unwrap();
    drop(watch);
    tokio::time::timeout(Duration::from_secs(20), running.task).await.unwrap().unwrap().unwrap();
}
