//! The webhook's serving certificate when no control plane keeps it (`--webhook-certs files`,
//! every install without `ha`): `cnimesh upgrade` is its keeper. Upgrade reuses the Secret as it
//! is, except that it renews the certificate
//! - when it has passed 2/3 of its life (the point where the managed mode renews too);
//! - when the Secret holds the CA key the managed mode left there (a mesh that left `ha`) and
//!   the certificate is one of the managed mode's short ones: it is handed back, re-issued by
//!   that CA for an install's lifetime, so nobody has to renew it in 20 days;
//! - when the operator asks (`--renew-webhook-certificate`).
//!
//! A renewal never strands the API server: the webhook's `caBundle` always trusts the certificate
//! the running control plane still serves (it reloads the Secret a minute or so later) and the
//! new one. Either the kept CA signs the new certificate, or a new CA does and the old CAs stay
//! in the bundle until they expire. A Secret cert-manager keeps is left alone.

use std::time::{Duration, SystemTime};

use anyhow::Context;
use cnimesh_identity::ca::{CaPem, Signer};
use cnimesh_identity::pem::split_pem;
use cnimesh_identity::tls::{first_validity, past_two_thirds};
use cnimesh_model::inject::{DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_NAMESPACE, new_webhook_cert, webhook_dns_names};

use super::{Certificates, WEBHOOK_LIFETIME};

/// Who keeps the webhook Secret besides `cnimesh upgrade`, as the Secret says.
#[derive(Debug, Clone, Default)]
pub struct SecretKeeper {
    /// The CA key the managed mode keeps in the Secret (`issuer.crt`, `issuer.key`).
    pub managed_ca: Option<CaPem>,
    /// cert-manager's annotations are on the Secret: it renews, upgrade must not.
    pub cert_manager: bool,
}

/// What upgrade did to the webhook's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Reused byte for byte.
    Kept,
    /// Re-issued by the CA the caBundle already trusts.
    ByKeptCa,
    /// Re-issued by a new CA; the bundle holds it and the old CAs that have not expired.
    ByNewCa,
}

impl Renewal {
    /// The line upgrade prints on stderr when it renewed.
    pub fn notice(self) -> Option<&'static str> {
        match self {
            Renewal::Kept => None,
            Renewal::ByKeptCa => Some(
                "note: the webhook's serving certificate is renewed by its CA (the caBundle is unchanged); \
                 the control plane loads it from the Secret within about a minute",
            ),
            Renewal::ByNewCa => Some(
                "note: the webhook's serving certificate is renewed by a new CA; the caBundle trusts the new CA \
                 and the old one until it expires, so pod creation is never refused while the control plane reloads",
            ),
        }
    }
}

/// Renews `certs`' webhook certificate if it is due (see the module's doc), as of `now`.
pub fn renew(certs: &mut Certificates, keeper: &SecretKeeper, force: bool, now: SystemTime) -> anyhow::Result<Renewal> {
    if keeper.cert_manager && !force {
        return Ok(Renewal::Kept);
    }
    let left = |pem: &str| first_validity(pem).and_then(|(_, until)| until.duration_since(now).ok());
    let short = |pem: &str| left(pem).is_none_or(|left| left < WEBHOOK_LIFETIME / 3);
    let handed_back = keeper.managed_ca.is_some() && short(&certs.webhook_cert);
    if !force && !handed_back && !past_two_thirds(&certs.webhook_cert, now) {
        return Ok(Renewal::Kept);
    }
    let bundle = split_pem(&certs.webhook_ca);
    let names = webhook_dns_names(DEFAULT_CONTROL_NAMESPACE, DEFAULT_CLUSTER_DOMAIN);
    let trusted = |ca: &&CaPem| bundle.iter().any(|b| b.trim() == ca.cert_pem.trim());
    if let Some(ca) = keeper.managed_ca.as_ref().filter(trusted).filter(|ca| !short(&ca.cert_pem)) {
        let lifetime = left(&ca.cert_pem).unwrap_or_default().min(WEBHOOK_LIFETIME);
        let serving = Signer::new(ca)
            .and_then(|signer| signer.new_server_cert(&names, lifetime))
            .context("re-issuing the webhook's certificate with the CA its Secret holds")?;
        certs.webhook_cert = serving.cert_pem;
        certs.webhook_key = serving.key_pem;
        certs.webhook_ca = unexpired(&bundle, now).concat();
        return Ok(Renewal::ByKeptCa);
    }
    let fresh = new_webhook_cert(&names, WEBHOOK_LIFETIME).context("a new webhook certificate")?;
    let mut new_bundle = vec![ensure_newline(fresh.ca)];
    new_bundle.extend(unexpired(&bundle, now));
    certs.webhook_ca = new_bundle.concat();
    certs.webhook_cert = fresh.cert;
    certs.webhook_key = fresh.key;
    Ok(Renewal::ByNewCa)
}

/// The bundle's certificates still valid at `now`, each ending in a newline.
fn unexpired(bundle: &[String], now: SystemTime) -> Vec<String> {
    bundle
        .iter()
        .filter(|pem| first_validity(pem).is_some_and(|(_, until)| until > now + Duration::from_secs(60)))
        .cloned()
        .map(ensure_newline)
        .collect()
}

fn ensure_newline(mut pem: String) -> String {
    if !pem.ends_with('\n') {
        pem.push('\n');
    }
    pem
}

#[cfg(test)]
mod tests {
    use cnimesh_identity::ca::new_private_ca;
    use rustls::client::danger::ServerCertVerifier;

    use super::*;

    const DAY: Duration = Duration::from_secs(86400);

    /// The webhook's TLS as the API server checks it: `cert` for the webhook Service's name,
    /// verified against the caBundle `bundle`.
    fn verifies(bundle: &str, cert: &str) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        for der in cnimesh_identity::pem::certs(bundle.as_bytes(), "bundle").unwrap() {
            roots.add(der).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots.into(),
            cnimesh_identity::provider::provider(),
        )
        .build()
        .unwrap();
        let chain = cnimesh_identity::pem::certs(cert.as_bytes(), "cert").unwrap();
        let name = rustls_pki_types::ServerName::try_from(
            webhook_dns_names(DEFAULT_CONTROL_NAMESPACE, DEFAULT_CLUSTER_DOMAIN)[0].clone(),
        )
        .unwrap();
        verifier.verify_server_cert(&chain[0], &[], &name, &[], rustls_pki_types::UnixTime::now()).is_ok()
    }

    fn certs_signed_by(ca: &CaPem, lifetime: Duration) -> Certificates {
        let names = webhook_dns_names(DEFAULT_CONTROL_NAMESPACE, DEFAULT_CLUSTER_DOMAIN);
        let serving = Signer::new(ca).unwrap().new_server_cert(&names, lifetime).unwrap();
        Certificates {
            anchors: String::new(),
            issuer_cert: String::new(),
            issuer_key: String::new(),
            webhook_ca: ca.cert_pem.clone(),
            webhook_cert: serving.cert_pem,
            webhook_key: serving.key_pem,
        }
    }

    #[test]
    fn a_certificate_with_most_of_its_life_left_is_kept_byte_for_byte() {
        let ca = new_private_ca("cnimesh webhook CA", 365 * DAY).unwrap();
        let mut certs = certs_signed_by(&ca, 365 * DAY);
        let before = certs.clone();
        let renewal = renew(&mut certs, &SecretKeeper::default(), false, SystemTime::now()).unwrap();
        assert_eq!(renewal, Renewal::Kept);
        assert_eq!((certs.webhook_ca, certs.webhook_cert), (before.webhook_ca, before.webhook_cert));
    }

    #[test]
    fn a_due_certificate_is_renewed_by_a_new_ca_and_the_bundle_trusts_both_the_old_and_the_new() {
        let ca = new_private_ca("cnimesh webhook CA", 365 * DAY).unwrap();
        let mut certs = certs_signed_by(&ca, 365 * DAY);
        let old_cert = certs.webhook_cert.clone();
        let in_300_days = SystemTime::now() + 300 * DAY;
        let renewal = renew(&mut certs, &SecretKeeper::default(), false, in_300_days).unwrap();
        assert_eq!(renewal, Renewal::ByNewCa);
        assert_ne!(certs.webhook_cert, old_cert);
        assert_eq!(split_pem(&certs.webhook_ca).len(), 2, "new CA first, then the old one");
        assert!(verifies(&certs.webhook_ca, &old_cert), "the certificate still served until the reload");
        assert!(verifies(&certs.webhook_ca, &certs.webhook_cert), "the new certificate");
    }

    #[test]
    fn leaving_ha_hands_the_short_managed_certificate_back_re_issued_by_the_kept_ca_for_a_year() {
        let ca = new_private_ca("cnimesh webhook CA", 365 * DAY).unwrap();
        let mut certs = certs_signed_by(&ca, 30 * DAY);
        let keeper = SecretKeeper { managed_ca: Some(ca.clone()), cert_manager: false };
        let renewal = renew(&mut certs, &keeper, false, SystemTime::now()).unwrap();
        assert_eq!(renewal, Renewal::ByKeptCa);
        assert_eq!(certs.webhook_ca, ca.cert_pem, "the caBundle is unchanged");
        assert!(verifies(&certs.webhook_ca, &certs.webhook_cert));
        let (_, until) = first_validity(&certs.webhook_cert).unwrap();
        assert!(until > SystemTime::now() + 300 * DAY, "about the CA's remaining life, not 30 days");
        // The next upgrade keeps it.
        assert_eq!(renew(&mut certs, &keeper, false, SystemTime::now()).unwrap(), Renewal::Kept);
    }

    #[test]
    fn a_kept_ca_near_its_end_is_not_used_and_a_new_ca_joins_the_bundle() {
        let ca = new_private_ca("cnimesh webhook CA", 60 * DAY).unwrap();
        let mut certs = certs_signed_by(&ca, 30 * DAY);
        let old_cert = certs.webhook_cert.clone();
        let keeper = SecretKeeper { managed_ca: Some(ca), cert_manager: false };
        assert_eq!(renew(&mut certs, &keeper, false, SystemTime::now()).unwrap(), Renewal::ByNewCa);
        assert!(verifies(&certs.webhook_ca, &old_cert) && verifies(&certs.webhook_ca, &certs.webhook_cert));
    }

    #[test]
    fn expired_cas_leave_the_bundle_when_the_certificate_is_renewed() {
        let old = new_private_ca("old", 365 * DAY).unwrap();
        let current = new_private_ca("cnimesh webhook CA", 365 * DAY).unwrap();
        let mut certs = certs_signed_by(&current, 365 * DAY);
        certs.webhook_ca = format!("{}{}", current.cert_pem, old.cert_pem);
        // In 400 days both CAs have expired, so only the new one is left.
        let renewal = renew(&mut certs, &SecretKeeper::default(), false, SystemTime::now() + 400 * DAY).unwrap();
        assert_eq!(renewal, Renewal::ByNewCa);
        assert_eq!(split_pem(&certs.webhook_ca).len(), 1);
    }

    #[test]
    fn a_secret_cert_manager_keeps_is_left_alone_unless_the_operator_forces_it() {
        let ca = new_private_ca("cnimesh webhook CA", 90 * DAY).unwrap();
        let mut certs = certs_signed_by(&ca, 90 * DAY);
        let keeper = SecretKeeper { managed_ca: None, cert_manager: true };
        let in_80_days = SystemTime::now() + 80 * DAY;
        assert_eq!(renew(&mut certs, &keeper, false, in_80_days).unwrap(), Renewal::Kept);
        assert_eq!(renew(&mut certs, &keeper, true, SystemTime::now()).unwrap(), Renewal::ByNewCa);
    }

    #[test]
    fn a_ca_key_planted_in_the_secret_that_the_bundle_does_not_trust_is_never_used_or_added() {
        let ca = new_private_ca("cnimesh webhook CA", 365 * DAY).unwrap();
        let planted = new_private_ca("cnimesh webhook CA", 365 * DAY).unwrap();
        let mut certs = certs_signed_by(&ca, 30 * DAY);
        let keeper = SecretKeeper { managed_ca: Some(planted.clone()), cert_manager: false };
        assert_eq!(renew(&mut certs, &keeper, false, SystemTime::now()).unwrap(), Renewal::ByNewCa);
        assert!(!split_pem(&certs.webhook_ca).iter().any(|b| b.trim() == planted.cert_pem.trim()));
        assert!(!verifies(&planted.cert_pem, &certs.webhook_cert), "not signed by the planted key");
    }

    #[test]
    fn a_certificate_that_does_not_parse_is_replaced() {
        let ca = new_private_ca("cnimesh webhook CA", 365 * DAY).unwrap();
        let mut certs = certs_signed_by(&ca, 365 * DAY);
        certs.webhook_cert = "garbage".into();
        assert_eq!(renew(&mut certs, &SecretKeeper::default(), false, SystemTime::now()).unwrap(), Renewal::ByNewCa);
        assert!(verifies(&certs.webhook_ca, &certs.webhook_cert));
    }
}
