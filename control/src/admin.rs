//! The admin listener: `/metrics` for Prometheus, `/ready` and `/live` for the kubelet, `/tap`
//! (the tap relay, [`crate::tap`]), `/destination.json?authority=<svc>.<ns>:<port>` (what
//! Destination's `Get` serves for it now, [`cnimesh_model::destination::read`]; `cnimesh diagnostics
//! endpoints` reads it through the API server's service proxy) and `/trust.json` (what this replica
//! signs with and serves, for `cnimesh check`: certificates only, never a key). Plain HTTP/1:
//! probes, scrapers and the API server's service proxy speak nothing else; nothing here is secret
//! but tap, which checks a token (endpoints and identities are what every meshed proxy is told anyway).
//!
//! Layer: runtime: the admin HTTP listener `serve` starts beside gRPC.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cnimesh_runtime::admin_http::serve_http;
use http::{Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use tokio::net::TcpListener;

use crate::tap::Relay;
use cnimesh_model::identity::IssuerRx;
use cnimesh_model::metrics::Metrics;

/// What the admin endpoints report on.
#[derive(Clone)]
pub struct AdminState {
    pub metrics: Arc<Metrics>,
    /// Ready once an issuer has loaded: before that every Certify would fail.
    pub issuer: IssuerRx,
    /// With Destination: ready once every kind of object has been loaded once (earlier answers
    /// could call an existing service unknown).
    pub index: Option<cnimesh_model::destination::Index>,
    /// `/tap`; `None`: 404 like any unknown path.
    pub tap: Option<Relay>,
    /// What `/destination.json` resolves with: the configuration the Destination service has.
    pub destination: Arc<cnimesh_model::destination::Config>,
    /// The webhook listener: `/trust.json` shakes hands with it to report the certificate it
    /// really serves (`cnimesh check` compares that with the caBundle).
    pub webhook_addr: Option<SocketAddr>,
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
    match cnimesh_model::destination::read::served(index, &authority, &state.destination) {
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
    serve_http(listener, shutdown, move |req: http::Request<hyper::body::Incoming>| {
        let state = state.clone();
        async move {
            match (&state.tap, req.uri().path()) {
                (Some(tap), "/tap") => tap.handle(req.headers(), req.uri().query()).await,
                (_, "/trust.json") => trust_json(&state).await.map(BodyExt::boxed_unsync),
                (_, path) => respond(&state, path, req.uri().query()).map(BodyExt::boxed_unsync),
            }
        }
    })
    .await
}

/// `/trust.json`: the issuer this replica signs with and the anchors it hands to proxies (as
/// loaded, not as stored), and the chain its webhook listener presents to a handshake now.
/// Certificates are base64 DER.
async fn trust_json(state: &AdminState) -> Response<Full<Bytes>> {
    let b64 = |der: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, der);
    let issuer = state.issuer.borrow().clone();
    let issuer = issuer.map(|i| {
        serde_json::json!({
            "chain": i.chain.iter().map(|c| b64(c)).collect::<Vec<_>>(),
            "anchors_pem": i.anchors_pem(),
        })
    });
    let webhook = match state.webhook_addr {
        None => serde_json::json!({"enabled": false}),
        Some(addr) => match served_chain(addr).await {
            Ok(chain) => {
                serde_json::json!({"enabled": true, "served": chain.iter().map(|c| b64(c)).collect::<Vec<_>>()})
            }
            Err(error) => serde_json::json!({"enabled": true, "error": error}),
        },
    };
    let body = serde_json::json!({"issuer": issuer, "webhook": webhook}).to_string();
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

/// The certificate chain the webhook listener at `addr` presents, from a real handshake over
/// loopback: what the API server gets, whatever the files or the Secret say.
async fn served_chain(addr: SocketAddr) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, String> {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let provider = cnimesh_identity::tls::provider();
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Recorder(provider.signature_verification_algorithms)))
        .with_no_client_auth();
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(SocketAddr::new(ip, addr.port())).await.map_err(|e| e.to_string())?;
        let name = rustls_pki_types::ServerName::try_from("cnimesh-webhook").map_err(|e| e.to_string())?;
        let tls =
            tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.map_err(|e| e.to_string())?;
        let chain =
            tls.get_ref().1.peer_certificates().unwrap_or_default().iter().map(|c| c.clone().into_owned()).collect();
        Ok(chain)
    };
    tokio::time::timeout(Duration::from_secs(5), handshake).await.map_err(|_| "handshake timed out".to_string())?
}

/// Accepts any server certificate (proving possession of its key): the handshake only reads
/// what is presented, `check` judges it against the caBundle, and nothing is sent over it.
#[derive(Debug)]
struct Recorder(rustls::crypto::WebPkiSupportedAlgorithms);

impl rustls::client::danger::ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &[rustls_pki_types::CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnimesh_model::destination::{Change, Index, Object};

    fn state(index: Option<Index>) -> AdminState {
        AdminState {
            metrics: Arc::default(),
            issuer: tokio::sync::watch::channel(None).1,
            index,
            tap: None,
            destination: Arc::default(),
            webhook_addr: None,
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
