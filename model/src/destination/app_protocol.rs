//! A Service port's `appProtocol` (Kubernetes' field, as Linkerd 2.18 reads it) declares the
//! protocol of its traffic, so no proxy has to detect it: a slow first write can then never
//! turn an HTTP connection into opaque TCP, nor a server-speaks-first one wait out detection.
//!
//! | `appProtocol` | served as |
//! |---|---|
//! | `http` | HTTP/1 |
//! | `kubernetes.io/ws` | HTTP/1 (with its upgrades, e.g. WebSocket) |
//! | `kubernetes.io/h2c` | HTTP/2 with prior knowledge |
//! | `cnimesh.io/opaque`, `linkerd.io/opaque` | opaque TCP |
//!
//! Anything else (`https`, `grpc`, vendor names) is detected as before; each unknown value is
//! logged once. The client side reads it in its outbound policy
//! (`cnimesh_control::grpc::outbound`) and Destination profile; the server side's protocol for a pod
//! port is [`super::model::declared_for_pod_port`], which the inbound policy index
//! ([`crate::policy::index`]) serves after a Server's `proxyProtocol` and the pod's opaque ports.
//!
//! Layer: model/index (pure).

use std::collections::HashSet;
use std::sync::OnceLock;

use cnimesh_common::names::{
    APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP, APP_PROTOCOL_LINKERD_OPAQUE, APP_PROTOCOL_OPAQUE, APP_PROTOCOL_WS,
};
use parking_lot::Mutex;

/// A protocol a Service port declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AppProtocol {
    /// `http` and `kubernetes.io/ws`.
    Http1,
    /// `kubernetes.io/h2c`.
    Http2,
    Opaque,
}

impl AppProtocol {
    /// The declared protocol of `value`; `None` (detect) for any other value, logged the first
    /// time it is seen.
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim() {
            APP_PROTOCOL_HTTP | APP_PROTOCOL_WS => Some(Self::Http1),
            APP_PROTOCOL_H2C => Some(Self::Http2),
            APP_PROTOCOL_OPAQUE | APP_PROTOCOL_LINKERD_OPAQUE => Some(Self::Opaque),
            other => {
                static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
                let mut seen = SEEN.get_or_init(Mutex::default).lock();
                // Bounded: a cluster has few distinct values; past that, silence.
                if seen.len() < 256 && seen.insert(other.to_string()) {
                    tracing::info!(
                        app_protocol = other,
                        "appProtocol not one the mesh declares; its ports are detected"
                    );
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declared_app_protocols_are_known_and_others_are_detected() {
        assert_eq!(AppProtocol::parse("http"), Some(AppProtocol::Http1));
        assert_eq!(AppProtocol::parse("kubernetes.io/ws"), Some(AppProtocol::Http1));
        assert_eq!(AppProtocol::parse("kubernetes.io/h2c"), Some(AppProtocol::Http2));
        assert_eq!(AppProtocol::parse("cnimesh.io/opaque"), Some(AppProtocol::Opaque));
        assert_eq!(AppProtocol::parse("linkerd.io/opaque"), Some(AppProtocol::Opaque), "for users moving over");
        assert_eq!(AppProtocol::parse("https"), None);
        assert_eq!(AppProtocol::parse("grpc"), None);
    }
}
