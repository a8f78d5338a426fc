//! The plain GETs `cnimesh stat` makes itself: a proxy's admin port (local mode) and Prometheus,
//! over `http://` or `https://`, with hyper-util's client and hyper-rustls: the URL is parsed by
//! `http`'s `Uri`, connections, TLS and HTTP/1 are the libraries'. A Prometheus behind TLS is
//! verified against the system's roots (`/etc/ssl/certs`, or `SSL_CERT_FILE`/`SSL_CERT_DIR`) and
//! `--prometheus-ca`, for a private CA; `https://user:password@host/` sends HTTP basic auth.
//!
//! Layer: commands' I/O.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::TokioExecutor;
use rustls::{ClientConfig, RootCertStore};

/// Where Prometheus's HTTP API is: `http(s)://[user:password@]host[:port][/prefix]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    pub https: bool,
    /// `host[:port]`, as written, without the user information (the Host header).
    pub authority: String,
    /// The host alone (the TLS server name), without IPv6 brackets.
    pub host: String,
    pub port: u16,
    /// The path prefix (`/prometheus` behind a reverse proxy), without a trailing slash.
    pub prefix: String,
    /// `Authorization: Basic …` from the URL's user information, if it has some.
    pub auth: Option<HeaderValue>,
}

impl BaseUrl {
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url.parse().map_err(|e: http::uri::InvalidUri| match e.to_string().as_str() {
            "invalid port" => format!("{url}: bad port"),
            reason => format!("{url}: {reason}"),
        })?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(format!("{url}: not an http:// or https:// URL")),
        };
        let authority = uri.authority().ok_or_else(|| format!("{url}: no host"))?;
        let (userinfo, host_port) = match authority.as_str().rsplit_once('@') {
            Some((userinfo, host_port)) => (Some(userinfo), host_port),
            None => (None, authority.as_str()),
        };
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("{url}: no host"));
        }
        // `Uri` takes `host:junk` and then has no port: that is a typo, not the default port.
        let port = &host_port[authority.host().len()..];
        if !port.is_empty() && authority.port_u16().is_none() {
            return Err(format!("{url}: bad port {:?}", &port[1..]));
        }
        Ok(Self {
            https,
            authority: host_port.to_string(),
            host: host.to_string(),
            port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
            prefix: uri.path().trim_end_matches('/').to_string(),
            auth: userinfo.map(basic_auth).transpose().map_err(|e| format!("{url}: {e}"))?,
        })
    }

    /// The absolute URI of `path_and_query` (which starts with the prefix) on this server.
    fn uri(&self, path_and_query: &str) -> Result<Uri, String> {
        let scheme = if self.https { "https" } else { "http" };
        let uri = format!("{scheme}://{}{path_and_query}", self.authority);
        uri.parse().map_err(|e| format!("{uri}: {e}"))
    }
}

/// `user:password` as written in a URL (percent-encoded) to a basic-auth header value, marked
/// sensitive so that it is never logged.
fn basic_auth(userinfo: &str) -> Result<HeaderValue, String> {
    use base64::Engine as _;
    let decoded = percent_encoding::percent_decode_str(userinfo).collect::<Vec<u8>>();
    let token = base64::engine::general_purpose::STANDARD.encode(decoded);
    let mut value =
        HeaderValue::try_from(format!("Basic {token}")).map_err(|e| format!("the user information: {e}"))?;
    value.set_sensitive(true);
    Ok(value)
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
    let config = ClientConfig::builder_with_provider(cnimesh_identity::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // hyper-rustls offers the ALPN protocols of the HTTP versions it enables (HTTP/1.1 here).
    Ok(Arc::new(config))
}

/// GET `path` over plain HTTP/1.1 from `addr` (a proxy's admin port).
pub async fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<String, String> {
    let uri: Uri = format!("http://{addr}{path}").parse().map_err(|e| format!("{addr}{path}: {e}"))?;
    let client = Client::builder(TokioExecutor::new()).build_http();
    get(client, uri, None, &addr.to_string(), path, timeout).await
}

/// GET `path` from `base` (plain or TLS, by its scheme); `tls` is required for `https://`.
pub async fn url_get(
    base: &BaseUrl,
    tls: Option<&Arc<ClientConfig>>,
    path: &str,
    timeout: Duration,
) -> Result<String, String> {
    let uri = base.uri(path)?;
    let auth = base.auth.as_ref();
    if !base.https {
        let client = Client::builder(TokioExecutor::new()).build_http();
        return get(client, uri, auth, &base.authority, path, timeout).await;
    }
    let config = tls.ok_or_else(|| format!("{}: https needs a TLS configuration", base.authority))?;
    // The TCP connector under TLS sees the `https://` URI: it must not insist on `http://`.
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(ClientConfig::clone(config))
        .https_only()
        .enable_http1()
        .wrap_connector(tcp);
    let client = Client::builder(TokioExecutor::new()).build(connector);
    get(client, uri, auth, &base.authority, path, timeout).await
}

/// One GET: the body of a 2xx answer, or why not (no answer in time, the connection or TLS, a
/// status other than 2xx with the body that explains it).
async fn get<C>(
    client: Client<C, Empty<Bytes>>,
    uri: Uri,
    auth: Option<&HeaderValue>,
    authority: &str,
    path: &str,
    timeout: Duration,
) -> Result<String, String>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let mut request = http::Request::get(uri);
    if let Some(auth) = auth {
        request = request.header(http::header::AUTHORIZATION, auth.clone());
    }
    let request = request.body(Empty::new()).map_err(|e| e.to_string())?;
    let fetch = async {
        let response = client.request(request).await.map_err(|e| request_error(&e, authority, path))?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| format!("{authority}{path}: {e}"))?.to_bytes();
        let body = String::from_utf8_lossy(&body).into_owned();
        if !status.is_success() {
            return Err(format!("{authority}{path}: HTTP {status}: {}", body.trim()));
        }
        Ok(body)
    };
    tokio::time::timeout(timeout, fetch).await.unwrap_or_else(|_| Err(no_answer(authority, path, timeout)))
}

fn no_answer(authority: &str, path: &str, timeout: Duration) -> String {
    format!("{authority}{path}: no answer within {}s", timeout.as_secs())
}

/// The client's error with its causes, said as what failed: TLS, connecting, or the exchange.
fn request_error(error: &hyper_util::client::legacy::Error, authority: &str, path: &str) -> String {
    let mut causes = Vec::new();
    let mut tls = false;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        causes.push(e.to_string());
        // A TLS failure is a rustls::Error inside an io::Error (tokio-rustls) inside another
        // (hyper-rustls): io::Error's `source` skips what it wraps, so look inside by hand.
        let mut inner: &(dyn std::error::Error + 'static) = e;
        while let Some(wrapped) = inner.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            inner = wrapped;
        }
        tls |= inner.is::<rustls::Error>();
        next = e.source();
    }
    let causes = causes.join(": ");
    match (tls, error.is_connect()) {
        (true, _) => format!("TLS to {authority}: {causes}"),
        (false, true) => format!("connecting to {authority}: {causes}"),
        (false, false) => format!("{authority}{path}: {causes}"),
    }
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

    #[test]
    fn user_information_becomes_basic_auth_and_leaves_the_authority() {
        let u = BaseUrl::parse("https://ops:p%40ss@prom.example/prometheus").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.host.as_str(), u.prefix.as_str()),
            ("prom.example", "prom.example", "/prometheus")
        );
        let auth = u.auth.unwrap();
        assert_eq!(auth, "Basic b3BzOnBAc3M=");
        assert!(auth.is_sensitive());
        assert_eq!(BaseUrl::parse("http://prom.example").unwrap().auth, None);
    }

    /// A Prometheus behind basic auth: the URL's credentials are sent, and a refusal is reported
    /// with its status.
    #[tokio::test]
    async fn basic_auth_from_the_url_is_sent_and_a_refusal_names_its_status() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                        let authorized = req.headers().get(http::header::AUTHORIZATION)
                            == Some(&http::HeaderValue::from_static("Basic b3BzOnBAc3M="));
                        let mut response =
                            http::Response::new(http_body_util::Full::new(bytes::Bytes::from(if authorized {
                                "ok"
                            } else {
                                "who are you"
                            })));
                        if !authorized {
                            *response.status_mut() = http::StatusCode::UNAUTHORIZED;
                        }
                        Ok::<_, std::convert::Infallible>(response)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        let timeout = Duration::from_secs(10);
        let with = BaseUrl::parse(&format!("http://ops:p%40ss@127.0.0.1:{port}")).unwrap();
        assert_eq!(url_get(&with, None, "/api/v1/query?query=up", timeout).await.unwrap(), "ok");
        let without = BaseUrl::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let e = url_get(&without, None, "/api/v1/query?query=up", timeout).await.unwrap_err();
        assert!(e.contains("HTTP 401") && e.contains("who are you"), "{e}");
        let closed = BaseUrl::parse("http://127.0.0.1:1").unwrap();
        let e = url_get(&closed, None, "/", timeout).await.unwrap_err();
        assert!(e.contains("connecting to 127.0.0.1:1"), "{e}");
    }
}
