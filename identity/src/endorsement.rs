//! Endorsed trust-anchor bundles. On a cluster the control plane copies its trust anchors into a
//! ConfigMap in every namespace, which injected proxies mount and re-read, so that rotating the
//! mesh's root needs no workload restart. A ConfigMap in a namespace can be written by anyone
//! granted ConfigMap write there; were proxies to trust what the file says, that grant would let
//! its holder add an anchor of their own and then impersonate any identity to that namespace's
//! proxies. So the bundle travels with an endorsement: the control plane's signature over it, by
//! the key of its own mesh certificate, with that certificate's chain. A proxy takes a new bundle
//! only when the chain verifies under the anchors it already trusts, names the control plane's
//! identity, and the signature verifies the bundle's bytes. The first anchors come from the pod's
//! environment, which only the injector writes.
//!
//! The endorsement is text: a line `signature ecdsa-p256-sha256 <hex>` (an ASN.1 ECDSA signature
//! over [`CONTEXT`], the signed-at line and the bundle's bytes), a line `signed-at <unix seconds>`,
//! then the signer's chain as PEM certificates, leaf first. The time lets a proxy refuse an older
//! endorsement than the one it took (a replayed bundle that still holds an anchor a rotation
//! dropped).

use std::time::{SystemTime, UNIX_EPOCH};

use rustls::SignatureScheme;
use rustls::sign::CertifiedKey;
use rustls_pki_types::CertificateDer;

use crate::Name;
use crate::anchors::Trust;
use crate::provider::provider;

/// What is signed before the bundle's bytes: a signature made for anything else never reads as
/// an endorsement.
pub const CONTEXT: &[u8] = b"cnimesh trust-anchor bundle endorsement v1\n";
/// The endorsement of a bundle file `F` is the file `F` + this, beside it (two keys of one
/// ConfigMap, which the kubelet swaps together).
pub const ENDORSEMENT_SUFFIX: &str = ".endorsement";
/// The one scheme: mesh certificates are ECDSA P-256.
const SCHEME: SignatureScheme = SignatureScheme::ECDSA_NISTP256_SHA256;
const SIGNATURE_PREFIX: &str = "signature ecdsa-p256-sha256 ";
const SIGNED_AT_PREFIX: &str = "signed-at ";
/// How far ahead of the verifier's clock a signing time may be (clocks of nodes differ a little).
/// Beyond it the endorsement is refused: taken, its time would make every honest later
/// endorsement look like a replay until that time passed.
pub const MAX_SKEW: std::time::Duration = std::time::Duration::from_secs(300);

/// Why an endorsement was not made or not accepted.
#[derive(Debug, thiserror::Error)]
pub enum EndorsementError {
    #[error("no `{}<hex>` line", SIGNATURE_PREFIX)]
    NoSignature,
    #[error("no `{}<unix seconds>` line", SIGNED_AT_PREFIX)]
    NoSignedAt,
    #[error("signed at {signed_at}, more than {}s ahead of this clock ({now})", MAX_SKEW.as_secs())]
    SignedInFuture { signed_at: u64, now: u64 },
    #[error("the signature is not hex")]
    SignatureNotHex,
    #[error("the signer's certificates: {0}")]
    Certificates(String),
    #[error("no signer certificate")]
    NoSigner,
    #[error("the signer is not {expected} under the anchors in force: {why}")]
    Signer { expected: String, why: String },
    #[error("the signature does not verify the bundle")]
    Signature,
    #[error("the key cannot sign with ECDSA P-256 SHA-256")]
    KeyScheme,
    #[error("signing: {0}")]
    Sign(String),
}

/// The endorsement of `bundle` by `key` (a mesh certificate's chain and key), made at `now`.
pub fn endorse(bundle: &[u8], key: &CertifiedKey, now: SystemTime) -> Result<String, EndorsementError> {
    let signed_at = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let signer = key.key.choose_scheme(&[SCHEME]).ok_or(EndorsementError::KeyScheme)?;
    let signature = signer.sign(&signed(signed_at, bundle)).map_err(|e| EndorsementError::Sign(e.to_string()))?;
    let mut text = format!("{SIGNATURE_PREFIX}{}\n{SIGNED_AT_PREFIX}{signed_at}\n", hex(&signature));
    for cert in key.cert.iter() {
        text.push_str(&pem("CERTIFICATE", cert));
    }
    Ok(text)
}

/// Accepts `bundle` when `endorsement` is `signer`'s signature over it, `signer`'s chain
/// verifying under `trusted` (the anchors in force, not the bundle's); returns when it was signed
/// (Unix seconds), refusing a time more than [`MAX_SKEW`] ahead of this clock.
pub fn verify(
    bundle: &[u8],
    endorsement: &[u8],
    trusted: impl Into<Trust>,
    signer: &Name,
) -> Result<u64, EndorsementError> {
    let text = std::str::from_utf8(endorsement).map_err(|_| EndorsementError::NoSignature)?;
    let line = |prefix: &str| text.lines().find_map(|line| line.trim().strip_prefix(prefix).map(str::trim));
    let signature = line(SIGNATURE_PREFIX).ok_or(EndorsementError::NoSignature)?;
    let signature = unhex(signature).ok_or(EndorsementError::SignatureNotHex)?;
    let signed_at: u64 = line(SIGNED_AT_PREFIX).and_then(|t| t.parse().ok()).ok_or(EndorsementError::NoSignedAt)?;
    let chain =
        crate::pem::certs(endorsement, "endorsement").map_err(|e| EndorsementError::Certificates(e.to_string()))?;
    let leaf = chain.first().ok_or(EndorsementError::NoSigner)?;
    crate::tls::verify(trusted, &chain, signer)
        .map_err(|e| EndorsementError::Signer { expected: signer.to_string(), why: e.to_string() })?;
    verify_signature(leaf, &signed(signed_at, bundle), &signature)?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    if signed_at > now.saturating_add(MAX_SKEW.as_secs()) {
        return Err(EndorsementError::SignedInFuture { signed_at, now });
    }
    Ok(signed_at)
}

fn signed(signed_at: u64, bundle: &[u8]) -> Vec<u8> {
    [CONTEXT, format!("{SIGNED_AT_PREFIX}{signed_at}\n").as_bytes(), bundle].concat()
}

/// `signature` over `message` by `leaf`'s public key, with the provider's verifier for the one
/// scheme.
fn verify_signature(leaf: &CertificateDer<'_>, message: &[u8], signature: &[u8]) -> Result<(), EndorsementError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(leaf).map_err(|e| EndorsementError::Certificates(e.to_string()))?;
    let public_key = &cert.tbs_certificate.subject_pki.subject_public_key.data;
    let algorithms = provider().signature_verification_algorithms;
    let candidates = algorithms.mapping.iter().find(|(scheme, _)| *scheme == SCHEME).map(|(_, algs)| *algs);
    let verified =
        candidates.unwrap_or_default().iter().any(|alg| alg.verify_signature(public_key, message, signature).is_ok());
    if verified { Ok(()) } else { Err(EndorsementError::Signature) }
}

fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut text = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        text.push_str(std::str::from_utf8(line).unwrap_or_default());
        text.push('\n');
    }
    text.push_str(&format!("-----END {label}-----\n"));
    text
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

    use super::*;
    use crate::ca::{CaPem, Signer, new_issuer, new_trust_anchor};
    use crate::tls;

    const HOUR: Duration = Duration::from_secs(3600);
    const CONTROL: &str = "cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local";

    /// A mesh certificate for `name` from `issuer` (under `anchor`), as the control plane issues
    /// its own.
    fn certified(issuer: &CaPem, name: &str) -> CertifiedKey {
        let signer = Signer::new(issuer).unwrap();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let now = SystemTime::now();
        let leaf = signer.sign(&Name::parse(name).unwrap(), &key, now - Duration::from_secs(60), now + HOUR).unwrap();
        let mut chain = vec![leaf];
        chain.extend(crate::pem::certs(issuer.cert_pem.as_bytes(), "issuer").unwrap());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Arc::unwrap_or_clone(tls::certified_key(chain, key).unwrap())
    }

    fn trusted(anchor: &CaPem) -> Arc<rustls::RootCertStore> {
        tls::roots(&crate::pem::certs(anchor.cert_pem.as_bytes(), "anchor").unwrap()).unwrap()
    }

    #[test]
    fn the_control_planes_endorsement_of_a_bundle_verifies_under_the_anchors_in_force() {
        let anchor = new_trust_anchor("cluster.local", HOUR).unwrap();
        let issuer = new_issuer(&anchor, "cluster.local", HOUR).unwrap();
        let control = certified(&issuer, CONTROL);
        let next = new_trust_anchor("cluster.local", HOUR).unwrap();
        let bundle = format!("{}{}", anchor.cert_pem, next.cert_pem);
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let endorsement = endorse(bundle.as_bytes(), &control, at).unwrap();
        let signed_at =
            verify(bundle.as_bytes(), endorsement.as_bytes(), trusted(&anchor), &Name::parse(CONTROL).unwrap());
        assert_eq!(signed_at.unwrap(), 1_700_000_000, "when it was signed, for the proxy's no-rollback rule");
    }

    #[test]
    fn an_endorsement_signed_in_the_future_is_refused_so_it_cannot_freeze_out_later_rotations() {
        // The control plane's clock ran ahead once (or a bundle it signed then is replayed): a
        // proxy taking it would refuse every honest endorsement until that time passes.
        let anchor = new_trust_anchor("cluster.local", HOUR).unwrap();
        let issuer = new_issuer(&anchor, "cluster.local", HOUR).unwrap();
        let control = certified(&issuer, CONTROL);
        let bundle = anchor.cert_pem.as_bytes();
        let ahead = endorse(bundle, &control, SystemTime::now() + HOUR * 24 * 365).unwrap();
        let e = verify(bundle, ahead.as_bytes(), trusted(&anchor), &Name::parse(CONTROL).unwrap());
        assert!(matches!(e, Err(EndorsementError::SignedInFuture { .. })), "{e:?}");
        // Within the allowed skew it is taken.
        let skewed = endorse(bundle, &control, SystemTime::now() + MAX_SKEW / 2).unwrap();
        verify(bundle, skewed.as_bytes(), trusted(&anchor), &Name::parse(CONTROL).unwrap()).unwrap();
    }

    #[test]
    fn rearranged_endorsement_text_never_makes_another_bundle_or_time_verify() {
        let anchor = new_trust_anchor("cluster.local", HOUR).unwrap();
        let issuer = new_issuer(&anchor, "cluster.local", HOUR).unwrap();
        let control = Name::parse(CONTROL).unwrap();
        let real = certified(&issuer, CONTROL);
        let attacker = new_trust_anchor("cluster.local", HOUR).unwrap();
        let planted = format!("{}{}", anchor.cert_pem, attacker.cert_pem);
        let honest = endorse(anchor.cert_pem.as_bytes(), &real, SystemTime::now() - HOUR / 2).unwrap();
        let (signature, rest) = honest.split_once('\n').unwrap();
        let (signed_at, chain) = rest.split_once('\n').unwrap();
        let later = endorse(anchor.cert_pem.as_bytes(), &real, SystemTime::now()).unwrap();
        let later_signed_at = later.lines().nth(1).unwrap();
        let refused = |endorsement: &str, bundle: &str| {
            verify(bundle.as_bytes(), endorsement.as_bytes(), trusted(&anchor), &control).is_err()
        };
        // The honest signature beside a planted bundle, in any arrangement of the lines: before
        // or after the chain, twice, with CRLF, inside a PEM block.
        for text in [
            format!("{chain}{signature}\n{signed_at}\n"),
            format!("{signature}\n{signature}\n{signed_at}\n{chain}"),
            honest.replace('\n', "\r\n"),
            format!("{signature}\n{signed_at}\n{}", chain.replacen("\n", &format!("\n{signature}\n"), 1)),
        ] {
            assert!(refused(&text, &planted), "{text}");
        }
        // A newer time beside the honest signature, first or second.
        assert!(refused(&format!("{signature}\n{later_signed_at}\n{signed_at}\n{chain}"), &anchor.cert_pem));
        // A second signed-at after the honest one changes nothing; bytes that are not UTF-8 are
        // refused, never skipped.
        let twice = format!("{signature}\n{signed_at}\n{later_signed_at}\n{chain}");
        let at = verify(anchor.cert_pem.as_bytes(), twice.as_bytes(), trusted(&anchor), &control).unwrap();
        assert_eq!(format!("signed-at {at}"), signed_at);
        let mut binary = honest.clone().into_bytes();
        binary.extend([0xff, 0xfe]);
        let e = verify(anchor.cert_pem.as_bytes(), &binary, trusted(&anchor), &control);
        assert!(e.is_err(), "{e:?}");
    }

    #[test]
    fn a_bundle_endorsed_by_anyone_but_the_control_plane_or_changed_after_signing_is_refused() {
        let anchor = new_trust_anchor("cluster.local", HOUR).unwrap();
        let issuer = new_issuer(&anchor, "cluster.local", HOUR).unwrap();
        let control = Name::parse(CONTROL).unwrap();
        let attacker = new_trust_anchor("cluster.local", HOUR).unwrap();
        let bundle = format!("{}{}", anchor.cert_pem, attacker.cert_pem);

        // A workload's own valid mesh certificate: the chain verifies, the name does not.
        let workload = certified(&issuer, "web.shop.serviceaccount.identity.cnimesh.cluster.local");
        let e = verify(
            bundle.as_bytes(),
            endorse(bundle.as_bytes(), &workload, SystemTime::now()).unwrap().as_bytes(),
            trusted(&anchor),
            &control,
        );
        assert!(matches!(e, Err(EndorsementError::Signer { .. })), "{e:?}");

        // The control plane's name, from the attacker's own CA (the anchor it wants trusted).
        let attacker_issuer = new_issuer(&attacker, "cluster.local", HOUR).unwrap();
        let forged = certified(&attacker_issuer, CONTROL);
        let e = verify(
            bundle.as_bytes(),
            endorse(bundle.as_bytes(), &forged, SystemTime::now()).unwrap().as_bytes(),
            trusted(&anchor),
            &control,
        );
        assert!(matches!(e, Err(EndorsementError::Signer { .. })), "{e:?}");

        // The real control plane's endorsement of another bundle, put beside this one.
        let real = certified(&issuer, CONTROL);
        let endorsement = endorse(anchor.cert_pem.as_bytes(), &real, SystemTime::now()).unwrap();
        let e = verify(bundle.as_bytes(), endorsement.as_bytes(), trusted(&anchor), &control);
        assert!(matches!(e, Err(EndorsementError::Signature)), "{e:?}");

        // The real chain with the signature line taken out, or garbled.
        let unsigned: String = endorsement.lines().skip(1).map(|l| format!("{l}\n")).collect();
        // Its time moved: the signature covers it.
        let signed_at = endorsement.lines().nth(1).unwrap().to_string();
        let later = endorsement.replacen(&signed_at, "signed-at 99999999999", 1);
        let e = verify(anchor.cert_pem.as_bytes(), later.as_bytes(), trusted(&anchor), &control);
        assert!(matches!(e, Err(EndorsementError::Signature)), "{e:?}");
        let e = verify(anchor.cert_pem.as_bytes(), unsigned.as_bytes(), trusted(&anchor), &control);
        assert!(matches!(e, Err(EndorsementError::NoSignature)), "{e:?}");
        let garbled = endorsement.replacen(SIGNATURE_PREFIX, &format!("{SIGNATURE_PREFIX}zz"), 1);
        let e = verify(anchor.cert_pem.as_bytes(), garbled.as_bytes(), trusted(&anchor), &control);
        assert!(matches!(e, Err(EndorsementError::SignatureNotHex)), "{e:?}");
        verify(anchor.cert_pem.as_bytes(), endorsement.as_bytes(), trusted(&anchor), &control).unwrap();
    }
}
