//! The admin listener: `/metrics` for Prometheus, `/ready` and `/live` for the kubelet, `/tap`
//! (the tap relay, [`crate::tap`]) and `/destination.json?authority=<svc>.<ns>:<port>` (what
//! Destination's `Get` serves for it now, [`crate::destination::read`]; `cnimesh diagnostics
//! endpoints` reads it through the API server's service proxy). Plain HTTP/1: probes, scrapers and
//! the API server's service proxy speak nothing else; nothing here is secret but tap, which checks
//! a token (endpoints and identities are what every meshed proxy is told anyway).
//!
//! Layer: runtime: the admin HTTP listener `serve` starts beside gRPC.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::identity::IssuerRx;
use crate::metrics::Metrics;
use crate::tap::{AdminBody, Relay};

/// What the admin endpoints report on.
#[derive(Clone)]
pub struct AdminState {
    pub metrics: Arc<Metrics>,
    /// Ready once an issuer has loaded: before that every Certify would fail.
    pub issuer: IssuerRx,
    /// With Destination: ready once every kind of object has been loaded once (earlier answers
    /// could call an existing service unknown).
    pub index: Option<crate::destination::Index>,
    /// `/tap`; `None`: 404 like any unknown path.
    pub tap: Option<Relay>,
    /// What `/destination.json` resolves with: the configuration the Destination service has.
    pub destination: Arc<crate::destination::Config>,
}

/// `/destination.json`: the answer for `?authority=…`, 400 naming the bad authority, 503 without
/// Destination (no cluster source).
fn destination_page(state: &AdminState, query: Option<&str>) -> (StatusCode, &'static str, String) {
    let Some(index) = &state.index else {
        return (StatusCode::SERVICE_UNAVAILABLE, "text/plain", "Destination is not served here\n".into());
    };
    let authority = query.and_then(|q| {
        form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "authority").map(|(_, v)| v.into_owned())
    });
    let Some(authority) = authority else {
        return (StatusCode::BAD_REQUEST, "text/plain", "missing ?authority=<service>.<namespace>:<port>\n".into());
    };
    match crate::destination::read::served(index, &authority, &state.destination) {
        Ok(served) => (
            StatusCode::OK,
            "application/json",
            serde_json::to_string_pretty(&served).expect("the answer serialises") + "\n",
        ),
        Err(e) => (StatusCode::BAD_REQUEST, "text/plain", format!("{e}\n")),
    }
}

fn respond(state: &AdminState, path: &str, query: Option<&str>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/destination.json" => destination_page(state, query),
        "/metrics" => {
            (StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", state.metrics.encode())
        }
        "/live" => (StatusCode::OK, "text/plain", "live\n".into()),
        "/ready" if state.issuer.borrow().is_none() => {
            (StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready: no issuer loaded\n".into())
        }
        "/ready" if state.index.as_ref().is_some_and(|i| !i.is_ready()) => {
            (StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready: cluster state not loaded yet\n".into())
        }
        "/ready" => (StatusCode::OK, "text/plain", "ready\n".into()),
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    };
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

/// Serves the admin endpoints on `listener` until `shutdown` resolves.
pub async fn serve(listener: TcpListener, state: AdminState, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let state = state.clone();
                async move {
                    let response: Response<AdminBody> = match (&state.tap, req.uri().path()) {
                        (Some(tap), "/tap") => tap.handle(req.headers(), req.uri().query()).await,
                        (_, path) => respond(&state, path, req.uri().query()).map(BodyExt::boxed_unsync),
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destination::{Change, Index, Object};

    fn state(index: Option<Index>) -> AdminState {
        AdminState {
            metrics: Arc::default(),
            issuer: tokio::sync::watch::channel(None).1,
            index,
            tap: None,
            destination: Arc::default(),
        }
    }

    async fn body(response: Response<Full<Bytes>>) -> (StatusCode, String) {
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn the_destination_page_answers_an_authority_and_names_a_bad_one() {
        let index = Index::new();
        let web: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]},
        }))
        .unwrap();
        index.apply([Change::Upsert(Object::from(web))]);
        let state = state(Some(index));

        let (status, text) = body(respond(&state, "/destination.json", Some("authority=web.shop%3A80"))).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let page: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(page["service"], "web.shop.svc.cluster.local");
        assert_eq!(page["exists"], true);
        assert_eq!(page["endpoints"], serde_json::json!([]));

        let (status, text) = body(respond(&state, "/destination.json", Some("authority=web.shop"))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(text.contains("\"web.shop\""), "the bad authority is named: {text}");
        let (status, text) = body(respond(&state, "/destination.json", None)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(text.contains("authority"), "{text}");
    }

    #[tokio::test]
    async fn without_destination_the_page_says_so() {
        let (status, text) = body(respond(&state(None), "/destination.json", Some("authority=web.shop:80"))).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(text.contains("not served"), "{text}");
    }
}
