//! Test workloads running inside pod namespaces: an HTTP/1 + HTTP/2 app (echo, streaming,
//! gRPC-shaped responses with trailers, WebSocket-style upgrade, slow responses), an app bound to
//! loopback only, a server-speaks-first service, a half-close service, and one that resets.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

pub const HTTP_PORT: u16 = 8080;
pub const LOCAL_ONLY_PORT: u16 = 8081;
pub const BANNER_PORT: u16 = 5432;
pub const HALF_CLOSE_PORT: u16 = 9000;
pub const RESET_PORT: u16 = 9001;
pub const BANNER: &str = "220 cnimesh-test ready\r\n";
/// Size of `/big`.
pub const BIG: usize = 8 << 20;

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).map_err(|n| match n {}).boxed_unsync()
}

/// Streams the request's frames back, then gRPC-style trailers with `status`.
fn grpc_echo(body: Incoming, status: &'static str) -> Body {
    let frames = futures::stream::unfold(Some(body), move |state| async move {
        let mut body = state?;
        match body.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => Some((Ok(Frame::data(data)), Some(body))),
                Err(_) => Some((Ok(Frame::data(Bytes::new())), Some(body))),
            },
            Some(Err(e)) => Some((Err(Box::new(e) as Box<dyn std::error::Error + Send + Sync>), None)),
            None => {
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", status.parse().unwrap());
                trailers.insert("grpc-message", "ok".parse().unwrap());
                trailers.insert("x-trailer", "kept".parse().unwrap());
                Some((Ok(Frame::trailers(trailers)), None))
            }
        }
    });
    StreamBody::new(frames).boxed_unsync()
}

/// Whether the `n`th request to `/flaky` (from 0) fails: 3 in every 10, never two in a row, so
/// requests sent one at a time each succeed on their first retry.
pub fn flaky_fails(n: usize) -> bool {
    matches!(n % 10, 0 | 3 | 6)
}

/// One app's identity and the count of `/flaky` requests it has answered.
struct AppState {
    name: Arc<str>,
    flaky: AtomicUsize,
}

async fn app(mut req: Request<Incoming>, state: Arc<AppState>) -> Result<Response<Body>, Infallible> {
    let name = &state.name;
    let path = req.uri().path().to_string();
    let response = match path.as_str() {
        "/hello" => {
            let mut r = Response::new(full(format!("hello from {name} over {:?}", req.version())));
            r.headers_mut().insert("x-app", "yes".parse().unwrap());
            r
        }
        // Which replica answered; replicas named `slow*` take 100 ms (load-balancing tests).
        "/replica" => {
            if name.starts_with("slow") {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Response::new(full(name.to_string()))
        }
        // The request's headers, one `name: value` per line (what a proxy forwarded, e.g. trace context).
        "/headers" => {
            let mut text = format!("version: {:?}\n", req.version());
            for (name, value) in req.headers() {
                text.push_str(&format!("{name}: {}\n", String::from_utf8_lossy(value.as_bytes())));
            }
            Response::new(full(text))
        }
        "/echo" => Response::new(
            req.into_body().map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>).boxed_unsync(),
        ),
        "/big" => {
            let chunks = futures::stream::iter((0..BIG / 65536).map(|_| {
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Frame::data(Bytes::from(vec![b'x'; 65536])))
            }));
            Response::new(StreamBody::new(chunks).boxed_unsync())
        }
        "/grpc" | "/grpc-fail" => {
            let status = if path == "/grpc" { "0" } else { "13" };
            let mut r = Response::new(grpc_echo(req.into_body(), status));
            r.headers_mut().insert("content-type", "application/grpc".parse().unwrap());
            r
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Response::new(full("slow done"))
        }
        // A backend failing 30 % of requests (500); the body is read first, as a real app does.
        "/flaky" => {
            let _ = req.into_body().collect().await;
            let failed = flaky_fails(state.flaky.fetch_add(1, Ordering::SeqCst));
            let mut r = Response::new(full(if failed { "flaky failure" } else { "flaky ok" }));
            if failed {
                *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            }
            r
        }
        // A gRPC method of the `test.Echo` service: the message echoed, `grpc-status: 0`, and
        // which replica answered in `x-replica`.
        p if p.starts_with("/test.Echo/") => {
            let mut r = Response::new(grpc_echo(req.into_body(), "0"));
            r.headers_mut().insert("content-type", "application/grpc".parse().unwrap());
            if let Ok(replica) = name.parse() {
                r.headers_mut().insert("x-replica", replica);
            }
            r
        }
        "/status/503" => {
            let mut r = Response::new(full("unavailable"));
            *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            r
        }
        "/ws" => {
            let upgrade = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                if let Ok(upgraded) = upgrade.await {
                    let mut io = TokioIo::new(upgraded);
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = io.read(&mut buf).await {
                        if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                }
            });
            Response::builder()
                .status(StatusCode::SWITCHING_PROTOCOLS)
                .header("upgrade", "websocket")
                .header("connection", "upgrade")
                .body(full(""))
                .unwrap()
        }
        _ => {
            let mut r = Response::new(full("not found"));
            *r.status_mut() = StatusCode::NOT_FOUND;
            r
        }
    };
    Ok(response)
}

async fn serve_http(listener: TcpListener, name: Arc<str>, accepted: Arc<AtomicUsize>) {
    let state = Arc::new(AppState { name, flaky: AtomicUsize::new(0) });
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        // Like most servers (Go's net/http, nginx): no Nagle delay on small responses.
        let _ = stream.set_nodelay(true);
        accepted.fetch_add(1, Ordering::SeqCst);
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| app(req, state.clone()));
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn serve_banner(listener: TcpListener) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else { continue };
        tokio::spawn(async move {
            s.write_all(BANNER.as_bytes()).await?;
            let mut buf = [0u8; 1024];
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>(());
                }
                s.write_all(&buf[..n]).await?;
            }
        });
    }
}

async fn serve_half_close(listener: TcpListener) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else { continue };
        tokio::spawn(async move {
            let mut got = Vec::new();
            s.read_to_end(&mut got).await?;
            s.write_all(format!("got {}", got.len()).as_bytes()).await?;
            s.shutdown().await
        });
    }
}

async fn serve_reset(listener: TcpListener) {
    loop {
        let Ok((s, _)) = listener.accept().await else { continue };
        // Linger 0: close with RST.
        let _ = s.set_zero_linger();
        drop(s);
    }
}

/// Workloads of one pod, served from a thread inside its netns until dropped.
pub struct Apps {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Connections the HTTP app accepted (to observe connection reuse).
    pub accepted: Arc<AtomicUsize>,
}

impl Apps {
    pub fn start(netns: &Path, ip: IpAddr, name: &str) -> anyhow::Result<Self> {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let name: Arc<str> = name.into();
        let thread = crate::netns::spawn_in(netns, move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let bind = |port| TcpListener::bind(SocketAddr::new(ip, port));
                let listeners = async {
                    Ok::<_, std::io::Error>((
                        bind(HTTP_PORT).await?,
                        // Loopback of the same family: a v4 and a v6 instance can share a pod.
                        TcpListener::bind(SocketAddr::new(
                            if ip.is_ipv6() {
                                std::net::Ipv6Addr::LOCALHOST.into()
                            } else {
                                std::net::Ipv4Addr::LOCALHOST.into()
                            },
                            LOCAL_ONLY_PORT,
                        ))
                        .await?,
                        bind(BANNER_PORT).await?,
                        bind(HALF_CLOSE_PORT).await?,
                        bind(RESET_PORT).await?,
                    ))
                };
                let (http, local, banner, half, reset) = match listeners.await {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                tokio::spawn(serve_http(http, name.clone(), counter));
                tokio::spawn(serve_http(local, name, Arc::default()));
                tokio::spawn(serve_banner(banner));
                tokio::spawn(serve_half_close(half));
                tokio::spawn(serve_reset(reset));
                let _ = ready_tx.send(Ok(()));
                let _ = stopped.await;
            });
        })?;
        ready_rx.recv()?.map_err(|e| anyhow::anyhow!("apps did not start: {e}"))?;
        Ok(Self { stop: Some(stop), thread: Some(thread), accepted })
    }
}

impl Drop for Apps {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
