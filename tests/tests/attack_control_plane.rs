//! Attacks on the control plane's gRPC port (4190) from an ordinary pod, on a real kernel with the real `cnimesh-control` binary: real TCP, real TLS, the
//! attacker's own gRPC clients in its pod's network namespace.
//!
//! - An attacker without a mesh certificate must get nothing but Identity.
//! - An attacker with a valid mesh certificate (it is a meshed pod) that floods Destination
//!   streams must be bounded: its streams beyond the limits are refused, the control plane's
//!   memory stays bounded, and a legitimate proxy's Certify and Destination calls still answer.
//! - A token of one of the control plane's own ServiceAccounts (the tap relay's, whose token any
//!   holder of the tap Role can mint) must not buy a mesh certificate.
//! - A client that connects before it holds a certificate and certifies on that connection (as
//!   the stock linkerd2-proxy does) must not be refused forever: the control plane ends the
//!   connection after refusing a call, and the client's next connection carries its certificate.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cnimesh_e2e::control::{Control, identity};
use cnimesh_e2e::netns::block_on_in;
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use cnimesh_identity::Name;
use cnimesh_identity::tls::{self, CurrentCert};
use hyper_util::rt::TokioIo;
use linkerd2_proxy_api::destination::GetDestination;
use linkerd2_proxy_api::destination::destination_client::DestinationClient;
use linkerd2_proxy_api::identity::CertifyRequest;
use linkerd2_proxy_api::identity::identity_client::IdentityClient;
use linkerd2_proxy_api::inbound::PortSpec;
use linkerd2_proxy_api::inbound::inbound_server_policies_client::InboundServerPoliciesClient;
use linkerd2_proxy_api::outbound::outbound_policies_client::OutboundPoliciesClient;
use linkerd2_proxy_api::outbound::{TrafficSpec, traffic_spec};
use serde_json::json;
use tokio_rustls::rustls::RootCertStore;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const SERVICE: &str = "web.shop.svc.cluster.local:80";

/// A `web` Service with one meshed endpoint, for Destination and policy to answer about.
const CLUSTER: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{name: http, port: 80, targetPort: 8080}]\n  selector: {app: web}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-abc\n  namespace: shop\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nports: [{port: 8080, protocol: TCP}]\nendpoints:\n  - addresses: [\"10.22.0.99\"]\n    conditions: {ready: true}\n    targetRef: {kind: Pod, name: web-0, namespace: shop}\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web-0\n  namespace: shop\n  labels: {app: web}\nspec:\n  serviceAccountName: web\n  containers:\n    - name: app\n      image: web\n      ports: [{containerPort: 8080}]\n    - name: cnimesh-proxy\n      image: cnimesh/proxy\nstatus:\n  phase: Running\n  podIP: 10.22.0.99\n  podIPs: [{ip: 10.22.0.99}]\n";

/// The control plane in a pod of its own, serving Destination and policy from `CLUSTER`.
struct ControlPlane<'n> {
    control: Control,
    _pod: Pod<'n>,
    roots: Arc<RootCertStore>,
    name: Name,
}

impl ControlPlane<'_> {
    fn addr(&self) -> SocketAddr {
        self.control.addr
    }

    /// The control plane's resident memory (KiB), from /proc: the process whose command line is
    /// the control binary serving from this control plane's issuer directory.
    fn rss_kib(&self) -> u64 {
        let issuer = self.control.issuer_dir().display().to_string();
        let pid = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let args: Vec<_> = cmdline.split(|b| *b == 0).map(String::from_utf8_lossy).collect();
                args.first().is_some_and(|a| a.ends_with("cnimesh-control-e2e")) && args.iter().any(|a| *a == issuer)
            })
            .expect("the control plane's process");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

fn control_plane<'n>(net: &'n Network, args: &[&str]) -> ControlPlane<'n> {
    let bins = bins!();
    let pod = Pod::unmeshed(net, "cnimesh", "control").unwrap();
    let control = Control::start_with_objects(&bins.control, &pod, args, &[("web.yaml", CLUSTER)]).unwrap();
    let anchors = cnimesh_identity::pem::certs(&std::fs::read(control.trust_anchors()).unwrap(), "anchors").unwrap();
    let roots = tls::roots(&anchors).unwrap();
    let name = Name::parse(&identity("cnimesh", "cnimesh-control")).unwrap();
    ControlPlane { control, _pod: pod, roots, name }
}

/// One TLS connection to the control plane carrying gRPC, presenting `cert` when given. Built
/// here rather than with the proxy's channel builder: the attacker chooses what it presents.
async fn connect(
    addr: SocketAddr,
    server: &Name,
    roots: Arc<RootCertStore>,
    cert: Option<Arc<CurrentCert>>,
) -> anyhow::Result<Channel> {
    let cert = cert.map(|c| c as Arc<dyn tokio_rustls::rustls::client::ResolvesClientCert>);
    let tls = tokio_rustls::TlsConnector::from(tls::client_config(roots, cert, &[b"h2"])?);
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(server.to_string())?;
    let connector = tower::service_fn(move |_: http::Uri| {
        let (tls, name) = (tls.clone(), name.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            Ok::<_, std::io::Error>(TokioIo::new(tls.connect(name, tcp).await?))
        }
    });
    Ok(Endpoint::from_static("http://cnimesh-control")
        .connect_timeout(Duration::from_secs(10))
        .connect_with_connector(connector)
        .await?)
}

/// Asks Identity for a certificate for `name` with `token`, without a client certificate (as a
/// proxy's first Certify is); the certificate and its key ready to present, or the refusal.
async fn certify(cp: &ControlPlane<'_>, name: &str, token: &str) -> Result<Arc<CurrentCert>, tonic::Status> {
    let channel =
        connect(cp.addr(), &cp.name, cp.roots.clone(), None).await.expect("a TLS connection without a certificate");
    let name = Name::parse(name).unwrap();
    let (key, csr) = cnimesh_identity::ca::new_csr(&name).unwrap();
    let request = CertifyRequest {
        identity: name.to_string(),
        token: token.as_bytes().to_vec(),
        certificate_signing_request: csr,
    };
    let response = IdentityClient::new(channel).certify(request).await?.into_inner();
    let chain = std::iter::once(response.leaf_certificate)
        .chain(response.intermediate_certificates)
        .map(tokio_rustls::rustls::pki_types::CertificateDer::from)
        .collect();
    let key = tokio_rustls::rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let cert = CurrentCert::default();
    cert.set(tls::certified_key(chain, key).unwrap());
    Ok(Arc::new(cert))
}

/// How one Destination `Get` stream fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Outcome {
    /// Its first update arrived: the stream is open and held.
    Answered,
    /// Refused with this code.
    Refused(Code),
    /// No answer within the wait (queued behind the connection's stream limit, say).
    Stalled,
}

/// Opens a `Get` stream and waits (bounded) for its first update; an answered stream is kept in
/// `held` so that it stays open.
async fn open_get(
    channel: Channel,
    held: &tokio::sync::Mutex<Vec<tonic::Streaming<linkerd2_proxy_api::destination::Update>>>,
) -> Outcome {
    let request = GetDestination { path: SERVICE.into(), ..Default::default() };
    let attempt = async {
        let mut stream = DestinationClient::new(channel).get(request).await?.into_inner();
        stream.message().await?;
        Ok::<_, tonic::Status>(stream)
    };
    match tokio::time::timeout(Duration::from_secs(10), attempt).await {
        Ok(Ok(stream)) => {
            held.lock().await.push(stream);
            Outcome::Answered
        }
        Ok(Err(status)) => Outcome::Refused(status.code()),
        Err(_) => Outcome::Stalled,
    }
}

/// A flood of `Get` streams from one pod: `connections` connections with `streams` streams each.
#[derive(Debug, Default)]
struct FloodResult {
    connected: usize,
    answered: usize,
    refused: std::collections::BTreeMap<String, usize>,
    stalled: usize,
}

/// Runs a flood from `netns` and, while every answered stream is still held open, `during`
/// (called from the test's thread); then closes everything.
fn flood_while<T>(
    cp: &ControlPlane<'_>,
    netns: &Path,
    cert: Option<Arc<CurrentCert>>,
    connections: usize,
    streams: usize,
    during: impl FnOnce(&FloodResult) -> T,
) -> (FloodResult, T) {
    let (addr, name, roots) = (cp.addr(), cp.name.clone(), cp.roots.clone());
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let netns = netns.to_path_buf();
    let attacker = std::thread::spawn(move || {
        block_on_in(&netns, async move {
            let held = Arc::new(tokio::sync::Mutex::new(Vec::new()));
            let mut result = FloodResult::default();
            let mut tasks = Vec::new();
            for _ in 0..connections {
                let Ok(channel) = connect(addr, &name, roots.clone(), cert.clone()).await else { continue };
                result.connected += 1;
                for _ in 0..streams {
                    let (channel, held) = (channel.clone(), held.clone());
                    tasks.push(tokio::spawn(async move { open_get(channel, &held).await }));
                }
            }
            for task in tasks {
                match task.await.unwrap() {
                    Outcome::Answered => result.answered += 1,
                    Outcome::Refused(code) => *result.refused.entry(format!("{code:?}")).or_default() += 1,
                    Outcome::Stalled => result.stalled += 1,
                }
            }
            opened_tx.send(result).unwrap();
            // Everything stays open until the test has measured.
            let _ = release_rx.await;
            drop(held);
        })
    });
    let result = opened_rx.recv().expect("the flood reports");
    let measured = during(&result);
    let _ = release_tx.send(());
    attacker.join().unwrap();
    (result, measured)
}

/// What a legitimate proxy needs from the control plane: a certificate, then a Destination answer
/// with it. Each bounded; returns what failed, if anything.
fn legitimate_proxy_is_answered(cp: &ControlPlane<'_>, netns: &Path, token: &str) -> Result<(), String> {
    block_on_in(netns, async {
        let id = identity("shop", "legit");
        let cert = tokio::time::timeout(Duration::from_secs(10), certify(cp, &id, token))
            .await
            .map_err(|_| "Certify did not answer within 10 s".to_string())?
            .map_err(|s| format!("Certify: {s:?}"))?;
        let channel =
            tokio::time::timeout(Duration::from_secs(10), connect(cp.addr(), &cp.name, cp.roots.clone(), Some(cert)))
                .await
                .map_err(|_| "no connection within 10 s".to_string())?
                .map_err(|e| format!("connect: {e:#}"))?;
        let held = tokio::sync::Mutex::new(Vec::new());
        match open_get(channel, &held).await {
            Outcome::Answered => Ok(()),
            other => Err(format!("Destination Get: {other:?}")),
        }
    })
}

/// A sample's value in Prometheus text; 0 when absent.
fn metric(metrics: &str, series: &str) -> f64 {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok()).unwrap_or(0.0)
}

/// The first answer of a stream call, bounded: a refusal or an answer, never a hang.
async fn bounded(
    call: impl std::future::Future<Output = Result<String, tonic::Status>>,
) -> Result<String, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(20), call).await.expect("an answer or a refusal within 20 s")
}

#[test]
fn a_pod_without_a_mesh_certificate_gets_identity_but_no_destination_or_policy() {
    if !require_root("a_pod_without_a_mesh_certificate_gets_identity_but_no_destination_or_policy") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let cp = control_plane(&net, &[]);
    let attacker = Pod::unmeshed(&net, "shop", "attacker").unwrap();
    let token = std::fs::read_to_string(cp.control.token("shop", "attacker").unwrap()).unwrap();

    let (destination, inbound, outbound, certified) = block_on_in(&attacker.netns.path(), async {
        let channel = connect(cp.addr(), &cp.name, cp.roots.clone(), None).await.unwrap();
        let destination = async {
            let request = GetDestination { path: SERVICE.into(), ..Default::default() };
            let mut stream = DestinationClient::new(channel.clone()).get(request).await?.into_inner();
            stream.message().await.map(|m| format!("{m:?}"))
        };
        let inbound = async {
            let spec = PortSpec { workload: "shop:web-0".into(), port: 8080 };
            let mut stream = InboundServerPoliciesClient::new(channel.clone()).watch_port(spec).await?.into_inner();
            stream.message().await.map(|m| format!("{m:?}"))
        };
        let outbound = async {
            let spec = TrafficSpec {
                source_workload: "shop:attacker".into(),
                target: Some(traffic_spec::Target::Authority(SERVICE.into())),
            };
            let mut stream = OutboundPoliciesClient::new(channel.clone()).watch(spec).await?.into_inner();
            stream.message().await.map(|m| format!("{m:?}"))
        };
        let destination = bounded(destination).await;
        let inbound = bounded(inbound).await;
        let outbound = bounded(outbound).await;
        // Identity stays open to certificate-less clients: that is how a proxy gets its first one.
        let certified = certify(&cp, &identity("shop", "attacker"), token.trim()).await.map(|_| ());
        (destination, inbound, outbound, certified)
    });
    eprintln!(
        "without a certificate: Destination {destination:?}\ninbound policy {inbound:?}\noutbound policy {outbound:?}"
    );
    for (what, answer) in
        [("Destination/Get", &destination), ("inbound WatchPort", &inbound), ("outbound Watch", &outbound)]
    {
        let status = answer.as_ref().expect_err(&format!("{what} must be refused without a mesh certificate"));
        assert_eq!(status.code(), Code::Unauthenticated, "{what}: {status:?}");
        assert!(status.message().contains("certificate"), "{what} says why: {status:?}");
    }
    certified.expect("Certify without a client certificate");
    let metrics = cp.control.metrics();
    assert!(
        metric(&metrics, "grpc_refused_total{reason=\"unauthenticated\"}") >= 3.0,
        "refusals are counted:\n{metrics}"
    );
}

#[test]
fn a_meshed_pod_flooding_destination_streams_is_bounded_and_legitimate_proxies_still_get_answers() {
    if !require_root("a_meshed_pod_flooding_destination_streams_is_bounded_and_legitimate_proxies_still_get_answers") {
        return;
    }
    const CONNECTIONS: usize = 5;
    const STREAMS: usize = 4000;
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let cp = control_plane(&net, &[]);
    let attacker = Pod::unmeshed(&net, "shop", "attacker").unwrap();
    let anonymous = Pod::unmeshed(&net, "shop", "anonymous").unwrap();
    let legit = Pod::unmeshed(&net, "shop", "legit").unwrap();
    let attacker_token = std::fs::read_to_string(cp.control.token("shop", "attacker").unwrap()).unwrap();
    let legit_token = std::fs::read_to_string(cp.control.token("shop", "legit").unwrap()).unwrap();
    // The attacker is a meshed pod: it holds a valid certificate for its own identity.
    let cert = block_on_in(&attacker.netns.path(), certify(&cp, &identity("shop", "attacker"), attacker_token.trim()))
        .expect("the attacker's own certificate");
    legitimate_proxy_is_answered(&cp, &legit.netns.path(), legit_token.trim()).expect("answers before the flood");
    let baseline = cp.rss_kib();

    let (flood, (during_rss, legit_during)) =
        flood_while(&cp, &attacker.netns.path(), Some(cert), CONNECTIONS, STREAMS, |_| {
            (cp.rss_kib(), legitimate_proxy_is_answered(&cp, &legit.netns.path(), legit_token.trim()))
        });
    let growth_mib = during_rss.saturating_sub(baseline) / 1024;
    eprintln!(
        "flood of {CONNECTIONS}x{STREAMS} Get streams with a mesh certificate: {flood:?}; control plane RSS {} MiB before, {} MiB during (+{growth_mib} MiB); legitimate proxy during the flood: {legit_during:?}",
        baseline / 1024,
        during_rss / 1024
    );
    // Without a certificate: nothing but refusals.
    let (anonymous, ()) = flood_while(&cp, &anonymous.netns.path(), None, CONNECTIONS, 200, |_| ());
    eprintln!("flood of {CONNECTIONS}x200 Get streams without a certificate: {anonymous:?}");

    assert_eq!(anonymous.answered, 0, "{anonymous:?}");
    // Each connection is ended after its first refusal: the streams it opened after the GOAWAY
    // are refused by HTTP/2 itself, never served; none is left hanging.
    assert_eq!(anonymous.stalled, 0, "{anonymous:?}");
    assert_eq!(anonymous.refused.values().sum::<usize>(), CONNECTIONS * 200, "{anonymous:?}");
    legit_during.expect("a legitimate proxy's Certify and Destination answer during the flood");
    assert!(flood.answered <= 1024, "one pod holds at most 1024 streams: {flood:?}");
    assert!(
        flood.refused.get("ResourceExhausted").copied().unwrap_or(0) > 0,
        "streams over the bounds are refused with RESOURCE_EXHAUSTED: {flood:?}"
    );
    assert!(growth_mib < 64, "the flood grew the control plane by {growth_mib} MiB");
    let metrics = cp.control.metrics();
    assert!(
        metric(&metrics, "grpc_refused_total{reason=\"streams_per_peer\"}") > 0.0,
        "refusals are counted:\n{metrics}"
    );
    assert!(metric(&metrics, "grpc_refused_total{reason=\"unauthenticated\"}") >= CONNECTIONS as f64, "{metrics}");

    // Memory comes back once the flood is gone.
    let mut after = 0;
    eventually("the control plane's memory returns after the flood", Duration::from_secs(60), || {
        after = cp.rss_kib();
        after < baseline + 8 * 1024
    });
    eprintln!("control plane RSS after the flood: {} MiB", after / 1024);
}

#[test]
fn a_token_of_a_control_plane_service_account_buys_no_mesh_certificate() {
    if !require_root("a_token_of_a_control_plane_service_account_buys_no_mesh_certificate") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let cp = control_plane(&net, &[]);
    let attacker = Pod::unmeshed(&net, "shop", "attacker").unwrap();
    // The tap relay's ServiceAccount (any holder of the tap Role can mint its tokens) and the
    // node agent's: both valid tokens as far as the token source is concerned.
    let accounts = [("cnimesh", "cnimesh-tap"), ("cnimesh", "cnimesh-control"), ("cnimesh-system", "cnimesh-node")];
    let tokens: Vec<(String, String)> = accounts
        .iter()
        .map(|(ns, sa)| (identity(ns, sa), std::fs::read_to_string(cp.control.token(ns, sa).unwrap()).unwrap()))
        .collect();
    let answers: Vec<(String, Result<(), tonic::Status>)> = block_on_in(&attacker.netns.path(), async {
        let mut answers = Vec::new();
        for (id, token) in &tokens {
            answers.push((id.clone(), certify(&cp, id, token.trim()).await.map(|_| ())));
        }
        answers
    });
    for (id, answer) in &answers {
        eprintln!("Certify as {id}: {answer:?}");
    }
    for (id, answer) in answers {
        let status = answer.expect_err(&format!("{id} must not be issued a mesh certificate"));
        assert_eq!(status.code(), Code::PermissionDenied, "{id}: {status:?}");
        assert!(status.message().contains("control plane"), "the refusal says why: {status:?}");
    }
    // An ordinary workload is still served.
    let web = std::fs::read_to_string(cp.control.token("shop", "web").unwrap()).unwrap();
    block_on_in(&attacker.netns.path(), certify(&cp, &identity("shop", "web"), web.trim()))
        .expect("shop/web is served");
}

/// gRPC calls on one HTTP/2 connection of our own (tonic's `Channel` would reconnect by itself).
type Grpc =
    tower::util::BoxCloneService<http::Request<tonic::body::Body>, http::Response<hyper::body::Incoming>, hyper::Error>;

/// One HTTP/2 connection to the control plane over TLS that presents whatever `cert` holds at
/// the handshake (nothing yet, for a proxy that has not certified), as linkerd2-proxy's client
/// does: the gRPC clients on it, and the connection's own task, which ends when the server
/// closes the connection.
async fn h2_connection(
    cp: &ControlPlane<'_>,
    cert: Arc<CurrentCert>,
) -> (Grpc, tokio::task::JoinHandle<hyper::Result<()>>) {
    let resolver = cert as Arc<dyn tokio_rustls::rustls::client::ResolvesClientCert>;
    let tls = tokio_rustls::TlsConnector::from(tls::client_config(cp.roots.clone(), Some(resolver), &[b"h2"]).unwrap());
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(cp.name.to_string()).unwrap();
    let tcp = tokio::net::TcpStream::connect(cp.addr()).await.unwrap();
    let stream = tls.connect(name, tcp).await.expect("a TLS connection");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("an HTTP/2 connection");
    let task = tokio::spawn(conn);
    let service = tower::service_fn(move |req: http::Request<tonic::body::Body>| {
        let mut sender = sender.clone();
        async move { sender.send_request(req).await }
    });
    (Grpc::new(service), task)
}

#[test]
fn a_proxy_that_certifies_on_a_connection_made_without_a_certificate_is_sent_away_and_answered_on_its_next_one() {
    if !require_root(
        "a_proxy_that_certifies_on_a_connection_made_without_a_certificate_is_sent_away_and_answered_on_its_next_one",
    ) {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let cp = control_plane(&net, &[]);
    let pod = Pod::unmeshed(&net, "shop", "late").unwrap();
    let token = std::fs::read_to_string(cp.control.token("shop", "late").unwrap()).unwrap();
    let origin = http::Uri::from_static("http://cnimesh-control");

    let (refused, closed, answered) = block_on_in(&pod.netns.path(), async {
        // The proxy's certificate store: empty at its first connection.
        let cert = Arc::new(CurrentCert::default());
        let (first, first_conn) = h2_connection(&cp, cert.clone()).await;
        // Certify on that connection, and hold the certificate from now on.
        let name = Name::parse(&identity("shop", "late")).unwrap();
        let (key, csr) = cnimesh_identity::ca::new_csr(&name).unwrap();
        let request =
            CertifyRequest { identity: name.to_string(), token: token.trim().into(), certificate_signing_request: csr };
        let certified = IdentityClient::with_origin(first.clone(), origin.clone())
            .certify(request)
            .await
            .expect("Certify on a connection without a certificate")
            .into_inner();
        let chain = std::iter::once(certified.leaf_certificate)
            .chain(certified.intermediate_certificates)
            .map(tokio_rustls::rustls::pki_types::CertificateDer::from)
            .collect();
        let key = tokio_rustls::rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        cert.set(tls::certified_key(chain, key).unwrap());
        // Destination on the same connection: it still has no client certificate.
        let get = |service| {
            let origin = origin.clone();
            async move {
                let request = GetDestination { path: SERVICE.into(), ..Default::default() };
                let mut stream = DestinationClient::with_origin(service, origin).get(request).await?.into_inner();
                stream.message().await.map(|m| format!("{m:?}"))
            }
        };
        let refused = bounded(get(first.clone())).await;
        // The server ends that connection (GOAWAY, then close) instead of keeping it.
        let closed = tokio::time::timeout(Duration::from_secs(20), first_conn).await;
        // The next connection presents the certificate, and Destination answers on it.
        let (second, _second_conn) = h2_connection(&cp, cert.clone()).await;
        let answered = bounded(get(second)).await;
        (refused, closed.map(|joined| joined.map(|ended| ended.map_err(|e| e.to_string()))), answered)
    });
    eprintln!("refused Get: {refused:?}\nfirst connection: {closed:?}\nGet on the next connection: {answered:?}");
    let status = refused.expect_err("Destination on the connection made without a certificate is refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let ended = closed.expect("the control plane closes the connection it refused a call on");
    assert!(ended.is_ok(), "the connection's task ended: {ended:?}");
    answered.expect("Destination answers on the connection that carries the certificate");
}
