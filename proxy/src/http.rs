//! HTTP proxying with hyper on both sides: per-target connection pools with keep-alive, HTTP/2
//! multiplexing, streaming bodies and trailers (gRPC), HTTP/1 upgrades and CONNECT spliced through,
//! hop-by-hop headers removed (RFC 9110 §7.6.1), and upstream failures answered with 502/503/504.
//! The inbound also accepts Linkerd's HTTP/1-over-HTTP/2 transport (`l5d-orig-proto`), so a stock
//! Linkerd proxy can reach an HTTP/1 app behind us.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{CONNECTION, HOST, HeaderName, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::discovery::balance::Load;
use crate::http_clients::{Clients, FixedConnector, UpstreamClient};
use crate::metrics::{Direction, Metrics, RequestLabels, ResponseLabels, TlsLabel};
use crate::route::{Picked, Route, RouteError};

pub type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Everything a connection's requests need.
pub struct HttpProxy {
    direction: Direction,
    /// The connection's original destination (metrics, messages).
    target: SocketAddr,
    route: Route,
    h2: bool,
    clients: Arc<Clients>,
    /// The pool for a fixed route, looked up once per connection.
    fixed: Option<UpstreamClient>,
    /// Outbound with discovery: requests may name a service in their authority.
    named: Option<NamedServices>,
    tls: TlsLabel,
    metrics: Arc<Metrics>,
    drain: crate::drain::Drain,
    /// This connection in `tcp_open_connections`; an upgraded tunnel keeps it open.
    open: Arc<crate::metrics::OpenConnection>,
    /// Metric handles for the last authority seen: a connection's requests nearly always share
    /// one, so the common case builds no label strings and takes no family lock.
    handles: Mutex<Option<Handles>>,
}

struct NamedServices {
    discovery: Arc<crate::discovery::Discovery>,
    identity: Option<Arc<crate::identity::Identity>>,
    /// Services this connection's requests named (`None`: not a known service).
    routes: Mutex<Vec<(String, Option<Arc<Route>>)>>,
}

/// A response body that reports how the response ended: gRPC puts its status in the trailers,
/// so a response is classified only once its stream is over.
struct Classified<B> {
    inner: B,
    on_end: Option<Box<dyn FnOnce(&'static str) + Send>>,
}

impl<B: hyper::body::Body> Classified<B> {
    /// Wraps `inner`; a body that is already over (e.g. empty) is classified at once, because
    /// the server may never poll it.
    fn new(inner: B, on_end: Box<dyn FnOnce(&'static str) + Send>) -> Self {
        let mut body = Self { inner, on_end: Some(on_end) };
        if body.inner.is_end_stream() {
            body.finish("success");
        }
        body
    }
}

impl<B> Classified<B> {
    fn finish(&mut self, classification: &'static str) {
        if let Some(f) = self.on_end.take() {
            f(classification);
        }
    }
}

impl<B> Drop for Classified<B> {
    /// A body dropped before its end (client went away, upstream reset) is a failure.
    fn drop(&mut self) {
        self.finish("failure");
    }
}

impl<B> hyper::body::Body for Classified<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let failed = trailers.get("grpc-status").is_some_and(|v| v != "0");
                    self.finish(if failed { "failure" } else { "success" });
                } else if self.inner.is_end_stream() {
                    // The last data frame of a sized body: servers stop polling here.
                    self.finish("success");
                }
            }
            Poll::Ready(Some(Err(_))) => self.finish("failure"),
            Poll::Ready(None) => self.finish("success"),
            Poll::Pending => {}
        }
        polled.map(|o| o.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Per-connection cache of metric handles (see [`HttpProxy::with_handles`]).
struct Handles {
    authority: String,
    labels: RequestLabels,
    requests: prometheus_client::metrics::counter::Counter,
    latency: prometheus_client::metrics::histogram::Histogram,
    responses: Vec<(u16, &'static str, prometheus_client::metrics::counter::Counter)>,
}

/// A failure answered to the client instead of the upstream's response.
#[derive(Debug)]
struct ProxyError {
    status: StatusCode,
    message: String,
}

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).map_err(|never| match never {}).boxed_unsync()
}

fn incoming(body: Incoming) -> Body {
    body.map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>).boxed_unsync()
}

fn error_response(e: &ProxyError) -> Response<Body> {
    let mut r = Response::new(full(format!("cnimesh-proxy: {}\n", e.message)));
    *r.status_mut() = e.status;
    r.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    if let Ok(v) = HeaderValue::from_str(&e.message) {
        r.headers_mut().insert("cnimesh-proxy-error", v);
    }
    r
}

/// Removes hop-by-hop headers; `upgrade` keeps `Connection: upgrade` and `Upgrade` for the
/// upgrade handshake itself. `TE: trailers` is end-to-end in practice (gRPC needs it).
pub fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let listed: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        if !(upgrade && name == UPGRADE) && name != TE {
            headers.remove(&name);
        }
    }
    for name in ["keep-alive", "proxy-connection", "transfer-encoding", "proxy-authenticate", "proxy-authorization"] {
        headers.remove(name);
    }
    if !upgrade {
        headers.remove(CONNECTION);
        headers.remove(UPGRADE);
    } else {
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    }
    let te_trailers =
        headers.get_all(TE).iter().any(|v| v.to_str().is_ok_and(|s| s.to_ascii_lowercase().contains("trailers")));
    headers.remove(TE);
    if te_trailers {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
}

/// Linkerd's marker of an HTTP/1 request (or response) carried over HTTP/2 between proxies. A
/// Linkerd outbound upgrades HTTP/1 to HTTP/2 towards endpoints the control plane hints as H2
/// (every meshed endpoint), naming the original version here; the receiving proxy must downgrade.
pub const L5D_ORIG_PROTO: HeaderName = HeaderName::from_static("l5d-orig-proto");

/// If `req` is an HTTP/2 request a Linkerd proxy upgraded from HTTP/1, turns it back into that
/// HTTP/1 request: the version the marker names (`HTTP/1.1` or `HTTP/1.0`, optionally followed
/// by `; absolute-form`), the marker removed, and `Host` from the `:authority`, which is where
/// the upgrade put the original `Host`. Returns whether it did. An absolute-form original still
/// goes to the app in origin form with its `Host`, as every HTTP/1 request through our pools does.
/// An unknown version is the peer's bug or a newer protocol we cannot speak to the app: 400,
/// rather than Linkerd's own fallback of sending HTTP/2 to an app that may not speak it.
fn downgrade_orig_proto<B>(req: &mut Request<B>) -> Result<bool, ProxyError> {
    if req.version() != Version::HTTP_2 || !req.headers().contains_key(&L5D_ORIG_PROTO) {
        return Ok(false);
    }
    let values: Vec<HeaderValue> = match req.headers_mut().entry(L5D_ORIG_PROTO) {
        http::header::Entry::Occupied(e) => e.remove_entry_mult().1.collect(),
        http::header::Entry::Vacant(_) => Vec::new(),
    };
    let version = match values.as_slice() {
        [value] => {
            let value = value.as_bytes();
            let (version, rest) = value.split_at(value.len().min(8));
            let rest_ok = rest.is_empty() || rest.eq_ignore_ascii_case(b"; absolute-form");
            match version {
                b"HTTP/1.1" if rest_ok => Some(Version::HTTP_11),
                b"HTTP/1.0" if rest_ok => Some(Version::HTTP_10),
                _ => None,
            }
        }
        _ => None,
    };
    let Some(version) = version else {
        return Err(ProxyError {
            status: StatusCode::BAD_REQUEST,
            message: format!("unsupported {L5D_ORIG_PROTO} {values:?}: expected HTTP/1.1 or HTTP/1.0"),
        });
    };
    *req.version_mut() = version;
    if let Some(authority) = req.uri().authority() {
        let host = HeaderValue::from_str(authority.as_str()).map_err(|e| ProxyError {
            status: StatusCode::BAD_REQUEST,
            message: format!("invalid authority for Host: {e}"),
        })?;
        req.headers_mut().insert(HOST, host);
    }
    Ok(true)
}

/// [`downgrade_orig_proto`] for the fuzz crate (fuzz/), which feeds it untrusted headers: whether
/// it downgraded, or the status it would answer with.
#[doc(hidden)]
pub fn downgrade_orig_proto_for_fuzzing<B>(req: &mut Request<B>) -> Result<bool, StatusCode> {
    downgrade_orig_proto(req).map_err(|e| e.status)
}

/// The answer to a downgraded request goes back over HTTP/2 marked with the version the app
/// answered in, as Linkerd's inbound does: Linkerd's outbound restores the HTTP/1 response from
/// it. `Transfer-Encoding` has no place in HTTP/2.
fn upgrade_orig_proto_response<B>(res: &mut Response<B>) {
    let original = if res.version() == Version::HTTP_10 { "HTTP/1.0" } else { "HTTP/1.1" };
    res.headers_mut().insert(L5D_ORIG_PROTO, HeaderValue::from_static(original));
    res.headers_mut().remove(TRANSFER_ENCODING);
    *res.version_mut() = Version::HTTP_2;
}

fn wants_upgrade<B>(req: &Request<B>) -> bool {
    req.method() == Method::CONNECT
        || (req.headers().contains_key(UPGRADE)
            && req
                .headers()
                .get_all(CONNECTION)
                .iter()
                .any(|v| v.to_str().is_ok_and(|s| s.to_ascii_lowercase().contains("upgrade"))))
}

fn upstream_error(target: SocketAddr, e: &(dyn std::error::Error + 'static)) -> ProxyError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return match io.kind() {
                io::ErrorKind::TimedOut => {
                    ProxyError { status: StatusCode::GATEWAY_TIMEOUT, message: format!("upstream {target} timed out") }
                }
                io::ErrorKind::ConnectionRefused => ProxyError {
                    status: StatusCode::BAD_GATEWAY,
                    message: format!("upstream {target} refused the connection"),
                },
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => ProxyError {
                    status: StatusCode::BAD_GATEWAY,
                    message: format!("upstream {target} reset the connection"),
                },
                _ => ProxyError { status: StatusCode::BAD_GATEWAY, message: format!("upstream {target}: {io}") },
            };
        }
        source = err.source();
    }
    ProxyError { status: StatusCode::BAD_GATEWAY, message: format!("upstream {target}: {e}") }
}

impl HttpProxy {
    pub fn new(
        direction: Direction,
        target: SocketAddr,
        h2: bool,
        route: Route,
        tls: TlsLabel,
        open: Arc<crate::metrics::OpenConnection>,
        shared: &crate::shared::Shared,
    ) -> Self {
        let clients = shared.clients.clone();
        let fixed = match &route {
            Route::Fixed(t) => Some(clients.get(t.addr, h2, t.tls.as_ref())),
            Route::Balanced { .. } => None,
        };
        let named = match (direction, &shared.discovery) {
            (Direction::outbound, Some(d)) => Some(NamedServices {
                discovery: d.clone(),
                identity: shared.identity.clone(),
                routes: Mutex::default(),
            }),
            _ => None,
        };
        Self {
            direction,
            target,
            route,
            h2,
            clients,
            fixed,
            named,
            tls,
            metrics: shared.metrics.clone(),
            drain: shared.drain.clone(),
            open,
            handles: Mutex::default(),
        }
    }

    /// The route for a request whose authority names a service (`web.shop.svc.cluster.local`),
    /// when it differs from the connection's own.
    async fn named_route(&self, authority: &str) -> Option<Arc<Route>> {
        let named = self.named.as_ref()?;
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().ok()?),
            None => (authority, self.target.port()),
        };
        if !host.contains(".svc.") {
            return None;
        }
        let key = format!("{host}:{port}");
        if matches!(&self.route, Route::Balanced { service, .. } if *service == key) {
            return None;
        }
        if let Some((_, route)) = named.routes.lock().expect("not poisoned").iter().find(|(k, _)| *k == key) {
            return route.clone();
        }
        let endpoints = named.discovery.endpoints(&key).await;
        let routable = endpoints.borrow().routable();
        let route = routable
            .then(|| Arc::new(Route::Balanced { service: key.clone(), endpoints, identity: named.identity.clone() }));
        let mut routes = named.routes.lock().expect("not poisoned");
        // A handful of services per connection at most; beyond that, no caching.
        if routes.len() < 8 {
            routes.push((key, route.clone()));
        }
        route
    }

    /// The upstream for one request: the fixed pool, or a balanced endpoint's; `h2` is the
    /// protocol towards it (a downgraded request goes over HTTP/1 on an HTTP/2 connection).
    fn select(&self, route: Option<&Route>, h2: bool) -> Result<(UpstreamClient, Picked), ProxyError> {
        let picked = route.unwrap_or(&self.route).pick().map_err(|e| ProxyError {
            status: match e {
                RouteError::NoEndpoints(_) => StatusCode::SERVICE_UNAVAILABLE,
                RouteError::NoIdentity(_) => StatusCode::BAD_GATEWAY,
            },
            message: e.to_string(),
        })?;
        let client = match (&self.fixed, route) {
            (Some(c), None) if h2 == self.h2 => c.clone(),
            _ => self.clients.get(picked.target.addr, h2, picked.target.tls.as_ref()),
        };
        Ok((client, picked))
    }

    /// Runs `f` on the metric handles for `authority`, creating them on a change of authority.
    fn with_handles<T>(&self, authority: &str, f: impl FnOnce(&mut Handles) -> T) -> T {
        let mut cached = self.handles.lock().expect("not poisoned");
        if cached.as_ref().is_none_or(|h| h.authority != authority) {
            let labels = RequestLabels {
                direction: self.direction,
                target_addr: self.metrics.target_label(self.direction, self.target),
                authority: self.metrics.authority_label(self.direction, authority),
                tls: self.tls.clone(),
            };
            *cached = Some(Handles {
                authority: authority.to_string(),
                requests: self.metrics.request_total.get_or_create(&labels).clone(),
                latency: self.metrics.response_latency_ms.get_or_create(&labels).clone(),
                responses: Vec::new(),
                labels,
            });
        }
        f(cached.as_mut().expect("just filled"))
    }

    fn count_response(&self, authority: &str, status: StatusCode, classification: &'static str) {
        let code = status.as_u16();
        self.with_handles(authority, |h| {
            if let Some((_, _, counter)) = h.responses.iter().find(|(c, k, _)| *c == code && *k == classification) {
                counter.inc();
                return;
            }
            let labels = ResponseLabels {
                direction: h.labels.direction,
                target_addr: h.labels.target_addr.clone(),
                authority: h.labels.authority.clone(),
                tls: h.labels.tls.clone(),
                status_code: code.to_string(),
                classification: classification.into(),
            };
            let counter = self.metrics.response_total.get_or_create(&labels).clone();
            counter.inc();
            // A handful of (status, classification) pairs per connection at most.
            if h.responses.len() < 16 {
                h.responses.push((code, classification, counter));
            }
        });
    }

    /// One request, end to end, with its metrics.
    pub async fn handle(self: Arc<Self>, mut req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
        let start = Instant::now();
        let authority = req
            .uri()
            .authority()
            .map(|a| a.to_string())
            .or_else(|| req.headers().get(HOST).and_then(|h| h.to_str().ok()).map(str::to_string))
            .unwrap_or_default();
        let latency = self.with_handles(&authority, |h| {
            h.requests.inc();
            h.latency.clone()
        });
        // A balanced request stays load on its endpoint until its response body ends (gRPC
        // streams, downloads), not just until its headers arrive.
        // Only the inbound speaks to apps, so only it undoes a peer proxy's upgrade.
        let downgraded = match self.direction {
            Direction::inbound => downgrade_orig_proto(&mut req),
            Direction::outbound => Ok(false),
        };
        let (result, load) = match downgraded {
            Err(e) => (Err(e), None),
            Ok(false) if wants_upgrade(&req) && req.version() != Version::HTTP_2 => (self.upgrade(req).await, None),
            Ok(downgraded) => match self.forward(req, &authority).await {
                Ok((mut response, load)) => {
                    if downgraded {
                        upgrade_orig_proto_response(&mut response);
                    }
                    (Ok(response), load)
                }
                Err(e) => (Err(e), None),
            },
        };
        let response = result.unwrap_or_else(|e| {
            tracing::warn!(direction = ?self.direction, target = %self.target, status = e.status.as_u16(), "{}", e.message);
            error_response(&e)
        });
        let status = response.status();
        // A trailers-only gRPC response carries its status in the headers.
        let failed_early = status.is_server_error() || response.headers().get("grpc-status").is_some_and(|v| v != "0");
        latency.observe(start.elapsed().as_secs_f64() * 1e3);
        let proxy = self.clone();
        let on_end = Box::new(move |end: &'static str| {
            drop(load);
            proxy.count_response(&authority, status, if failed_early { "failure" } else { end });
        });
        Ok(response.map(|inner| Classified::new(inner, on_end).boxed_unsync()))
    }

    async fn forward(
        &self,
        req: Request<Incoming>,
        authority: &str,
    ) -> Result<(Response<Body>, Option<Load>), ProxyError> {
        let (mut parts, body) = req.into_parts();
        let h2 = parts.version == Version::HTTP_2;
        // HTTP/1.0 stays HTTP/1.0 only when a downgrade named it; otherwise HTTP/1 goes as 1.1.
        let version = match parts.version {
            Version::HTTP_2 => Version::HTTP_2,
            Version::HTTP_10 if self.h2 => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        strip_hop_by_hop(&mut parts.headers, false);
        // The pool is per target, so the URI only carries the authority the client used.
        let authority = if authority.is_empty() { self.target.to_string() } else { authority.to_string() };
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = Uri::builder()
            .scheme(parts.uri.scheme_str().unwrap_or("http"))
            .authority(authority.as_str())
            .path_and_query(path)
            .build()
            .map_err(|e| ProxyError {
                status: StatusCode::BAD_REQUEST,
                message: format!("invalid request target: {e}"),
            })?;
        parts.version = version;
        let named = self.named_route(&authority).await;
        let (client, picked) = self.select(named.as_deref(), h2)?;
        let upstream = picked.target.addr;
        let result = client.request(Request::from_parts(parts, body)).await;
        if let Some(load) = &picked.load {
            match &result {
                Ok(_) => load.observe(),
                Err(_) => load.fail(),
            }
        }
        let mut response = result.map_err(|e| upstream_error(upstream, &e))?;
        strip_hop_by_hop(response.headers_mut(), false);
        Ok((response.map(incoming), picked.load))
    }

    /// HTTP/1 `Upgrade` (e.g. WebSocket) and `CONNECT`: the handshake goes upstream on a fresh
    /// connection, and on success both upgraded connections are spliced together.
    async fn upgrade(&self, mut req: Request<Incoming>) -> Result<Response<Body>, ProxyError> {
        let (_, picked) = self.select(None, self.h2)?;
        let target = picked.target.addr;
        let connector =
            FixedConnector { target, timeout: self.clients.connect_timeout, tls: picked.target.tls.clone() };
        let upstream = connector.connect().await.map_err(|e| upstream_error(target, &e))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(upstream))
            .await
            .map_err(|e| upstream_error(target, &e))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream upgrade connection ended");
            }
        });
        let server_side = hyper::upgrade::on(&mut req);
        let is_connect = req.method() == Method::CONNECT;
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers, !is_connect);
        let mut response =
            sender.send_request(Request::from_parts(parts, body)).await.map_err(|e| upstream_error(target, &e))?;
        let switched =
            response.status() == StatusCode::SWITCHING_PROTOCOLS || (is_connect && response.status().is_success());
        if switched {
            let client_side = hyper::upgrade::on(&mut response);
            let guard = self.drain.guard();
            let open = self.open.clone();
            tokio::spawn(async move {
                // The tunnel counts as load on its endpoint for as long as it lasts.
                let _held = (guard, open, picked.load);
                match tokio::try_join!(server_side, client_side) {
                    Ok((a, b)) => {
                        let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
                        if let Err(e) = tokio::io::copy_bidirectional(&mut a, &mut b).await {
                            tracing::debug!(%target, error = %e, "upgraded connection ended");
                        }
                    }
                    Err(e) => tracing::warn!(%target, error = %e, "upgrade failed"),
                }
            });
        } else {
            strip_hop_by_hop(response.headers_mut(), false);
        }
        Ok(response.map(incoming))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("keep-alive, x-secret"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert(TE, HeaderValue::from_static("trailers, deflate"));
        h.insert("x-end-to-end", HeaderValue::from_static("kept"));
        strip_hop_by_hop(&mut h, false);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-end-to-end", "te"]);
        assert_eq!(h[TE], "trailers");

        let mut up = HeaderMap::new();
        up.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        up.insert(UPGRADE, HeaderValue::from_static("websocket"));
        strip_hop_by_hop(&mut up, true);
        assert_eq!((up[CONNECTION].to_str().unwrap(), up[UPGRADE].to_str().unwrap()), ("upgrade", "websocket"));
    }

    #[test]
    fn orig_proto_requests_become_http1_and_their_responses_are_marked() {
        let upgraded = |value: &'static str| {
            Request::builder()
                .version(Version::HTTP_2)
                .uri("http://web.shop.svc.cluster.local:8080/path?q=1")
                .header(L5D_ORIG_PROTO, value)
                .header("x-app-header", "kept")
                .body(())
                .unwrap()
        };
        let mut req = upgraded("HTTP/1.1");
        assert!(downgrade_orig_proto(&mut req).unwrap());
        assert_eq!(req.version(), Version::HTTP_11);
        assert!(!req.headers().contains_key(L5D_ORIG_PROTO));
        assert_eq!(req.headers()[HOST], "web.shop.svc.cluster.local:8080");
        assert_eq!(req.headers()["x-app-header"], "kept");
        assert_eq!(req.uri().path_and_query().unwrap().as_str(), "/path?q=1");

        let mut req = upgraded("HTTP/1.0; absolute-form");
        assert!(downgrade_orig_proto(&mut req).unwrap());
        assert_eq!(req.version(), Version::HTTP_10);

        for bad in ["HTTP/2", "HTTP/1.1x", "h2c", ""] {
            let e = downgrade_orig_proto(&mut upgraded(bad)).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad:?}");
            assert!(e.message.contains("l5d-orig-proto"), "{}", e.message);
        }

        // Unmarked HTTP/2, and HTTP/1 (nothing to undo), stay as they are.
        let mut plain = Request::builder().version(Version::HTTP_2).uri("http://a/").body(()).unwrap();
        assert!(!downgrade_orig_proto(&mut plain).unwrap());
        assert_eq!(plain.version(), Version::HTTP_2);
        let mut h1 = upgraded("HTTP/1.1");
        *h1.version_mut() = Version::HTTP_11;
        assert!(!downgrade_orig_proto(&mut h1).unwrap());

        let mut res = Response::builder()
            .version(Version::HTTP_11)
            .header(TRANSFER_ENCODING, "chunked")
            .header("x-app", "yes")
            .body(())
            .unwrap();
        upgrade_orig_proto_response(&mut res);
        assert_eq!(res.version(), Version::HTTP_2);
        assert_eq!(res.headers()[L5D_ORIG_PROTO], "HTTP/1.1");
        assert!(!res.headers().contains_key(TRANSFER_ENCODING));
        assert_eq!(res.headers()["x-app"], "yes");
        let mut res = Response::builder().version(Version::HTTP_10).body(()).unwrap();
        upgrade_orig_proto_response(&mut res);
        assert_eq!(res.headers()[L5D_ORIG_PROTO], "HTTP/1.0");
    }
}
