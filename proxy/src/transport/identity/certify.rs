//! The Identity service client: gRPC (linkerd2-proxy-api `Identity/Certify`) over TLS, the
//! control plane's certificate checked against our trust anchors and its expected identity.

use std::time::{Duration, SystemTime};

use anyhow::Context;
use cnimesh_identity::Name;
use cnimesh_identity::tls::Trust;
use linkerd2_proxy_api::identity::CertifyRequest;
use linkerd2_proxy_api::identity::identity_client::IdentityClient;
use rustls_pki_types::CertificateDer;
use tonic::transport::Channel;

use super::config::IdentityConfig;

/// A channel to the Identity service. No client certificate: Certify is how a proxy gets its
/// first one, and the control plane serves it without (renewals need none either).
pub fn channel(config: &IdentityConfig, roots: impl Into<Trust>) -> anyhow::Result<Channel> {
    cnimesh_identity::grpc_channel::channel(
        &config.control_addr,
        &config.control_name,
        roots,
        None,
        Some(Duration::from_secs(10)),
    )
}

/// A channel to the Identity service presenting `cert` as client certificate while one is held:
/// an ExternalWorkload's renewal ([`super::external`]). One per attempt, so the handshake
/// presents the certificate held at that moment.
pub fn channel_presenting(
    config: &IdentityConfig,
    roots: impl Into<Trust>,
    cert: std::sync::Arc<cnimesh_identity::tls::CurrentCert>,
) -> anyhow::Result<Channel> {
    cnimesh_identity::grpc_channel::channel(
        &config.control_addr,
        &config.control_name,
        roots,
        Some(cert),
        Some(Duration::from_secs(10)),
    )
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
    roots: impl Into<Trust>,
    csr: &[u8],
) -> anyhow::Result<Issued> {
    let token = tokio::fs::read(&config.token_file)
        .await
        .with_context(|| format!("reading the service-account token {}", config.token_file.display()))?;
    certify_with(channel, config, roots, csr, token.trim_ascii().to_vec()).await
}

/// One Certify call proving who we are with `token` (a service-account token, a join token, or
/// nothing when the channel presents our certificate).
pub async fn certify_with(
    channel: Channel,
    config: &IdentityConfig,
    roots: impl Into<Trust>,
    csr: &[u8],
    token: Vec<u8>,
) -> anyhow::Result<Issued> {
    let request =
        CertifyRequest { identity: config.name.to_string(), token, certificate_signing_request: csr.to_vec() };
    let response = IdentityClient::new(channel)
        .certify(request)
        .await
        .map_err(|s| {
            anyhow::anyhow!("Certify at {}: {}", config.control_addr, cnimesh_identity::grpc_channel::describe(&s))
        })?
        .into_inner();
    let mut chain = vec![CertificateDer::from(response.leaf_certificate)];
    chain.extend(response.intermediate_certificates.into_iter().map(CertificateDer::from));
    check(&chain, &config.name, roots)?;
    let not_after = cnimesh_identity::tls::not_after(&chain[0])?;
    Ok(Issued { chain, not_after })
}

fn check(chain: &[CertificateDer<'static>], name: &Name, roots: impl Into<Trust>) -> anyhow::Result<()> {
    let named = cnimesh_identity::tls::identity_of(&chain[0]);
    anyhow::ensure!(named.as_ref() == Some(name), "the issued certificate names {named:?}, not {name}");
    cnimesh_identity::tls::verify(roots, chain, name).context("the issued certificate does not verify")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error of a Certify call to `control_addr`, where no control plane answers.
    async fn certify_error(control_addr: &str, case: &str) -> String {
        let token = std::env::temp_dir().join(format!("cnimesh-proxy-token-{}-{case}", std::process::id()));
        std::fs::write(&token, "token").unwrap();
        let config = IdentityConfig {
            name: "web.shop.serviceaccount.identity.cnimesh.cluster.local".parse().unwrap(),
            trust_anchors: crate::app::config::TrustAnchors::File("/nonexistent/ca.crt".into()),
            token_file: token.clone(),
            control_addr: control_addr.into(),
            control_name: crate::app::config::DEFAULT_CONTROL_NAME.parse().unwrap(),
            max_backoff: Duration::from_secs(1),
            external: None,
        };
        let roots = std::sync::Arc::new(rustls::RootCertStore::empty());
        let result = certify(channel(&config, roots.clone()).unwrap(), &config, roots, b"csr").await;
        let _ = std::fs::remove_file(token);
        format!("{:#}", result.err().expect("nothing answers there"))
    }

    #[tokio::test]
    async fn an_unresolvable_control_plane_is_named_with_the_resolution_error() {
        let e = certify_error("nonexistent.invalid:4190", "unresolvable").await;
        assert!(e.contains("nonexistent.invalid:4190"), "{e}");
        assert!(e.contains("resolving") && e.contains("failed to lookup"), "{e}");
    }

    #[tokio::test]
    async fn a_refusing_control_plane_is_named_with_the_connect_error() {
        // A port that was just free: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = certify_error(&format!("127.0.0.1:{port}"), "refused").await;
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
        assert!(e.contains("Connection refused"), "{e}");
    }
}
