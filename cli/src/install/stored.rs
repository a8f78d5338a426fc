//! The install's options kept in the cluster: the ConfigMap `cnimesh-install-values` holds the
//! overrides the operator gave (what `cnimesh upgrade` merges new ones over), the effective
//! values (for reading), the version that rendered them and a fingerprint of the trust anchors
//! (so a later run sees whether the anchors changed). No secret goes in it.

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

use super::values::{Overrides, Values};

pub const VALUES_CONFIG_MAP: &str = "cnimesh-install-values";
pub const OVERRIDES_KEY: &str = "overrides.yaml";
pub const VALUES_KEY: &str = "values.yaml";
pub const VERSION_KEY: &str = "version";
pub const FINGERPRINT_KEY: &str = "trustAnchorsFingerprint";

/// The ConfigMap for this rendering.
pub fn config_map(values: &Values, overrides: &Overrides, anchors_pem: &str) -> Value {
    let data = BTreeMap::from([
        (VERSION_KEY.to_string(), env!("CARGO_PKG_VERSION").to_string()),
        (OVERRIDES_KEY.to_string(), overrides.to_yaml()),
        (VALUES_KEY.to_string(), values.to_yaml()),
        (FINGERPRINT_KEY.to_string(), fingerprint(anchors_pem)),
    ]);
    let map = ConfigMap { metadata: super::meta(VALUES_CONFIG_MAP), data: Some(data), ..Default::default() };
    super::with_type_meta(serde_json::to_value(map).expect("a ConfigMap serialises"), "ConfigMap")
}

/// The overrides a stored ConfigMap holds (checked again: a hand-edited one gets the same errors).
pub fn overrides(map: &ConfigMap) -> anyhow::Result<Overrides> {
    let text = map.data.as_ref().and_then(|d| d.get(OVERRIDES_KEY)).with_context(|| {
        format!("the ConfigMap {VALUES_CONFIG_MAP} has no {OVERRIDES_KEY}; recreate it with `cnimesh upgrade --set …`")
    })?;
    Ok(Overrides::from_yaml(text, &format!("ConfigMap {VALUES_CONFIG_MAP} {OVERRIDES_KEY}"))?)
}

/// `sha256:<hex>` over the DER of every certificate of the bundle, so PEM layout does not
/// matter; text that holds no certificate is hashed as it is.
pub fn fingerprint(anchors_pem: &str) -> String {
    let der: Vec<u8> = match cnimesh_identity::pem::certs(anchors_pem.as_bytes(), "trust anchors") {
        Ok(certs) => certs.iter().flat_map(|c| c.as_ref().to_vec()).collect(),
        Err(_) => anchors_pem.as_bytes().to_vec(),
    };
    let hash = sha256(&der);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// SHA-256 from the one crypto provider of the build (aws-lc-rs, through rustls).
fn sha256(data: &[u8]) -> Vec<u8> {
    let provider = cnimesh_identity::tls::provider();
    let hash = provider
        .cipher_suites
        .iter()
        .find_map(|suite| match suite {
            rustls::SupportedCipherSuite::Tls13(s)
                if s.common.hash_provider.algorithm() == rustls::crypto::hash::HashAlgorithm::SHA256 =>
            {
                Some(s.common.hash_provider)
            }
            _ => None,
        })
        .expect("aws-lc-rs offers a TLS 1.3 suite over SHA-256");
    hash.hash(data).as_ref().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_is_sha256_of_the_certificates() {
        // SHA-256 of the empty input, as every implementation knows it.
        assert_eq!(fingerprint(""), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        let anchor =
            cnimesh_identity::ca::new_trust_anchor("cluster.local", std::time::Duration::from_secs(60)).unwrap();
        let reflowed = anchor.cert_pem.replace('\n', "\r\n");
        assert_eq!(fingerprint(&anchor.cert_pem), fingerprint(&reflowed));
        assert_ne!(fingerprint(&anchor.cert_pem), fingerprint(""));
    }
}
