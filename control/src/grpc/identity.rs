//! `io.linkerd.proxy.identity.Identity/Certify`: a token and a CSR in, a leaf certificate out.
//!
//! Status codes, so that a proxy (and an operator reading its logs) can tell what to fix:
//! - `InvalidArgument`: the request itself is wrong (identity not one of our service-account
//!   names, CSR malformed or asking for more than the identity, oversized token). Retrying
//!   the same request cannot help.
//! - `Unauthenticated`: the token proves nothing (empty, unknown, expired, rejected by the API
//!   server).
//! - `PermissionDenied`: the token is valid but for another identity, audience or user kind; or
//!   the identity is one of the control plane's own ServiceAccounts, which Identity never serves
//!   ([`cnimesh_model::identity::reserved`]).
//! - `Unavailable`: our side (no issuer loaded yet, API server unreachable); retry later.
//! - `Internal`: signing failed.
//!
//! Three ways to prove who is asking ([`Proof`]):
//! - a service-account token (pods): TokenReview, as always;
//! - a join token (`cnimesh-join.v1.…`, an ExternalWorkload's first certificate): checked and used
//!   up in the control plane's namespace ([`JoinStore::consume`]): a token used before, expired or
//!   guessed is `Unauthenticated`, one for another workload or identity (or whose workload is
//!   gone, made again or revoked) `PermissionDenied`, a malformed one `InvalidArgument`;
//! - no token, and the connection's verified client certificate ([`PeerIdentity`]) naming the
//!   very identity asked for, for the very key of the CSR, that key bound by a join token's use
//!   to one ExternalWorkload which still exists with the same uid, is not revoked and holds that
//!   service account ([`JoinStore::renewable`]): an ExternalWorkload's proxy renewing. Any
//!   other certificate (a pod's, even of the same ServiceAccount; one of a workload revoked or
//!   made again) proves nothing here: `PermissionDenied`, so a pod's certificate never renews
//!   itself or mints another.
//!
//! Layer: gRPC: maps the identity model (issuer, tokens, CSR checks) to linkerd2-proxy-api's
//! Certify.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use cnimesh_identity::{Name, tls};
use linkerd2_proxy_api::identity::identity_server::{Identity, IdentityServer};
use linkerd2_proxy_api::identity::{CertifyRequest, CertifyResponse};
use rcgen::PublicKeyData;
use tonic::{Code, Request, Response, Status};

use cnimesh_model::external::join_store::JoinStore;
use cnimesh_model::identity::csr;
use cnimesh_model::identity::issuer::IssuerRx;
use cnimesh_model::identity::join::{self, JoinError, JoinToken};
use cnimesh_model::identity::tokens::{Authenticator, MAX_TOKEN_LEN, TokenError};
use cnimesh_model::identity::{Policy, Reserved};
use cnimesh_model::metrics::{CertifyResult, Metrics};

use super::peer::PeerIdentity;

/// Room for the largest token and CSR we accept, plus the identity and framing.
const MAX_REQUEST_LEN: usize = MAX_TOKEN_LEN + csr::MAX_CSR_LEN + 1024;

pub struct IdentityService {
    issuer: IssuerRx,
    authenticator: Arc<dyn Authenticator>,
    policy: Policy,
    reserved: Reserved,
    metrics: Arc<Metrics>,
    /// Join tokens and renewals of ExternalWorkloads; `None`: both refused.
    join: Option<JoinStore>,
}

/// What a Certify request proves its identity with.
enum Proof<'a> {
    /// A pod's projected service-account token.
    ServiceAccountToken(&'a [u8]),
    /// An ExternalWorkload's one-time join token.
    Join(JoinToken),
    /// No token: the verified client certificate of the connection, naming this identity.
    Certificate(PeerIdentity),
}

impl IdentityService {
    pub fn new(issuer: IssuerRx, authenticator: Arc<dyn Authenticator>, policy: Policy, metrics: Arc<Metrics>) -> Self {
        Self { issuer, authenticator, policy, reserved: Reserved::default(), metrics, join: None }
    }

    /// Serves ExternalWorkloads: join tokens and renewals with their certificates, checked
    /// against `store` (the control plane's namespace).
    pub fn with_join(mut self, store: JoinStore) -> Self {
        self.join = Some(store);
        self
    }

    /// Which ServiceAccounts are refused whatever their token ([`Reserved`]; by default the
    /// control plane's and the node agent's namespaces).
    pub fn with_reserved(mut self, reserved: Reserved) -> Self {
        self.reserved = reserved;
        self
    }

    /// The tonic service, ready for `Routes::add_service`. Requests are capped well below
    /// tonic's 4 MiB default: an honest one is a token and a CSR, a few KiB.
    pub fn into_server(self) -> IdentityServer<Self> {
        IdentityServer::new(self).max_decoding_message_size(MAX_REQUEST_LEN)
    }

    async fn handle(&self, req: CertifyRequest, peer: Option<PeerIdentity>) -> Result<CertifyResponse, Status> {
        let name = Name::parse(&req.identity).map_err(|e| Status::invalid_argument(format!("identity: {e}")))?;
        let (sa, ns) = name
            .service_account(&self.policy.trust_domain)
            .map_err(|e| Status::invalid_argument(format!("identity: {e}")))?;
        // Before the token is even reviewed: no token makes these accounts' identities ours to give.
        self.reserved.check(ns, sa).map_err(|e| Status::permission_denied(e.to_string()))?;
        if req.token.len() > MAX_TOKEN_LEN {
            return Err(Status::invalid_argument(format!(
                "the token is {} bytes, more than the {MAX_TOKEN_LEN} allowed",
                req.token.len()
            )));
        }
        let proof = if join::is_join_token(&req.token) {
            Proof::Join(JoinToken::parse(&req.token).map_err(|e| Status::invalid_argument(e.to_string()))?)
        } else if !req.token.trim_ascii().is_empty() {
            Proof::ServiceAccountToken(&req.token)
        } else if let Some(peer) = peer {
            Proof::Certificate(peer)
        } else {
            return Err(Status::unauthenticated("no token"));
        };
        // The CSR first: it is local work, while the token may cost an API server round trip.
        let csr = csr::validate(&req.certificate_signing_request, &name)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        match proof {
            Proof::ServiceAccountToken(token) => {
                let account = self.authenticator.authenticate(token).await.map_err(|e| match e {
                    TokenError::Unauthenticated(m) => Status::unauthenticated(m),
                    TokenError::Denied(m) => Status::permission_denied(m),
                    TokenError::Unavailable(m) => Status::unavailable(m),
                })?;
                if (account.namespace.as_str(), account.name.as_str()) != (ns, sa) {
                    return Err(Status::permission_denied(format!(
                        "the token is service account {}/{}'s, not {ns}/{sa}'s",
                        account.namespace, account.name
                    )));
                }
            }
            Proof::Join(token) => {
                let key = join::key_sha256(csr.public_key.der_bytes());
                self.join_store()?.consume(&token, ns, sa, &key).await.map_err(join_status)?;
                tracing::info!(identity = %name, workload = %format!("{}/{}", token.namespace, token.name), "join token used");
            }
            Proof::Certificate(peer) => {
                if peer.name != name {
                    return Err(Status::permission_denied(format!(
                        "the client certificate is {}'s: a certificate renews only its own identity, not {name}",
                        peer.name
                    )));
                }
                // The renewed certificate is for the key the workload joined with, so that it
                // renews in turn; a new key needs a new join.
                if join::key_sha256(csr.public_key.der_bytes()) != peer.key_sha256 {
                    return Err(Status::permission_denied(
                        "the CSR's key is not the client certificate's: a renewal keeps the key; a new key needs a new `cnimesh external-workload join`",
                    ));
                }
                let workload = self.join_store()?.renewable(ns, sa, &peer.key_sha256).await.map_err(join_status)?;
                tracing::info!(identity = %name, workload = %format!("{ns}/{workload}"), "renewal with the workload's certificate");
            }
        }

        let issuer = self.issuer.borrow().clone().ok_or_else(|| Status::unavailable("no issuer loaded yet"))?;
        let now = SystemTime::now();
        let leaf = issuer
            .signer
            .sign(&name, &csr.public_key, now - self.policy.clock_skew, now + self.policy.lifetime)
            .map_err(|e| Status::internal(format!("signing: {e}")))?;
        // The certificate's own notAfter (whole seconds, capped at the issuer's expiry) is what
        // peers will enforce, so that is what the proxy is told.
        let valid_until = tls::not_after(&leaf).map_err(|e| Status::internal(format!("issued certificate: {e}")))?;
        tracing::info!(
            identity = %name,
            serial = %serial_of(&leaf),
            expires_unix = cnimesh_model::identity::issuer::epoch_secs(valid_until),
            "certificate issued"
        );
        Ok(CertifyResponse {
            leaf_certificate: leaf.to_vec(),
            intermediate_certificates: issuer.chain.iter().map(|c| c.to_vec()).collect(),
            valid_until: Some(valid_until.into()),
        })
    }
}

impl IdentityService {
    fn join_store(&self) -> Result<&JoinStore, Status> {
        self.join.as_ref().ok_or_else(|| {
            Status::permission_denied("this control plane serves no ExternalWorkloads (join tokens and renewals)")
        })
    }
}

fn join_status(error: JoinError) -> Status {
    match error {
        JoinError::Malformed(m) => Status::invalid_argument(m),
        JoinError::Unauthenticated(m) => Status::unauthenticated(m),
        JoinError::Denied(m) => Status::permission_denied(m),
        JoinError::Unavailable(m) => Status::unavailable(m),
    }
}

fn serial_of(cert: &[u8]) -> String {
    x509_parser::parse_x509_certificate(cert).map(|(_, c)| c.raw_serial_as_string()).unwrap_or_default()
}

fn classify(result: &Result<CertifyResponse, Status>) -> CertifyResult {
    match result {
        Ok(_) => CertifyResult::Ok,
        Err(s) => match s.code() {
            Code::InvalidArgument => CertifyResult::Invalid,
            Code::Unauthenticated | Code::PermissionDenied => CertifyResult::Denied,
            _ => CertifyResult::Error,
        },
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn certify(&self, request: Request<CertifyRequest>) -> Result<Response<CertifyResponse>, Status> {
        let start = Instant::now();
        let identity = request.get_ref().identity.clone();
        let peer = request.extensions().get::<PeerIdentity>().cloned();
        let result = self.handle(request.into_inner(), peer).await;
        let outcome = classify(&result);
        self.metrics.certified(outcome, start.elapsed());
        if let Err(status) = &result {
            match outcome {
                CertifyResult::Error => {
                    tracing::error!(%identity, code = ?status.code(), message = status.message(), "certify failed")
                }
                _ => tracing::info!(%identity, code = ?status.code(), message = status.message(), "certify refused"),
            }
        }
        result.map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use cnimesh_model::identity::issuer::tests::write_pki;
    use cnimesh_model::identity::issuer::{Issuer, IssuerRx};
    use cnimesh_model::identity::tokens::tests::Known;
    use rustls_pki_types::CertificateDer;
    use tokio::sync::watch;

    struct Fixture {
        service: IdentityService,
        issuer: Arc<Issuer>,
        metrics: Arc<Metrics>,
        _pki: tempfile::TempDir,
    }

    fn fixture(lifetime: Duration, issuer_lifetime: Duration) -> Fixture {
        let pki = tempfile::tempdir().unwrap();
        write_pki(pki.path(), issuer_lifetime);
        let issuer = Arc::new(Issuer::load(pki.path()).unwrap());
        let (_tx, rx): (_, IssuerRx) = watch::channel(Some(issuer.clone()));
        let tokens = Known(vec![
            ("token-web", "shop", "web"),
            ("token-db", "shop", "db"),
            ("token-tap", "cnimesh", "cnimesh-tap"),
            ("token-grafana", "cnimesh", "grafana"),
        ]);
        let metrics = Arc::new(Metrics::default());
        let policy = Policy { trust_domain: "cluster.local".into(), lifetime, clock_skew: Duration::from_secs(20) };
        let service = IdentityService::new(rx, Arc::new(tokens), policy, metrics.clone());
        Fixture { service, issuer, metrics, _pki: pki }
    }

    fn web() -> Name {
        Name::for_service_account("web", "shop", "cluster.local").unwrap()
    }

    fn request(name: &Name, token: &str) -> CertifyRequest {
        let (_key, csr) = cnimesh_identity::ca::new_csr(name).unwrap();
        CertifyRequest { identity: name.to_string(), token: token.into(), certificate_signing_request: csr }
    }

    async fn certify(f: &Fixture, req: CertifyRequest) -> Result<CertifyResponse, Status> {
        f.service.certify(Request::new(req)).await.map(Response::into_inner)
    }

    #[tokio::test]
    async fn issues_a_leaf_that_chains_to_the_anchors_for_the_identity() {
        let f = fixture(Duration::from_secs(24 * 3600), Duration::from_secs(7 * 24 * 3600));
        let before = SystemTime::now();
        let rsp = certify(&f, request(&web(), "token-web\n")).await.unwrap();
        let leaf = CertificateDer::from(rsp.leaf_certificate.clone());
        let mut chain = vec![leaf.clone()];
        chain.extend(rsp.intermediate_certificates.iter().map(|c| CertificateDer::from(c.clone())));
        assert_eq!(rsp.intermediate_certificates, vec![f.issuer.signer.issuer_der.to_vec()]);
        tls::verify(f.issuer.roots.clone(), &chain, &web()).unwrap();
        assert_eq!(tls::identity_of(&leaf), Some(web()));

        // valid_until = now + lifetime (whole seconds), the same as the certificate says.
        let valid_until = SystemTime::try_from(rsp.valid_until.unwrap()).unwrap();
        assert_eq!(valid_until, tls::not_after(&leaf).unwrap());
        let lifetime = valid_until.duration_since(before).unwrap();
        assert!(lifetime.abs_diff(Duration::from_secs(24 * 3600)) <= Duration::from_secs(2), "{lifetime:?}");
        // not_before = now - skew.
        let (_, x509) = x509_parser::parse_x509_certificate(&leaf).unwrap();
        let not_before = x509.validity().not_before.timestamp();
        let now = before.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
        assert!((now - 20 - not_before).abs() <= 2, "not_before {not_before}, now {now}");
        assert_eq!(f.metrics.certify_count(CertifyResult::Ok), 1);
    }

    #[tokio::test]
    async fn a_valid_token_of_a_control_plane_service_account_is_refused_unless_allowed() {
        let mut f = fixture(Duration::from_secs(3600), Duration::from_secs(7200));
        let tap = Name::for_service_account("cnimesh-tap", "cnimesh", "cluster.local").unwrap();
        let status = certify(&f, request(&tap, "token-tap")).await.unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert!(status.message().contains("cnimesh/cnimesh-tap belongs to the control plane"), "{status:?}");
        assert_eq!(f.metrics.certify_count(CertifyResult::Denied), 1);

        let grafana = Name::for_service_account("grafana", "cnimesh", "cluster.local").unwrap();
        f.service = f.service.with_reserved(Reserved::default().allow("cnimesh", "grafana"));
        certify(&f, request(&grafana, "token-grafana")).await.expect("an allowed account is served");
        assert_eq!(certify(&f, request(&tap, "token-tap")).await.unwrap_err().code(), Code::PermissionDenied);
    }

    #[tokio::test]
    async fn caps_the_lifetime_at_the_issuers_expiry() {
        let f = fixture(Duration::from_secs(24 * 3600), Duration::from_secs(600));
        let rsp = certify(&f, request(&web(), "token-web")).await.unwrap();
        let valid_until = SystemTime::try_from(rsp.valid_until.unwrap()).unwrap();
        assert_eq!(valid_until, f.issuer.signer.issuer_not_after);
    }

    #[tokio::test]
    async fn seconds_long_lifetimes_work() {
        let f = fixture(Duration::from_secs(10), Duration::from_secs(3600));
        let before = SystemTime::now();
        let rsp = certify(&f, request(&web(), "token-web")).await.unwrap();
        let valid_until = SystemTime::try_from(rsp.valid_until.unwrap()).unwrap();
        let lifetime = valid_until.duration_since(before - Duration::from_secs(1)).unwrap();
        assert!((Duration::from_secs(9)..=Duration::from_secs(12)).contains(&lifetime), "{lifetime:?}");
    }

    #[tokio::test]
    async fn a_token_of_another_account_is_denied() {
        let f = fixture(Duration::from_secs(3600), Duration::from_secs(7200));
        let err = certify(&f, request(&web(), "token-db")).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{err}");
        assert!(err.message().contains("shop/db"), "{err}");
        let err = certify(&f, request(&web(), "nobody's")).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{err}");
        let err = certify(&f, request(&web(), "")).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{err}");
        assert_eq!(f.metrics.certify_count(CertifyResult::Denied), 3);
    }

    #[tokio::test]
    async fn bad_requests_are_invalid_arguments() {
        let f = fixture(Duration::from_secs(3600), Duration::from_secs(7200));
        let mut other_csr = request(&web(), "token-web");
        other_csr.certificate_signing_request =
            cnimesh_identity::ca::new_csr(&Name::for_service_account("db", "shop", "cluster.local").unwrap())
                .unwrap()
                .1;
        let not_sa = Name::parse("web.example.org").unwrap();
        let foreign_domain = Name::for_service_account("web", "shop", "example.org").unwrap();
        let cases = [
            other_csr,
            CertifyRequest { certificate_signing_request: vec![], ..request(&web(), "token-web") },
            CertifyRequest { certificate_signing_request: vec![0x30; 20_000], ..request(&web(), "token-web") },
            CertifyRequest { token: vec![b'x'; MAX_TOKEN_LEN + 1], ..request(&web(), "token-web") },
            CertifyRequest { identity: "Not A Name".into(), ..request(&web(), "token-web") },
            request(&not_sa, "token-web"),
            request(&foreign_domain, "token-web"),
        ];
        for req in cases {
            let err = certify(&f, req).await.unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        }
        assert_eq!(f.metrics.certify_count(CertifyResult::Invalid), 7);
        assert_eq!(f.metrics.certify_count(CertifyResult::Ok), 0);
    }

    #[tokio::test]
    async fn a_kube_token_of_another_account_is_denied() {
        use cnimesh_model::identity::kube_tokens::tests::{mocked, status};
        let mut f = fixture(Duration::from_secs(3600), Duration::from_secs(7200));
        let (tokens, _) = mocked(status("system:serviceaccount:shop:web", &[cnimesh_identity::TOKEN_AUDIENCE]));
        f.service.authenticator = Arc::new(tokens);
        certify(&f, request(&web(), "kube-token")).await.unwrap();
        let (tokens, _) = mocked(status("system:serviceaccount:shop:db", &[cnimesh_identity::TOKEN_AUDIENCE]));
        f.service.authenticator = Arc::new(tokens);
        let err = certify(&f, request(&web(), "kube-token")).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    }

    #[tokio::test]
    async fn without_an_issuer_it_is_unavailable() {
        let mut f = fixture(Duration::from_secs(3600), Duration::from_secs(7200));
        let (_tx, rx) = watch::channel(None);
        f.service.issuer = rx;
        let err = certify(&f, request(&web(), "token-web")).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
        assert_eq!(f.metrics.certify_count(CertifyResult::Error), 1);
    }
}
