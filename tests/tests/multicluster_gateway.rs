//! issue 28, the gateway path on a real kernel: two control planes on the files backend, `east`
//! (trust domain cluster.local) and `west` (trust domain west.local, its issuer signed by east's
//! anchor: one anchor, two clusters). West runs `web` (a meshed pod with the test apps) and the
//! multicluster gateway (a cnimesh proxy in gateway mode in a pod of its own). The mirror objects
//! are written into east's cluster directory by hand, as the multicluster contract shapes them
//! (the mirror controller is another part's): `web-west` through the gateway, `web-flat` straight
//! to web's pod (remote discovery, flat network).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use cnimesh_common::names::{GATEWAY_NAME, MULTICLUSTER_NAMESPACE};
use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, env_refs, write_atomically};
use cnimesh_e2e::sidecar::{Reply, Sidecar, http_reply_in, metric_with};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use cnimesh_proxy::transport::header::{SessionProtocol, TransportHeader};
use serde_json::json;

const MIRROR_IP: &str = "10.96.0.50";
const FLAT_IP: &str = "10.96.0.51";
const WEB_FQDN: &str = "web.shop.svc.cluster.local";
const PATIENCE: Duration = Duration::from_secs(30);

/// West's `web` Service (HTTP on 80, the half-close app on its port, opaque) and its pod.
fn west_web_yaml(ip: Ipv4Addr) -> String {
    let (http, tcp) = (apps::HTTP_PORT, apps::HALF_CLOSE_PORT);
    [
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop}}\nspec:\n  clusterIP: 10.97.0.10\n  selector: {{app: web}}\n  ports: [{{name: http, port: 80, targetPort: {http}}}, {{name: tcp, port: {tcp}, targetPort: {tcp}, appProtocol: cnimesh.io/opaque}}]\n"),
        format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{{name: http, port: {http}}}, {{name: tcp, port: {tcp}}}]\nendpoints:\n  - addresses: [\"{ip}\"]\n    targetRef: {{kind: Pod, name: web-0, namespace: shop}}\n"),
        format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-0\n  namespace: shop\n  labels: {{app: web}}\nspec:\n  serviceAccountName: web\n  containers:\n    - name: app\n      ports: [{{name: http, containerPort: {http}}}, {{name: tcp, containerPort: {tcp}}}]\n    - name: cnimesh-proxy\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"),
    ]
    .join("---\n")
}

/// West's policy on web's HTTP port: only `allowed` (a full identity) may call it.
fn west_policy_yaml(allowed: &str) -> String {
    [
        "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {name: web-http, namespace: shop}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  port: http\n  proxyProtocol: HTTP/1\n".to_string(),
        format!("apiVersion: policy.cnimesh.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {{name: callers, namespace: shop}}\nspec:\n  identities: [\"{allowed}\"]\n"),
        "apiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {name: callers-to-web, namespace: shop}\nspec:\n  targetRef: {group: policy.cnimesh.io, kind: Server, name: web-http}\n  requiredAuthenticationRefs: [{group: policy.cnimesh.io, kind: MeshTLSAuthentication, name: callers}]\n".to_string(),
    ]
    .join("---\n")
}

/// East's mirror of west's `web` through the gateway, by hand as the contract shapes it.
fn mirror_yaml(gateway: Ipv4Addr, gateway_identity: &str) -> String {
    let tcp = apps::HALF_CLOSE_PORT;
    let port = cnimesh_common::names::PROXY_INBOUND_PORT;
    [
        format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: web-west\n  namespace: shop\n  labels: {{mirror.cnimesh.io/mirrored-service: 'true', mirror.cnimesh.io/cluster-name: west}}\n  annotations: {{mirror.cnimesh.io/remote-svc-fq-name: {WEB_FQDN}}}\nspec:\n  clusterIP: {MIRROR_IP}\n  ports: [{{name: http, port: 80, targetPort: 80}}, {{name: tcp, port: {tcp}, targetPort: {tcp}, appProtocol: cnimesh.io/opaque}}]\n"),
        format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-west-gateway\n  namespace: shop\n  labels: {{kubernetes.io/service-name: web-west, mirror.cnimesh.io/mirrored-service: 'true', mirror.cnimesh.io/cluster-name: west}}\n  annotations: {{mirror.cnimesh.io/remote-gateway-identity: {gateway_identity}}}\naddressType: IPv4\nports: [{{name: http, port: {port}}}, {{name: tcp, port: {port}}}]\nendpoints:\n  - addresses: [\"{gateway}\"]\n"),
    ]
    .join("---\n")
}

/// East's remote-discovery mirror of west's `web`: web's pod itself, with its west identity.
fn flat_yaml(web: Ipv4Addr, web_identity: &str) -> String {
    let http = apps::HTTP_PORT;
    [
        format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: web-flat\n  namespace: shop\n  labels: {{mirror.cnimesh.io/mirrored-service: 'true', mirror.cnimesh.io/cluster-name: west}}\n  annotations: {{mirror.cnimesh.io/remote-svc-fq-name: {WEB_FQDN}}}\nspec:\n  clusterIP: {FLAT_IP}\n  ports: [{{name: http, port: 80, targetPort: 80}}]\n"),
        format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-flat-web\n  namespace: shop\n  labels: {{kubernetes.io/service-name: web-flat, mirror.cnimesh.io/mirrored-service: 'true', mirror.cnimesh.io/cluster-name: west}}\n  annotations: {{mirror.cnimesh.io/remote-identity: {web_identity}}}\naddressType: IPv4\nports: [{{name: http, port: {http}}}]\nendpoints:\n  - addresses: [\"{web}\"]\n"),
    ]
    .join("---\n")
}

fn get(pod: &Pod<'_>, to: &str) -> Reply {
    http_reply_in(&pod.netns.path(), to, "GET", "/replica", "").unwrap_or_default()
}

/// An opaque exchange from `pod`: send, half-close, read the answer (empty when closed on us).
fn opaque(pod: &Pod<'_>, to: SocketAddr) -> String {
    cnimesh_cni::netns::run_in(&pod.netns.path(), move || {
        let mut s = TcpStream::connect(to)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"hello")?;
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        std::io::Result::Ok(answer)
    })
    .unwrap()
    .unwrap_or_default()
}

/// What a client that is not the mesh gets from the gateway: the bytes it answers (none: closed).
fn plaintext_to_gateway(pod: &Pod<'_>, gateway: SocketAddr) -> String {
    cnimesh_cni::netns::run_in(&pod.netns.path(), move || {
        let mut s = TcpStream::connect(gateway)?;
        s.set_read_timeout(Some(Duration::from_secs(15)))?;
        let mut bytes = TransportHeader { port: 80, name: WEB_FQDN.into(), protocol: Some(SessionProtocol::Http1) }
            .encode()
            .to_vec();
        bytes.extend_from_slice(b"GET /replica HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n");
        s.write_all(&bytes)?;
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        std::io::Result::Ok(answer)
    })
    .unwrap()
    .unwrap_or_default()
}

/// TLS to the gateway from `pod` with `config` (with or without a client certificate), then
/// `header` and an HTTP/1 request: what comes back (nothing when refused).
fn tls_to_gateway(
    pod: &Pod<'_>,
    gateway: SocketAddr,
    config: Arc<tokio_rustls::rustls::ClientConfig>,
    server: &str,
    header: TransportHeader,
) -> String {
    let server = server.to_string();
    cnimesh_cni::netns::run_in(&pod.netns.path(), move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let tcp = tokio::net::TcpStream::connect(gateway).await?;
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(server)?;
            let exchange = async {
                let mut tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
                tls.write_all(&header.encode()).await?;
                tls.write_all(b"GET /replica HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n").await?;
                let mut answer = Vec::new();
                let _ = tls.read_to_end(&mut answer).await;
                anyhow::Ok(String::from_utf8_lossy(&answer).into_owned())
            };
            Ok::<_, anyhow::Error>(
                tokio::time::timeout(Duration::from_secs(15), exchange)
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_default(),
            )
        })
    })
    .unwrap()
    .unwrap_or_default()
}

/// TLS trusting the mesh anchors, without a client certificate.
fn anonymous_tls(control: &Control) -> Arc<tokio_rustls::rustls::ClientConfig> {
    let anchors = std::fs::read(control.trust_anchors()).unwrap();
    let roots =
        cnimesh_identity::tls::roots(&cnimesh_identity::pem::certs(&anchors, "trust anchors").unwrap()).unwrap();
    cnimesh_identity::tls::client_config(roots, None, &[]).unwrap()
}

fn refused(gateway: &Sidecar, reason: &str) -> f64 {
    metric_with(&gateway.metrics(), "gateway_refused_total", &[&format!("reason=\"{reason}\"")])
}

struct Clusters<'n> {
    east: Control,
    west: Control,
    client: Pod<'n>,
    web: Pod<'n>,
    gateway_pod: Pod<'n>,
    client_proxy: Sidecar,
    web_proxy: Sidecar,
    gateway: Sidecar,
    west_dir: tempfile::TempDir,
    _east_dir: tempfile::TempDir,
    _apps: Apps,
    _control_pods: (Pod<'n>, Pod<'n>),
}

impl<'n> Clusters<'n> {
    fn start(bins: &cnimesh_e2e::Bins, net: &'n Network) -> Self {
        let (east_dir, west_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let east_pod = Pod::unmeshed(net, "cnimesh", "control-east").unwrap();
        let west_pod = Pod::unmeshed(net, "cnimesh", "control-west").unwrap();
        let client = Pod::named(net, "shop", "client").unwrap();
        // ClusterIPs are routed out of the pod, where capture takes them (as kube-proxy's range).
        client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
        let web = Pod::named(net, "shop", "web-0").unwrap();
        // Not captured: the gateway is reached at its own address, and dials B's pods itself.
        let gateway_pod = Pod::unmeshed(net, MULTICLUSTER_NAMESPACE, GATEWAY_NAME).unwrap();
        write_atomically(&west_dir.path().join("web.yaml"), &west_web_yaml(web.ipv4()));
        let west_cluster = west_dir.path().display().to_string();
        let east_cluster = east_dir.path().display().to_string();
        let east = Control::start(&bins.control, &east_pod, &["--cluster-dir", &east_cluster]).unwrap();
        let west = Control::start_sharing_anchor(
            &bins.control,
            &west_pod,
            &["--cluster-dir", &west_cluster],
            &east,
            "west.local",
        )
        .unwrap();
        let gateway_identity = west.identity(MULTICLUSTER_NAMESPACE, GATEWAY_NAME);
        write_atomically(&east_dir.path().join("mirror.yaml"), &mirror_yaml(gateway_pod.ipv4(), &gateway_identity));
        write_atomically(&east_dir.path().join("flat.yaml"), &flat_yaml(web.ipv4(), &west.identity("shop", "web")));

        let apps = Apps::start(&web.netns.path(), web.ipv4().into(), "web-0").unwrap();
        let mut web_env = west.proxy_env("shop", "web", &west.token("shop", "web").unwrap());
        web_env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), west.addr.to_string()));
        web_env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), "shop:web-0".into()));
        let web_proxy = Sidecar::start(&bins.proxy, &web.netns, &env_refs(&web_env)).unwrap();
        let gateway = start_gateway(bins, &west, &gateway_pod);
        let mut client_env = east.proxy_env("shop", "client", &east.token("shop", "client").unwrap());
        client_env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), east.addr.to_string()));
        let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&client_env)).unwrap();
        Self {
            east,
            west,
            client,
            web,
            gateway_pod,
            client_proxy,
            web_proxy,
            gateway,
            west_dir,
            _east_dir: east_dir,
            _apps: apps,
            _control_pods: (east_pod, west_pod),
        }
    }

    fn gateway_addr(&self) -> SocketAddr {
        SocketAddr::new(self.gateway_pod.ipv4().into(), cnimesh_common::names::PROXY_INBOUND_PORT)
    }
}

fn start_gateway(bins: &cnimesh_e2e::Bins, west: &Control, pod: &Pod<'_>) -> Sidecar {
    let mut env = west.proxy_env(
        MULTICLUSTER_NAMESPACE,
        GATEWAY_NAME,
        &west.token(MULTICLUSTER_NAMESPACE, GATEWAY_NAME).unwrap(),
    );
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), west.addr.to_string()));
    env.push(("CNIMESH_PROXY_MODE".into(), "gateway".into()));
    // Refusals of silent clients come sooner (the default wait is the detection timeout).
    env.push(("CNIMESH_PROXY_DETECT_TIMEOUT_MS".into(), "2000".into()));
    Sidecar::start(&bins.proxy, &pod.netns, &env_refs(&env)).unwrap()
}

#[test]
fn an_east_client_reaches_west_through_the_gateway_with_mtls_on_both_hops_and_non_mesh_clients_are_refused() {
    if !require_root(
        "an_east_client_reaches_west_through_the_gateway_with_mtls_on_both_hops_and_non_mesh_clients_are_refused",
    ) {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let mut c = Clusters::start(&bins, &net);
    let mirror = format!("{MIRROR_IP}:80");
    let client_id = c.east.identity("shop", "client");
    let gateway_id = c.west.identity(MULTICLUSTER_NAMESPACE, GATEWAY_NAME);

    // HTTP through the gateway: web answers, and each hop saw mTLS with the documented identities.
    let reply = get(&c.client, &mirror);
    assert_eq!((reply.status, reply.body.as_str()), (200, "web-0"), "{reply:?}");
    let gateway_metrics = c.gateway.metrics();
    let admitted = metric_with(
        &gateway_metrics,
        "gateway_connections_total",
        &[&format!("client_id=\"{client_id}\""), &format!("target=\"{WEB_FQDN}:80\"")],
    );
    assert!(admitted >= 1.0, "the gateway saw the east client's identity:\n{gateway_metrics}");
    let web_metrics = c.web_proxy.metrics();
    let seen =
        metric_with(&web_metrics, "request_total", &["direction=\"inbound\"", &format!("client_id=\"{gateway_id}\"")]);
    assert!(seen >= 1.0, "web saw the gateway's identity:\n{web_metrics}");
    let client_metrics = c.client_proxy.metrics();
    let labelled = metric_with(
        &client_metrics,
        "request_total",
        &["direction=\"outbound\"", "target_cluster_name=\"west\"", &format!("server_id=\"{gateway_id}\"")],
    );
    assert!(labelled >= 1.0, "the client's series name the target cluster:\n{client_metrics}");

    // Opaque bytes through the gateway.
    let tcp = SocketAddr::new(MIRROR_IP.parse().unwrap(), apps::HALF_CLOSE_PORT);
    assert_eq!(opaque(&c.client, tcp), "got 5");
    let opaque_admitted = metric_with(&c.gateway.metrics(), "gateway_connections_total", &["session=\"opaque\""]);
    assert!(opaque_admitted >= 1.0, "{}", c.gateway.metrics());

    // Not the mesh: plaintext (even with a valid header), TLS without a client certificate.
    let outsider = Pod::unmeshed(&net, "shop", "outsider").unwrap();
    assert_eq!(plaintext_to_gateway(&outsider, c.gateway_addr()), "", "plaintext is refused");
    assert!(refused(&c.gateway, "not_mtls") >= 1.0, "{}", c.gateway.metrics());
    let header = || TransportHeader { port: 80, name: WEB_FQDN.into(), protocol: Some(SessionProtocol::Http1) };
    let anonymous = tls_to_gateway(&outsider, c.gateway_addr(), anonymous_tls(&c.east), &gateway_id, header());
    assert!(!anonymous.contains("web-0"), "TLS without a client certificate is refused: {anonymous}");
    eventually("the handshake refusal is counted", PATIENCE, || refused(&c.gateway, "tls_handshake") >= 1.0);

    // A mesh client whose header names an address or another cluster's domain: not an open proxy.
    let mesh = cnimesh_e2e::tap_client::client_tls(&c.east, &c.east.identity("shop", "client")).unwrap();
    let mesh = {
        let mut config = (*mesh).clone();
        config.alpn_protocols.clear();
        Arc::new(config)
    };
    let ok = tls_to_gateway(&outsider, c.gateway_addr(), mesh.clone(), &gateway_id, header());
    assert!(ok.contains("web-0"), "a mesh client with a good header is served: {ok}");
    for (name, reason) in
        [(c.web.ipv4().to_string(), "address_target"), ("web.shop.svc.east.local".to_string(), "foreign_name")]
    {
        let bad = TransportHeader { port: apps::HTTP_PORT, name: name.clone(), protocol: Some(SessionProtocol::Http1) };
        let answer = tls_to_gateway(&outsider, c.gateway_addr(), mesh.clone(), &gateway_id, bad);
        assert!(!answer.contains("web-0"), "{name} is refused: {answer}");
        eventually(&format!("{name} counted as {reason}"), PATIENCE, || refused(&c.gateway, reason) >= 1.0);
    }
    let unknown = TransportHeader { port: 80, name: "nope.shop.svc.cluster.local".into(), protocol: None };
    assert_eq!(tls_to_gateway(&outsider, c.gateway_addr(), mesh, &gateway_id, unknown), "");
    eventually("an unknown Service counted", PATIENCE, || refused(&c.gateway, "unknown_service") >= 1.0);

    // West's policy decides what the gateway may reach: allowed by its identity, then not.
    write_atomically(&c.west_dir.path().join("policy.yaml"), &west_policy_yaml(&gateway_id));
    eventually("the gateway's identity is authorized", PATIENCE, || get(&c.client, &mirror).status == 200);
    let other = c.west.identity("shop", "other");
    write_atomically(&c.west_dir.path().join("policy.yaml"), &west_policy_yaml(&other));
    eventually("the gateway is denied by west's policy", PATIENCE, || get(&c.client, &mirror).status == 403);
    std::fs::remove_file(c.west_dir.path().join("policy.yaml")).unwrap();
    eventually("allowed again without the policy", PATIENCE, || get(&c.client, &mirror).status == 200);

    // The gateway killed: a clear error naming the gateway; back, the requests recover.
    c.gateway.kill();
    let down = get(&c.client, &mirror);
    assert!(matches!(down.status, 502 | 503), "{down:?}");
    let error = down.header("cnimesh-proxy-error").unwrap_or_default().to_string();
    assert!(error.contains(&c.gateway_addr().to_string()) && error.contains("gateway"), "{error}");
    c.gateway = start_gateway(&bins, &c.west, &c.gateway_pod);
    eventually("requests recover once the gateway is back", PATIENCE, || get(&c.client, &mirror).status == 200);
}

#[test]
fn in_flat_mode_the_west_server_sees_the_east_clients_own_identity() {
    if !require_root("in_flat_mode_the_west_server_sees_the_east_clients_own_identity") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let c = Clusters::start(&bins, &net);
    let reply = get(&c.client, &format!("{FLAT_IP}:80"));
    assert_eq!((reply.status, reply.body.as_str()), (200, "web-0"), "{reply:?}");
    let client_id = c.east.identity("shop", "client");
    let web_metrics = c.web_proxy.metrics();
    let seen =
        metric_with(&web_metrics, "request_total", &["direction=\"inbound\"", &format!("client_id=\"{client_id}\"")]);
    assert!(seen >= 1.0, "web saw the east client's own identity:\n{web_metrics}");
    let client_metrics = c.client_proxy.metrics();
    let web_id = c.west.identity("shop", "web");
    let labelled = metric_with(
        &client_metrics,
        "request_total",
        &["target_cluster_name=\"west\"", &format!("server_id=\"{web_id}\"")],
    );
    assert!(labelled >= 1.0, "{client_metrics}");
}
