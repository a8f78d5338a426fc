//! A server outside the mesh's networks (egress): a pod's netns on the test bridge
//! that also holds an address no cluster network covers (TEST-NET-3 by default), reached from a
//! client pod through a host route over the same bridge, as a node reaches the internet through
//! its gateway. It serves the test apps' HTTP there ([`crate::apps`]) and a real TLS server
//! with a certificate for a DNS name, signed by a private CA the client trusts.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio_rustls::rustls;

use crate::apps::Apps;
use crate::pod::Pod;

/// The outside server's address: TEST-NET-3, in no cluster network.
pub const OUTSIDE_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// The TLS server's port (443 is skipped by capture by default).
pub const TLS_PORT: u16 = 8443;
/// What the TLS server writes once the handshake is done.
pub const TLS_GREETING: &str = "hello over tls\n";

/// The outside server: its apps and its TLS listener, stopped when dropped.
pub struct Outside {
    _apps: Apps,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The private CA's certificate: what a client trusts.
    pub ca_pem: String,
}

impl Outside {
    /// Starts the apps and a TLS server for `names` on [`OUTSIDE_IP`] in `pod`, and routes that
    /// address from each of `clients` over the bridge.
    pub fn start(pod: &Pod<'_>, names: &[&str], clients: &[&Pod<'_>]) -> anyhow::Result<Self> {
        Self::start_at(pod, OUTSIDE_IP, names, clients)
    }

    /// Like [`Outside::start`], on the address `at` (another server outside, such as one an
    /// attacker runs).
    pub fn start_at(pod: &Pod<'_>, at: Ipv4Addr, names: &[&str], clients: &[&Pod<'_>]) -> anyhow::Result<Self> {
        let ip = at.to_string();
        pod.netns.exec("ip", &["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
        for client in clients {
            client.netns.exec("ip", &["route", "add", &format!("{ip}/32"), "dev", "eth0"])?;
        }
        let apps = Apps::start(&pod.netns.path(), IpAddr::V4(at), &pod.name)?;
        let ca = cnimesh_identity::ca::new_private_ca("outside-ca", Duration::from_secs(3600))?;
        let signer = cnimesh_identity::ca::Signer::new(&ca)?;
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let leaf = signer.new_server_cert(&names, Duration::from_secs(3600))?;
        let chain = cnimesh_identity::pem::certs(leaf.cert_pem.as_bytes(), "leaf")?;
        let key = cnimesh_identity::pem::key(leaf.key_pem.as_bytes(), "leaf key")?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = crate::netns::spawn_in(&pod.netns.path(), move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::bind(SocketAddr::new(IpAddr::V4(at), TLS_PORT)).await {
                    Ok(l) => l,
                    Err(e) => return drop(ready_tx.send(Err(e.to_string()))),
                };
                let _ = ready_tx.send(Ok(()));
                let serve = async {
                    while let Ok((tcp, _)) = listener.accept().await {
                        let acceptor = acceptor.clone();
                        tokio::spawn(async move {
                            if let Ok(mut tls) = acceptor.accept(tcp).await {
                                let _ = tls.write_all(TLS_GREETING.as_bytes()).await;
                                let _ = tls.shutdown().await;
                            }
                        });
                    }
                };
                tokio::select! {
                    () = serve => {}
                    _ = stopped => {}
                }
            });
        })?;
        ready_rx.recv()?.map_err(|e| anyhow::anyhow!("TLS server did not start: {e}"))?;
        Ok(Self { _apps: apps, stop: Some(stop), thread: Some(thread), ca_pem: ca.cert_pem })
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A TLS client in `netns`: connects to `addr`, handshakes with `sni` trusting `ca_pem` only,
/// and reads what the server says. `Err` when the handshake (or the connection) fails.
pub fn tls_in(netns: &Path, addr: SocketAddr, sni: &str, ca_pem: &str) -> anyhow::Result<String> {
    let anchors = cnimesh_identity::pem::certs(ca_pem.as_bytes(), "outside CA")?;
    let mut roots = rustls::RootCertStore::empty();
    for anchor in anchors {
        roots.add(anchor)?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(sni.to_string())?;
    cnimesh_cni::netns::run_in(netns, move || {
        let mut tcp = TcpStream::connect(addr)?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name)?;
        let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
        tls.flush()?;
        let mut got = String::new();
        match tls.read_to_string(&mut got) {
            Ok(_) => {}
            // The server's close_notify may race its FIN; what was read counts.
            Err(e) if !got.is_empty() && e.kind() == std::io::ErrorKind::UnexpectedEof => {}
            Err(e) => return Err(anyhow::Error::from(e)),
        }
        anyhow::ensure!(!got.is_empty(), "connection closed before the server spoke");
        Ok(got)
    })?
}
