//! The HTTP side: hyper's HTTP/1 server on the listener, the checks every request passes (who
//! sent it and with which token: [`Access`]; GET or HEAD only), then the page's files or the API.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::access::{Access, Admitted};
use super::api::{self, ApiError, Body, State};
use super::assets;

/// Serves connections forever; on the caller's [`tokio::task::LocalSet`] (the handlers' futures
/// borrow in ways the compiler cannot prove `Send`, and the CLI's runtime has one thread anyway).
pub async fn serve(listener: tokio::net::TcpListener, access: Access, state: State) -> anyhow::Result<()> {
    let access = Arc::new(access);
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
        let (state, access) = (state.clone(), access.clone());
        tokio::task::spawn_local(async move {
            let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                let (state, access) = (state.clone(), access.clone());
                async move { Ok::<_, Infallible>(handle(&state, &access, request).await) }
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
pub async fn handle<B>(state: &State, access: &Access, request: Request<B>) -> Response<Body> {
    match access.check(request.headers(), request.uri()) {
        Err(refused) => {
            tracing::info!("dashboard: refused {} {}: {refused}", request.method(), request.uri().path());
            return api::error_response(&refused.to_api_error());
        }
        Ok(Admitted::TradeToken { location, set_cookie }) => return trade_token(&location, &set_cookie),
        Ok(Admitted::Serve) => {}
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

/// The first load's answer: the cookie that stands for the token from now on, and the same URL
/// without the token (303, so the address bar and history keep no secret).
fn trade_token(location: &str, set_cookie: &str) -> Response<Body> {
    Response::builder()
        .status(StatusCode::SEE_OTHER)
        .header(http::header::LOCATION, location)
        .header(http::header::SET_COOKIE, set_cookie)
        .header(http::header::CACHE_CONTROL, "no-store")
        .header(http::header::REFERRER_POLICY, "no-referrer")
        .body(Full::new(Bytes::new()).boxed_unsync())
        .expect("a response")
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
