//! The webhook's HTTPS endpoint: AdmissionReview v1 in, AdmissionReview out.
//!
//! Two paths, one per MutatingWebhookConfiguration entry. The API server evaluates each entry's
//! `namespaceSelector` against its own view of the namespace, so the path tells the webhook
//! whether the pod's namespace is labelled `cnimesh.io/inject=enabled` without the webhook ever
//! reading namespaces (no RBAC for it, no cache to go stale, no API call on the admission path).
//!
//! Layer: serving (the webhook's counterpart of the gRPC layer): HTTPS in, the pure mutation,
//! AdmissionReview out.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND};
use serde_json::Value;
use tokio::net::TcpListener;

use tokio::sync::watch;

use cnimesh_model::inject::{
    InjectConfig, InjectConfigError, NamespaceDefault, NamespaceInjection, ServerVersion, SidecarMode, mutate,
};

use super::namespaces::Namespaces;
use cnimesh_model::identity::issuer::IssuerRx;

/// Pods in namespaces labelled `cnimesh.io/inject=enabled`.
pub const INJECT_PATH: &str = "/inject";
/// Pods in every other namespace (injected only if annotated `cnimesh.io/inject: enabled`).
pub const OPT_IN_PATH: &str = "/inject/opt-in";
/// The API server caps objects at about 3 MiB; a review carries one object (old object: none
/// on CREATE) plus metadata.
pub const MAX_BODY: usize = 4 * 1024 * 1024;
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The webhook's state: a validated configuration, and what it learns while running (the API
/// server's version, the trust anchors), which the pure mutation gets as a resolved config.
#[derive(Debug)]
pub struct Webhook {
    config: InjectConfig,
    mode: SidecarMode,
    server: watch::Receiver<Option<ServerVersion>>,
    issuer: Option<IssuerRx>,
    namespaces: Option<Namespaces>,
}

/// A review ready to be answered: the request and its webhook path's namespace case.
enum Parsed {
    Request(Box<AdmissionRequest<DynamicObject>>, NamespaceInjection),
    /// Answered without a mutation (an object that does not parse).
    Answered(Box<AdmissionResponse>),
}

impl Webhook {
    /// A webhook that injects exactly `config` (its sidecar form and anchors fixed).
    pub fn new(config: InjectConfig) -> Result<Self, InjectConfigError> {
        config.validate()?;
        let mode = if config.native_sidecars { SidecarMode::Native } else { SidecarMode::Regular };
        Ok(Self { config, mode, server: watch::channel(None).1, issuer: None, namespaces: None })
    }

    /// Decide the sidecar form per `mode`, from the versions `server` reports (`auto`).
    pub fn with_sidecar_mode(mut self, mode: SidecarMode, server: watch::Receiver<Option<ServerVersion>>) -> Self {
        self.mode = mode;
        self.server = server;
        self
    }

    /// Hand proxies the anchors of the issuer the control plane signs with (reloaded with it).
    pub fn with_issuer_anchors(mut self, issuer: IssuerRx) -> Self {
        self.issuer = Some(issuer);
        self
    }

    /// Read each pod's namespace for its default-inbound-policy annotation. Without it the
    /// cluster setting stands for every unannotated pod (a webhook with no cluster to read).
    pub fn with_namespaces(mut self, namespaces: Namespaces) -> Self {
        self.namespaces = Some(namespaces);
        self
    }

    /// The configuration as of now: sidecar form for the current server, current anchors.
    pub fn config(&self) -> InjectConfig {
        let mut config = self.config.clone();
        config.native_sidecars = self.mode.native_for(*self.server.borrow());
        if let Some(issuer) = &self.issuer
            && let Some(issuer) = issuer.borrow().as_ref()
        {
            config.trust_anchors_pem = issuer.anchors_pem().to_string();
        }
        config
    }

    /// One AdmissionReview body for `path`: the review to answer with, or a client error. The
    /// namespace is not read (as without [`Webhook::with_namespaces`]): the served path uses
    /// [`Webhook::review_reading_namespace`].
    pub fn review(&self, path: &str, body: &[u8]) -> Result<Vec<u8>, (StatusCode, String)> {
        let response = match parse(path, body)? {
            Parsed::Request(request, namespace) => {
                mutate(&request, namespace, &NamespaceDefault::NotLooked, &self.config())
            }
            Parsed::Answered(response) => *response,
        };
        encode(response)
    }

    /// Like [`Webhook::review`], reading the pod's namespace first when there is a pod to inject
    /// and a namespace source: its default inbound policy, and its tracing settings, which go
    /// over the cluster's.
    pub async fn review_reading_namespace(&self, path: &str, body: &[u8]) -> Result<Vec<u8>, (StatusCode, String)> {
        let response = match parse(path, body)? {
            Parsed::Request(request, namespace) => {
                let (ns_default, ns_tracing) = match (&self.namespaces, request.namespace.as_deref()) {
                    (Some(source), Some(ns)) if is_pod_create(&request) => source.settings_of(ns).await,
                    _ => (NamespaceDefault::NotLooked, Default::default()),
                };
                let mut config = self.config();
                config.tracing = config.tracing.overridden_by(&ns_tracing);
                mutate(&request, namespace, &ns_default, &config)
            }
            Parsed::Answered(response) => *response,
        };
        encode(response)
    }
}

fn is_pod_create(request: &AdmissionRequest<DynamicObject>) -> bool {
    request.kind.group.is_empty()
        && request.kind.kind == "Pod"
        && request.operation == kube::core::admission::Operation::Create
}

fn parse(path: &str, body: &[u8]) -> Result<Parsed, (StatusCode, String)> {
    let namespace = match path {
        INJECT_PATH => NamespaceInjection::Enabled,
        OPT_IN_PATH => NamespaceInjection::NotEnabled,
        _ => return Err((StatusCode::NOT_FOUND, format!("no webhook at {path}; try {INJECT_PATH}"))),
    };
    match serde_json::from_slice::<AdmissionReview<DynamicObject>>(body) {
        Ok(review) => {
            if review.types.api_version != META_API_VERSION_V1 || review.types.kind != META_KIND {
                let found = format!("{} {}", review.types.api_version, review.types.kind);
                return Err(bad(format!("expected an {META_API_VERSION_V1} {META_KIND}, found {found}")));
            }
            let request: AdmissionRequest<DynamicObject> =
                review.try_into().map_err(|_| bad("the AdmissionReview has no request".into()))?;
            Ok(Parsed::Request(Box::new(request), namespace))
        }
        Err(error) => Ok(Parsed::Answered(Box::new(unreadable_object(body, &error)?))),
    }
}

fn encode(response: AdmissionResponse) -> Result<Vec<u8>, (StatusCode, String)> {
    encode_review(response).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the response: {e}")))
}

/// The AdmissionReview as admission.k8s.io/v1 defines it: `patch` is `[]byte`, which JSON
/// carries as base64. kube-core serialises its `Vec<u8>` as an array of numbers, which API
/// servers happen to accept but the schema does not promise.
fn encode_review(mut response: AdmissionResponse) -> serde_json::Result<Vec<u8>> {
    let patch = response.patch.take();
    let mut review = serde_json::to_value(response.into_review())?;
    if let (Some(patch), Some(Value::Object(out))) = (patch, review.get_mut("response")) {
        out.insert("patch".into(), serde_json::to_value(k8s_openapi::ByteString(patch))?);
    }
    serde_json::to_vec(&review)
}

fn bad(message: String) -> (StatusCode, String) {
    (StatusCode::BAD_REQUEST, message)
}

/// A review whose object does not parse (a field of an unexpected type, say) is still a review:
/// if its uid can be read, the pod is admitted unchanged with a warning instead of failing the
/// API server's call (which, under `failurePolicy: Fail`, would reject the pod).
fn unreadable_object(body: &[u8], error: &serde_json::Error) -> Result<AdmissionResponse, (StatusCode, String)> {
    let value: Value = serde_json::from_slice(body).map_err(|e| bad(format!("not JSON: {e}")))?;
    let is_v1_review = value.get("apiVersion").and_then(Value::as_str) == Some(META_API_VERSION_V1)
        && value.get("kind").and_then(Value::as_str) == Some(META_KIND);
    let uid = value.pointer("/request/uid").and_then(Value::as_str).filter(|_| is_v1_review);
    let uid = uid.ok_or_else(|| bad(format!("not an {META_API_VERSION_V1} {META_KIND}: {error}")))?;
    tracing::warn!(%uid, %error, "admitting an unreadable object unchanged");
    let mut response = AdmissionResponse::invalid("");
    response.uid = uid.to_string();
    response.allowed = true;
    response.result = Default::default();
    response.warnings = Some(vec![format!("cnimesh: proxy not injected: cannot read the object: {error}")]);
    Ok(response)
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(body.into()))
        .expect("a valid response")
}

async fn handle(webhook: &Webhook, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let text = |status, message: String| reply(status, "text/plain; charset=utf-8", format!("{message}\n"));
    if req.method() != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, format!("{} is not POST", req.method()));
    }
    let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !content_type.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json")) {
        return text(StatusCode::BAD_REQUEST, format!("content type {content_type:?} is not application/json"));
    }
    let path = req.uri().path().to_string();
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            return text(StatusCode::PAYLOAD_TOO_LARGE, format!("the body exceeds {MAX_BODY} bytes"));
        }
        Err(error) => return text(StatusCode::BAD_REQUEST, format!("reading the body: {error}")),
    };
    match webhook.review_reading_namespace(&path, &body).await {
        Ok(review) => reply(StatusCode::OK, "application/json", review),
        Err((status, message)) => {
            tracing::debug!(%path, %status, %message, "bad webhook request");
            text(status, message)
        }
    }
}

/// Serves the webhook over TLS on `listener` until `shutdown` resolves, then lets in-flight
/// reviews finish (up to 10 s).
pub async fn serve_webhook(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<Webhook>,
    shutdown: impl Future<Output = ()>,
) {
    crate::tls_accept::accept_tls(listener, tls, shutdown, "webhook", move |tls, peer, watcher| {
        let state = state.clone();
        async move {
            let service = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(handle(&state, req).await) }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(error) = watcher.watch(conn).await {
                tracing::debug!(%peer, %error, "webhook connection ended with an error");
            }
        }
    })
    .await
}
