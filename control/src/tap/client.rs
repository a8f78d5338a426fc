//! The relay's side of `Tap/Observe`: a gRPC stream to one pod's proxy at `podIP:4191`, over
//! mTLS. The control plane presents its own certificate (the identity proxies let tap) and
//! checks that the proxy proves the identity of the pod's service account under the mesh's trust
//! anchors: an address that now belongs to another pod, or anything else listening there, does
//! not get to see (or feed) a tap.
//!
//! Layer: gRPC (client).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cnimesh_identity::Name;
use cnimesh_identity::tls::CurrentCert;
use hyper_util::rt::TokioIo;
use linkerd2_proxy_api::tap::tap_client::TapClient;
use linkerd2_proxy_api::tap::{ObserveRequest, TapEvent};
use rustls_pki_types::ServerName;
use tonic::transport::Endpoint;

/// A proxy that does not complete TCP and TLS in this time is reported, not waited for.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// TLS for tap connections: the control plane's certificate as the client's, the mesh's
/// anchors as roots. Built per tap, so anchors and certificate are current.
pub fn tls(roots: Arc<rustls::RootCertStore>, own: Arc<CurrentCert>) -> Result<tokio_rustls::TlsConnector, String> {
    let config = cnimesh_identity::tls::client_config(roots, Some(own), &[b"h2"]).map_err(|e| e.to_string())?;
    Ok(tokio_rustls::TlsConnector::from(config))
}

/// Opens `Observe` on the proxy at `addr`, which must prove `identity`.
pub async fn observe(
    tls: tokio_rustls::TlsConnector,
    addr: SocketAddr,
    identity: &Name,
    request: ObserveRequest,
) -> Result<tonic::Streaming<TapEvent>, String> {
    let name = ServerName::try_from(identity.to_string()).map_err(|e| format!("{identity}: {e}"))?;
    let connector = tower::service_fn(move |_: http::Uri| {
        let (tls, name) = (tls.clone(), name.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("connecting to {addr}: {e}")))?;
            tcp.set_nodelay(true)?;
            let tls = tls.connect(name, tcp).await.map_err(|e| {
                // A proxy without tap answers the ClientHello as plain HTTP.
                let hint = if e.to_string().contains("InvalidContentType") {
                    " (the admin port answered in plain text: does this proxy serve tap?)"
                } else {
                    ""
                };
                io::Error::new(e.kind(), format!("TLS handshake with {addr}: {e}{hint}"))
            })?;
            Ok::<_, io::Error>(TokioIo::new(tls))
        }
    });
    let endpoint = Endpoint::from_static("http://tap")
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    let channel = tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect_with_connector(connector))
        .await
        .map_err(|_| format!("{addr}: no TLS connection within {}s", CONNECT_TIMEOUT.as_secs()))?
        .map_err(|e| cnimesh_common::error::with_causes(format!("{addr}"), &e))?;
    let answer = TapClient::new(channel).observe(request).await.map_err(|status| {
        cnimesh_common::error::with_causes(
            format!("{addr}: Observe: {:?}: {}", status.code(), status.message()),
            &status,
        )
    })?;
    Ok(answer.into_inner())
}
