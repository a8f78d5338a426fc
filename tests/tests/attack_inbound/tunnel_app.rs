//! An app that switches protocols whenever asked, as permissive servers do: `Upgrade: h2c`
//! (then HTTP/2 on the same connection, answering `h2 <path>`), `Upgrade: websocket` (then an
//! echo) and `CONNECT` (then an echo). Plain HTTP/1 requests get `200 <request target>` (`/headers`: the request head). And the attacker's
//! side of each tunnel.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const TUNNEL_PORT: u16 = 8090;

/// Reads one request or response head (up to the blank line); `None` at EOF.
async fn read_head(s: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

async fn echo(mut s: TcpStream) {
    let mut buf = [0u8; 1024];
    while let Ok(n) = s.read(&mut buf).await {
        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
}

async fn serve(mut s: TcpStream) -> Option<()> {
    loop {
        let head = read_head(&mut s).await?;
        let mut line = head.split_whitespace();
        let (method, path) = (line.next()?.to_string(), line.next()?.to_string());
        let upgrade = header(&head, "upgrade").map(str::to_ascii_lowercase);
        if upgrade.as_deref() == Some("h2c") {
            s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
                .await
                .ok()?;
            let service = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                let body = format!("h2 {}", req.uri().path());
                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(body))))
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(s), service)
                .await;
            return Some(());
        }
        if upgrade.as_deref() == Some("websocket") {
            s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
                .await
                .ok()?;
            echo(s).await;
            return Some(());
        }
        if method == "CONNECT" {
            s.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.ok()?;
            echo(s).await;
            return Some(());
        }
        // `/headers` shows what the app was sent; anything else, the request target as received.
        let body = if path == "/headers" { head.clone() } else { path };
        let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        s.write_all(answer.as_bytes()).await.ok()?;
    }
}

/// The app on `ip`:[`TUNNEL_PORT`] in the netns at `netns`, until dropped.
pub struct TunnelApp {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TunnelApp {
    pub fn start(netns: &Path, ip: IpAddr) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = cnimesh_e2e::netns::spawn_in(netns, move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = TcpListener::bind(SocketAddr::new(ip, TUNNEL_PORT)).await.unwrap();
                ready_tx.send(()).unwrap();
                let accept = async {
                    loop {
                        if let Ok((s, _)) = listener.accept().await {
                            tokio::spawn(serve(s));
                        }
                    }
                };
                tokio::select! {
                    () = accept => {}
                    _ = stopped => {}
                }
            });
        })
        .unwrap();
        ready_rx.recv().unwrap();
        Self { stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for TunnelApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn status_of(head: &str) -> u16 {
    head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// What the attacker got: the status of its upgrade request, and of `/admin` asked next on the
/// same connection (over HTTP/2 when the upgrade went through, else HTTP/1); 0 = closed.
#[derive(Debug, PartialEq, Eq)]
pub struct H2cAttempt {
    pub upgrade: u16,
    pub admin: u16,
}

/// `GET <probe>` offering `Upgrade: h2c`, then `GET /admin` on the same connection.
pub fn h2c_smuggle(netns: &Path, to: SocketAddr, probe: &str) -> H2cAttempt {
    let probe = probe.to_string();
    cnimesh_e2e::netns::block_on_in(netns, async move {
        let attempt = async {
            let mut s = TcpStream::connect(to).await.ok()?;
            let offer = format!(
                "GET {probe} HTTP/1.1\r\nHost: api\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
            );
            s.write_all(offer.as_bytes()).await.ok()?;
            let head = read_head(&mut s).await?;
            let upgrade = status_of(&head);
            if upgrade == 101 {
                let (mut sender, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s)).await.ok()?;
                tokio::spawn(conn);
                let req = http::Request::get("http://api/admin").body(Full::new(Bytes::new())).unwrap();
                let admin = sender.send_request(req).await.map_or(0, |r| r.status().as_u16());
                return Some(H2cAttempt { upgrade, admin });
            }
            // Not switched: the rest of the answer, then the next request as HTTP/1.
            let length: usize = header(&head, "content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
            let mut body = vec![0; length];
            s.read_exact(&mut body).await.ok()?;
            s.write_all(b"GET /admin HTTP/1.1\r\nHost: api\r\n\r\n").await.ok()?;
            let admin = read_head(&mut s).await.map_or(0, |h| status_of(&h));
            Some(H2cAttempt { upgrade, admin })
        };
        tokio::time::timeout(Duration::from_secs(20), attempt)
            .await
            .ok()
            .flatten()
            .unwrap_or(H2cAttempt { upgrade: 0, admin: 0 })
    })
}

/// Opens a tunnel with `request` (a request head ending in a blank line): `Some(status)` when
/// the answer switched (101, or 2xx to CONNECT) and the tunnel echoes; otherwise the status seen
/// (0: closed) with `None`.
pub fn open_tunnel(netns: &Path, to: SocketAddr, request: &str) -> (u16, bool) {
    let request = request.to_string();
    cnimesh_e2e::netns::block_on_in(netns, async move {
        let attempt = async {
            let mut s = TcpStream::connect(to).await.ok()?;
            s.write_all(request.as_bytes()).await.ok()?;
            let head = read_head(&mut s).await?;
            let status = status_of(&head);
            if status != 101 && !(request.starts_with("CONNECT") && (200..300).contains(&status)) {
                return Some((status, false));
            }
            s.write_all(b"through").await.ok()?;
            let mut got = [0u8; 7];
            let echoed = s.read_exact(&mut got).await.is_ok() && &got == b"through";
            Some((status, echoed))
        };
        tokio::time::timeout(Duration::from_secs(20), attempt).await.ok().flatten().unwrap_or((0, false))
    })
}
