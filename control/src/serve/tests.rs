//! The control plane served in-process: Identity over TLS, the admin port, tracing.
use std::net::SocketAddr;
use std::time::Duration;

use linkerd2_proxy_api::identity::CertifyRequest;
use linkerd2_proxy_api::identity::identity_client::IdentityClient;
use rustls_pki_types::CertificateDer;

use tokio::net::TcpListener;

use super::*;
use cnimesh_model::identity::issuer::tests::write_pki;

struct Running {
    grpc: SocketAddr,
    admin: SocketAddr,
    anchors: Vec<CertificateDer<'static>>,
    anchor: cnimesh_identity::ca::CaPem,
    control: Name,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    pki: tempfile::TempDir,
    /// `shop/web`'s token for Identity, from the in-process API server.
    token: String,
}

async fn start() -> Running {
    start_traced(None).await
}

async fn start_traced(trace: Option<TraceConfig>) -> Running {
    let pki = tempfile::tempdir().unwrap();
    let anchor = write_pki(pki.path(), Duration::from_secs(3600));
    let api = cnimesh_apiserver::ClusterApi::new();
    let token = api.issue_token("shop", "web", &[cnimesh_identity::TOKEN_AUDIENCE]).unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (grpc_addr, admin_addr) = (grpc.local_addr().unwrap(), admin.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let control = Name::for_service_account("cnimesh-control", "cnimesh", "cluster.local").unwrap();
    let policy = Policy {
        trust_domain: "cluster.local".into(),
        lifetime: Duration::from_secs(3600),
        clock_skew: Duration::from_secs(20),
    };
    let listeners = Listeners { grpc: grpc.into(), admin: admin.into() };
    let shutdown = async {
        let _ = stopped.await;
    };
    let config = Config {
        trace,
        ..Config::new(pki.path().to_path_buf(), control.clone(), policy, api.client(), listeners, shutdown)
    };
    let task = tokio::spawn(run(config));
    let anchors = cnimesh_identity::pem::certs(anchor.cert_pem.as_bytes(), "anchor").unwrap();
    Running { grpc: grpc_addr, admin: admin_addr, anchors, anchor, control, stop: Some(stop), task, pki, token }
}

async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response[9..12].parse().unwrap();
    (status, response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certify_over_tls_end_to_end() {
    let mut running = start().await;
    let roots = cnimesh_identity::tls::roots(&running.anchors).unwrap();

    // The own certificate is issued right after start.
    let channel = channel(&running).await;
    let mut client = IdentityClient::new(channel);
    let web = Name::for_service_account("web", "shop", "cluster.local").unwrap();
    for _ in 0..2 {
        let (_key, csr) = cnimesh_identity::ca::new_csr(&web).unwrap();
        let req = CertifyRequest {
            identity: web.to_string(),
            token: running.token.as_bytes().to_vec(),
            certificate_signing_request: csr,
        };
        let rsp = client.certify(req).await.unwrap().into_inner();
        let chain: Vec<CertificateDer<'static>> = std::iter::once(rsp.leaf_certificate)
            .chain(rsp.intermediate_certificates)
            .map(CertificateDer::from)
            .collect();
        cnimesh_identity::tls::verify(roots.clone(), &chain, &web).unwrap();
    }
    let (_key, csr) = cnimesh_identity::ca::new_csr(&web).unwrap();
    let denied =
        CertifyRequest { identity: web.to_string(), token: b"wrong".to_vec(), certificate_signing_request: csr };
    assert_eq!(client.certify(denied).await.unwrap_err().code(), tonic::Code::Unauthenticated);

    // A client expecting another name must not get through.
    let other = Name::for_service_account("impostor", "cnimesh", "cluster.local").unwrap();
    assert!(
        cnimesh_identity::grpc_channel::connect(&running.grpc.to_string(), &other, roots.clone(), None).await.is_err()
    );

    let (status, _) = http_get(running.admin, "/ready").await;
    assert_eq!(status, 200);
    let (status, _) = http_get(running.admin, "/live").await;
    assert_eq!(status, 200);
    let (status, metrics) = http_get(running.admin, "/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("identity_certify_total{result=\"ok\"} 2"), "{metrics}");
    assert!(metrics.contains("identity_certify_total{result=\"denied\"} 1"), "{metrics}");
    assert!(metrics.contains("identity_certify_duration_seconds_count 3"), "{metrics}");

    running.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), running.task).await.unwrap().unwrap().unwrap();
}

/// A gRPC channel to the running control plane, once its own certificate is issued.
async fn channel(running: &Running) -> tonic::transport::Channel {
    let roots = cnimesh_identity::tls::roots(&running.anchors).unwrap();
    for _ in 0..100 {
        match cnimesh_identity::grpc_channel::connect(&running.grpc.to_string(), &running.control, roots.clone(), None)
            .await
        {
            Ok(channel) => return channel,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("the control plane never served its certificate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_grpc_call_with_a_sampled_traceparent_gets_a_server_span_in_the_callers_trace() {
    use linkerd2_proxy_api::destination::GetDestination;
    use linkerd2_proxy_api::destination::destination_client::DestinationClient;

    let receiver = cnimesh_trace::Receiver::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let trace = TraceConfig {
        collector: receiver.endpoint(),
        sampling: "0".into(),
        ca_file: None,
        pod: "cnimesh-control-0".into(),
        namespace: "cnimesh".into(),
        identity: "cnimesh-control.cnimesh".into(),
    };
    let mut running = start_traced(Some(trace)).await;
    let channel = channel(&running).await;
    let web = Name::for_service_account("web", "shop", "cluster.local").unwrap();
    let certify = || {
        let (_key, csr) = cnimesh_identity::ca::new_csr(&web).unwrap();
        let token = running.token.as_bytes().to_vec();
        CertifyRequest { identity: web.to_string(), token, certificate_signing_request: csr }
    };
    fn traced<T>(message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap();
        request.metadata_mut().insert("traceparent", parent);
        request
    }
    let mut identity = IdentityClient::new(channel.clone());
    // Without context, at sampling 0: no span. With an unsampled parent: none either.
    identity.certify(certify()).await.unwrap();
    let mut unsampled = tonic::Request::new(certify());
    let header = "00-11111111111111111111111111111111-2222222222222222-00".parse().unwrap();
    unsampled.metadata_mut().insert("traceparent", header);
    identity.certify(unsampled).await.unwrap();
    // A sampled parent: the span continues its trace.
    identity.certify(traced(certify())).await.unwrap();
    // Destination without a mesh client certificate is refused; the span says so.
    let refused = DestinationClient::new(channel)
        .get(traced(GetDestination { path: "web.shop.svc.cluster.local:80".into(), ..Default::default() }))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);

    let spans = receiver.wait_for(2, Duration::from_secs(20)).await.unwrap();
    assert_eq!(spans.len(), 2, "one span per sampled call and none for the others: {spans:#?}");
    for span in &spans {
        assert_eq!(span.kind, "server");
        assert_eq!(span.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span.parent_span_id.as_deref(), Some("00f067aa0ba902b7"));
        assert_eq!(span.attr("rpc.system"), Some("grpc"));
        assert_eq!(span.attr("network.peer.address"), Some("127.0.0.1"));
        assert_eq!(span.resource.get("service.name").map(String::as_str), Some("cnimesh-control"));
        assert_eq!(span.resource.get("k8s.pod.name").map(String::as_str), Some("cnimesh-control-0"));
    }
    let certified = spans.iter().find(|s| s.attr("rpc.method") == Some("Certify")).expect("the Certify span");
    assert_eq!(certified.name, "io.linkerd.proxy.identity.Identity/Certify");
    assert_eq!(certified.attr("rpc.service"), Some("io.linkerd.proxy.identity.Identity"));
    assert_eq!(certified.attr("rpc.grpc.status_code"), Some("0"));
    assert_eq!(certified.status, "unset");
    let get = spans.iter().find(|s| s.attr("rpc.method") == Some("Get")).expect("the Destination span");
    assert_eq!(get.attr("rpc.grpc.status_code"), Some("16"), "UNAUTHENTICATED");
    assert!(get.status.starts_with("error"), "{}", get.status);
    assert!(get.attr("cnimesh.refused").is_some_and(|m| m.contains("client certificate")));

    running.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), running.task).await.unwrap().unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_trace_collector_stops_the_control_plane_at_start() {
    let trace = TraceConfig {
        collector: "collector".into(),
        sampling: "0".into(),
        ca_file: None,
        pod: String::new(),
        namespace: String::new(),
        identity: String::new(),
    };
    let running = start_traced(Some(trace)).await;
    let error = tokio::time::timeout(Duration::from_secs(15), running.task).await.unwrap().unwrap().unwrap_err();
    assert!(format!("{error:#}").contains("\"collector\""), "{error:#}");
}

/// The chain the gRPC server presents, from a bare TLS handshake.
async fn served_chain(running: &Running) -> Option<Vec<CertificateDer<'static>>> {
    let roots = cnimesh_identity::tls::roots(&running.anchors).unwrap();
    let config = cnimesh_identity::tls::client_config(roots, None, &[b"h2"]).unwrap();
    let tcp = tokio::net::TcpStream::connect(running.grpc).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from(running.control.to_string()).unwrap();
    let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await.ok()?;
    tls.get_ref().1.peer_certificates().map(|c| c.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_certificate_follows_the_issuer() {
    let mut running = start().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Some(chain) = served_chain(&running).await {
            break chain;
        }
        assert!(tokio::time::Instant::now() < deadline, "no certificate served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(cnimesh_identity::tls::identity_of(&first[0]), Some(running.control.clone()));

    let new = cnimesh_model::identity::issuer::tests::write_issuer(
        running.pki.path(),
        &running.anchor,
        Duration::from_secs(7200),
    );
    let new_der = cnimesh_identity::pem::certs(new.cert_pem.as_bytes(), "new issuer").unwrap().remove(0);
    assert_ne!(first[1], new_der);
    loop {
        let chain = served_chain(&running).await.expect("still served");
        if chain[1] == new_der {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the served certificate was not renewed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop.take().unwrap().send(()).unwrap();
    running.task.await.unwrap().unwrap();
}

/// Only Certify is served without a client certificate; a certificate must chain to the
/// issuer's anchors (one from another mesh fails the handshake); a valid one gets through to
/// routing (Destination is not served here: UNIMPLEMENTED, not UNAUTHENTICATED).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_other_than_certify_need_a_client_certificate_from_our_anchors() {
    use linkerd2_proxy_api::destination::GetDestination;
    use linkerd2_proxy_api::destination::destination_client::DestinationClient;

    let mut running = start().await;
    let roots = cnimesh_identity::tls::roots(&running.anchors).unwrap();
    let addr = running.grpc.to_string();
    let connect = |cert| cnimesh_identity::grpc_channel::connect(&addr, &running.control, roots.clone(), cert);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let anonymous = loop {
        match connect(None).await {
            Ok(channel) => break channel,
            Err(e) => assert!(tokio::time::Instant::now() < deadline, "{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let get = |channel| async move {
        let request = GetDestination { path: "web.shop.svc.cluster.local:80".into(), ..Default::default() };
        DestinationClient::new(channel).get(request).await.map(|_| ()).unwrap_err()
    };
    assert_eq!(get(anonymous).await.code(), tonic::Code::Unauthenticated);

    let web = Name::for_service_account("web", "shop", "cluster.local").unwrap();
    let ours = own_cert::issue_from_dir(running.pki.path(), &web, Duration::from_secs(600)).unwrap();
    assert_eq!(get(connect(Some(ours)).await.unwrap()).await.code(), tonic::Code::Unimplemented);

    let elsewhere = tempfile::tempdir().unwrap();
    write_pki(elsewhere.path(), Duration::from_secs(3600));
    let theirs = own_cert::issue_from_dir(elsewhere.path(), &web, Duration::from_secs(600)).unwrap();
    // TLS 1.3: the server's verdict on the client certificate may arrive after the client
    // thinks the handshake is done, so it shows on the first call at the latest.
    if let Ok(channel) = connect(Some(theirs)).await {
        assert_ne!(get(channel).await.code(), tonic::Code::Unimplemented);
    }
    running.stop.take().unwrap().send(()).unwrap();
    running.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn not_ready_without_an_issuer() {
    let pki = tempfile::tempdir().unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_addr = admin.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let policy =
        Policy { trust_domain: "cluster.local".into(), lifetime: Duration::from_secs(60), clock_skew: Duration::ZERO };
    let config = Config::new(
        pki.path().to_path_buf(),
        Name::parse("control.example").unwrap(),
        policy,
        cnimesh_apiserver::ClusterApi::new().client(),
        Listeners { grpc: grpc.into(), admin: admin.into() },
        async {
            let _ = stopped.await;
        },
    );
    let task = tokio::spawn(run(config));
    // The listener is bound already: the request waits in its backlog until run() serves it.
    let (status, body) = http_get(admin_addr, "/ready").await;
    assert!(body.contains("no issuer"), "{body}");
    assert_eq!(status, 503);
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}
