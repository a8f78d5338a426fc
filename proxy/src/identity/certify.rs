//! The Identity service client: gRPC (linkerd2-proxy-api `Identity/Certify`) over TLS, the
//! control plane's certificate checked against our trust anchors and its expected identity.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use cnimesh_identity::Name;
use linkerd2_proxy_api::identity::CertifyRequest;
use linkerd2_proxy_api::identity::identity_client::IdentityClient;
use rustls_pki_types::CertificateDer;
use tonic::transport::Channel;

use crate::config::IdentityConfig;

/// A channel to the Identity service.
pub fn channel(config: &IdentityConfig, roots: Arc<rustls::RootCertStore>) -> anyhow::Result<Channel> {
    crate::control::channel(&config.control_addr, &config.control_name, roots, Some(Duration::from_secs(10)))
}

/// A certificate the control plane issued, checked.
pub struct Issued {
    pub chain: Vec<CertificateDer<'static>>,
    pub not_after: SystemTime,
}

/// One Certify call. The answer is checked before use: it must name us, chain to our anchors,
/// and match our key (checked when the caller builds the rustls key).
pub async fn certify(
    channel: Channel,
    config: &IdentityConfig,
    roots: Arc<rustls::RootCertStore>,
    csr: &[u8],
) -> anyhow::Result<Issued> {
    let token = tokio::fs::read(&config.token_file)
        .await
        .with_context(|| format!("reading the service-account token {}", config.token_file.display()))?;
    let request = CertifyRequest {
        identity: config.name.to_string(),
        token: token.trim_ascii().to_vec(),
        certificate_signing_request: csr.to_vec(),
    };
    let response = IdentityClient::new(channel)
        .certify(request)
        .await
        .map_err(|s| anyhow::anyhow!("Certify refused: {:?}: {}", s.code(), s.message()))?
        .into_inner();
    let mut chain = vec![CertificateDer::from(response.leaf_certificate)];
    chain.extend(response.intermediate_certificates.into_iter().map(CertificateDer::from));
    check(&chain, &config.name, roots)?;
    let not_after = cnimesh_identity::tls::not_after(&chain[0])?;
    Ok(Issued { chain, not_after })
}

fn check(chain: &[CertificateDer<'static>], name: &Name, roots: Arc<rustls::RootCertStore>) -> anyhow::Result<()> {
    let named = cnimesh_identity::tls::identity_of(&chain[0]);
    anyhow::ensure!(named.as_ref() == Some(name), "the issued certificate names {named:?}, not {name}");
    cnimesh_identity::tls::verify(roots, chain, name).context("the issued certificate does not verify")?;
    Ok(())
}
