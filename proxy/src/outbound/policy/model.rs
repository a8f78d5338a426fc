//! An outbound policy as the proxy uses it, checked when it arrives so that a connection only
//! reads plain fields. Which fields count follows linkerd2-proxy's `client-policy` crate: a
//! policy without metadata or protocol, or a `detect` without its timeout, is refused (and the
//! last good answer kept), as a stock proxy refuses it.

use std::sync::Arc;
use std::time::Duration;

use linkerd2_proxy_api::outbound::{self as api, proxy_protocol};

use crate::outbound::routes::model::{HttpRoute, InvalidRoute, ResourceRef, resource_ref};
use crate::outbound::routes::select::RouteTable;
use crate::transport::detect;

/// What the control plane says about one outbound target.
#[derive(Debug)]
pub struct OutboundPolicy {
    /// What the policy was discovered for (a Service port): the `parent_*` of route metrics.
    pub parent: ResourceRef,
    pub protocol: Protocol,
    /// Routes for requests that arrive as HTTP/1 (detected or declared), compiled once here.
    pub http1: RouteTable,
    /// Routes for requests that arrive as HTTP/2 (a `grpc` policy's gRPC routes too).
    pub http2: RouteTable,
    /// issue 30: what an EgressNetwork's policy says about TLS and opaque connections.
    pub streams: crate::outbound::egress::rules::StreamRules,
    /// The answer this was built from: two policies are the same when their answers are.
    source: api::OutboundPolicy,
}

impl PartialEq for OutboundPolicy {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// The protocol the control plane declares for the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Not known: detect, giving the client `timeout` to speak.
    Detect {
        timeout: Duration,
    },
    /// Opaque TCP (the target is marked opaque, e.g. a server-speaks-first database).
    Opaque,
    Http1,
    Http2,
    /// gRPC: HTTP/2 with gRPC routes.
    Grpc,
    /// TLS the application originates: opaque to the proxy.
    Tls,
}

impl Protocol {
    /// How a connection to the target is served without detection, or `None` to detect.
    pub fn known(self) -> Option<detect::Protocol> {
        match self {
            Self::Detect { .. } => None,
            Self::Opaque | Self::Tls => Some(detect::Protocol::Opaque),
            Self::Http1 => Some(detect::Protocol::Http1),
            Self::Http2 | Self::Grpc => Some(detect::Protocol::Http2),
        }
    }
}

/// Why an answer was refused.
#[derive(Debug, thiserror::Error)]
pub enum Invalid {
    #[error("metadata: {0}")]
    Metadata(String),
    #[error("no protocol")]
    NoProtocol,
    #[error("detect without a timeout")]
    NoDetectTimeout,
    #[error("negative detect timeout")]
    NegativeTimeout,
    #[error(transparent)]
    Route(#[from] InvalidRoute),
}

impl OutboundPolicy {
    pub fn from_api(policy: api::OutboundPolicy) -> Result<Self, Invalid> {
        let source = policy.clone();
        let streams = crate::outbound::egress::rules::StreamRules::from_api(&source);
        let parent = resource_ref(policy.metadata).map_err(Invalid::Metadata)?;
        let (mut http1, mut http2, mut grpc) = (Vec::new(), Vec::new(), Vec::new());
        let protocol = match policy.protocol.and_then(|p| p.kind).ok_or(Invalid::NoProtocol)? {
            proxy_protocol::Kind::Detect(d) => {
                let timeout = d.timeout.ok_or(Invalid::NoDetectTimeout)?;
                http1 = d.http1.map(|h| h.routes).unwrap_or_default();
                http2 = d.http2.map(|h| h.routes).unwrap_or_default();
                Protocol::Detect { timeout: Duration::try_from(timeout).map_err(|_| Invalid::NegativeTimeout)? }
            }
            proxy_protocol::Kind::Opaque(_) => Protocol::Opaque,
            proxy_protocol::Kind::Http1(h) => {
                http1 = h.routes;
                Protocol::Http1
            }
            proxy_protocol::Kind::Http2(h) => {
                http2 = h.routes;
                Protocol::Http2
            }
            proxy_protocol::Kind::Grpc(g) => {
                grpc = g.routes;
                Protocol::Grpc
            }
            proxy_protocol::Kind::Tls(_) => Protocol::Tls,
        };
        let checked = |routes: Vec<api::HttpRoute>| -> Result<Arc<[HttpRoute]>, Invalid> {
            Ok(routes.into_iter().map(HttpRoute::from_api).collect::<Result<Vec<_>, _>>()?.into())
        };
        let mut http2 = checked(http2)?.to_vec();
        for route in grpc {
            http2.push(HttpRoute::from_grpc(route)?);
        }
        let (http1, http2) = (RouteTable::new(checked(http1)?), RouteTable::new(http2.into()));
        Ok(Self { parent, protocol, http1, http2, streams, source })
    }

    /// The routes for a request of `version`.
    pub fn routes(&self, version: http::Version) -> &RouteTable {
        if version == http::Version::HTTP_2 { &self.http2 } else { &self.http1 }
    }
}

#[cfg(test)]
mod tests {
    use linkerd2_proxy_api::meta;

    use super::*;

    /// A Service port's policy with `kind` as its protocol, as cnimesh-control answers it.
    fn service_policy(kind: proxy_protocol::Kind) -> api::OutboundPolicy {
        api::OutboundPolicy {
            protocol: Some(api::ProxyProtocol { kind: Some(kind) }),
            metadata: Some(meta::Metadata {
                kind: Some(meta::metadata::Kind::Resource(meta::Resource {
                    group: "core".into(),
                    kind: "Service".into(),
                    name: "db".into(),
                    namespace: "shop".into(),
                    section: String::new(),
                    port: 5432,
                })),
            }),
        }
    }

    fn opaque() -> proxy_protocol::Kind {
        proxy_protocol::Kind::Opaque(proxy_protocol::Opaque { routes: Vec::new() })
    }

    #[test]
    fn protocols_are_read_and_known_without_detection_where_declared() {
        let p = OutboundPolicy::from_api(service_policy(opaque())).unwrap();
        let parent = &p.parent;
        assert_eq!((&*parent.kind, &*parent.namespace, &*parent.name, parent.port), ("Service", "shop", "db", 5432));
        assert_eq!(p.protocol.known(), Some(detect::Protocol::Opaque));
        let detect = proxy_protocol::Kind::Detect(proxy_protocol::Detect {
            timeout: Some(Duration::from_secs(10).try_into().unwrap()),
            ..Default::default()
        });
        let p = OutboundPolicy::from_api(service_policy(detect)).unwrap();
        assert_eq!(p.protocol, Protocol::Detect { timeout: Duration::from_secs(10) });
        assert_eq!(p.protocol.known(), None, "detect: as before policies");
        let http1 = proxy_protocol::Kind::Http1(proxy_protocol::Http1::default());
        let http2 = proxy_protocol::Kind::Http2(proxy_protocol::Http2::default());
        let grpc = proxy_protocol::Kind::Grpc(proxy_protocol::Grpc::default());
        let tls = proxy_protocol::Kind::Tls(proxy_protocol::Tls::default());
        let known = |k| OutboundPolicy::from_api(service_policy(k)).unwrap().protocol.known();
        assert_eq!(known(http1), Some(detect::Protocol::Http1));
        assert_eq!(known(http2), Some(detect::Protocol::Http2));
        assert_eq!(known(grpc), Some(detect::Protocol::Http2));
        assert_eq!(known(tls), Some(detect::Protocol::Opaque), "the app's own TLS is opaque to us");
    }

    #[test]
    fn answers_a_stock_proxy_refuses_are_refused() {
        let mut no_protocol = service_policy(opaque());
        no_protocol.protocol = None;
        assert!(matches!(OutboundPolicy::from_api(no_protocol), Err(Invalid::NoProtocol)));
        let mut no_meta = service_policy(opaque());
        no_meta.metadata = None;
        assert!(matches!(OutboundPolicy::from_api(no_meta), Err(Invalid::Metadata(_))));
        let detect = proxy_protocol::Kind::Detect(proxy_protocol::Detect::default());
        assert!(matches!(OutboundPolicy::from_api(service_policy(detect)), Err(Invalid::NoDetectTimeout)));
        let mut negative =
            proxy_protocol::Detect { timeout: Some(Duration::ZERO.try_into().unwrap()), ..Default::default() };
        if let Some(t) = &mut negative.timeout {
            t.seconds = -1;
        }
        let negative = service_policy(proxy_protocol::Kind::Detect(negative));
        assert!(matches!(OutboundPolicy::from_api(negative), Err(Invalid::NegativeTimeout)));
    }
}
