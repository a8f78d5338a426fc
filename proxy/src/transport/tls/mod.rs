//! Mesh TLS on connections: terminating inbound mTLS addressed to our identity and originating
//! outbound mTLS to meshed endpoints.

pub mod client_hello;

/// Upper bound of an inbound TLS handshake once its ClientHello has arrived.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cnimesh_identity::Name;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use super::labels::TlsLabel;
use crate::transport::Io;
use crate::transport::identity::Identity;
use crate::transport::maybe_tls::MaybeTls;
use crate::transport::prefixed::PrefixedIo;
use client_hello::Peek;

/// A client connection after the inbound TLS decision.
pub type ClientIo<I> = MaybeTls<I, tokio_rustls::server::TlsStream<PrefixedIo<I>>>;
/// An upstream connection, mTLS or plain.
pub type UpstreamIo = MaybeTls<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;

pub enum Inbound<I> {
    /// Proceed with protocol detection; `prefix` holds bytes already read.
    Accepted { io: ClientIo<I>, prefix: Bytes, tls: TlsLabel },
    /// Not mTLS to us, and plaintext is not accepted here.
    Refused(&'static str),
    /// Neither a whole ClientHello nor any other decisive byte arrived within the wait (a
    /// silent client, or one dribbling a handshake); `prefix` holds what it did send.
    Undecided { io: I, prefix: Bytes },
}

/// Terminates mTLS when the ClientHello is addressed to our identity; anything else stays
/// plaintext (an application's own TLS included) unless `require_tls`.
pub async fn inbound<I: Io>(
    mut stream: I,
    identity: &Identity,
    wait: Duration,
    require_tls: bool,
) -> io::Result<Inbound<I>> {
    let (peek, prefix) = client_hello::read(&mut stream, wait).await?;
    match peek {
        Peek::ClientHello(Some(sni)) if sni == identity.name.as_str() => {
            let acceptor = tokio_rustls::TlsAcceptor::from(identity.server.clone());
            // Our SNI is public: a peer that sends it and then stalls must not hold the
            // connection (and its drain guard) forever.
            let handshake = acceptor.accept(PrefixedIo::new(prefix, stream));
            let tls = tokio::time::timeout(wait.max(HANDSHAKE_TIMEOUT), handshake)
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
            let client_id = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(cnimesh_identity::tls::identity_of);
            let label = TlsLabel { tls: true, client_id: client_id.map(|n| n.to_string()), server_id: None };
            Ok(Inbound::Accepted { io: MaybeTls::Tls(Box::new(tls)), prefix: Bytes::new(), tls: label })
        }
        _ if require_tls => Ok(Inbound::Refused("not mTLS to this proxy's identity")),
        Peek::NeedMore(_) => Ok(Inbound::Undecided { io: stream, prefix }),
        _ => Ok(Inbound::Accepted { io: MaybeTls::Plain(stream), prefix, tls: TlsLabel::plaintext() }),
    }
}

/// mTLS to one meshed endpoint.
#[derive(Clone)]
pub struct UpstreamTls {
    pub config: Arc<rustls::ClientConfig>,
    pub server_id: Name,
}

impl UpstreamTls {
    pub fn label(&self) -> TlsLabel {
        TlsLabel { tls: true, client_id: None, server_id: Some(self.server_id.to_string()) }
    }
}

/// Connects to `target`, within `timeout` for TCP and the handshake together.
pub async fn connect(target: SocketAddr, timeout: Duration, tls: Option<&UpstreamTls>) -> io::Result<UpstreamIo> {
    let connect = async {
        let tcp = crate::transport::tcp::connect(target, timeout).await?;
        let Some(tls) = tls else { return Ok(MaybeTls::Plain(tcp)) };
        let name = ServerName::try_from(tls.server_id.to_string()).map_err(io::Error::other)?;
        let stream = tokio_rustls::TlsConnector::from(tls.config.clone()).connect(name, tcp).await?;
        Ok(MaybeTls::Tls(Box::new(stream)))
    };
    tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("connect to {target} timed out")))?
}

/// Whether and how to secure an outbound connection to `target`.
pub fn outbound(identity: Option<&Identity>, expected: Option<Name>) -> Result<Option<UpstreamTls>, &'static str> {
    match (identity, expected) {
        (_, None) => Ok(None),
        // Without an identity of our own the server cannot authenticate us: plaintext.
        (None, Some(_)) => Ok(None),
        // Never downgrade a meshed endpoint to plaintext because we are not ready yet.
        (Some(id), Some(_)) if !id.has_cert() => Err("no certificate yet for mTLS to a meshed endpoint"),
        (Some(id), Some(server_id)) => Ok(Some(UpstreamTls { config: id.client.clone(), server_id })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn identity() -> Identity {
        Identity::without_certificate("web.shop.serviceaccount.identity.cnimesh.cluster.local")
    }

    #[tokio::test]
    async fn clients_without_a_whole_hello_in_time_are_undecided_not_plaintext() {
        let identity = identity();
        let wait = Duration::from_millis(200);
        let (_silent, server) = tokio::io::duplex(1024);
        let got = inbound(server, &identity, wait, false).await.unwrap();
        assert!(matches!(got, Inbound::Undecided { ref prefix, .. } if prefix.is_empty()));
        // A handshake record header, then nothing more: a ClientHello dribbled from its first byte.
        let (mut client, server) = tokio::io::duplex(1024);
        client.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await.unwrap();
        let got = inbound(server, &identity, wait, false).await.unwrap();
        assert!(matches!(got, Inbound::Undecided { ref prefix, .. } if prefix.len() == 6));
        // Plaintext is recognised at once; with mTLS required, the undecided are refused too.
        let (mut client, server) = tokio::io::duplex(1024);
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let got = inbound(server, &identity, Duration::from_secs(30), false).await.unwrap();
        assert!(matches!(got, Inbound::Accepted { io: MaybeTls::Plain(_), .. }));
        let (_silent, server) = tokio::io::duplex(1024);
        assert!(matches!(inbound(server, &identity, wait, true).await.unwrap(), Inbound::Refused(_)));
    }
}
