//! Serving over HTTPS, with a certificate from a CA of its own for the address served, and the
//! kubeconfig that reaches it (the CA inline, a bearer token), written 0600 when written to a file.
//! On 127.0.0.1 by default; on another address (a pod's, or local mode's bridge, so that processes
//! in other network namespaces reach it) only once a token is required, because the server has no
//! authorization beyond its token: without one, anyone who can reach the address is the cluster's
//! administrator.

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
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error(
        "refusing to serve on {0} without a required token: anyone who reaches it would be the cluster's administrator"
    )]
    Unauthenticated(SocketAddr),
    #[error("cannot serve on the unspecified address {0}: a kubeconfig must name the address its clients dial")]
    Unspecified(SocketAddr),
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
    /// `https://ADDR:PORT`.
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

/// A TLS acceptor for `ip` and the CA (PEM) its certificate chains to.
fn tls_for(ip: std::net::IpAddr) -> Result<(tokio_rustls::TlsAcceptor, String), ServeError> {
    use cnimesh_identity::ca;
    let bad = |e: &dyn std::fmt::Display| ServeError::Certificate(e.to_string());
    let lifetime = Duration::from_secs(24 * 3600);
    let authority = ca::new_private_ca("cnimesh-apiserver", lifetime).map_err(|e| bad(&e))?;
    let leaf = ca::Signer::new(&authority)
        .and_then(|s| s.new_server_cert(&[ip.to_string()], lifetime))
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

/// Serves `api` over HTTP/1.1 in TLS on `addr` (port 0: an ephemeral one), which must be a
/// loopback address unless `api` requires a token. The listening socket is made in the network
/// namespace of the calling thread.
pub(crate) async fn serve(api: Arc<ClusterApi>, addr: SocketAddr) -> Result<Served, ServeError> {
    check_address(&api, addr)?;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })?;
    serve_on(api, listener).await
}

/// Serves `api` on a socket bound elsewhere (in another network namespace, by a thread that
/// entered it), under the same rule as [`serve`].
pub(crate) async fn serve_listener(
    api: Arc<ClusterApi>,
    listener: std::net::TcpListener,
) -> Result<Served, ServeError> {
    let addr = listener.local_addr().map_err(|source| ServeError::Bind { addr: ([0, 0, 0, 0], 0).into(), source })?;
    check_address(&api, addr)?;
    let bind = |source| ServeError::Bind { addr, source };
    listener.set_nonblocking(true).map_err(bind)?;
    serve_on(api, tokio::net::TcpListener::from_std(listener).map_err(bind)?).await
}

/// A kubeconfig must name a dialable address, and an address other processes reach needs a token.
fn check_address(api: &ClusterApi, addr: SocketAddr) -> Result<(), ServeError> {
    if addr.ip().is_unspecified() {
        return Err(ServeError::Unspecified(addr));
    }
    if !addr.ip().is_loopback() && !api.requires_token() {
        return Err(ServeError::Unauthenticated(addr));
    }
    Ok(())
}

async fn serve_on(api: Arc<ClusterApi>, listener: tokio::net::TcpListener) -> Result<Served, ServeError> {
    let addr = listener.local_addr().map_err(|source| ServeError::Bind { addr: ([0, 0, 0, 0], 0).into(), source })?;
    let (acceptor, ca_pem) = tls_for(addr.ip())?;
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
