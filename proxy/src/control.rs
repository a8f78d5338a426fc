//! gRPC channels to the control plane: TLS, with the control plane's certificate checked against
//! our trust anchors and the identity it must prove. The channel connects lazily and reconnects
//! by itself; each call is bounded by the timeout.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cnimesh_identity::Name;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tonic::transport::{Channel, Endpoint};

/// A channel to `addr` (`host:port`, resolved at each connect) expecting identity `name`.
/// `timeout` bounds unary calls; streams are long-lived and use `None`.
pub fn channel(
    addr: &str,
    name: &Name,
    roots: Arc<rustls::RootCertStore>,
    timeout: Option<Duration>,
) -> anyhow::Result<Channel> {
    let tls = tokio_rustls::TlsConnector::from(cnimesh_identity::tls::client_config(roots, None, &[b"h2"])?);
    let addr = addr.to_string();
    let name = ServerName::try_from(name.to_string()).context("control-plane identity")?;
    let connector = tower::service_fn(move |_: http::Uri| {
        let (tls, addr, name) = (tls.clone(), addr.clone(), name.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(&addr).await?;
            tcp.set_nodelay(true)?;
            Ok::<_, std::io::Error>(TokioIo::new(tls.connect(name, tcp).await?))
        }
    });
    let mut endpoint = Endpoint::from_static("http://cnimesh-control")
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    if let Some(t) = timeout {
        endpoint = endpoint.timeout(t);
    }
    Ok(endpoint.connect_with_connector_lazy(connector))
}
