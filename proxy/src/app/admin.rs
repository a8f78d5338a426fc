//! The admin server (default 0.0.0.0:4191): `/metrics`, `/ready`, `/live`, `/proxy-log-level`
//! (GET shows, PUT sets, e.g. `cnimesh=debug`), `/shutdown` (POST, loopback peers only), and the
//! status pages `/env.json`, `/identity.json`, `/endpoints.json`, `/policy.json` (see [`status`]). The same port
//! serves tap ([`crate::http::tap`]): a connection that opens with a TLS ClientHello goes there,
//! anything else is plain HTTP (Prometheus scrapes, probes).

pub mod status;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

use crate::serve::drain::Drain;
use crate::serve::metrics::Metrics;
use crate::transport::prefixed::PrefixedIo;
use crate::transport::tls::client_hello::{self, Peek};

/// Changes the log filter at run time; returns the error for an invalid directive.
pub trait LogLevel: Send + Sync {
    fn get(&self) -> String;
    fn set(&self, directive: &str) -> Result<(), String>;
}

pub struct Admin {
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
    pub log: Box<dyn LogLevel>,
    pub drain: Drain,
    /// With an identity, not ready until a certificate is held.
    pub identity: Option<Arc<crate::transport::identity::Identity>>,
    /// For `/env.json`: the effective configuration and the (redacted) environment.
    pub config: crate::app::config::Config,
    pub env: Vec<(String, String)>,
    /// For `/endpoints.json`.
    pub discovery: Option<Arc<crate::client::discovery::Discovery>>,
    /// For `/policy.json`: the inbound policies enforced (none: every client allowed).
    pub policies: Option<Arc<crate::inbound::policy::discover::Policies>>,
    /// TLS connections go here; without it (no identity) they are closed.
    pub tap: Option<crate::serve::tap::TapListener>,
}

/// How long a connection may stay silent before it is served as plain HTTP anyway (hyper then
/// applies its own rules to it).
const PEEK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder().status(status).body(Full::new(body.into())).expect("valid response")
}

fn json_reply(value: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = reply(StatusCode::OK, serde_json::to_string_pretty(value).expect("JSON values serialise") + "\n");
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    r
}

impl Admin {
    async fn route(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
        match (req.method(), req.uri().path()) {
            (&Method::GET, "/metrics") => {
                let mut r = reply(StatusCode::OK, self.metrics.encode());
                r.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
                );
                r
            }
            (&Method::GET, "/live") => reply(StatusCode::OK, "live\n"),
            (&Method::GET, "/env.json") => json_reply(&status::env_json(&self.config, &self.env)),
            (&Method::GET, "/identity.json") => {
                json_reply(&status::identity_json(self.identity.as_deref(), std::time::SystemTime::now()))
            }
            (&Method::GET, "/endpoints.json") => json_reply(&status::endpoints_json(self.discovery.as_deref())),
            (&Method::GET, "/policy.json") => {
                json_reply(&status::policy_json(self.policies.as_deref(), std::time::SystemTime::now()))
            }
            (&Method::GET, "/ready") => {
                if !self.ready.load(Ordering::SeqCst) || self.drain.is_draining() {
                    reply(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                } else if self.identity.as_ref().is_some_and(|id| !id.has_cert()) {
                    reply(StatusCode::SERVICE_UNAVAILABLE, "not ready: no certificate yet\n")
                } else {
                    reply(StatusCode::OK, "ready\n")
                }
            }
            // The log level and shutdown are operator controls: loopback (kubectl exec,
            // port-forward) only; 4191 is reachable from other pods for /metrics.
            (_, "/proxy-log-level" | "/shutdown") if !peer.ip().is_loopback() => {
                reply(StatusCode::FORBIDDEN, "only accepted from localhost\n")
            }
            (&Method::GET, "/proxy-log-level") => reply(StatusCode::OK, format!("{}\n", self.log.get())),
            (&Method::PUT, "/proxy-log-level") => {
                let body = match Limited::new(req.into_body(), 4096).collect().await {
                    Ok(b) => b.to_bytes(),
                    Err(e) => return reply(StatusCode::BAD_REQUEST, format!("cannot read body: {e}\n")),
                };
                let directive = String::from_utf8_lossy(&body).trim().to_string();
                match self.log.set(&directive) {
                    Ok(()) => {
                        tracing::info!(directive, "log level changed");
                        reply(StatusCode::NO_CONTENT, "")
                    }
                    Err(e) => reply(StatusCode::BAD_REQUEST, format!("invalid log level {directive:?}: {e}\n")),
                }
            }
            (&Method::POST, "/shutdown") => {
                tracing::info!(%peer, "shutdown requested");
                self.drain.start();
                reply(StatusCode::OK, "shutting down\n")
            }
            (
                _,
                "/metrics" | "/live" | "/ready" | "/proxy-log-level" | "/shutdown" | "/env.json" | "/identity.json"
                | "/endpoints.json" | "/policy.json",
            ) => reply(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
            _ => reply(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    /// One admin connection: tap if it opens with a ClientHello, plain HTTP otherwise.
    async fn connection(self: Arc<Self>, mut stream: TcpStream, peer: SocketAddr) {
        let Ok((peek, prefix)) = client_hello::read(&mut stream, PEEK_WAIT).await else { return };
        let stream = PrefixedIo::new(prefix, stream);
        if let Peek::ClientHello(_) = peek {
            match &self.tap {
                Some(tap) => tap.accept(stream, peer).await,
                None => tracing::debug!(%peer, "TLS on the admin port refused: no identity, so no tap"),
            }
            return;
        }
        let service = service_fn(move |req| {
            let admin = self.clone();
            async move { Ok::<_, Infallible>(admin.route(req, peer).await) }
        });
        // Probes and operators' `nc` may half-close after the request: still answer them.
        let _ = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(TokioIo::new(stream), service)
            .await;
    }

    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                // e.g. EMFILE: back off instead of spinning.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            };
            let admin = self.clone();
            tokio::spawn(async move { admin.connection(stream, peer).await });
        }
    }
}
