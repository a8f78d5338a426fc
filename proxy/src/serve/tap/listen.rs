//! Tap's side of the admin port: connections that open with a TLS ClientHello are mTLS with
//! this proxy's certificate (whatever the SNI), a client certificate from the mesh trust
//! anchors required and ALPN h2, then served by one gRPC server fed through a channel. Which
//! client identity may tap is decided per call ([`super::grpc`]), so a refused caller learns
//! why instead of seeing a failed handshake.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cnimesh_identity::Name;
use cnimesh_identity::tls::ClientAuth;
use linkerd2_proxy_api::tap::tap_server::TapServer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::grpc::{TapPeer, TapService};
use crate::http::tap::registry::Taps;
use crate::serve::metrics::Metrics;
use crate::transport::identity::Identity;
use crate::transport::prefixed::PrefixedIo;

/// Upper bound of a tap client's TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the gRPC server to take them.
const PENDING: usize = 16;

type Tls = tokio_rustls::server::TlsStream<PrefixedIo<TcpStream>>;

/// Where the admin server hands TLS connections.
pub struct TapListener {
    acceptor: tokio_rustls::TlsAcceptor,
    conns: mpsc::Sender<io::Result<TapConn>>,
}

impl TapListener {
    /// Starts the gRPC server for `identity`'s proxy; `allowed` are the client identities that
    /// may tap.
    pub fn start(
        identity: &Identity,
        allowed: Vec<Name>,
        taps: Arc<Taps>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let config = cnimesh_identity::tls::server_config(
            identity.roots.clone(),
            identity.cert.clone(),
            ClientAuth::Required,
            &[b"h2"],
        )?;
        let names: Vec<&str> = allowed.iter().map(Name::as_str).collect();
        tracing::info!(allowed = ?names, "tap served on the admin port over mTLS");
        let (conns, rx) = mpsc::channel(PENDING);
        let server = tonic::transport::Server::builder()
            .add_service(TapServer::new(TapService::new(taps, allowed, metrics)))
            .serve_with_incoming(tokio_stream::wrappers::ReceiverStream::new(rx));
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::warn!(error = %e, "the tap server stopped");
            }
        });
        Ok(Self { acceptor: tokio_rustls::TlsAcceptor::from(config), conns })
    }

    /// Completes the handshake of a connection whose first bytes (`io`'s prefix) were a
    /// ClientHello, and hands it to the gRPC server.
    pub async fn accept(&self, io: PrefixedIo<TcpStream>, addr: SocketAddr) {
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(io)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(%addr, error = %e, "tap handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%addr, "tap handshake timed out");
                return;
            }
        };
        let identity =
            tls.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(cnimesh_identity::tls::identity_of);
        let _ = self.conns.send(Ok(TapConn { tls, peer: TapPeer { addr, identity } })).await;
    }
}

/// A tap client's connection, with who it is for the gRPC requests on it.
pub struct TapConn {
    tls: Tls,
    peer: TapPeer,
}

impl tonic::transport::server::Connected for TapConn {
    type ConnectInfo = TapPeer;
    fn connect_info(&self) -> TapPeer {
        self.peer.clone()
    }
}

impl AsyncRead for TapConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for TapConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }
}
