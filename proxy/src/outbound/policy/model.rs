//! An outbound policy as the proxy uses it, checked when it arrives so that a connection only
//! reads plain fields. Which fields count follows linkerd2-proxy's `client-policy` crate: a
//! policy without metadata or protocol, or a `detect` without its timeout, is refused (and the
//! last good answer kept), as a stock proxy refuses it.

use std::sync::Arc;
use std::time::Duration;

use linkerd2_proxy_api::outbound::{self as api, proxy_protocol};

use crate::client::discovery::accrual::ConsecutiveFailures;
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
    /// What an EgressNetwork's policy says about TLS and opaque connections.
    pub streams: super::streams::StreamRules,
    /// Failure accrual (circuit breaking) for HTTP/1 and HTTP/2 requests: the protocol's
    /// `failure_accrual` (`None`: "circuit breaking is not performed").
    pub accrual: [Option<ConsecutiveFailures>; 2],
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
    #[error("failure accrual: {0}")]
    FailureAccrual(&'static str),
    #[error(transparent)]
    Route(#[from] InvalidRoute),
}

impl OutboundPolicy {
    pub fn from_api(policy: api::OutboundPolicy) -> Result<Self, Invalid> {
        let source = policy.clone();
        let streams = super::streams::StreamRules::from_api(&source);
        let parent = resource_ref(policy.metadata).map_err(Invalid::Metadata)?;
        let (mut http1, mut http2, mut grpc) = (Vec::new(), Vec::new(), Vec::new());
        let (mut accrual1, mut accrual2) = (None, None);
        let protocol = match policy.protocol.and_then(|p| p.kind).ok_or(Invalid::NoProtocol)? {
            proxy_protocol::Kind::Detect(d) => {
                let timeout = d.timeout.ok_or(Invalid::NoDetectTimeout)?;
                if let Some(h) = d.http1 {
                    accrual1 = h.failure_accrual;
                    http1 = h.routes;
                }
                if let Some(h) = d.http2 {
                    accrual2 = h.failure_accrual;
                    http2 = h.routes;
                }
                Protocol::Detect { timeout: Duration::try_from(timeout).map_err(|_| Invalid::NegativeTimeout)? }
            }
            proxy_protocol::Kind::Opaque(_) => Protocol::Opaque,
            proxy_protocol::Kind::Http1(h) => {
                http1 = h.routes;
                accrual1 = h.failure_accrual;
                Protocol::Http1
            }
            proxy_protocol::Kind::Http2(h) => {
                http2 = h.routes;
                accrual2 = h.failure_accrual;
                Protocol::Http2
            }
            proxy_protocol::Kind::Grpc(g) => {
                grpc = g.routes;
                accrual2 = g.failure_accrual;
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
        let accrual = [failure_accrual(accrual1)?, failure_accrual(accrual2)?];
        Ok(Self { parent, protocol, http1, http2, streams, accrual, source })
    }

    /// The failure accrual of a request of `version`, if its Service has one.
    pub fn accrual(&self, version: http::Version) -> Option<&ConsecutiveFailures> {
        self.accrual[usize::from(version == http::Version::HTTP_2)].as_ref()
    }

    /// The routes for a request of `version`.
    pub fn routes(&self, version: http::Version) -> &RouteTable {
        if version == http::Version::HTTP_2 { &self.http2 } else { &self.http1 }
    }
}

/// A protocol's `failure_accrual`, checked as linkerd2-proxy's `client-policy` does:
/// `consecutive_failures` with a backoff whose minimum is not above its maximum and whose jitter
/// is a ratio; `max_failures` 0 turns it off (as the proto says); the `unified` kind is not
/// served by this mesh's control plane and is refused rather than ignored.
fn failure_accrual(accrual: Option<api::FailureAccrual>) -> Result<Option<ConsecutiveFailures>, Invalid> {
    use api::failure_accrual::Kind;
    let Some(kind) = accrual.and_then(|a| a.kind) else { return Ok(None) };
    let c = match kind {
        Kind::ConsecutiveFailures(c) => c,
        Kind::Unified(_) => return Err(Invalid::FailureAccrual("unified failure accrual is not supported")),
    };
    if c.max_failures == 0 {
        return Ok(None);
    }
    let backoff = c.backoff.ok_or(Invalid::FailureAccrual("consecutive failures without a backoff"))?;
    let time = |d: Option<prost_types::Duration>| {
        d.and_then(|d| Duration::try_from(d).ok()).ok_or(Invalid::FailureAccrual("backoff without a valid duration"))
    };
    let (min_penalty, max_penalty) = (time(backoff.min_backoff)?, time(backoff.max_backoff)?);
    if min_penalty > max_penalty {
        return Err(Invalid::FailureAccrual("min backoff above max backoff"));
    }
    let jitter_ratio = f64::from(backoff.jitter_ratio);
    if !(0.0..=100.0).contains(&jitter_ratio) {
        return Err(Invalid::FailureAccrual("jitter ratio not in 0..=100"));
    }
    Ok(Some(ConsecutiveFailures { max_failures: c.max_failures, min_penalty, max_penalty, jitter_ratio }))
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

    fn accrual(max_failures: u32, min_ms: u64, max_ms: u64) -> api::FailureAccrual {
        use api::failure_accrual::{ConsecutiveFailures as Api, Kind};
        let ms = |ms| Some(Duration::from_millis(ms).try_into().unwrap());
        let backoff = api::ExponentialBackoff {
            min_backoff: ms(min_ms),
            max_backoff: ms(max_ms),
            jitter_ratio: 0.5,
            ..Default::default()
        };
        api::FailureAccrual {
            kind: Some(Kind::ConsecutiveFailures(Api { max_failures, backoff: Some(backoff) })),
            ..Default::default()
        }
    }

    #[test]
    fn failure_accrual_is_read_per_http_version_and_bad_ones_are_refused() {
        let http1 = |a| proxy_protocol::Kind::Http1(proxy_protocol::Http1 { routes: Vec::new(), failure_accrual: a });
        let p = OutboundPolicy::from_api(service_policy(http1(Some(accrual(3, 100, 2000))))).unwrap();
        let expected = ConsecutiveFailures {
            max_failures: 3,
            min_penalty: Duration::from_millis(100),
            max_penalty: Duration::from_secs(2),
            jitter_ratio: 0.5,
        };
        assert_eq!(p.accrual(http::Version::HTTP_11), Some(&expected));
        assert_eq!(p.accrual(http::Version::HTTP_2), None, "an http1 policy says nothing of HTTP/2");
        let off = OutboundPolicy::from_api(service_policy(http1(Some(accrual(0, 100, 2000))))).unwrap();
        assert_eq!(off.accrual(http::Version::HTTP_11), None, "max_failures 0: off");
        let none = OutboundPolicy::from_api(service_policy(http1(None))).unwrap();
        assert_eq!(none.accrual(http::Version::HTTP_11), None);
        let inverted = OutboundPolicy::from_api(service_policy(http1(Some(accrual(3, 2000, 100)))));
        assert!(matches!(inverted, Err(Invalid::FailureAccrual(_))));
        let mut no_backoff = accrual(3, 1, 2);
        if let Some(api::failure_accrual::Kind::ConsecutiveFailures(c)) = &mut no_backoff.kind {
            c.backoff = None;
        }
        assert!(matches!(
            OutboundPolicy::from_api(service_policy(http1(Some(no_backoff)))),
            Err(Invalid::FailureAccrual(_))
        ));
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
