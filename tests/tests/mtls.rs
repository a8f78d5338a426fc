//! Identity and automatic mTLS on a real kernel: `cnimesh-control` in a pod of its own issues
//! certificates to two meshed pods' proxies; traffic between them is mTLS on the wire.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, env_refs, identity};
use cnimesh_e2e::mesh::{meshed, meshed_with};
use cnimesh_e2e::sidecar::{Sidecar, http_in};
use cnimesh_e2e::sniff::{self, Sniffer};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

/// An opaque exchange from the client pod: send, half-close, read the answer.
fn opaque(client: &Pod<'_>, to: SocketAddr, payload: &'static [u8]) -> String {
    cnimesh_cni::netns::run_in(&client.netns.path(), move || {
        let mut s = TcpStream::connect(to)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(payload)?;
        s.shutdown(std::net::Shutdown::Write)?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        std::io::Result::Ok(answer)
    })
    .unwrap()
    .unwrap()
}

#[test]
fn traffic_between_meshed_pods_is_mtls_on_the_wire() {
    if !require_root("traffic_between_meshed_pods_is_mtls_on_the_wire") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let m = meshed(&bins!(), &net, &[]);
    let server_http = format!("{}:{}", m.server.ipv4(), apps::HTTP_PORT);
    let sniffer = Sniffer::start(&m.server.netns.path(), m.client.ipv4(), m.server.ipv4()).unwrap();

    let (status, body) =
        http_in(&m.client.netns.path(), &server_http, "POST", "/echo", "plaintext-marker-1234").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("plaintext-marker-1234"), "{body}");
    let answer =
        opaque(&m.client, SocketAddr::new(m.server.ipv4().into(), apps::HALF_CLOSE_PORT), b"opaque-marker-5678");
    assert_eq!(answer, "got 18");
    let wire = sniffer.stop();

    assert!(!wire.is_empty(), "the capture saw the pods' traffic");
    assert!(sniff::contains(&wire, &[0x17, 0x03, 0x03]), "TLS application data records on the wire");
    for plaintext in [&b"POST /echo"[..], b"plaintext-marker-1234", b"opaque-marker-5678", b"got 18"] {
        assert!(
            !sniff::contains(&wire, plaintext),
            "{:?} crossed the network in clear",
            String::from_utf8_lossy(plaintext)
        );
    }

    let client_id = identity("shop", "client");
    let server_metrics = m.server_proxy.metrics();
    for port in [apps::HTTP_PORT, apps::HALF_CLOSE_PORT] {
        let tcp = format!(
            "tcp_open_total{{direction=\"inbound\",target_addr=\"{}:{port}\",tls=\"true\",client_id=\"{client_id}\"}}",
            m.server.ipv4()
        );
        assert!(server_metrics.contains(&tcp), "{tcp} in\n{server_metrics}");
    }
    assert!(
        server_metrics.contains(&format!("tls=\"true\",client_id=\"{client_id}\",status_code=\"200\"")),
        "{server_metrics}"
    );
    let client_metrics = m.client_proxy.metrics();
    let server_id = format!("tls=\"true\",server_id=\"{}\"", identity("shop", "server"));
    assert!(client_metrics.contains(&server_id), "{server_id} in\n{client_metrics}");
    assert!(m.client_proxy.metric("identity_cert_expiration_timestamp_seconds") > 0.0);
    assert!(m.control.metrics().contains("identity"), "the control plane counts issuances");
}

#[test]
fn plaintext_stays_possible_unless_required() {
    if !require_root("plaintext_stays_possible_unless_required") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let m = meshed(&bins!(), &net, &[]);
    // A pod outside the mesh talks to the meshed server in plaintext: accepted (permissive).
    let outsider = Pod::unmeshed(&net, "shop", "outsider").unwrap();
    let server_http = format!("{}:{}", m.server.ipv4(), apps::HTTP_PORT);
    let (status, _) = http_in(&outsider.netns.path(), &server_http, "GET", "/hello", "").unwrap();
    assert_eq!(status, 200);
    assert!(
        m.server_proxy.metrics().contains("direction=\"inbound\"")
            && m.server_proxy.metrics().contains("tls=\"false\"")
    );

    // A server that requires mTLS refuses the outsider and still serves the meshed client.
    let strict = Pod::named(&net, "shop", "strict").unwrap();
    let _apps = Apps::start(&strict.netns.path(), strict.ipv4().into(), "strict").unwrap();
    let mut env = m.control.proxy_env("shop", "strict", &m.control.token("shop", "strict").unwrap());
    env.push(("CNIMESH_PROXY_INBOUND_REQUIRE_TLS".into(), "true".into()));
    let strict_proxy = Sidecar::start(&bins.proxy, &strict.netns, &env_refs(&env)).unwrap();
    let strict_http = format!("{}:{}", strict.ipv4(), apps::HTTP_PORT);
    let refused = http_in(&outsider.netns.path(), &strict_http, "GET", "/hello", "");
    assert!(!matches!(refused, Ok((200, _))), "plaintext must be refused: {refused:?}");
    assert!(strict_proxy.metric("tcp_refused_total") >= 1.0);
    drop(m);
}

#[test]
fn a_forged_token_gets_no_certificate_and_the_proxy_stays_unready() {
    if !require_root("a_forged_token_gets_no_certificate_and_the_proxy_stays_unready") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let control = Control::start(&bins.control, &control_pod, &[]).unwrap();
    // A real token of another workload, and one nobody issued.
    let _victim = control.token("shop", "payments").unwrap();
    let thief = control.token("shop", "thief").unwrap();
    let pod = Pod::named(&net, "shop", "thief").unwrap();
    let env = control.proxy_env("shop", "payments", &thief);
    let proxy = Sidecar::spawn(&bins.proxy, &pod.netns, &env_refs(&env)).unwrap();
    eventually("two refused certificate requests", Duration::from_secs(30), || {
        proxy.metric("identity_cert_refresh_total{result=\"failure\"}") >= 2.0
    });
    assert_eq!(proxy.admin("GET", "/ready", "").unwrap().0, 503, "not ready without a certificate");
    assert_eq!(proxy.metric("identity_cert_refresh_total{result=\"success\"}"), 0.0);

    let pod2 = Pod::named(&net, "shop", "forger").unwrap();
    let forged = control.proxy_token("forger", "not-a-token-anyone-issued").unwrap();
    let env = control.proxy_env("shop", "forger", &forged);
    let proxy2 = Sidecar::spawn(&bins.proxy, &pod2.netns, &env_refs(&env)).unwrap();
    eventually("two refused certificate requests", Duration::from_secs(30), || {
        proxy2.metric("identity_cert_refresh_total{result=\"failure\"}") >= 2.0
    });
    assert_eq!(proxy2.admin("GET", "/ready", "").unwrap().0, 503);
}

#[test]
fn short_lived_certificates_rotate_under_load_without_failures() {
    if !require_root("short_lived_certificates_rotate_under_load_without_failures") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let m = meshed(&bins!(), &net, &["--cert-lifetime", "5s"]);
    let server_http = format!("{}:{}", m.server.ipv4(), apps::HTTP_PORT);
    let half_close = SocketAddr::new(m.server.ipv4().into(), apps::HALF_CLOSE_PORT);
    let refreshed = |p: &Sidecar| p.metric("identity_cert_refresh_total{result=\"success\"}");
    let (mut requests, mut failures) = (0, Vec::new());
    // Until both proxies have rotated twice after their first certificate.
    while refreshed(&m.client_proxy) < 3.0 || refreshed(&m.server_proxy) < 3.0 {
        match http_in(&m.client.netns.path(), &server_http, "POST", "/echo", "rotate") {
            Ok((200, body)) if body.contains("rotate") => {}
            other => failures.push(format!("http: {other:?}")),
        }
        // A new upstream connection (and handshake) every time.
        let answer = opaque(&m.client, half_close, b"ping");
        if answer != "got 4" {
            failures.push(format!("opaque: {answer:?}"));
        }
        requests += 2;
        assert!(requests < 100_000, "certificates never rotated");
    }
    assert!(failures.is_empty(), "{} of {requests} requests failed: {failures:?}", failures.len());
    assert!(m.server_proxy.metrics().contains(&format!("client_id=\"{}\"", identity("shop", "client"))));
}

/// A port on the server pod where only an HTTP/1 app listens.
const HTTP1_ONLY_PORT: u16 = 8095;

/// An app that speaks HTTP/1 only (an HTTP/2 preface is a parse error to it) and answers with
/// what it saw: version, `Host`, target, whether `l5d-orig-proto` reached it, and the body.
async fn serve_http1_only(listener: tokio::net::TcpListener) {
    use http_body_util::BodyExt;
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                let seen = format!(
                    "{:?} host={} target={} orig-proto={:?}",
                    req.version(),
                    req.headers().get(http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("-"),
                    req.uri(),
                    req.headers().get("l5d-orig-proto"),
                );
                if req.uri().path() == "/slow" {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                let body = req.into_body().collect().await?.to_bytes();
                let answer = format!("{seen} body={}", String::from_utf8_lossy(&body));
                Ok::<_, hyper::Error>(http::Response::new(http_body_util::Full::new(bytes::Bytes::from(answer))))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// A client certificate for `name`, signed by the control plane's issuer (as a Linkerd proxy
/// sharing the mesh's trust anchor holds), and a TLS client that presents it.
fn mesh_client_tls(control: &Control, name: &str) -> std::sync::Arc<tokio_rustls::rustls::ClientConfig> {
    use cnimesh_identity::{Name, ca, pem, tls};
    use cnimesh_model::identity::issuer::{ISSUER_CERT_FILE, ISSUER_KEY_FILE};
    let issuer = ca::CaPem {
        cert_pem: std::fs::read_to_string(control.issuer_dir().join(ISSUER_CERT_FILE)).unwrap(),
        key_pem: std::fs::read_to_string(control.issuer_dir().join(ISSUER_KEY_FILE)).unwrap(),
    };
    let signer = ca::Signer::new(&issuer).unwrap();
    let name = Name::parse(name).unwrap();
    let (key, _csr) = ca::new_csr(&name).unwrap();
    let now = std::time::SystemTime::now();
    let leaf = signer.sign(&name, &key, now - Duration::from_secs(60), now + Duration::from_secs(3600)).unwrap();
    let key = tokio_rustls::rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let cert = tls::CurrentCert::default();
    cert.set(tls::certified_key(vec![leaf, signer.issuer_der.clone()], key).unwrap());
    let anchors = pem::certs(&std::fs::read(control.trust_anchors()).unwrap(), "anchors").unwrap();
    // No ALPN: Linkerd's outbound offers none for HTTP; the peer detects HTTP/2 after TLS.
    tls::client_config(tls::roots(&anchors).unwrap(), Some(std::sync::Arc::new(cert)), &[]).unwrap()
}

/// A stock Linkerd proxy talks to a cnimesh proxy: the control plane's H2 hint makes its outbound
/// carry the HTTP/1 requests of an HTTP/1 app over one mTLS HTTP/2 connection, each marked with
/// `l5d-orig-proto`. The inbound hands the app the HTTP/1 request it was and marks the response.
#[test]
fn linkerd_http1_over_http2_reaches_an_http1_only_app() {
    if !require_root("linkerd_http1_over_http2_reaches_an_http1_only_app") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let m = meshed(&bins!(), &net, &[]);
    // Linkerd's proxy stands in a pod of its own: its mTLS is its own, not a cnimesh outbound's.
    let peer = Pod::unmeshed(&net, "shop", "linkerd-peer").unwrap();
    let config = mesh_client_tls(&m.control, &identity("shop", "linkerd-peer"));
    let app = SocketAddr::new(m.server.ipv4().into(), HTTP1_ONLY_PORT);
    let listener =
        cnimesh_cni::netns::run_in(&m.server.netns.path(), || std::net::TcpListener::bind(app)).unwrap().unwrap();
    let socket = cnimesh_cni::netns::run_in(&peer.netns.path(), || std::net::TcpStream::connect(app)).unwrap().unwrap();
    let authority = format!("web.shop.svc.cluster.local:{HTTP1_ONLY_PORT}");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let answers = rt.block_on(async {
        listener.set_nonblocking(true).unwrap();
        tokio::spawn(serve_http1_only(tokio::net::TcpListener::from_std(listener).unwrap()));
        socket.set_nonblocking(true).unwrap();
        let tcp = tokio::net::TcpStream::from_std(socket).unwrap();
        let sni = tokio_rustls::rustls::pki_types::ServerName::try_from(identity("shop", "server")).unwrap();
        let tls = tokio_rustls::TlsConnector::from(config).connect(sni, tcp).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let mut answers = Vec::new();
        for (method, path, orig_proto, body) in [
            ("GET", "/inspect?x=1", Some("HTTP/1.1"), ""),
            ("POST", "/submit", Some("HTTP/1.1"), "form-data"),
            ("GET", "/inspect", Some("HTTP/1.0"), ""),
            ("GET", "/inspect", Some("HTTP/9"), ""),
            // Unmarked HTTP/2 still goes to the app as HTTP/2, which this app refuses.
            ("GET", "/inspect", None, ""),
        ] {
            let mut req = http::Request::builder()
                .method(method)
                .version(http::Version::HTTP_2)
                .uri(format!("http://{authority}{path}"));
            if let Some(v) = orig_proto {
                req = req.header("l5d-orig-proto", v);
            }
            let req = req.body(http_body_util::Full::new(bytes::Bytes::from(body))).unwrap();
            let response = tokio::time::timeout(Duration::from_secs(20), sender.send_request(req))
                .await
                .expect("an answer")
                .unwrap();
            let status = response.status().as_u16();
            let marked = response.headers().get("l5d-orig-proto").map(|v| v.to_str().unwrap().to_string());
            let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
            answers.push((status, marked, String::from_utf8_lossy(&body).into_owned()));
        }
        answers
    });

    let ok = |marked: &str, body: String| (200, Some(marked.to_string()), body);
    assert_eq!(
        answers[0],
        ok("HTTP/1.1", format!("HTTP/1.1 host={authority} target=/inspect?x=1 orig-proto=None body="))
    );
    assert_eq!(
        answers[1],
        ok("HTTP/1.1", format!("HTTP/1.1 host={authority} target=/submit orig-proto=None body=form-data"))
    );
    assert_eq!(answers[2], ok("HTTP/1.0", format!("HTTP/1.0 host={authority} target=/inspect orig-proto=None body=")));
    let (status, marked, body) = &answers[3];
    assert_eq!((*status, marked), (400, &None), "{body}");
    assert!(body.contains("l5d-orig-proto"), "{body}");
    assert_eq!(answers[4].0, 502, "the app refuses HTTP/2: {:?}", answers[4]);
    let metrics = m.server_proxy.metrics();
    let client = format!("client_id=\"{}\",status_code=\"200\"", identity("shop", "linkerd-peer"));
    assert!(metrics.contains(&client), "{client} in\n{metrics}");
}

/// Our outbound's side of Linkerd's transport upgrade: with `CNIMESH_PROXY_OUTBOUND_H2_UPGRADE`,
/// an HTTP/1 app's requests to a meshed endpoint share one mTLS HTTP/2 connection (concurrent
/// requests included), and the app on the other side still sees plain HTTP/1.1.
#[test]
fn our_outbound_carries_http1_over_one_http2_connection_when_upgrading() {
    if !require_root("our_outbound_carries_http1_over_one_http2_connection_when_upgrading") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let m = meshed_with(&bins!(), &net, &[], &[("CNIMESH_PROXY_OUTBOUND_H2_UPGRADE", "true")]);
    let app = SocketAddr::new(m.server.ipv4().into(), HTTP1_ONLY_PORT);
    let listener =
        cnimesh_cni::netns::run_in(&m.server.netns.path(), || std::net::TcpListener::bind(app)).unwrap().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.spawn(async move {
        listener.set_nonblocking(true).unwrap();
        serve_http1_only(tokio::net::TcpListener::from_std(listener).unwrap()).await;
    });
    let client = m.client.netns.path();
    let (status, body) = http_in(&client, &app.to_string(), "POST", "/first", "hello").unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, format!("HTTP/1.1 host={app} target=/first orig-proto=None body=hello"));
    let concurrent: Vec<_> = (0..4)
        .map(|_| {
            let (client, app) = (client.clone(), app.to_string());
            std::thread::spawn(move || http_in(&client, &app, "GET", "/slow", "").unwrap())
        })
        .collect();
    for answer in concurrent {
        let (status, body) = answer.join().unwrap();
        assert_eq!((status, body), (200, format!("HTTP/1.1 host={app} target=/slow orig-proto=None body=")));
    }
    let inbound = format!("tcp_open_total{{direction=\"inbound\",target_addr=\"{app}\",tls=\"true\"");
    assert_eq!(
        m.server_proxy.metric(&inbound),
        1.0,
        "one HTTP/2 connection carried all five:\n{}",
        m.server_proxy.metrics()
    );
    let marked = format!("tls=\"true\",server_id=\"{}\"", identity("shop", "server"));
    assert!(m.client_proxy.metrics().contains(&marked), "{marked}");
}
