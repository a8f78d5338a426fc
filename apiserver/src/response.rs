//! The answers: JSON bodies and the `Status` objects errors carry, as clients (kube-rs, kubectl)
//! read them to decide (404 NotFound, 409 Conflict/AlreadyExists, 401, 503).

use std::convert::Infallible;

use http::{Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};

/// The body of every answer: whole, or a watch's stream of lines.
pub type Body = BoxBody<Bytes, Infallible>;

pub(crate) fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response<Body> {
    let message = message.into();
    json_response(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": reason,
            "code": code.as_u16(), "message": message}),
    )
}

pub(crate) fn json_response(code: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("a valid response")
}

/// A plain-text answer, as a pod's `/metrics` page reaches a client through the pod proxy.
pub(crate) fn text_response(text: String) -> Response<Body> {
    Response::builder()
        .header("content-type", "text/plain; version=0.0.4")
        .body(Full::new(Bytes::from(text)).boxed())
        .expect("a valid response")
}
