//! Serving over HTTPS on 127.0.0.1 (never another address: the server has no authorization
//! beyond its token), with a certificate for `127.0.0.1` from a CA of its own, and the kubeconfig
//! that reaches it (the CA inline, a bearer token), written 0600 when written to a file.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http::Request;
use http_body_util::BodyExt;

use crate::ClusterApi;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("binding 127.0.0.1:0: {0}")]
    Bind(#[source] io::Error),
    #[error("the server's certificate: {0}")]
    Certificate(String),
}

/// A server listening on 127.0.0.1 for a [`ClusterApi`]; stops (connections too) when dropped.
pub struct Served {
    pub addr: SocketAddr,
    /// The CA its certificate chains to (PEM).
    pub ca_pem: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Served {
    /// `https://127.0.0.1:PORT`.
    pub fn server(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// A kubeconfig for this server as `cluster`, authenticating with `token`: what `cnimesh
    /// multicluster link` writes (the server, its CA inline, a token).
    pub fn kubeconfig(&self, cluster: &str, token: &str) -> String {
        self.kubeconfig_with_user(cluster, &format!("token: {token}"))
    }

    /// The same with the user's fields given as YAML (indented under `user:` by this function).
    pub fn kubeconfig_with_user(&self, cluster: &str, user: &str) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let user: String = user.lines().map(|l| format!("    {l}\n")).collect();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\ncontexts:\n- name: {cluster}\n  context:\n    cluster: {cluster}\n    user: mirror\ncurrent-context: {cluster}\nusers:\n- name: mirror\n  user:\n{user}",
            self.server()
        )
    }

    /// Writes [`Served::kubeconfig`] to `path`, readable by its owner only (it holds the token).
    pub fn write_kubeconfig(&self, path: &Path, cluster: &str, token: &str) -> io::Result<()> {
        cnimesh_common::fs::write_atomic(path, self.kubeconfig(cluster, token).as_bytes(), Some(0o600))
    }
}

/// A TLS acceptor for `127.0.0.1` and the CA (PEM) its certificate chains to.
fn tls_for_loopback() -> Result<(tokio_rustls::TlsAcceptor, String), ServeError> {
    use cnimesh_identity::ca;
    let bad = |e: &dyn std::fmt::Display| ServeError::Certificate(e.to_string());
    let lifetime = Duration::from_secs(24 * 3600);
    let authority = ca::new_private_ca("cnimesh-apiserver", lifetime).map_err(|e| bad(&e))?;
    let leaf = ca::Signer::new(&authority)
        .and_then(|s| s.new_server_cert(&["127.0.0.1".to_string()], lifetime))
        .map_err(|e| bad(&e))?;
    let chain =
        cnimesh_identity::pem::certs(leaf.cert_pem.as_bytes(), "the server's certificate").map_err(|e| bad(&e))?;
    let key = cnimesh_identity::pem::key(leaf.key_pem.as_bytes(), "the server's key").map_err(|e| bad(&e))?;
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(cnimesh_identity::provider::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| bad(&e))?;
    Ok((tokio_rustls::TlsAcceptor::from(Arc::new(config)), authority.cert_pem))
}

/// Serves `api` over HTTP/1.1 in TLS on an ephemeral port of 127.0.0.1.
pub(crate) async fn serve(api: Arc<ClusterApi>) -> Result<Served, ServeError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(ServeError::Bind)?;
    let addr = listener.local_addr().map_err(ServeError::Bind)?;
    let (acceptor, ca_pem) = tls_for_loopback()?;
    let task = tokio::spawn(async move {
        // Held here so that aborting the accept loop ends its connections too.
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let api = api.clone();
            let acceptor = acceptor.clone();
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let api = api.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                    Ok::<_, Infallible>(api.handle(parts.method, &parts.uri, &parts.headers, bytes).await)
                }
            });
            connections.spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else { return };
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
            while connections.try_join_next().is_some() {}
        }
    });
    Ok(Served { addr, ca_pem, task })
}
