//! The sidecar proxy on a real kernel: a client pod and a server pod, both captured by
//! cnimesh-cni, each with a `cnimesh-proxy` running as UID 2102. Every request goes app → client's
//! outbound proxy → server's inbound proxy → app.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::netns::block_on_in;
use cnimesh_e2e::sidecar::{Sidecar, http_in, metric_with};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use http::Request;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

struct Mesh<'a> {
    client: &'a Pod<'a>,
    server: &'a Pod<'a>,
    client_proxy: &'a mut Sidecar,
    server_proxy: &'a mut Sidecar,
    apps: &'a Apps,
}

impl Mesh<'_> {
    fn server_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.server.ipv4().into(), port)
    }
}

/// Two captured pods with proxies and the test apps in the server pod.
fn with_mesh(test: &str, env: &[(&str, &str)], f: impl FnOnce(&mut Mesh<'_>)) {
    if !require_root(test) {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let client = Pod::named(&net, "shop", "client").unwrap();
    let server = Pod::named(&net, "shop", "server").unwrap();
    let apps = Apps::start(&server.netns.path(), server.ipv4().into(), "server").unwrap();
    let mut client_proxy = Sidecar::start(&bins.proxy, &client.netns, env).unwrap();
    let mut server_proxy = Sidecar::start(&bins.proxy, &server.netns, env).unwrap();
    f(&mut Mesh {
        client: &client,
        server: &server,
        client_proxy: &mut client_proxy,
        server_proxy: &mut server_proxy,
        apps: &apps,
    });
}

/// Raw TCP from the client pod (as the app, so captured).
fn raw(m: &Mesh<'_>, port: u16, f: impl FnOnce(&mut TcpStream) -> std::io::Result<String> + Send) -> String {
    let addr = m.server_addr(port);
    cnimesh_cni::netns::run_in(&m.client.netns.path(), move || {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        f(&mut s)
    })
    .unwrap()
    .unwrap_or_else(|e| panic!("raw connection to port {port}: {e}"))
}

fn read_until(s: &mut TcpStream, end: &str) -> std::io::Result<String> {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&got).contains(end) {
        if s.read(&mut byte)? == 0 {
            break;
        }
        got.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

fn metric_line<'a>(metrics: &'a str, name: &str, labels: &str) -> Option<&'a str> {
    metrics.lines().find(|l| l.starts_with(&format!("{name}{{")) && l.contains(labels))
}

fn metric_value(metrics: &str, name: &str, labels: &str) -> f64 {
    metric_line(metrics, name, labels)
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} with {labels} in\n{metrics}"))
}

#[test]
fn proxies_carry_http_grpc_upgrades_and_opaque_tcp() {
    with_mesh("proxies_carry_http_grpc_upgrades_and_opaque_tcp", &[], |m| {
        let base = format!("http://{}", m.server_addr(apps::HTTP_PORT));
        let accepted_before = m.apps.accepted.load(std::sync::atomic::Ordering::SeqCst);
        let (hello, echoed, big, keepalive) = block_on_in(&m.client.netns.path(), {
            let base = base.clone();
            async move {
                let client = Client::builder(TokioExecutor::new())
                    .build_http::<http_body_util::combinators::UnsyncBoxBody<Bytes, std::convert::Infallible>>();
                let get = |path: &str| {
                    Request::get(format!("{base}{path}")).body(Full::new(Bytes::new()).boxed_unsync()).unwrap()
                };
                let hello = client.request(get("/hello")).await.unwrap();
                assert_eq!(hello.status(), 200);
                assert_eq!(hello.headers()["x-app"], "yes");
                let hello = hello.into_body().collect().await.unwrap().to_bytes();
                // Chunked, streamed request body.
                let chunks = futures::stream::iter(["one ", "two ", "three"].map(|c| Ok(Frame::data(Bytes::from(c)))));
                let echo = Request::post(format!("{base}/echo")).body(StreamBody::new(chunks).boxed_unsync()).unwrap();
                let echoed = client.request(echo).await.unwrap().into_body().collect().await.unwrap().to_bytes();
                let big =
                    client.request(get("/big")).await.unwrap().into_body().collect().await.unwrap().to_bytes().len();
                let mut statuses = Vec::new();
                for _ in 0..5 {
                    let r = client.request(get("/hello")).await.unwrap();
                    statuses.push(r.status().as_u16());
                    r.into_body().collect().await.unwrap();
                }
                (hello, echoed, big, statuses)
            }
        });
        assert_eq!(String::from_utf8_lossy(&hello), "hello from server over HTTP/1.1");
        assert_eq!(&echoed[..], b"one two three");
        assert_eq!(big, apps::BIG, "large streamed body arrives whole");
        assert_eq!(keepalive, [200; 5]);
        let accepted = m.apps.accepted.load(std::sync::atomic::Ordering::SeqCst) - accepted_before;
        assert_eq!(accepted, 1, "keep-alive: the inbound proxy reused one connection to the app");

        // HTTP/2 and gRPC (unary and bidirectional streaming, trailers).
        let (h2_hello, unary, stream_replies, trailers) = block_on_in(&m.client.netns.path(), {
            let base = base.clone();
            async move {
                let client = Client::builder(TokioExecutor::new())
                    .http2_only(true)
                    .build_http::<http_body_util::combinators::UnsyncBoxBody<Bytes, std::convert::Infallible>>(
                );
                let r = client
                    .request(
                        Request::get(format!("{base}/hello")).body(Full::new(Bytes::new()).boxed_unsync()).unwrap(),
                    )
                    .await
                    .unwrap();
                assert_eq!(r.version(), http::Version::HTTP_2);
                let h2_hello = r.into_body().collect().await.unwrap().to_bytes();
                let grpc = |body| {
                    Request::post(format!("{base}/grpc"))
                        .header("content-type", "application/grpc")
                        .header("te", "trailers")
                        .body(body)
                        .unwrap()
                };
                let unary = client.request(grpc(Full::new(Bytes::from_static(b"ping")).boxed_unsync())).await.unwrap();
                let collected = unary.into_body().collect().await.unwrap();
                let unary_trailers = collected.trailers().cloned().unwrap();
                let unary_body = collected.to_bytes();
                assert_eq!(unary_trailers["grpc-status"], "0");
                // A gRPC error: HTTP 200, grpc-status 13 in the trailers.
                let failing = Request::post(format!("{base}/grpc-fail"))
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(Full::new(Bytes::from_static(b"x")).boxed_unsync())
                    .unwrap();
                let failed = client.request(failing).await.unwrap().into_body().collect().await.unwrap();
                assert_eq!(failed.trailers().unwrap()["grpc-status"], "13");
                // Streaming: each message is answered before the next is sent.
                let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(1);
                let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
                let mut response =
                    client.request(grpc(StreamBody::new(stream).boxed_unsync())).await.unwrap().into_body();
                let mut replies = Vec::new();
                for msg in ["a", "b", "c"] {
                    tx.send(Ok(Frame::data(Bytes::from(msg)))).await.unwrap();
                    loop {
                        let frame = response.frame().await.unwrap().unwrap();
                        if let Ok(data) = frame.into_data()
                            && !data.is_empty()
                        {
                            replies.push(String::from_utf8_lossy(&data).into_owned());
                            break;
                        }
                    }
                }
                drop(tx);
                let mut trailers = None;
                while let Some(frame) = response.frame().await {
                    if let Ok(t) = frame.unwrap().into_trailers() {
                        trailers = Some(t);
                    }
                }
                (h2_hello, unary_body, replies, trailers.unwrap())
            }
        });
        assert_eq!(String::from_utf8_lossy(&h2_hello), "hello from server over HTTP/2.0", "HTTP/2 end to end");
        assert_eq!(&unary[..], b"ping");
        assert_eq!(stream_replies, ["a", "b", "c"]);
        assert_eq!((trailers["grpc-status"].to_str().unwrap(), trailers["x-trailer"].to_str().unwrap()), ("0", "kept"));

        // HTTP/1 upgrade (WebSocket-style): bytes flow both ways after 101.
        let client_ns = m.client.netns.path();
        let tunnel_target = format!("direction=\"outbound\",target_addr=\"{}\"", m.server_addr(apps::HTTP_PORT));
        let ws = raw(m, apps::HTTP_PORT, |s| {
            s.write_all(b"GET /ws HTTP/1.1\r\nHost: server\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")?;
            let head = read_until(s, "\r\n\r\n")?;
            s.write_all(b"ping-over-upgrade")?;
            let echoed = read_until(s, "upgrade")?;
            // The tunnel is still open: it counts as an open connection.
            let (_, metrics) =
                http_in(&client_ns, "127.0.0.1:4191", "GET", "/metrics", "").map_err(std::io::Error::other)?;
            let open = metrics
                .lines()
                .find(|l| l.starts_with("tcp_open_connections{") && l.contains(&tunnel_target))
                .map(str::to_string);
            assert_eq!(open.as_deref().and_then(|l| l.rsplit(' ').next()), Some("1"), "{metrics}");
            Ok(format!("{}|{echoed}", head.lines().next().unwrap_or_default()))
        });
        assert_eq!(ws, "HTTP/1.1 101 Switching Protocols|ping-over-upgrade");

        // Opaque, server-speaks-first (an opaque port: no detection stall).
        let banner = raw(m, apps::BANNER_PORT, |s| read_until(s, "\r\n"));
        assert_eq!(banner, apps::BANNER);
        // Opaque half-close: our FIN reaches the server, its answer still reaches us.
        let answer = raw(m, apps::HALF_CLOSE_PORT, |s| {
            s.write_all(b"12345")?;
            s.shutdown(std::net::Shutdown::Write)?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        });
        assert_eq!(answer, "got 5");

        // Metrics, labelled per direction and target.
        let server_ip = m.server.ipv4();
        let out = m.client_proxy.metrics();
        let target = format!("target_addr=\"{server_ip}:8080\"");
        let http_labels = format!("direction=\"outbound\",{target},authority=\"{server_ip}:8080\",tls=\"false\"");
        assert!(metric_value(&out, "request_total", &http_labels) >= 11.0, "{out}");
        assert!(
            metric_value(
                &out,
                "response_total",
                &format!("{http_labels},status_code=\"200\",classification=\"success\"")
            ) >= 11.0,
            "{out}"
        );
        assert!(metric_line(&out, "response_latency_ms_bucket", &http_labels).is_some());
        // gRPC status from the trailers decides the classification.
        assert_eq!(
            metric_value(
                &out,
                "response_total",
                &format!("{http_labels},status_code=\"200\",classification=\"failure\"")
            ),
            1.0,
            "{out}"
        );
        assert_eq!(
            metric_value(
                &out,
                "tcp_open_total",
                &format!("direction=\"outbound\",target_addr=\"{server_ip}:5432\",tls=\"false\"")
            ),
            1.0
        );
        assert!(
            metric_value(&out, "tcp_write_bytes_total", &format!("direction=\"outbound\",{target}"))
                >= apps::BIG as f64
        );
        let inbound = m.server_proxy.metrics();
        assert!(
            metric_value(
                &inbound,
                "request_total",
                &format!("direction=\"inbound\",{target},authority=\"{server_ip}:8080\"")
            ) >= 11.0,
            "{inbound}"
        );
        assert_eq!(
            metric_value(
                &inbound,
                "tcp_read_bytes_total",
                &format!("direction=\"inbound\",target_addr=\"{server_ip}:9000\"")
            ),
            5.0
        );
        assert_eq!(
            metric_value(
                &inbound,
                "tcp_close_total",
                &format!("direction=\"inbound\",target_addr=\"{server_ip}:9000\"")
            ),
            1.0
        );
    });
}

#[test]
fn failures_get_clear_answers_and_the_proxy_stays_up() {
    with_mesh(
        "failures_get_clear_answers_and_the_proxy_stays_up",
        &[("CNIMESH_PROXY_DETECT_TIMEOUT_MS", "300"), ("CNIMESH_PROXY_HEADER_TIMEOUT_MS", "2000")],
        |m| {
            let client_ns = m.client.netns.path();
            let get =
                |port: u16, path: &str| http_in(&client_ns, &m.server_addr(port).to_string(), "GET", path, "").unwrap();

            let (status, body) = get(9999, "/");
            assert_eq!(status, 502, "{body}");
            assert!(body.contains("refused"), "{body}");
            let (status, body) = get(apps::RESET_PORT, "/");
            assert_eq!(status, 502, "an upstream reset is a 502: {body}");
            // The app bound to 127.0.0.1 is not reachable through the inbound proxy.
            let (status, body) = get(apps::LOCAL_ONLY_PORT, "/hello");
            assert_eq!(status, 502, "loopback-only app must stay private: {body}");
            let (status, _) = get(apps::HTTP_PORT, "/status/503");
            assert_eq!(status, 503);

            // Garbage bytes: forwarded as opaque; nobody crashes.
            let garbage = raw(m, apps::HTTP_PORT, |s| {
                s.write_all(b"\x00\x01\x02\xffnot http at all\r\n\r\n")?;
                let mut out = Vec::new();
                s.read_to_end(&mut out)?;
                Ok(String::from_utf8_lossy(&out).into_owned())
            });
            // Forwarded as opaque bytes through both proxies: the app itself rejects them.
            assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage:?}");
            // Slowloris: a request whose headers never finish is cut off.
            let slow = raw(m, apps::HTTP_PORT, |s| {
                s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n")?;
                let mut out = Vec::new();
                s.read_to_end(&mut out)?;
                Ok(String::from_utf8_lossy(&out).into_owned())
            });
            assert!(!slow.contains("hello from"), "{slow}");
            // An idle keep-alive connection outlives the detect timeout (only the header timeout,
            // which covers the wait for the next request, ends it).
            let kept = raw(m, apps::HTTP_PORT, |s| {
                let request = b"GET /hello HTTP/1.1\r\nHost: server\r\n\r\n";
                s.write_all(request)?;
                let first = read_until(s, "over HTTP/1.1")?;
                std::thread::sleep(Duration::from_millis(800));
                s.write_all(request)?;
                let second = read_until(s, "over HTTP/1.1")?;
                Ok(format!("{}|{}", first.contains("hello from server"), second.contains("hello from server")))
            });
            assert_eq!(kept, "true|true");

            assert_eq!(get(apps::HTTP_PORT, "/hello").0, 200, "still serving after all that");
            assert_eq!(m.client_proxy.admin("GET", "/ready", "").unwrap().0, 200);
            assert_eq!(m.server_proxy.admin("GET", "/ready", "").unwrap().0, 200);
            let out = m.client_proxy.metrics();
            let server_ip = m.server.ipv4();
            assert!(metric_line(&out, "response_total", &format!("target_addr=\"{server_ip}:8080\"")).is_some());
            assert!(
                metric_line(&out, "response_total", "status_code=\"503\",classification=\"failure\"").is_some(),
                "{out}"
            );
        },
    );
}

#[test]
fn admin_endpoints_and_graceful_shutdown() {
    with_mesh("admin_endpoints_and_graceful_shutdown", &[], |m| {
        assert_eq!(m.server_proxy.admin("GET", "/proxy-log-level", "").unwrap(), (200, "warn\n".into()));
        assert_eq!(m.server_proxy.admin("PUT", "/proxy-log-level", "cnimesh=debug,info").unwrap().0, 204);
        assert_eq!(m.server_proxy.admin("GET", "/proxy-log-level", "").unwrap().1, "cnimesh=debug,info\n");
        let (status, body) = m.server_proxy.admin("PUT", "/proxy-log-level", "x=notalevel").unwrap();
        assert_eq!(status, 400, "{body}");
        assert_eq!(m.server_proxy.admin("GET", "/live", "").unwrap().0, 200);
        assert_eq!(m.server_proxy.admin("GET", "/nope", "").unwrap().0, 404);

        // Operator controls are refused from another pod; metrics are not.
        let client_ns = m.client.netns.path();
        let admin = m.server_addr(4191).to_string();
        let (status, body) = http_in(&client_ns, &admin, "POST", "/shutdown", "").unwrap();
        assert_eq!(status, 403, "{body}");
        assert_eq!(http_in(&client_ns, &admin, "PUT", "/proxy-log-level", "trace").unwrap().0, 403);
        assert_eq!(http_in(&client_ns, &admin, "GET", "/proxy-log-level", "").unwrap().0, 403);
        assert_eq!(http_in(&client_ns, &admin, "GET", "/metrics", "").unwrap().0, 200);

        // An in-flight request completes across a graceful shutdown.
        let inbound = || metric_with(&m.server_proxy.metrics(), "request_total", &["direction=\"inbound\""]);
        let before = inbound();
        let slow = {
            let client_ns = client_ns.clone();
            let addr = m.server_addr(apps::HTTP_PORT).to_string();
            std::thread::spawn(move || http_in(&client_ns, &addr, "GET", "/slow", "").unwrap())
        };
        eventually("the slow request reached the server's proxy", Duration::from_secs(10), || inbound() > before);
        assert_eq!(m.server_proxy.admin("POST", "/shutdown", "").unwrap().0, 200);
        assert_eq!(slow.join().unwrap(), (200, "slow done".into()), "in-flight request completed");
        assert!(m.server_proxy.wait(), "server proxy exited cleanly after draining");
        // With the inbound proxy gone, the client's proxy answers instead of hanging.
        let (status, _) =
            http_in(&client_ns, &m.server_addr(apps::HTTP_PORT).to_string(), "GET", "/hello", "").unwrap();
        assert_eq!(status, 502);
        assert!(m.client_proxy.terminate(), "SIGTERM: clean exit");
    });
}

#[test]
fn ipv6_and_unredirected_connections() {
    with_mesh("ipv6_and_unredirected_connections", &[], |m| {
        let v6 = m.server.ipv6();
        let _apps6 = Apps::start(&m.server.netns.path(), v6.into(), "server6").unwrap();
        let (status, body) = http_in(
            &m.client.netns.path(),
            &SocketAddr::new(v6.into(), apps::HTTP_PORT).to_string(),
            "GET",
            "/hello",
            "",
        )
        .unwrap();
        assert_eq!((status, body.as_str()), (200, "hello from server6 over HTTP/1.1"));
        let out = m.client_proxy.metrics();
        assert!(metric_line(&out, "request_total", &format!("target_addr=\"[{v6}]:8080\"")).is_some(), "{out}");

        // Straight to a proxy port, not through capture: closed, never proxied to itself.
        let unredirected = cnimesh_cni::netns::run_in(&m.server.netns.path(), || {
            let mut s = TcpStream::connect("127.0.0.1:4140")?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")?;
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            std::io::Result::Ok(out)
        })
        .unwrap()
        .unwrap();
        assert!(unredirected.is_empty(), "{}", String::from_utf8_lossy(&unredirected));
        assert_eq!(m.server_proxy.admin("GET", "/ready", "").unwrap().0, 200, "and the proxy is fine");
    });
}

/// Sends `request` over a fresh connection from inside `netns`, half-closes (as `nc`, HTTP/1.0
/// tools and some health checkers do), and reads until the server closes.
fn half_closed_request(netns: &std::path::Path, to: SocketAddr, request: &str) -> String {
    let request = request.to_string();
    cnimesh_cni::netns::run_in(netns, move || {
        let mut s = TcpStream::connect(to)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(request.as_bytes())?;
        s.shutdown(std::net::Shutdown::Write)?;
        let mut out = Vec::new();
        s.read_to_end(&mut out)?;
        std::io::Result::Ok(String::from_utf8_lossy(&out).into_owned())
    })
    .unwrap()
    .unwrap_or_else(|e| panic!("half-closed request to {to}: {e}"))
}

#[test]
fn http1_clients_that_half_close_get_the_whole_response() {
    let test = "http1_clients_that_half_close_get_the_whole_response";
    if !require_root(test) {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let client = Pod::named(&net, "shop", "client").unwrap();
    let server = Pod::named(&net, "shop", "server").unwrap();
    let plain = Pod::unmeshed(&net, "shop", "plain").unwrap();
    let _server_apps = Apps::start(&server.netns.path(), server.ipv4().into(), "server").unwrap();
    let _plain_apps = Apps::start(&plain.netns.path(), plain.ipv4().into(), "plain").unwrap();
    let _client_proxy = Sidecar::start(&bins.proxy, &client.netns, &[]).unwrap();
    let _server_proxy = Sidecar::start(&bins.proxy, &server.netns, &[]).unwrap();
    let at = |pod: &Pod<'_>| SocketAddr::new(pod.ipv4().into(), apps::HTTP_PORT);
    let paths = [
        ("outbound and inbound proxy", &client, at(&server), "server"),
        ("inbound proxy only", &plain, at(&server), "server"),
        ("outbound proxy only", &client, at(&plain), "plain"),
    ];
    // Every path and request is tried, so a failure report shows which of them broke.
    let mut failed = Vec::new();
    for (via, from, to, app) in paths {
        for (request, body) in [
            (format!("GET /hello HTTP/1.1\r\nHost: {to}\r\n\r\n"), format!("hello from {app} over HTTP/1.1")),
            (format!("GET /hello HTTP/1.0\r\nHost: {to}\r\n\r\n"), format!("hello from {app} over HTTP/1.1")),
            // The app answers only after a while: the client's FIN arrived long before.
            (format!("GET /slow HTTP/1.1\r\nHost: {to}\r\n\r\n"), "slow done".to_string()),
        ] {
            let response = half_closed_request(&from.netns.path(), to, &request);
            let status_line = response.lines().next().unwrap_or_default();
            let ok = status_line.starts_with("HTTP/1.")
                && status_line.split_whitespace().nth(1) == Some("200")
                && response.ends_with(&body);
            if !ok {
                failed.push(format!("{via}, {}: {response:?}", request.lines().next().unwrap_or_default()));
            }
        }
    }
    // The admin server too: probes and operators' `nc` half-close as well.
    let admin: SocketAddr = "127.0.0.1:4191".parse().unwrap();
    let ready = half_closed_request(&server.netns.path(), admin, "GET /ready HTTP/1.0\r\n\r\n");
    if ready.split_whitespace().nth(1) != Some("200") {
        failed.push(format!("admin server, GET /ready HTTP/1.0: {ready:?}"));
    }
    assert!(failed.is_empty(), "half-closed clients without their response:\n{}", failed.join("\n"));
}
