//! The one crypto provider (aws-lc-rs), passed explicitly to every rustls builder: with another
//! provider compiled in (kube pulls ring in some feature sets), rustls's implicit default panics.
//! A module of its own so that [`crate::tls`] and [`crate::anchors`] both use it without
//! importing each other.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

/// The one crypto provider.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}
