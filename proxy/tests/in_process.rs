//! The proxy's connection handling driven in-process, without root or capture: a client on one
//! end of an in-memory stream, [`cnimesh_proxy::serve::accept::connection`] on the other with the
//! original destination it would have read from the socket, and a real app on loopback.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use cnimesh_proxy::app::config::Config;
use cnimesh_proxy::serve::accept::connection;
use cnimesh_proxy::serve::drain::Drain;
use cnimesh_proxy::serve::metrics::{Direction, Metrics};
use cnimesh_proxy::serve::shared::Shared;
use http::{Request, Response, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::TcpListener;

mod support;

/// An HTTP/1-only app on loopback answering `<version> <path> host=<Host>`; counts connections.
async fn app() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let host = req.headers().get("host").map(|h| h.to_str().unwrap().to_string()).unwrap_or_default();
                    let text = format!("{:?} {} host={host}", req.version(), req.uri());
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    (addr, accepted)
}

fn shared() -> Arc<Shared> {
    Arc::new(Shared::new(Config::default(), Arc::new(Metrics::default()), Drain::default(), None, None))
}

/// A captured connection to `addr`, served in the background; the client's end is returned.
fn captured(shared: &Arc<Shared>, addr: SocketAddr, direction: Direction) -> DuplexStream {
    let (client, proxy_side) = tokio::io::duplex(64 * 1024);
    let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    tokio::spawn(connection(proxy_side, peer, addr, direction, shared.clone()));
    client
}

async fn body_text(res: Response<Incoming>) -> String {
    String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

#[tokio::test]
async fn outbound_http1_requests_share_one_upstream_connection_across_client_connections() {
    let (app, accepted) = app().await;
    let shared = shared();
    for _ in 0..2 {
        let io = captured(&shared, app, Direction::outbound);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await.unwrap();
        tokio::spawn(conn);
        for path in ["/a", "/b?c=d"] {
            let req = Request::get(path).header("host", "web.example:80").body(Full::new(Bytes::new())).unwrap();
            let res = sender.send_request(req).await.unwrap();
            assert_eq!(res.status(), 200);
            assert_eq!(body_text(res).await, format!("HTTP/1.1 {path} host=web.example:80"));
        }
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "the target's pooled connection serves every client connection");
    assert_eq!(shared.outbound.by_addr.len(), 1);
    let metrics = shared.metrics.encode();
    assert!(metrics.contains("request_total{direction=\"outbound\",target_addr=\"127.0.0.1:"), "{metrics}");
    assert!(metrics.contains("authority=\"web.example:80\",tls=\"false\"} 4"), "{metrics}");
    assert!(metrics.contains("status_code=\"200\",classification=\"success\"} 4"), "{metrics}");
}

#[tokio::test]
async fn an_upstream_that_refuses_is_a_502_naming_why() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let shared = shared();
    let io = captured(&shared, closed, Direction::outbound);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await.unwrap();
    tokio::spawn(conn);
    let res = sender.send_request(Request::get("/").body(Full::new(Bytes::new())).unwrap()).await.unwrap();
    assert_eq!(res.status(), 502);
    assert_eq!(res.headers()["cnimesh-proxy-error"], format!("upstream {closed} refused the connection"));
}

#[tokio::test]
async fn a_half_closed_http1_client_still_gets_its_response() {
    let (app, _) = app().await;
    let mut io = captured(&shared(), app, Direction::outbound);
    io.write_all(b"GET /half HTTP/1.1\r\nHost: app\r\n\r\n").await.unwrap();
    io.shutdown().await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), io.read_to_string(&mut answer)).await.unwrap().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("HTTP/1.1 /half host=app"), "{answer}");
}

#[tokio::test]
async fn inbound_turns_linkerd_http2_back_into_http1_for_the_app() {
    let (app, _) = app().await;
    let shared = shared();
    let io = captured(&shared, support::pod_addr_for(&shared, app), Direction::inbound);
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io)).await.unwrap();
    tokio::spawn(conn);
    for _ in 0..3 {
        let req = Request::get("http://web.shop.svc.cluster.local:8080/orig?x=1")
            .version(Version::HTTP_2)
            .header("l5d-orig-proto", "HTTP/1.1")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let res = sender.send_request(req).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["l5d-orig-proto"], "HTTP/1.1");
        assert_eq!(body_text(res).await, "HTTP/1.1 /orig?x=1 host=web.shop.svc.cluster.local:8080");
    }
}

#[tokio::test]
async fn opaque_bytes_are_forwarded_both_ways() {
    let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = echo.accept().await.unwrap();
        let mut buf = vec![0u8; 64];
        let n = s.read(&mut buf).await.unwrap();
        s.write_all(&buf[..n]).await.unwrap();
    });
    let mut io = captured(&shared(), addr, Direction::outbound);
    io.write_all(b"\x00\x01binary, not HTTP").await.unwrap();
    let mut got = vec![0u8; 18];
    tokio::time::timeout(Duration::from_secs(10), io.read_exact(&mut got)).await.unwrap().unwrap();
    assert_eq!(&got, b"\x00\x01binary, not HTTP");
}

/// An app answering with the `l5d-client-id` and `l5d-server-id` it was sent.
async fn identity_echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let h = |name| req.headers().get(name).map_or("none", |v| v.to_str().unwrap()).to_string();
                    let text = format!("client={} server={}", h("l5d-client-id"), h("l5d-server-id"));
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

/// One raw HTTP/1 exchange on a captured connection: everything the proxy sent back.
async fn exchange(mut io: DuplexStream, request: &str) -> String {
    io.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), io.read_to_string(&mut answer)).await.unwrap();
    answer
}

/// The proxy's own check: whatever the capture rules let through, an
/// original destination on loopback (a neighbour's packet to 127.0.0.1 redirected to us) never
/// reaches the app's loopback-only listener. Unfixed: `HTTP/1.1 200` from the app.
#[tokio::test]
async fn an_inbound_connection_to_a_loopback_address_is_refused_and_counted() {
    let (app, accepted) = app().await;
    let shared = shared();
    for to in [
        app,
        SocketAddr::new("::ffff:127.0.0.1".parse().unwrap(), app.port()),
        SocketAddr::new("127.0.0.2".parse().unwrap(), app.port()),
    ] {
        let io = captured(&shared, to, Direction::inbound);
        let answer = exchange(io, "GET /secret HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n").await;
        assert_eq!(answer, "", "{to}: closed without an answer");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "the app never saw a connection");
    let text = shared.metrics.encode();
    assert!(text.contains("inbound_tcp_accept_errors_total{error=\"loopback_destination\"} 3"), "{text}");
}

/// The proxy's own check, for the addresses Linux turns into loopback when a socket dials them:
/// `0.0.0.0` (any of 0.0.0.0/8 a neighbour's packet carries), `::` and their IPv4-mapped forms.
/// A listener on `0.0.0.0` or `::` binds, so "an address of this pod" alone let them through.
/// Unfixed: `HTTP/1.1 200` from the loopback-only app.
#[tokio::test]
async fn an_inbound_connection_to_an_unspecified_address_is_refused_and_counted() {
    let (app, accepted) = app().await;
    let v6 = TcpListener::bind(("::1", app.port())).await.ok();
    let shared = shared();
    let to: Vec<SocketAddr> = ["0.0.0.0", "0.1.2.3", "::", "::ffff:0.0.0.0"]
        .iter()
        .map(|ip| SocketAddr::new(ip.parse().unwrap(), app.port()))
        .collect();
    for &to in &to {
        let io = captured(&shared, to, Direction::inbound);
        let answer = exchange(io, "GET /secret HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n").await;
        assert_eq!(answer, "", "{to}: closed without an answer");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "the app never saw a connection");
    if let Some(v6) = v6 {
        let nothing = tokio::time::timeout(Duration::from_millis(50), v6.accept()).await;
        assert!(nothing.is_err(), "the app's ::1 listener never saw a connection");
    }
    let text = shared.metrics.encode();
    let counted = format!("inbound_tcp_accept_errors_total{{error=\"loopback_destination\"}} {}", to.len());
    assert!(text.contains(&counted), "{text}");
}

/// An identity claimed in a header is not passed on (a plaintext client
/// has none, so the app sees none). Unfixed: the app saw `client=admin...`.
#[tokio::test]
async fn identity_headers_a_client_sends_never_reach_the_app() {
    let app = identity_echo().await;
    let shared = shared();
    let io = captured(&shared, support::pod_addr_for(&shared, app), Direction::inbound);
    let answer = exchange(
        io,
        "GET / HTTP/1.1\r\nHost: app\r\nl5d-client-id: admin.cnimesh.serviceaccount.identity.cnimesh.cluster.local\r\nl5d-server-id: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.ends_with("client=none server=none"), "{answer}");
}
