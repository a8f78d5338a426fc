//! The plain GETs `cnimesh stat` makes itself: a proxy's admin port (local mode) and Prometheus,
//! over `http://` or `https://`. A Prometheus behind TLS is verified against the system's roots
//! (`/etc/ssl/certs`, or `SSL_CERT_FILE`/`SSL_CERT_DIR`) and `--prometheus-ca`, for a private CA.
//!
//! Layer: runtime (operator CLI I/O).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};

/// Where Prometheus's HTTP API is: `http(s)://host[:port][/prefix]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    pub https: bool,
    /// `host[:port]`, as written (the Host header).
    pub authority: String,
    /// The host alone (the TLS server name), without IPv6 brackets.
    pub host: String,
    pub port: u16,
    /// The path prefix (`/prometheus` behind a reverse proxy), without a trailing slash.
    pub prefix: String,
}

impl BaseUrl {
    pub fn parse(url: &str) -> Result<Self, String> {
        let (https, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => return Err(format!("{url}: not an http:// or https:// URL")),
        };
        let (authority, prefix) = rest.split_once('/').map_or((rest, String::new()), |(a, p)| (a, format!("/{p}")));
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => {
                (host, port.parse().map_err(|_| format!("{url}: bad port {port:?}"))?)
            }
            _ => (authority, if https { 443 } else { 80 }),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("{url}: no host"));
        }
        Ok(Self {
            https,
            authority: authority.to_string(),
            host: host.to_string(),
            port,
            prefix: prefix.trim_end_matches('/').to_string(),
        })
    }
}

/// The TLS client for an `https://` Prometheus: the system's roots plus `extra_ca` (PEM).
pub fn tls_config(extra_ca: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    // Unreadable system certificates are skipped, as every TLS client does; none at all is an
    // error below only if no --prometheus-ca was given either.
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = extra_ca {
        let pem = std::fs::read(path).map_err(|e| format!("--prometheus-ca {}: {e}", path.display()))?;
        let certs = cnimesh_identity::pem::certs(&pem, &format!("--prometheus-ca {}", path.display()))
            .map_err(|e| e.to_string())?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(format!("--prometheus-ca {}: no usable CA certificate", path.display()));
        }
    }
    if roots.is_empty() {
        return Err("no CA certificates: none in the system store and no --prometheus-ca".into());
    }
    let mut config = ClientConfig::builder_with_provider(cnimesh_identity::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// GET `path` over plain HTTP/1.1 from `addr` (a proxy's admin port).
pub async fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<String, String> {
    let fetch = async {
        let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connecting to {addr}: {e}"))?;
        get_over(stream, &addr.to_string(), path).await
    };
    tokio::time::timeout(timeout, fetch).await.unwrap_or_else(|_| Err(no_answer(&addr.to_string(), path, timeout)))
}

/// GET `path` from `base` (plain or TLS, by its scheme); `tls` is required for `https://`.
pub async fn url_get(
    base: &BaseUrl,
    tls: Option<&Arc<ClientConfig>>,
    path: &str,
    timeout: Duration,
) -> Result<String, String> {
    let fetch = async {
        let addr = tokio::net::lookup_host((base.host.as_str(), base.port))
            .await
            .map_err(|e| format!("resolving {}: {e}", base.host))?
            .next()
            .ok_or_else(|| format!("{} resolves to nothing", base.host))?;
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting to {} ({addr}): {e}", base.authority))?;
        if !base.https {
            return get_over(stream, &base.authority, path).await;
        }
        let config = tls.ok_or_else(|| format!("{}: https needs a TLS configuration", base.authority))?;
        let name = ServerName::try_from(base.host.clone()).map_err(|e| format!("{}: {e}", base.host))?;
        let stream = tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, stream)
            .await
            .map_err(|e| format!("TLS to {}: {e}", base.authority))?;
        get_over(stream, &base.authority, path).await
    };
    tokio::time::timeout(timeout, fetch).await.unwrap_or_else(|_| Err(no_answer(&base.authority, path, timeout)))
}

fn no_answer(authority: &str, path: &str, timeout: Duration) -> String {
    format!("{authority}{path}: no answer within {}s", timeout.as_secs())
}

/// One HTTP/1.1 GET on an open connection: the body of a 2xx answer, or why not.
async fn get_over<IO>(io: IO, authority: &str, path: &str) -> Result<String, String>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(|e| format!("{authority}: {e}"))?;
    tokio::spawn(conn);
    let request = http::Request::get(path)
        .header(http::header::HOST, authority)
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| format!("{authority}{path}: {e}"))?;
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map_err(|e| format!("{authority}{path}: {e}"))?
        .to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    if !status.is_success() {
        return Err(format!("{authority}{path}: HTTP {status}: {}", body.trim()));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_scheme_port_and_prefix() {
        let u = BaseUrl::parse("https://prom.example:9443/prometheus/").unwrap();
        assert_eq!((u.https, u.host.as_str(), u.port, u.prefix.as_str()), (true, "prom.example", 9443, "/prometheus"));
        assert_eq!(u.authority, "prom.example:9443");
        let u = BaseUrl::parse("http://10.0.0.1").unwrap();
        assert_eq!((u.https, u.port, u.prefix.as_str()), (false, 80, ""));
        assert_eq!(BaseUrl::parse("https://[fd00::1]").unwrap().host, "fd00::1");
        assert_eq!(BaseUrl::parse("https://[fd00::1]:9090").unwrap().port, 9090);
        assert!(BaseUrl::parse("ftp://x").unwrap_err().contains("not an http"));
        assert!(BaseUrl::parse("http://x:port").unwrap_err().contains("bad port"));
    }

    /// An `https://` Prometheus with a private CA: verified with --prometheus-ca, refused without.
    #[tokio::test]
    async fn https_is_verified_against_the_given_ca() {
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.cert.pem()).unwrap();
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(ca.signing_key.serialize_der().into());
        let server = rustls::ServerConfig::builder_with_provider(cnimesh_identity::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![ca.cert.der().clone()], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                        let body = format!("{{\"path\":\"{}\"}}", req.uri());
                        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(body),
                        )))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        let base = BaseUrl::parse(&format!("https://localhost:{port}/prom")).unwrap();
        let timeout = Duration::from_secs(10);
        let tls = tls_config(Some(&ca_file)).unwrap();
        let body = url_get(&base, Some(&tls), "/prom/api/v1/query?query=up", timeout).await.unwrap();
        assert_eq!(body, r#"{"path":"/prom/api/v1/query?query=up"}"#);
        match tls_config(None) {
            Ok(system_only) => {
                let e = url_get(&base, Some(&system_only), "/", timeout).await.unwrap_err();
                assert!(e.contains("TLS to localhost"), "{e}");
            }
            Err(e) => assert!(e.contains("no CA certificates"), "{e}"),
        }
        assert!(tls_config(Some(&dir.path().join("missing.pem"))).unwrap_err().contains("missing.pem"));
    }
}
