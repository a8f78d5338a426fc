//! Join tokens: how a host outside Kubernetes (an ExternalWorkload) gets its first certificate
//! without SPIRE and without a service-account token.
//!
//! `cnimesh external-workload join NAME` makes a token `cnimesh-join.v1.<ns>.<name>.<secret>`
//! (256 random bits, base64url) and stores only its SHA-256 ([`Pending`]: with the
//! ExternalWorkload's uid, its service account and an expiry) under the key `<ns>_<name>` of the
//! one Secret [`SECRET_NAME`] (type [`SECRET_TYPE`]) in the control plane's namespace: one
//! pending token per workload, a new join replaces the old. One Secret, by name, so that the
//! control plane's Role names it (`resourceNames`) and reads no other Secret of its namespace.
//!
//! Certify with a join token ([`Pending::check`], then [`super::join_store`]): the hash is
//! compared in constant time, then the expiry, the workload and identity it is bound to; the
//! token is consumed (replaced by a [`Binding`] with a resourceVersion precondition, so of two
//! uses at the same time exactly one wins) before anything is signed. The binding (the
//! workload's uid and the certified key's SHA-256) is what later renewals with the certificate
//! are checked against: the key, not the ServiceAccount, says which ExternalWorkload renews.
//!
//! Layer: model (pure: the token, its hash, the pending record and its checks).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

/// Every join token starts with this: it tells a join token from a service-account token.
pub const TOKEN_PREFIX: &str = "cnimesh-join.v1.";
/// The Secret (in the control plane's namespace) holding the pending tokens' hashes.
pub const SECRET_NAME: &str = "cnimesh-join-tokens";
/// Its type: a Secret of that name with another type is not read.
pub const SECRET_TYPE: &str = "cnimesh.io/join-token";
/// Random bytes in a token: 256 bits.
const SECRET_BYTES: usize = 32;
/// Longer than any token `join` makes (a 63-byte namespace, a 253-byte name, 43 bytes of secret).
pub const MAX_JOIN_TOKEN_LEN: usize = 512;
/// How long a token is valid unless `--ttl` says otherwise.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10 * 60);
/// The longest `--ttl`: a join token is meant to be used within minutes.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// Why a join token is refused. The Identity service maps these to status codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    /// Not a join token's shape (InvalidArgument: retrying the same cannot help).
    #[error("malformed join token: {0}")]
    Malformed(String),
    /// Unknown, already used, guessed or expired (Unauthenticated).
    #[error("{0}")]
    Unauthenticated(String),
    /// Valid, but not for this identity, or its workload is gone or revoked (PermissionDenied).
    #[error("{0}")]
    Denied(String),
    /// The API server could not be asked (Unavailable).
    #[error("{0}")]
    Unavailable(String),
}

/// A join token: the ExternalWorkload it is for, and its secret part.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub namespace: String,
    pub name: String,
    text: String,
}

/// Never the secret in a log line or a panic.
impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JoinToken({}/{}, secret redacted)", self.namespace, self.name)
    }
}

/// Whether `token` claims to be a join token (then it is judged as one, never as a
/// service-account token).
pub fn is_join_token(token: &[u8]) -> bool {
    token.trim_ascii().starts_with(TOKEN_PREFIX.as_bytes())
}

impl JoinToken {
    /// A new token for ExternalWorkload `namespace/name`, from the system's secure random source.
    pub fn generate(namespace: &str, name: &str) -> Result<Self, JoinError> {
        let mut secret = [0u8; SECRET_BYTES];
        aws_lc_rs::rand::fill(&mut secret).map_err(|_| JoinError::Unavailable("no secure randomness".into()))?;
        let text = format!("{TOKEN_PREFIX}{namespace}.{name}.{}", URL_SAFE_NO_PAD.encode(secret));
        Self::parse(text.as_bytes())
    }

    /// Reads a token (surrounding whitespace ignored, as a file's newline): the prefix, a
    /// namespace (a DNS label), a name (a DNS subdomain) and 43 base64url characters.
    pub fn parse(token: &[u8]) -> Result<Self, JoinError> {
        if token.len() > MAX_JOIN_TOKEN_LEN {
            return Err(JoinError::Malformed(format!(
                "{} bytes, more than the {MAX_JOIN_TOKEN_LEN} a join token has",
                token.len()
            )));
        }
        let text = std::str::from_utf8(token.trim_ascii()).map_err(|_| JoinError::Malformed("not UTF-8".into()))?;
        let rest = text
            .strip_prefix(TOKEN_PREFIX)
            .ok_or_else(|| JoinError::Malformed(format!("it does not start with {TOKEN_PREFIX:?}")))?;
        let (namespace, rest) =
            rest.split_once('.').ok_or_else(|| JoinError::Malformed("no namespace, name and secret".into()))?;
        let (name, secret) = rest.rsplit_once('.').ok_or_else(|| JoinError::Malformed("no name and secret".into()))?;
        let dns = |s: &str, dots: bool| {
            !s.is_empty()
                && s.len() <= 253
                && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.'))
        };
        if !dns(namespace, false) || namespace.len() > 63 {
            return Err(JoinError::Malformed("the namespace is not a namespace's name".into()));
        }
        if !dns(name, true) {
            return Err(JoinError::Malformed("the name is not an ExternalWorkload's name".into()));
        }
        match URL_SAFE_NO_PAD.decode(secret) {
            Ok(bytes) if bytes.len() == SECRET_BYTES => {}
            _ => return Err(JoinError::Malformed(format!("the secret is not {SECRET_BYTES} base64url bytes"))),
        }
        Ok(Self { namespace: namespace.into(), name: name.into(), text: text.into() })
    }

    /// The token as the operator is given it: once, never stored.
    pub fn reveal(&self) -> &str {
        &self.text
    }

    /// SHA-256 of the whole token, hex: what is stored.
    pub fn hash(&self) -> String {
        sha256_hex(self.text.as_bytes())
    }

    /// The Secret's key for this token's workload.
    pub fn key(&self) -> String {
        key(&self.namespace, &self.name)
    }
}

/// The Secret's key for ExternalWorkload `namespace/name`: `_` is in neither, so keys never
/// collide.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}_{name}")
}

/// The workload a Secret key names: `(namespace, name)`; `None` for a key `join` never writes.
pub fn workload_of(key: &str) -> Option<(&str, &str)> {
    key.split_once('_').filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 (hex) of a public key (the bits of its SubjectPublicKeyInfo, as a CSR and the
/// certificate issued for it carry them): what binds an ExternalWorkload's renewals to the key
/// it joined with.
pub fn key_sha256(public_key: &[u8]) -> String {
    sha256_hex(public_key)
}

/// [`key_sha256`] of the key a certificate (DER) certifies; `None` when it does not parse.
pub fn certificate_key_sha256(certificate: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(certificate).ok()?;
    Some(key_sha256(&cert.tbs_certificate.subject_pki.subject_public_key.data))
}

/// What the Secret holds under a workload's [`key`] (JSON): the token `join` made, until it is
/// used; then the binding that lets that host renew.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Entry {
    Pending(Pending),
    Bound(Binding),
}

/// A join token was used: the ExternalWorkload (by uid) and the key it was certified for. Only a
/// client certificate for this very key renews, and only while that workload (same uid, not
/// revoked, same service account) exists: a pod or another workload holding the same identity
/// has another key; a workload deleted and made again has another uid. A new `join` replaces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Binding {
    /// The ExternalWorkload's uid when its token was used.
    pub uid: String,
    /// The service account it was certified for.
    pub service_account: String,
    /// [`key_sha256`] of the certified key.
    pub key_sha256: String,
}

/// What the Secret holds for one pending token (JSON under [`key`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pending {
    /// SHA-256 of the token, hex.
    pub sha256: String,
    /// The ExternalWorkload's uid when the token was made: a workload deleted and made again
    /// under the same name is another one.
    pub uid: String,
    /// The service account whose identity (in the workload's namespace) it may be certified for.
    pub service_account: String,
    /// Unix seconds after which it is refused.
    pub expires: u64,
}

impl Pending {
    pub fn new(token: &JoinToken, uid: &str, service_account: &str, ttl: Duration) -> Self {
        Self {
            sha256: token.hash(),
            uid: uid.into(),
            service_account: service_account.into(),
            expires: epoch(SystemTime::now() + ttl),
        }
    }

    /// Whether `token` is this one (its hash compared in constant time), unexpired, and for the
    /// service account `service_account`. The workload itself is the caller's to check.
    pub fn check(&self, token: &JoinToken, service_account: &str, now: SystemTime) -> Result<(), JoinError> {
        let matches =
            aws_lc_rs::constant_time::verify_slices_are_equal(token.hash().as_bytes(), self.sha256.as_bytes());
        if matches.is_err() {
            return Err(JoinError::Unauthenticated(format!(
                "the join token for {}/{} is not the one pending (guessed, or replaced by a newer join)",
                token.namespace, token.name
            )));
        }
        if epoch(now) >= self.expires {
            return Err(JoinError::Unauthenticated(format!(
                "the join token for {}/{} has expired: run `cnimesh external-workload join` again",
                token.namespace, token.name
            )));
        }
        if self.service_account != service_account {
            return Err(JoinError::Denied(format!(
                "the join token for {}/{} certifies service account {:?}, not {service_account:?}",
                token.namespace, token.name, self.service_account
            )));
        }
        Ok(())
    }
}

fn epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_token_parses_back_and_only_its_hash_is_kept() {
        let token = JoinToken::generate("shop", "db-vm.east").unwrap();
        assert!(token.reveal().starts_with("cnimesh-join.v1.shop.db-vm.east."));
        let parsed = JoinToken::parse(format!("{}\n", token.reveal()).as_bytes()).unwrap();
        assert_eq!((parsed.namespace.as_str(), parsed.name.as_str()), ("shop", "db-vm.east"));
        assert_eq!(parsed.hash(), token.hash());
        assert_eq!(token.hash().len(), 64);
        assert_ne!(JoinToken::generate("shop", "db-vm.east").unwrap().hash(), token.hash(), "random");
        assert!(!format!("{token:?}").contains(&token.reveal()[30..]), "Debug never shows the secret");
        let pending = Pending::new(&token, "uid-1", "db", DEFAULT_TTL);
        assert!(!serde_json::to_string(&pending).unwrap().contains(&token.reveal()[30..]));
        pending.check(&parsed, "db", SystemTime::now()).unwrap();
    }

    #[test]
    fn a_guessed_expired_or_other_accounts_token_is_refused() {
        let token = JoinToken::generate("shop", "db-vm").unwrap();
        let pending = Pending::new(&token, "uid-1", "db", Duration::from_secs(60));
        let guessed = JoinToken::generate("shop", "db-vm").unwrap();
        assert!(matches!(pending.check(&guessed, "db", SystemTime::now()), Err(JoinError::Unauthenticated(_))));
        let later = SystemTime::now() + Duration::from_secs(61);
        let expired = pending.check(&token, "db", later).unwrap_err();
        assert!(matches!(&expired, JoinError::Unauthenticated(m) if m.contains("expired")), "{expired}");
        assert!(matches!(pending.check(&token, "web", SystemTime::now()), Err(JoinError::Denied(_))));
    }

    #[test]
    fn a_pending_token_and_a_binding_read_back_as_what_they_are() {
        let token = JoinToken::generate("shop", "db-vm").unwrap();
        let pending = Entry::Pending(Pending::new(&token, "uid-1", "db", DEFAULT_TTL));
        let bound =
            Entry::Bound(Binding { uid: "uid-1".into(), service_account: "db".into(), key_sha256: "ab".into() });
        for entry in [pending, bound] {
            let json = serde_json::to_vec(&entry).unwrap();
            assert_eq!(serde_json::from_slice::<Entry>(&json).unwrap(), entry);
        }
        assert_eq!(workload_of("shop_db-vm.east"), Some(("shop", "db-vm.east")));
        assert_eq!(workload_of("shop"), None);
        assert_eq!(workload_of("_db"), None);
    }

    #[test]
    fn malformed_and_oversized_tokens_are_malformed_without_panics() {
        let good = JoinToken::generate("shop", "db").unwrap();
        let secret = good.reveal().rsplit_once('.').unwrap().1.to_string();
        let oversized = format!("{TOKEN_PREFIX}shop.{}.{secret}", "a".repeat(600));
        for bad in [
            "".to_string(),
            "cnimesh-join.v1.".to_string(),
            "cnimesh-join.v1.shop".to_string(),
            "cnimesh-join.v1.shop.db".to_string(),
            format!("cnimesh-join.v1.Shop.db.{secret}"),
            format!("cnimesh-join.v1.shop..{secret}"),
            format!("cnimesh-join.v1.shop.db_x.{secret}"),
            "cnimesh-join.v1.shop.db.short".to_string(),
            format!("cnimesh-join.v1.shop.db.{secret}AA"),
            format!("cnimesh-join.v2.shop.db.{secret}"),
            oversized,
        ] {
            assert!(matches!(JoinToken::parse(bad.as_bytes()), Err(JoinError::Malformed(_))), "{bad:?}");
        }
        assert!(matches!(JoinToken::parse(&[0xff, 0xfe]), Err(JoinError::Malformed(_))));
        assert!(is_join_token(b" cnimesh-join.v1.x"));
        assert!(!is_join_token(b"eyJhbGciOi"));
    }
}
