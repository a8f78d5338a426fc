//! The gateway path on a real kernel: two control planes on the files backend, `east`
//! (trust domain cluster.local) and `west` (trust domain west.local, its issuer signed by east's
//! anchor: one anchor, two clusters). West runs `web` (a meshed pod with the test apps) and the
//! multicluster gateway (a cnimesh proxy in gateway mode in a pod of its own). The mirror objects
//! are written into east's cluster directory by hand, as the multicluster contract shapes them
//! (the mirror controller is another part's): `web-west` through the gateway, `web-flat` straight
//! to web's pod (remote discovery, flat network).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use cnimesh_common::names::{GATEWAY_NAME, MULTICLUSTER_NAMESPACE};
use cnimesh_e2e::apps;
use cnimesh_e2e::control::Control;
use cnimesh_e2e::multicluster::{FLAT_IP, MIRROR_IP, Meshed, WEB_FQDN, start_gateway, west_policy_yaml};
use cnimesh_e2e::sidecar::{Reply, Sidecar, http_reply_in, metric_with};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use cnimesh_proxy::http::headers::GATEWAY_CLIENT_ID;
use cnimesh_proxy::transport::header::{SessionProtocol, TransportHeader};
use serde_json::json;

const PATIENCE: Duration = Duration::from_secs(30);

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
    tls_to_gateway_for(pod, gateway, config, server, header, "web")
}

/// As [`tls_to_gateway`], with the HTTP request's `Host` naming `host`.
fn tls_to_gateway_for(
    pod: &Pod<'_>,
    gateway: SocketAddr,
    config: Arc<tokio_rustls::rustls::ClientConfig>,
    server: &str,
    header: TransportHeader,
    host: &str,
) -> String {
    let request = format!("GET /replica HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tls_exchange(pod, gateway, config, server, header.encode().to_vec(), request)
}

/// TLS from `pod` to `to` (verifying `server`) with `config`, then `preamble` and `request`:
/// what comes back (nothing when refused).
fn tls_exchange(
    pod: &Pod<'_>,
    to: SocketAddr,
    config: Arc<tokio_rustls::rustls::ClientConfig>,
    server: &str,
    preamble: Vec<u8>,
    request: String,
) -> String {
    let server = server.to_string();
    cnimesh_cni::netns::run_in(&pod.netns.path(), move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let tcp = tokio::net::TcpStream::connect(to).await?;
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(server)?;
            let exchange = async {
                let mut tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
                tls.write_all(&preamble).await?;
                tls.write_all(request.as_bytes()).await?;
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

/// mTLS with a certificate for `identity` from `control`'s issuer, HTTP/1 (no ALPN).
fn mesh_tls(control: &Control, identity: &str) -> Arc<tokio_rustls::rustls::ClientConfig> {
    let mut config = (*cnimesh_e2e::tap_client::client_tls(control, identity).unwrap()).clone();
    config.alpn_protocols.clear();
    Arc::new(config)
}

/// An HTTP/1 GET of `path` with `headers`, closing the connection after the answer.
fn request(path: &str, headers: &[(&str, &str)]) -> String {
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    format!("GET {path} HTTP/1.1\r\nHost: web\r\n{extra}Connection: close\r\n\r\n")
}

/// The status of a raw HTTP/1 answer (0 when there is none).
fn status_of(answer: &str) -> u16 {
    answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// TLS trusting the mesh anchors, without a client certificate.
fn anonymous_tls(control: &Control) -> Arc<tokio_rustls::rustls::ClientConfig> {
    let anchors = std::fs::read(control.trust_anchors()).unwrap();
    let roots =
        cnimesh_identity::tls::roots(&cnimesh_identity::pem::certs(&anchors, "trust anchors").unwrap()).unwrap();
    cnimesh_identity::tls::client_config(roots, None, &[]).unwrap()
}

/// A Service of west with no endpoints, which no gateway client was admitted for.
const SECRET_YAML: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: secret, namespace: shop}\nspec:\n  clusterIP: 10.97.0.11\n  ports: [{name: http, port: 80, targetPort: 80}]\n";

fn refused(gateway: &Sidecar, reason: &str) -> f64 {
    metric_with(&gateway.metrics(), "gateway_refused_total", &[&format!("reason=\"{reason}\"")])
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
    let mut c = Meshed::start(&bins, &net);
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
    // Attack: admitted for web, a request naming another Service of west in its Host (`secret`,
    // which has no endpoints: followed, it would answer 503) still goes to web alone.
    c.west.cluster.apply_yaml("secret.yaml", SECRET_YAML).unwrap();
    eventually("west's Destination knows secret", PATIENCE, || {
        c.west
            .admin("/destination.json?authority=secret.shop:80")
            .is_ok_and(|(_, page)| page.contains("\"exists\": true"))
    });
    let smuggled = tls_to_gateway_for(
        &outsider,
        c.gateway_addr(),
        mesh.clone(),
        &gateway_id,
        header(),
        "secret.shop.svc.cluster.local",
    );
    assert!(smuggled.contains("web-0"), "a request is pinned to the Service its header named: {smuggled}");
    let unknown = TransportHeader { port: 80, name: "nope.shop.svc.cluster.local".into(), protocol: None };
    assert_eq!(tls_to_gateway(&outsider, c.gateway_addr(), mesh, &gateway_id, unknown), "");
    eventually("an unknown Service counted", PATIENCE, || refused(&c.gateway, "unknown_service") >= 1.0);

    // West's policy decides who reaches web through the gateway, by the calling workload's own
    // identity: allowed, then not.
    c.west.cluster.apply_yaml("policy.yaml", &west_policy_yaml(&client_id)).unwrap();
    eventually("the east client is authorized by name", PATIENCE, || get(&c.client, &mirror).status == 200);
    let other = c.east.identity("shop", "other");
    c.west.cluster.apply_yaml("policy.yaml", &west_policy_yaml(&other)).unwrap();
    eventually("the east client is denied by west's policy", PATIENCE, || get(&c.client, &mirror).status == 403);
    c.west.cluster.delete_file("policy.yaml");
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
    let c = Meshed::start(&bins, &net);
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

/// A Service of west named `name` with an endpoint on web's pod (HTTP on 80),
/// labelled `mirror.cnimesh.io/exported=<export>` (no label when `None`).
fn west_service_on_web(name: &str, cluster_ip: &str, web: std::net::Ipv4Addr, export: Option<&str>) -> String {
    let http = apps::HTTP_PORT;
    let labels = export.map(|e| format!(", labels: {{mirror.cnimesh.io/exported: '{e}'}}")).unwrap_or_default();
    [
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop{labels}}}\nspec:\n  clusterIP: {cluster_ip}\n  ports: [{{name: http, port: 80, targetPort: {http}}}]\n"),
        format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: http, port: {http}}}]\nendpoints:\n  - addresses: [\"{web}\"]\n    targetRef: {{kind: Pod, name: web-0, namespace: shop}}\n"),
    ]
    .join("---\n")
}

#[test]
fn the_gateway_forwards_only_to_services_exported_through_it_and_an_unexported_service_is_refused_again() {
    if !require_root(
        "the_gateway_forwards_only_to_services_exported_through_it_and_an_unexported_service_is_refused_again",
    ) {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let c = Meshed::start(&bins, &net);
    let gateway_id = c.west.identity(MULTICLUSTER_NAMESPACE, GATEWAY_NAME);
    // Two Services of west on web's pod: `hidden` not exported at all, `direct` exported for
    // remote discovery only (linked clusters reach its pods directly, never through the gateway).
    c.west.cluster.apply_yaml("hidden.yaml", &west_service_on_web("hidden", "10.97.0.12", c.web.ipv4(), None)).unwrap();
    let direct = west_service_on_web("direct", "10.97.0.13", c.web.ipv4(), Some("remote-discovery"));
    c.west.cluster.apply_yaml("direct.yaml", &direct).unwrap();
    for name in ["hidden", "direct"] {
        eventually(&format!("west's Destination serves {name} with web's pod"), PATIENCE, || {
            c.west
                .admin(&format!("/destination.json?authority={name}.shop:80"))
                .is_ok_and(|(_, page)| page.contains(&c.web.ipv4().to_string()))
        });
    }

    // The attacker: any mesh client of a linked cluster, with a valid header and certificate.
    let outsider = Pod::unmeshed(&net, "shop", "outsider").unwrap();
    let mesh = cnimesh_e2e::tap_client::client_tls(&c.east, &c.east.identity("shop", "client")).unwrap();
    let mesh = {
        let mut config = (*mesh).clone();
        config.alpn_protocols.clear();
        Arc::new(config)
    };
    let to = |name: &str| {
        let fqdn = format!("{name}.shop.svc.cluster.local");
        let header = TransportHeader { port: 80, name: fqdn.clone(), protocol: Some(SessionProtocol::Http1) };
        tls_to_gateway_for(&outsider, c.gateway_addr(), mesh.clone(), &gateway_id, header, &fqdn)
    };
    let unknown = || refused(&c.gateway, "unknown_service");

    // The exported Service is served; the others are refused like unknown names, no app byte.
    let web = to("web");
    assert!(web.contains("web-0"), "the exported web is served: {web}");
    for (n, name) in ["hidden", "direct"].into_iter().enumerate() {
        let answer = to(name);
        assert_eq!(answer, "", "{name} is not exported through the gateway: refused");
        let count = (n + 1) as f64;
        eventually(&format!("{name} counted as unknown_service"), PATIENCE, || unknown() >= count);
    }
    assert!(to("web").contains("web-0"), "refusals leave the exported Service served");
    // The gateway's admin page shows its view, as any proxy's: web with web's pod, hidden unknown.
    let (_, page) = c.gateway.admin("GET", "/endpoints.json", "").unwrap();
    let page: serde_json::Value = serde_json::from_str(&page).unwrap();
    let service = |name: &str| {
        let authority = format!("{name}.shop.svc.cluster.local:80");
        page["services"].as_array().into_iter().flatten().find(|s| s["authority"] == authority.as_str()).cloned()
    };
    let web_pod = format!("{}:{}", c.web.ipv4(), apps::HTTP_PORT);
    let served = service("web").unwrap_or_default();
    assert_eq!(served["endpoints"][0]["addr"], web_pod.as_str(), "{page:#}");
    assert_eq!(service("hidden").unwrap_or_default()["exists"], false, "{page:#}");

    // Exported through the gateway: reachable. Unexported again: refused for new connections.
    let exported = west_service_on_web("hidden", "10.97.0.12", c.web.ipv4(), Some("true"));
    c.west.cluster.apply_yaml("hidden.yaml", &exported).unwrap();
    eventually("hidden, once exported, is served", PATIENCE, || to("hidden").contains("web-0"));
    let before = unknown();
    c.west.cluster.apply_yaml("hidden.yaml", &west_service_on_web("hidden", "10.97.0.12", c.web.ipv4(), None)).unwrap();
    eventually("hidden, unexported, is refused again", PATIENCE, || to("hidden").is_empty());
    assert!(unknown() > before, "counted: {}", c.gateway.metrics());
    assert!(to("web").contains("web-0"), "web stays served");
}

/// The transport header for west's `web` over HTTP/1.
fn web_header() -> TransportHeader {
    TransportHeader { port: 80, name: WEB_FQDN.into(), protocol: Some(SessionProtocol::Http1) }
}

#[test]
fn a_workload_its_own_clusters_policy_denies_is_refused_by_its_own_clusters_gateway() {
    if !require_root("a_workload_its_own_clusters_policy_denies_is_refused_by_its_own_clusters_gateway") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let c = Meshed::start(&bins, &net);
    let gateway_id = c.west.identity(MULTICLUSTER_NAMESPACE, GATEWAY_NAME);
    let web_id = c.west.identity("shop", "web");
    // West's policy on web admits the gateway (for what comes from linked clusters) and none of
    // west's own workloads.
    c.west.cluster.apply_yaml("policy.yaml", &west_policy_yaml(&gateway_id)).unwrap();
    let intruder = Pod::unmeshed(&net, "shop", "intruder").unwrap();
    let tls = mesh_tls(&c.west, &c.west.identity("shop", "intruder"));
    let direct = SocketAddr::new(c.web.ipv4().into(), apps::HTTP_PORT);
    eventually("west's policy denies the intruder when it calls web directly", PATIENCE, || {
        status_of(&tls_exchange(&intruder, direct, tls.clone(), &web_id, Vec::new(), request("/replica", &[]))) == 403
    });
    // Attack: the same workload through its own cluster's gateway, which web sees as the client.
    let through = tls_to_gateway(&intruder, c.gateway_addr(), tls, &gateway_id, web_header());
    eprintln!("west's intruder through west's gateway: {through:?}");
    assert!(!through.contains("web-0"), "the gateway laundered a workload of its own cluster: {through}");
    assert_eq!(through, "", "refused at admission");
    eventually("the refusal is counted", PATIENCE, || refused(&c.gateway, "own_trust_domain") >= 1.0);
}

#[test]
fn through_the_gateway_west_policy_authorizes_the_remote_workload_by_its_own_name() {
    if !require_root("through_the_gateway_west_policy_authorizes_the_remote_workload_by_its_own_name") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let c = Meshed::start(&bins, &net);
    let mirror = format!("{MIRROR_IP}:80");
    let gateway_id = c.west.identity(MULTICLUSTER_NAMESPACE, GATEWAY_NAME);
    let client_id = c.east.identity("shop", "client");
    c.west.cluster.apply_yaml("policy.yaml", &west_policy_yaml(&client_id)).unwrap();
    // East's client, authorized by name, through the gateway.
    eventually("east's client is authorized by its own name through the gateway", PATIENCE, || {
        get(&c.client, &mirror).status == 200
    });
    let reply = get(&c.client, &mirror);
    assert_eq!((reply.status, reply.body.as_str()), (200, "web-0"), "{reply:?}");
    // The app is told who called: the remote workload, not the gateway.
    let outsider = Pod::unmeshed(&net, "shop", "outsider").unwrap();
    let as_client = mesh_tls(&c.east, &client_id);
    let headers = tls_exchange(
        &outsider,
        c.gateway_addr(),
        as_client,
        &gateway_id,
        web_header().encode().to_vec(),
        request("/headers", &[]),
    );
    assert!(headers.contains(&format!("l5d-client-id: {client_id}")), "{headers}");
    assert!(
        !headers.contains(GATEWAY_CLIENT_ID.as_str()),
        "the forwarded identity stays between the proxies: {headers}"
    );
    // Another east workload, not authorized, through the same gateway.
    let other = tls_to_gateway(
        &outsider,
        c.gateway_addr(),
        mesh_tls(&c.east, &c.east.identity("shop", "other")),
        &gateway_id,
        web_header(),
    );
    eprintln!("an unauthorized east workload through the gateway: {other:?}");
    assert_eq!(status_of(&other), 403, "{other}");
    // A remote workload that names an authorized one in the header itself: the gateway replaces it.
    let claimed = tls_exchange(
        &outsider,
        c.gateway_addr(),
        mesh_tls(&c.east, &c.east.identity("shop", "other")),
        &gateway_id,
        web_header().encode().to_vec(),
        request("/replica", &[(GATEWAY_CLIENT_ID.as_str(), &client_id)]),
    );
    assert_eq!(status_of(&claimed), 403, "{claimed}");
}

#[test]
fn a_gateway_client_header_from_a_peer_that_is_not_the_gateway_is_ignored_and_stripped() {
    if !require_root("a_gateway_client_header_from_a_peer_that_is_not_the_gateway_is_ignored_and_stripped") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let c = Meshed::start(&bins, &net);
    let web_id = c.west.identity("shop", "web");
    let client_id = c.east.identity("shop", "client");
    let other_id = c.east.identity("shop", "other");
    let outsider = Pod::unmeshed(&net, "shop", "outsider").unwrap();
    let direct = SocketAddr::new(c.web.ipv4().into(), apps::HTTP_PORT);
    let forging = mesh_tls(&c.east, &client_id);
    let forged = |path: &str| {
        tls_exchange(
            &outsider,
            direct,
            forging.clone(),
            &web_id,
            Vec::new(),
            request(path, &[(GATEWAY_CLIENT_ID.as_str(), &other_id)]),
        )
    };
    // Only `other` is authorized; east's client, straight to web (flat), claims to be it.
    c.west.cluster.apply_yaml("policy.yaml", &west_policy_yaml(&other_id)).unwrap();
    eventually("the policy applies", PATIENCE, || {
        status_of(&tls_exchange(
            &outsider,
            direct,
            mesh_tls(&c.east, &other_id),
            &web_id,
            Vec::new(),
            request("/replica", &[]),
        )) == 200
    });
    let answer = forged("/replica");
    eprintln!("a forged {GATEWAY_CLIENT_ID} from east's client, straight to web: {answer:?}");
    assert_eq!(status_of(&answer), 403, "authorized as itself, not as the header says: {answer}");
    // Authorized as itself, the header never reaches the app.
    c.west.cluster.apply_yaml("policy.yaml", &west_policy_yaml(&client_id)).unwrap();
    eventually("east's client is authorized", PATIENCE, || status_of(&forged("/replica")) == 200);
    let headers = forged("/headers");
    assert!(headers.contains(&format!("l5d-client-id: {client_id}")), "{headers}");
    assert!(!headers.contains(GATEWAY_CLIENT_ID.as_str()), "a forged gateway header reached the app: {headers}");
}

#[test]
fn a_remote_workload_cannot_forge_the_gateway_client_header_through_an_opaque_session() {
    if !require_root("a_remote_workload_cannot_forge_the_gateway_client_header_through_an_opaque_session") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let c = Meshed::start(&bins, &net);
    let gateway_id = c.west.identity(MULTICLUSTER_NAMESPACE, GATEWAY_NAME);
    let client_id = c.east.identity("shop", "client");
    let outsider = Pod::unmeshed(&net, "shop", "outsider").unwrap();
    // Only east's client is authorized; east's `other` claims to be it.
    c.west.cluster.apply_yaml("policy.yaml", &west_policy_yaml(&client_id)).unwrap();
    eventually("east's client is authorized through the gateway", PATIENCE, || {
        get(&c.client, &format!("{MIRROR_IP}:80")).status == 200
    });
    let as_other = mesh_tls(&c.east, &c.east.identity("shop", "other"));
    let opaque_header = TransportHeader { protocol: None, ..web_header() };
    // An opaque session to web's HTTP port: once with a leading empty line (detection once
    // called that opaque while HTTP parsers skip it), once as a plain request.
    for lead in ["\r\n", "\n", ""] {
        let forged = format!("{lead}{}", request("/replica", &[(GATEWAY_CLIENT_ID.as_str(), &client_id)]));
        let answer = tls_exchange(
            &outsider,
            c.gateway_addr(),
            as_other.clone(),
            &gateway_id,
            opaque_header.encode().to_vec(),
            forged,
        );
        eprintln!("a forged {GATEWAY_CLIENT_ID} in an opaque session (lead {lead:?}): {answer:?}");
        assert_ne!(status_of(&answer), 200, "authorized as the forged identity: {answer}");
        assert!(!answer.contains("web-0"), "reached web as the forged identity: {answer}");
    }
    eventually("the refusal is counted", PATIENCE, || refused(&c.gateway, "opaque_to_non_opaque_port") >= 1.0);
}

#[test]
fn a_request_from_the_gateway_identity_without_the_gateway_client_header_is_refused() {
    if !require_root("a_request_from_the_gateway_identity_without_the_gateway_client_header_is_refused") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let c = Meshed::start(&bins, &net);
    let gateway_id = c.west.identity(MULTICLUSTER_NAMESPACE, GATEWAY_NAME);
    let web_id = c.west.identity("shop", "web");
    let client_id = c.east.identity("shop", "client");
    // The gateway's identity is authorized (as operators once were told to, for opaque ports).
    c.west.cluster.apply_yaml("policy.yaml", &west_policy_yaml(&gateway_id)).unwrap();
    let outsider = Pod::unmeshed(&net, "shop", "outsider").unwrap();
    let direct = SocketAddr::new(c.web.ipv4().into(), apps::HTTP_PORT);
    let as_gateway = mesh_tls(&c.west, &gateway_id);
    let from_gateway = |headers: &[(&str, &str)]| {
        tls_exchange(&outsider, direct, as_gateway.clone(), &web_id, Vec::new(), request("/replica", headers))
    };
    // With the header, the request is the remote workload's (not authorized here): the policy applies.
    eventually("the policy applies", PATIENCE, || {
        status_of(&from_gateway(&[(GATEWAY_CLIENT_ID.as_str(), &client_id)])) == 403
    });
    let bare = from_gateway(&[]);
    eprintln!("a request from the gateway's identity without {GATEWAY_CLIENT_ID}: {bare:?}");
    assert_ne!(status_of(&bare), 200, "authorized as the gateway itself: {bare}");
    assert!(matches!(status_of(&bare), 400 | 403), "{bare}");
    let twice = from_gateway(&[(GATEWAY_CLIENT_ID.as_str(), &client_id), (GATEWAY_CLIENT_ID.as_str(), &client_id)]);
    assert_eq!(status_of(&twice), 400, "{twice}");
}
