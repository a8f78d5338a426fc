//! A tap client as the control plane's relay is one: a certificate for the control plane's
//! identity from its issuer, mTLS to a proxy's admin port (from inside the proxy's pod, on
//! loopback), and `Tap/Observe` on it. For the tap test and the tap benchmark.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use cnimesh_common::names::PROXY_ADMIN_PORT;
use cnimesh_model::identity::issuer::{ISSUER_CERT_FILE, ISSUER_KEY_FILE};
use hyper_util::rt::TokioIo;
use linkerd2_proxy_api::tap::observe_request::{self, r#match};
use linkerd2_proxy_api::tap::tap_client::TapClient;
use linkerd2_proxy_api::tap::{ObserveRequest, TapEvent};
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tonic::transport::Channel;

use crate::control::Control;

/// TLS presenting a certificate for `identity` signed by `control`'s issuer (as the control
/// plane's own certificate is), trusting the mesh anchors, offering h2.
pub fn client_tls(control: &Control, identity: &str) -> anyhow::Result<Arc<ClientConfig>> {
    let dir = control.issuer_dir();
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).with_context(|| format!("reading {f}"));
    let issuer = cnimesh_identity::ca::CaPem { cert_pem: read(ISSUER_CERT_FILE)?, key_pem: read(ISSUER_KEY_FILE)? };
    let signer = cnimesh_identity::ca::Signer::new(&issuer)?;
    let name: cnimesh_identity::Name = identity.parse()?;
    let (key, _csr) = cnimesh_identity::ca::new_csr(&name)?;
    let now = SystemTime::now();
    let leaf = signer.sign(&name, &key, now - Duration::from_secs(300), now + Duration::from_secs(3600))?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let cert = Arc::new(cnimesh_identity::tls::CurrentCert::default());
    cert.set(cnimesh_identity::tls::certified_key(vec![leaf, signer.issuer_der.clone()], key)?);
    let anchors = std::fs::read(control.trust_anchors())?;
    let roots = cnimesh_identity::tls::roots(&cnimesh_identity::pem::certs(&anchors, "trust anchors")?)?;
    Ok(cnimesh_identity::tls::client_config(roots, Some(cert), &[b"h2"])?)
}

/// A tap client to the proxy of the pod at `netns` (its admin port, on loopback inside the
/// pod), which must prove identity `proxy`. Each connection's socket is made inside the pod.
pub async fn connect(netns: &Path, tls: Arc<ClientConfig>, proxy: &str) -> anyhow::Result<TapClient<Channel>> {
    let connector = tokio_rustls::TlsConnector::from(tls);
    let name = ServerName::try_from(proxy.to_string())?;
    let netns: PathBuf = netns.to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://proxy")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let (connector, name, netns) = (connector.clone(), name.clone(), netns.clone());
            async move {
                let tcp = cnimesh_cni::netns::run_in(&netns, || {
                    std::net::TcpStream::connect(("127.0.0.1", PROXY_ADMIN_PORT))
                })
                .map_err(std::io::Error::other)??;
                tcp.set_nonblocking(true)?;
                let tls = connector.connect(name, tokio::net::TcpStream::from_std(tcp)?).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await?;
    Ok(TapClient::new(channel))
}

/// Observe every request, up to `limit`.
pub fn everything(limit: u32) -> ObserveRequest {
    let all = r#match::Match::All(r#match::Seq::default());
    ObserveRequest { limit, r#match: Some(observe_request::Match { r#match: Some(all) }), extract: None }
}

/// Reads `stream` to its end in the background, counting the events (the benchmark's tap
/// client: consumes everything, keeps nothing).
pub fn count(mut stream: tonic::Streaming<TapEvent>) -> Arc<AtomicU64> {
    let seen = Arc::new(AtomicU64::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok(Some(_)) = stream.message().await {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    seen
}
