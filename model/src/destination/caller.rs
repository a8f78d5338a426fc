//! Who a Destination request is for, and what that caller may see.
//!
//! A multicluster gateway forwards connections from every linked cluster to Services of this
//! one, so it must reach only the Services this cluster exports through it: those labelled
//! `mirror.cnimesh.io/exported=true` (a `remote-discovery` export is reached directly, never
//! through the gateway). The proxy in gateway mode says so in the `context_token` of each of its
//! Destination requests (`{"cnimesh.io/caller": "gateway"}`), and Destination answers it as if
//! nothing else existed: a Service that is not exported, a pod IP or an unknown address gets
//! exactly the answer of an unknown name (`no_endpoints{exists: false}`, an empty profile), so
//! the gateway refuses it as it refuses a name nobody defined, and never learns where it is.
//!
//! Why the token and not the caller's certificate: the gateway marks itself whatever
//! ServiceAccount it runs as, so a gateway deployed under another name is still restricted;
//! and the marker only ever *restricts* what its sender sees (a caller that leaves it out sees
//! what every mesh proxy already may), so an unauthenticated token is safe.
//!
//! The filter is applied per stream, to each snapshot as it is sent: the watch channels stay
//! shared by every caller of a Service and carry the whole, unfiltered state, so no caller's
//! view leaks into another's; and a label change (a new snapshot) reaches an open stream at once,
//! so a Service unexported while a gateway follows it is removed from that gateway's answer.

use std::sync::Arc;

use cnimesh_common::names::{CONTEXT_TOKEN_CALLER_KEY, CONTEXT_TOKEN_GATEWAY};

use super::index::{IpView, ServiceView};

/// What kind of proxy is asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A workload's proxy (or a stock linkerd2-proxy): sees every Service.
    Proxy,
    /// A multicluster gateway: sees only the Services exported through it.
    Gateway,
}

impl Caller {
    /// The caller a request's `context_token` names. Anything but a JSON object marking a
    /// gateway (Linkerd's `{"ns": …, "nodeName": …}`, an empty token, garbage) is a proxy.
    pub fn of_context_token(token: &str) -> Self {
        if token.is_empty() {
            return Caller::Proxy;
        }
        let Ok(serde_json::Value::Object(fields)) = serde_json::from_str::<serde_json::Value>(token) else {
            return Caller::Proxy;
        };
        match fields.get(CONTEXT_TOKEN_CALLER_KEY).and_then(serde_json::Value::as_str) {
            Some(CONTEXT_TOKEN_GATEWAY) => Caller::Gateway,
            _ => Caller::Proxy,
        }
    }

    /// A Service as this caller may see it: a gateway sees only exported Services.
    pub fn service(self, view: &ServiceView) -> Option<&Arc<super::index::ServiceSnapshot>> {
        let snapshot = view.as_ref()?;
        (self == Caller::Proxy || snapshot.service.gateway_exported).then_some(snapshot)
    }

    /// An address as this caller may see it: a gateway sees only the ClusterIPs of exported
    /// Services (it forwards to Service names, never to a pod).
    pub fn ip(self, view: &IpView) -> &IpView {
        match (self, view) {
            (Caller::Proxy, view) => view,
            (Caller::Gateway, IpView::Service(_, service)) if service.gateway_exported => view,
            (Caller::Gateway, _) => &IpView::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_json_object_naming_the_gateway_marks_a_gateway() {
        assert_eq!(Caller::of_context_token(r#"{"cnimesh.io/caller":"gateway"}"#), Caller::Gateway);
        assert_eq!(
            Caller::of_context_token(r#"{"ns":"cnimesh-multicluster","nodeName":"n1","cnimesh.io/caller":"gateway"}"#),
            Caller::Gateway
        );
        for other in [
            "",
            r#"{"ns":"shop","nodeName":"n1"}"#,
            r#"{"cnimesh.io/caller":"proxy"}"#,
            r#"{"cnimesh.io/caller":true}"#,
            r#"["cnimesh.io/caller","gateway"]"#,
            "gateway",
            "{not json",
        ] {
            assert_eq!(Caller::of_context_token(other), Caller::Proxy, "{other}");
        }
    }
}
