//! `cnimesh-control serve`: wires the issuer, the control plane's own certificate, the gRPC
//! services and the admin listener together. Callable in-process with bound listeners (tests,
//! benchmarks).
//!
//! Layer: runtime: the one place where sources, index, gRPC services and admin are wired together.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use cnimesh_common::names::TAP_TOKEN_AUDIENCE;
use cnimesh_identity::Name;
use cnimesh_identity::tls::CurrentCert;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::Routes;

use crate::admin::{self, AdminState};
use crate::destination::Index;
use crate::grpc::destination::DestinationService;
use crate::grpc::identity::IdentityService;
use crate::grpc::inbound::InboundService;
use crate::grpc::limits::Admission;
use crate::grpc::outbound::OutboundService;
use crate::grpc::peer::{self, OptionalMeshClientVerifier};
use crate::grpc::spans::{GrpcTracing, TraceConfig};
use crate::identity::{Authenticator, KubeTokens, Policy, issuer, own_cert};
use crate::metrics::Metrics;
use crate::sources::{FileSource, KubeSource, Source};
use crate::tap::Relay;
use cnimesh_identity::trust_domain::Verifying;

/// Where cluster state (Services, EndpointSlices, Pods) for the Destination service comes from.
pub enum ClusterSource {
    /// Local mode: a directory of Kubernetes objects as YAML.
    Files(PathBuf),
    /// Watches on the API server.
    Kube(kube::Client),
}

pub struct Config {
    /// `ca.crt`, `tls.crt`, `tls.key`, watched for changes.
    pub issuer_dir: PathBuf,
    /// The control plane's own identity: the name proxies verify when they connect.
    pub identity_name: Name,
    pub policy: Policy,
    /// Where workload tokens are checked: TokenReview against this API server.
    pub tokens: kube::Client,
    /// Destination, inbound and outbound policy are served when a source is configured.
    pub cluster: Option<ClusterSource>,
    /// Answers' cluster and trust domains.
    pub destination: crate::destination::Config,
    /// Inbound policy's defaults; policy is served beside Destination, from the same source.
    pub inbound_policy: crate::policy::Config,
    /// The injection webhook and its serving certificate, when enabled.
    pub webhook: Option<(crate::inject::Webhook, Arc<rustls::ServerConfig>)>,
    /// The webhook's certificate from a watched Secret, and in managed mode the election and the
    /// leader's upkeep of it (`crate::webhook_certs`). `None`: the one in `webhook` is fixed.
    pub webhook_certs: Option<crate::webhook_certs::SecretSource>,
    /// What one client may hold open on the gRPC port (`crate::grpc::limits`).
    pub limits: crate::grpc::limits::Limits,
    /// ServiceAccounts Identity refuses to certify: the control plane's and the node agent's.
    pub reserved: crate::identity::Reserved,
    /// How replicas elect the writer of the endorsed trust bundle in every namespace
    /// (`crate::trust_bundle`, through the API server of `tokens`); `None`: none is written.
    pub trust_bundle: Option<crate::leader::ElectionConfig>,
}

pub struct Listeners {
    /// gRPC over TLS: Identity to anyone, everything else to mesh identities only.
    pub grpc: TcpListener,
    /// HTTP `/metrics`, `/ready`, `/live`.
    pub admin: TcpListener,
    /// HTTPS admission webhook (`Config::webhook`).
    pub webhook: Option<TcpListener>,
}

/// Runs the control plane until `shutdown` resolves, then drains gRPC calls and returns.
pub async fn run(config: Config, listeners: Listeners, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    run_traced(config, listeners, None, shutdown).await
}

/// [`run`], with a SERVER span per gRPC call exported to `trace`'s collector
/// ([`crate::grpc::spans`]); `None` is [`run`].
pub async fn run_traced(
    config: Config,
    listeners: Listeners,
    trace: Option<TraceConfig>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let tracer = match &trace {
        Some(trace) => {
            let tracer = GrpcTracing::spawn(trace).context("the control plane's tracing")?;
            tracing::info!(collector = %trace.collector, sampling = %trace.sampling, "tracing gRPC calls");
            Some(tracer)
        }
        None => None,
    };
    let metrics = Arc::new(Metrics::default());
    let (stop, stopped) = watch::channel(false);
    let cert_tasks = config
        .webhook_certs
        .map(|source| crate::webhook_certs::spawn(source, metrics.clone(), stopped.clone()))
        .unwrap_or_default();
    let issuer = issuer::watch_dir(config.issuer_dir.clone(), metrics.clone(), stopped.clone())
        .with_context(|| format!("loading the issuer from {}", config.issuer_dir.display()))?;

    let own_cert = Arc::new(CurrentCert::default());
    let own_cert_task = tokio::spawn(own_cert::keep_current(
        config.identity_name.clone(),
        issuer.clone(),
        config.policy.clone(),
        own_cert.clone(),
        stopped.clone(),
    ));
    let bundle_tasks = config.trust_bundle.map(|election| {
        let role = crate::trust_bundle::TRUST_BUNDLE_WRITE;
        let (leadership, elector) =
            crate::leader::spawn(config.tokens.clone(), role, election, metrics.clone(), stopped.clone());
        let writer = crate::trust_bundle::run(
            config.tokens.clone(),
            leadership,
            issuer.clone(),
            own_cert.clone(),
            stopped.clone(),
        );
        [elector, tokio::spawn(writer)]
    });
    // Client certificates are asked for but optional: a proxy asks for its first one here.
    // Those presented are checked against the issuer's anchors as they are now; every call but
    // Certify needs one (crate::grpc::peer).
    let verifying = Verifying::new(config.identity_name.clone(), own_cert.clone());
    let verifier = OptionalMeshClientVerifier::following(issuer.clone(), verifying);
    let server_tls =
        peer::server_config(own_cert.clone(), verifier).context("TLS configuration for the gRPC server")?;

    // Tap tokens carry their own audience.
    let authenticator: Arc<dyn Authenticator> = Arc::new(KubeTokens::new(config.tokens.clone()));
    let tap_authenticator: Arc<dyn Authenticator> =
        Arc::new(KubeTokens::new(config.tokens).with_audience(TAP_TOKEN_AUDIENCE));
    let trust_domain = config.policy.trust_domain.clone();
    let identity = IdentityService::new(issuer.clone(), authenticator, config.policy, metrics.clone())
        .with_reserved(config.reserved);
    let mut routes = Routes::new(identity.into_server());
    let index = config.cluster.as_ref().map(|_| Index::new());
    let destination_config = Arc::new(config.destination.clone());
    let source_task = match (config.cluster, index.clone()) {
        (Some(source), Some(index)) => {
            // Egress, with the same cluster networks inbound policy uses.
            let egress = crate::egress::Index::counting_refusals(
                crate::egress::Config::new(config.inbound_policy.cluster_networks.clone()),
                metrics.clone(),
            );
            let policy = crate::policy::Index::new(config.inbound_policy);
            routes = routes
                .add_service(DestinationService::new(index.clone(), config.destination.clone()).into_server())
                .add_service(InboundService::new(policy.clone()).into_server())
                .add_service(
                    OutboundService::new(index.clone(), config.destination)
                        .with_routes(policy.clone())
                        .with_egress(egress.clone())
                        .into_server(),
                );
            Some(match source {
                ClusterSource::Files(dir) => tokio::spawn(
                    FileSource::new(dir)
                        .with_policy(policy)
                        .with_egress(egress)
                        .with_metrics(metrics.clone())
                        .run(index),
                ),
                ClusterSource::Kube(client) => tokio::spawn(
                    KubeSource::new(client)
                        .with_policy(policy)
                        .with_egress(egress)
                        .with_metrics(metrics.clone())
                        .run(index),
                ),
            })
        }
        _ => None,
    };

    tracing::info!(
        grpc = %listeners.grpc.local_addr()?,
        admin = %listeners.admin.local_addr()?,
        identity = %config.identity_name,
        "serving"
    );
    let admission = Admission::new(config.limits);
    let grpc = tokio::spawn(crate::grpc::serve_tls_traced(
        listeners.grpc,
        routes,
        server_tls,
        admission,
        metrics.clone(),
        tracer,
        until(stopped.clone()),
    ));
    let webhook_addr = listeners.webhook.as_ref().and_then(|l| l.local_addr().ok());
    let webhook = match (config.webhook, listeners.webhook) {
        (Some((webhook, tls)), Some(listener)) => {
            tracing::info!(addr = %listener.local_addr()?, "serving the injection webhook");
            let webhook = Arc::new(webhook.with_issuer_anchors(issuer.clone()));
            Some(tokio::spawn(crate::inject::serve_webhook(listener, tls, webhook, until(stopped.clone()))))
        }
        (None, None) => None,
        _ => anyhow::bail!("the webhook needs both its configuration and a listener"),
    };
    let tap =
        Relay::new(tap_authenticator, metrics.clone(), index.clone(), issuer.clone(), own_cert.clone(), trust_domain);
    let admin_state =
        AdminState { metrics, issuer, index, tap: Some(tap), destination: destination_config, webhook_addr };
    let admin = tokio::spawn(admin::serve(listeners.admin, admin_state, until(stopped)));

    shutdown.await;
    tracing::info!("shutting down");
    stop.send_replace(true);
    grpc.await.context("gRPC server task")?;
    admin.await.context("admin server task")?;
    if let Some(webhook) = webhook {
        webhook.await.context("webhook task")?;
    }
    own_cert_task.await.context("own certificate task")?;
    for task in cert_tasks.into_iter().chain(bundle_tasks.into_iter().flatten()) {
        // The elector releases its Lease (bounded by a renew interval); the others just stop.
        if tokio::time::timeout(std::time::Duration::from_secs(10), task).await.is_err() {
            tracing::warn!("a writer task (webhook certificate, trust bundle) did not stop in time");
        }
    }
    if let Some(task) = source_task {
        task.abort();
    }
    Ok(())
}

async fn until(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use linkerd2_proxy_api::identity::CertifyRequest;
    use linkerd2_proxy_api::identity::identity_client::IdentityClient;
    use rustls_pki_types::CertificateDer;

    use super::*;
    use crate::identity::issuer::tests::write_pki;

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
        let control = Name::for_service_account("cnimesh-control", "cnimesh", "cluster.local").unwrap();
        let config = Config {
            issuer_dir: pki.path().to_path_buf(),
            identity_name: control.clone(),
            policy: Policy {
                trust_domain: "cluster.local".into(),
                lifetime: Duration::from_secs(3600),
                clock_skew: Duration::from_secs(20),
            },
            tokens: api.client(),
            cluster: None,
            destination: Default::default(),
            inbound_policy: Default::default(),
            webhook: None,
            webhook_certs: None,
            trust_bundle: None,
            limits: Default::default(),
            reserved: Default::default(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(run_traced(config, Listeners { grpc, admin, webhook: None }, trace, async {
            let _ = stopped.await;
        }));
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
            cnimesh_identity::grpc_channel::connect(&running.grpc.to_string(), &other, roots.clone(), None)
                .await
                .is_err()
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
            match cnimesh_identity::grpc_channel::connect(
                &running.grpc.to_string(),
                &running.control,
                roots.clone(),
                None,
            )
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

        let new = crate::identity::issuer::tests::write_issuer(
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
        let config = Config {
            issuer_dir: pki.path().to_path_buf(),
            identity_name: Name::parse("control.example").unwrap(),
            policy: Policy {
                trust_domain: "cluster.local".into(),
                lifetime: Duration::from_secs(60),
                clock_skew: Duration::ZERO,
            },
            tokens: cnimesh_apiserver::ClusterApi::new().client(),
            cluster: None,
            destination: Default::default(),
            inbound_policy: Default::default(),
            webhook: None,
            webhook_certs: None,
            trust_bundle: None,
            limits: Default::default(),
            reserved: Default::default(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(config, Listeners { grpc, admin, webhook: None }, async {
            let _ = stopped.await;
        }));
        // The listener is bound already: the request waits in its backlog until run() serves it.
        let (status, body) = http_get(admin_addr, "/ready").await;
        assert!(body.contains("no issuer"), "{body}");
        assert_eq!(status, 503);
        stop.send(()).unwrap();
        task.await.unwrap().unwrap();
    }
}
