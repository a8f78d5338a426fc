//! Stock-proxy compatibility of the policy services, at the protocol level: a generated tonic
//! client (linkerd2-proxy-api 0.20) calls `InboundServerPolicies.GetPort`/`WatchPort` and
//! `OutboundPolicies.Get`/`Watch` on the control plane's real TLS gRPC listener (the one Identity
//! and Destination use), with cluster state from the files source, and checks each answer both
//! for its content and against what linkerd2-proxy refuses (its `server-policy` and
//! `client-policy` crates: a missing protocol, detect timeout, `name` label, network,
//! authentication, rule, queue or discovery makes the proxy reject the whole update).
//! Changes to the files (a Server, an AuthorizationPolicy, a Service's opaque ports) must reach
//! open watches.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use cnimesh_control::identity::Policy;
use cnimesh_control::{ClusterSource, Config, Listeners, TokenSource};
use cnimesh_identity::{Name, ca};
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
    cluster: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _pki: tempfile::TempDir,
}

/// Writes `text` atomically (temporary name, then rename), as the files source asks of writers.
fn write(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, dir.join(name)).unwrap();
}

async fn start() -> Running {
    let pki = tempfile::tempdir().unwrap();
    let anchor = ca::new_trust_anchor("cluster.local", Duration::from_secs(3600)).unwrap();
    let issuer = ca::new_issuer(&anchor, "cluster.local", Duration::from_secs(3600)).unwrap();
    std::fs::write(pki.path().join("ca.crt"), &anchor.cert_pem).unwrap();
    std::fs::write(pki.path().join("tls.crt"), &issuer.cert_pem).unwrap();
    std::fs::write(pki.path().join("tls.key"), &issuer.key_pem).unwrap();
    let cluster = tempfile::tempdir().unwrap();
    write(cluster.path(), "cluster.yaml", CLUSTER);
    write(cluster.path(), "service.yaml", &service("5432"));

    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc.local_addr().unwrap();
    let control = Name::for_service_account("cnimesh-control", "cnimesh", "cluster.local").unwrap();
    let config = Config {
        issuer_dir: pki.path().to_path_buf(),
        identity_name: control.clone(),
        policy: Policy {
            trust_domain: "cluster.local".into(),
            lifetime: Duration::from_secs(3600),
            clock_skew: Duration::from_secs(20),
        },
        tokens: TokenSource::Files(pki.path().to_path_buf()),
        cluster: Some(ClusterSource::Files(cluster.path().to_path_buf())),
        destination: Default::default(),
        inbound_policy: Default::default(),
        webhook: None,
        webhook_certs: None,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(cnimesh_control::run(config, Listeners { grpc, admin, webhook: None }, async {
        let _ = stopped.await;
    }));
    let anchors = cnimesh_identity::pem::certs(anchor.cert_pem.as_bytes(), "anchor").unwrap();
    let roots = cnimesh_identity::tls::roots(&anchors).unwrap();
    Running { grpc: grpc_addr, control, roots, cluster, stop: Some(stop), task, _pki: pki }
}

/// The control plane's own certificate is issued right after start: retry briefly.
async fn channel(running: &Running) -> Channel {
    for _ in 0..100 {
        let addr = running.grpc.to_string();
        if let Ok(channel) = cnimesh_proxy::grpc_channel::connect(&addr, &running.control, running.roots.clone()).await
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

/// What linkerd2-proxy's `client-policy` crate requires of an `OutboundPolicy`.
fn stock_proxy_accepts_outbound(policy: &outbound::OutboundPolicy) {
    assert!(policy.metadata.as_ref().and_then(|m| m.kind.as_ref()).is_some(), "metadata");
    let kind = policy.protocol.as_ref().and_then(|p| p.kind.as_ref()).expect("protocol set");
    let check_backend = |b: &outbound::Backend| {
        assert!(b.metadata.is_some() && b.queue.as_ref().is_some_and(|q| q.failfast_timeout.is_some()), "{b:?}");
        match b.kind.as_ref().expect("backend kind") {
            backend::Kind::Balancer(p2c) => {
                assert!(p2c.discovery.as_ref().and_then(|d| d.kind.as_ref()).is_some() && p2c.load.is_some())
            }
            backend::Kind::Forward(addr) => assert!(addr.addr.is_some()),
        }
    };
    let check_opaque = |o: &out_proto::Opaque| {
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
    };
    let check_http = |routes: &[outbound::HttpRoute]| {
        assert!(!routes.is_empty());
        for r in routes {
            assert!(r.metadata.is_some() && !r.rules.is_empty());
            for rule in &r.rules {
                let Some(outbound::http_route::distribution::Kind::FirstAvailable(first)) =
                    rule.backends.as_ref().and_then(|d| d.kind.as_ref())
                else {
                    panic!("{rule:?}")
                };
                first.backends.iter().for_each(|b| check_backend(b.backend.as_ref().expect("backend")));
            }
        }
    };
    match kind {
        out_proto::Kind::Detect(d) => {
            assert!(d.timeout.is_some(), "Detect needs a timeout");
            check_opaque(d.opaque.as_ref().expect("detect.opaque"));
            check_http(&d.http1.as_ref().expect("detect.http1").routes);
            check_http(&d.http2.as_ref().expect("detect.http2").routes);
        }
        out_proto::Kind::Opaque(o) => check_opaque(o),
        other => panic!("unexpected protocol {other:?}"),
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

    // An open WatchPort follows the files: a Server (no policy yet: nothing authorized) ...
    let mut watch = client.watch_port(spec("shop:api-0", 8080)).await.unwrap().into_inner();
    assert_eq!(next(&mut watch).await, server);
    write(running.cluster.path(), "server.yaml", SERVER);
    let server = next(&mut watch).await;
    stock_proxy_accepts_inbound(&server);
    assert_eq!((server.labels["group"].as_str(), server.labels["kind"].as_str()), ("policy.cnimesh.io", "server"));
    assert_eq!(server.labels["name"], "api-http");
    assert!(matches!(server.protocol.as_ref().unwrap().kind, Some(in_proto::Kind::Http1(_))));
    assert!(server.authorizations.is_empty(), "a Server alone authorizes nobody");

    // ... then an AuthorizationPolicy with its authentications.
    write(running.cluster.path(), "authz.yaml", AUTHORIZATION);
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
    write(running.cluster.path(), "authz.yaml", &AUTHORIZATION.replace("10.0.0.0/16", "10.0.0.0/99"));
    write(running.cluster.path(), "server.yaml", &SERVER.replace("HTTP/1", "HTTP/2"));
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
    write(running.cluster.path(), "service.yaml", &service("80,5432"));
    let changed = next(&mut watch).await;
    stock_proxy_accepts_outbound(&changed);
    assert!(matches!(changed.protocol.as_ref().unwrap().kind, Some(out_proto::Kind::Opaque(_))));

    running.stop.take().unwrap().send(()).unwrap();
    drop(watch);
    tokio::time::timeout(Duration::from_secs(20), running.task).await.unwrap().unwrap().unwrap();
}
