//! The HTTP side: hyper's HTTP/1 server on the listener, the checks every request passes (GET or
//! HEAD only; a Host header naming the bound address or localhost, so that a page from another
//! origin that rebinds its DNS name to 127.0.0.1 is refused), then the page's files or the API.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::api::{self, ApiError, Body, State};
use super::assets;

/// The Host header values accepted: the bound address and localhost's names, with the port.
#[derive(Debug, Clone)]
pub struct Hosts(Vec<String>);

impl Hosts {
    pub fn for_address(bound: SocketAddr) -> Self {
        let port = bound.port();
        let mut hosts: Vec<String> =
            ["localhost", "127.0.0.1", "[::1]"].iter().map(|h| format!("{h}:{port}")).collect();
        if !bound.ip().is_unspecified() {
            hosts.push(bound.to_string());
        }
        if port == 80 {
            hosts.extend(["localhost".into(), "127.0.0.1".into(), "[::1]".into()]);
        }
        hosts.sort();
        hosts.dedup();
        Self(hosts)
    }

    fn allows(&self, host: &str) -> bool {
        self.0.iter().any(|h| h.eq_ignore_ascii_case(host))
    }
}

/// Serves connections forever; on the caller's [`tokio::task::LocalSet`] (the handlers' futures
/// borrow in ways the compiler cannot prove `Send`, and the CLI's runtime has one thread anyway).
pub async fn serve(listener: tokio::net::TcpListener, bound: SocketAddr, state: State) -> anyhow::Result<()> {
    let hosts = Arc::new(Hosts::for_address(bound));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors and the like: keep serving the connections there are.
                tracing::warn!("dashboard: accepting a connection: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let (state, hosts) = (state.clone(), hosts.clone());
        tokio::task::spawn_local(async move {
            let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                let (state, hosts) = (state.clone(), hosts.clone());
                async move { Ok::<_, Infallible>(handle(&state, &hosts, request).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                .await
            {
                tracing::debug!("dashboard: connection from {peer}: {e}");
            }
        });
    }
}

/// One request: the checks, then a file of the page or the API.
pub async fn handle<B>(state: &State, hosts: &Hosts, request: Request<B>) -> Response<Body> {
    let host = request.headers().get(http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    if !hosts.allows(host) {
        return api::error_response(
            &ApiError::new(StatusCode::FORBIDDEN, format!("Host {host:?} is not this dashboard's address"))
                .hint("open the URL `cnimesh dashboard` printed (this check stops DNS rebinding)"),
        );
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = api::error_response(&ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{}: the dashboard only reads (GET)", request.method()),
        ));
        response.headers_mut().insert(http::header::ALLOW, http::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let path = request.uri().path();
    match path.strip_prefix("/api/") {
        Some(api_path) => api::handle(state, api_path, request.uri().query()).await,
        None => asset(path),
    }
}

/// A file of the page, with headers that keep it to itself (no framing, no other origins).
fn asset(path: &str) -> Response<Body> {
    let Some((content_type, bytes)) = assets::get(path) else {
        return api::error_response(&ApiError::new(StatusCode::NOT_FOUND, format!("{path}: not found")));
    };
    Response::builder()
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::CACHE_CONTROL, "no-store")
        .header(http::header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header(http::header::X_FRAME_OPTIONS, "DENY")
        .header(http::header::REFERRER_POLICY, "no-referrer")
        .header(
            http::header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        )
        .body(Full::new(Bytes::from_static(bytes)).boxed_unsync())
        .expect("a response")
}
