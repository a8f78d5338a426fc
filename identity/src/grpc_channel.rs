//! gRPC channels to the control plane: TLS, with the control plane's certificate checked against
//! our trust anchors and the identity it must prove, and our own workload certificate presented:
//! the control plane serves everything but Identity to mesh identities only. The channel
//! connects lazily and reconnects by itself; each call is bounded by the timeout.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::Name;
use crate::tls::CurrentCert;
use anyhow::Context;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tonic::transport::{Channel, Endpoint};

/// How long a connection attempt waits for our first certificate before it fails (and the
/// caller's retry tries again): within the endpoint's connect timeout.
const CERT_WAIT: Duration = Duration::from_secs(4);
const CERT_POLL: Duration = Duration::from_millis(20);

/// A channel to `addr` (`host:port`, resolved at each connect) expecting identity `name`,
/// presenting `cert` (the workload's current certificate, read at each handshake so that a
/// rotation is picked up by the next connection). `None` for Identity itself: a proxy has no
/// certificate when it first asks. `timeout` bounds unary calls; streams are long-lived and use
/// `None`. It connects lazily.
pub fn channel(
    addr: &str,
    name: &Name,
    roots: impl Into<crate::tls::Trust>,
    cert: Option<Arc<CurrentCert>>,
    timeout: Option<Duration>,
) -> anyhow::Result<Channel> {
    Ok(endpoint(timeout).connect_with_connector_lazy(connector(addr, name, roots, cert)?))
}

/// The same channel connected now, so that a failed resolution, connect or handshake (a wrong
/// identity) is an error at once: for the control plane's tests and benchmarks, which use this
/// builder too, so there is one.
pub async fn connect(
    addr: &str,
    name: &Name,
    roots: impl Into<crate::tls::Trust>,
    cert: Option<Arc<CurrentCert>>,
) -> anyhow::Result<Channel> {
    let connector = connector(addr, name, roots, cert)?;
    endpoint(None).connect_with_connector(connector).await.with_context(|| format!("connecting to {addr}"))
}

fn endpoint(timeout: Option<Duration>) -> Endpoint {
    let endpoint = Endpoint::from_static("http://cnimesh-control")
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    match timeout {
        Some(t) => endpoint.timeout(t),
        None => endpoint,
    }
}

/// TCP to `addr`, then TLS verifying `name` under `roots`, offering h2 and presenting `cert`.
/// With a `cert` that is still empty (the proxy's first Certify has not answered yet) the
/// connection waits for it: a connection made without it would be refused every call but
/// Certify for as long as it lives.
fn connector(
    addr: &str,
    name: &Name,
    roots: impl Into<crate::tls::Trust>,
    cert: Option<Arc<CurrentCert>>,
) -> anyhow::Result<
    impl tower::Service<
        http::Uri,
        Response = TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
        Error = io::Error,
        Future: Send,
    > + Clone
    + Send
    + 'static,
> {
    let resolver = cert.clone().map(|c| c as Arc<dyn rustls::client::ResolvesClientCert>);
    let tls = tokio_rustls::TlsConnector::from(crate::tls::client_config(roots, resolver, &[b"h2"])?);
    let addr = addr.to_string();
    let name = ServerName::try_from(name.to_string()).context("control-plane identity")?;
    Ok(tower::service_fn(move |_: http::Uri| {
        let (tls, addr, name, cert) = (tls.clone(), addr.clone(), name.clone(), cert.clone());
        async move {
            if let Some(cert) = cert {
                wait_for(&cert)
                    .await
                    .map_err(|e| io::Error::new(io::ErrorKind::NotConnected, format!("{addr}: {e}")))?;
            }
            let tcp = connect_tcp(&addr).await?;
            tcp.set_nodelay(true)?;
            let tls = tls
                .connect(name, tcp)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake with {addr}: {e}")))?;
            Ok::<_, io::Error>(TokioIo::new(tls))
        }
    }))
}

/// Waits (bounded) until `cert` holds a certificate.
async fn wait_for(cert: &CurrentCert) -> Result<(), &'static str> {
    let deadline = tokio::time::Instant::now() + CERT_WAIT;
    while cert.get().is_none() {
        if tokio::time::Instant::now() >= deadline {
            return Err("no workload certificate yet: the control plane answers this only to a mesh identity");
        }
        tokio::time::sleep(CERT_POLL).await;
    }
    Ok(())
}

/// Resolves `addr` and connects to the first address that answers. Each failure says which
/// step failed and for which address: tonic reports a failed connect only as `transport error`,
/// so this text (found in the error's sources) is all an operator gets to go on.
async fn connect_tcp(addr: &str) -> io::Result<tokio::net::TcpStream> {
    let resolved =
        tokio::net::lookup_host(addr).await.map_err(|e| io::Error::new(e.kind(), format!("resolving {addr}: {e}")))?;
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("resolving {addr}: no addresses"));
    for ip in resolved {
        match tokio::net::TcpStream::connect(ip).await {
            Ok(tcp) => return Ok(tcp),
            Err(e) if addr == ip.to_string() => last = io::Error::new(e.kind(), format!("connecting to {addr}: {e}")),
            Err(e) => last = io::Error::new(e.kind(), format!("connecting to {addr} ({ip}): {e}")),
        }
    }
    Err(last)
}

/// A failed control-plane call in full. tonic turns a connection failure into `Unknown:
/// transport error` and keeps the cause (resolution, connect, TLS) in the error's sources, so
/// those are walked and appended (skipping text already said).
pub fn describe(status: &tonic::Status) -> String {
    cnimesh_common::error::with_causes(format!("{:?}: {}", status.code(), status.message()), status)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Before its first Certify answer a proxy has no certificate; a Destination or policy
    /// connection made then would be refused every call for its whole life, so it is not made.
    #[tokio::test]
    async fn a_channel_that_presents_the_workload_certificate_waits_for_the_first_one_and_says_so() {
        let name: Name = crate::name::DEFAULT_CONTROL_NAME.parse().unwrap();
        let roots = Arc::new(rustls::RootCertStore::empty());
        let error = connect("127.0.0.1:1", &name, roots, Some(Arc::new(CurrentCert::default()))).await.unwrap_err();
        let error = format!("{error:#}");
        assert!(error.contains("no workload certificate yet"), "{error}");
    }
}
