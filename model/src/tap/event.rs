//! One tap event as the relay streams it and the `cnimesh tap` / `top` commands read it: a flat
//! JSON object per line, with the pod whose proxy saw it. The proxies speak protobuf
//! (`io.linkerd.proxy.tap.TapEvent`); the relay converts once, so its callers need no proto.
//!
//! Layer: model (pure): proto in, serde records out.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use linkerd2_proxy_api::tap::TapEvent;
use linkerd2_proxy_api::tap::eos;
use linkerd2_proxy_api::tap::tap_event::{self, ProxyDirection, http};
use serde::{Deserialize, Serialize};

/// One line of the relay's `application/x-ndjson` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TapLine {
    /// The namespace of the pod whose proxy reported the event (or could not be tapped).
    pub namespace: String,
    pub pod: String,
    #[serde(flatten)]
    pub body: Body,
}

/// What happened, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Body {
    /// A request's headers reached the proxy.
    #[serde(rename_all = "camelCase")]
    RequestInit {
        #[serde(flatten)]
        at: Stream,
        method: String,
        scheme: String,
        authority: String,
        path: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        headers: Vec<(String, String)>,
    },
    /// The response's headers.
    #[serde(rename_all = "camelCase")]
    ResponseInit {
        #[serde(flatten)]
        at: Stream,
        since_request_init_us: u64,
        http_status: u32,
    },
    /// The response is over: its last byte, a gRPC status in the trailers, or a reset.
    #[serde(rename_all = "camelCase")]
    ResponseEnd {
        #[serde(flatten)]
        at: Stream,
        since_request_init_us: u64,
        since_response_init_us: u64,
        response_bytes: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grpc_status: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reset_code: Option<u32>,
    },
    /// This pod's proxy could not be tapped (or its stream broke); the others go on.
    Error { message: String },
}

/// Which request, on which connection, seen in which direction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stream {
    /// `base:stream`, unique per proxy.
    pub id: String,
    /// `inbound`, `outbound` or `unknown`.
    pub direction: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SocketAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<SocketAddr>,
    /// The proxy's labels for each side (`tls`, `client_id`, `server_id`, ...) and the route.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub source_meta: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub destination_meta: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub route_meta: BTreeMap<String, String>,
    /// The pods at either end (`ns/name`), when the control plane knows their addresses: a proxy
    /// knows only IPs, the relay names them so that `top` shows workloads' pods, not addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_pod: Option<String>,
}

impl Stream {
    pub fn inbound(&self) -> bool {
        self.direction == "inbound"
    }
}

impl Body {
    /// The request an event belongs to, to fill in (`None` for errors).
    pub fn stream_mut(&mut self) -> Option<&mut Stream> {
        match self {
            Body::RequestInit { at, .. } | Body::ResponseInit { at, .. } | Body::ResponseEnd { at, .. } => Some(at),
            Body::Error { .. } => None,
        }
    }

    /// The request an event belongs to (`None` for errors).
    pub fn stream(&self) -> Option<&Stream> {
        match self {
            Body::RequestInit { at, .. } | Body::ResponseInit { at, .. } | Body::ResponseEnd { at, .. } => Some(at),
            Body::Error { .. } => None,
        }
    }
}

impl TapLine {
    pub fn error(namespace: &str, pod: &str, message: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), pod: pod.into(), body: Body::Error { message: message.into() } }
    }

    /// The event a proxy sent, or `None` for one that carries no HTTP event (nothing to show).
    pub fn from_event(namespace: &str, pod: &str, event: TapEvent) -> Option<Self> {
        let direction = match ProxyDirection::try_from(event.proxy_direction) {
            Ok(ProxyDirection::Inbound) => "inbound",
            Ok(ProxyDirection::Outbound) => "outbound",
            _ => "unknown",
        };
        let labels = |meta: Option<tap_event::EndpointMeta>| meta.map(|m| m.labels.into_iter().collect());
        let stream = |id: Option<http::StreamId>| Stream {
            id: id.map_or_else(|| "-".into(), |id| format!("{}:{}", id.base, id.stream)),
            direction: direction.into(),
            source: event.source.and_then(|a| SocketAddr::try_from(a).ok()),
            destination: event.destination.and_then(|a| SocketAddr::try_from(a).ok()),
            source_meta: labels(event.source_meta.clone()).unwrap_or_default(),
            destination_meta: labels(event.destination_meta.clone()).unwrap_or_default(),
            route_meta: event.route_meta.clone().map(|m| m.labels.into_iter().collect()).unwrap_or_default(),
            source_pod: None,
            destination_pod: None,
        };
        let tap_event::Event::Http(http) = event.event.clone()?;
        let body = match http.event? {
            http::Event::RequestInit(init) => Body::RequestInit {
                at: stream(init.id),
                method: init
                    .method
                    .and_then(|m| ::http::Method::try_from(m).ok())
                    .map_or_else(|| "-".into(), |m| m.to_string()),
                scheme: init
                    .scheme
                    .and_then(|s| s.r#type)
                    .and_then(|t| TryInto::<std::borrow::Cow<'static, str>>::try_into(&t).ok())
                    .map_or_else(String::new, |s| s.into_owned()),
                authority: init.authority,
                path: init.path,
                headers: init
                    .headers
                    .map(|h| {
                        h.headers
                            .into_iter()
                            .map(|h| (h.name, String::from_utf8_lossy(&h.value).into_owned()))
                            .collect()
                    })
                    .unwrap_or_default(),
            },
            http::Event::ResponseInit(init) => Body::ResponseInit {
                at: stream(init.id),
                since_request_init_us: micros(init.since_request_init),
                http_status: init.http_status,
            },
            http::Event::ResponseEnd(end) => {
                let (grpc_status, reset_code) = match end.eos.and_then(|e| e.end) {
                    Some(eos::End::GrpcStatusCode(code)) => (Some(code), None),
                    Some(eos::End::ResetErrorCode(code)) => (None, Some(code)),
                    None => (None, None),
                };
                Body::ResponseEnd {
                    at: stream(end.id),
                    since_request_init_us: micros(end.since_request_init),
                    since_response_init_us: micros(end.since_response_init),
                    response_bytes: end.response_bytes,
                    grpc_status,
                    reset_code,
                }
            }
        };
        Some(Self { namespace: namespace.into(), pod: pod.into(), body })
    }
}

/// A protobuf duration in whole microseconds; negative or absent ones are 0.
fn micros(duration: Option<prost_types::Duration>) -> u64 {
    duration.and_then(|d| Duration::try_from(d).ok()).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use linkerd2_proxy_api::http_types::{HttpMethod, Scheme};
    use linkerd2_proxy_api::net::TcpAddress;
    use linkerd2_proxy_api::tap::Eos;

    use super::*;

    fn event(direction: ProxyDirection, http: http::Event) -> TapEvent {
        let src: SocketAddr = "10.0.0.5:51234".parse().unwrap();
        let dst: SocketAddr = "10.0.0.7:8080".parse().unwrap();
        TapEvent {
            source: Some(TcpAddress::from(src)),
            source_meta: Some(tap_event::EndpointMeta {
                labels: [("tls".to_string(), "true".to_string())].into_iter().collect(),
            }),
            route_meta: None,
            destination: Some(TcpAddress::from(dst)),
            destination_meta: None,
            proxy_direction: direction as i32,
            event: Some(tap_event::Event::Http(tap_event::Http { event: Some(http) })),
        }
    }

    #[test]
    fn each_http_event_converts_and_round_trips_through_json() {
        let id = Some(http::StreamId { base: 3, stream: 1 });
        let events = [
            http::Event::RequestInit(http::RequestInit {
                id,
                method: Some(HttpMethod::from(::http::Method::GET)),
                scheme: Some(Scheme::from("http")),
                authority: "web:8080".into(),
                path: "/hello".into(),
                headers: None,
            }),
            http::Event::ResponseInit(http::ResponseInit {
                id,
                since_request_init: Some(prost_types::Duration { seconds: 0, nanos: 812_000 }),
                http_status: 200,
                headers: None,
            }),
            http::Event::ResponseEnd(http::ResponseEnd {
                id,
                since_request_init: Some(prost_types::Duration { seconds: 1, nanos: 0 }),
                since_response_init: Some(prost_types::Duration { seconds: 0, nanos: 25_000 }),
                response_bytes: 13,
                eos: Some(Eos { end: Some(eos::End::GrpcStatusCode(0)) }),
                trailers: None,
            }),
        ];
        let lines: Vec<TapLine> = events
            .into_iter()
            .map(|e| TapLine::from_event("demo", "web-1", event(ProxyDirection::Inbound, e)).unwrap())
            .collect();
        let Body::RequestInit { at, method, scheme, authority, path, .. } = &lines[0].body else { panic!() };
        assert_eq!((at.id.as_str(), at.direction.as_str()), ("3:1", "inbound"));
        assert_eq!(
            (method.as_str(), scheme.as_str(), authority.as_str(), path.as_str()),
            ("GET", "http", "web:8080", "/hello")
        );
        assert_eq!(at.source_meta.get("tls").map(String::as_str), Some("true"));
        assert!(matches!(lines[1].body, Body::ResponseInit { since_request_init_us: 812, http_status: 200, .. }));
        assert!(matches!(
            lines[2].body,
            Body::ResponseEnd {
                since_request_init_us: 1_000_000,
                since_response_init_us: 25,
                response_bytes: 13,
                grpc_status: Some(0),
                reset_code: None,
                ..
            }
        ));
        for line in &lines {
            let json = serde_json::to_string(line).unwrap();
            assert!(!json.contains('\n'));
            assert_eq!(&serde_json::from_str::<TapLine>(&json).unwrap(), line, "{json}");
        }
        let json: serde_json::Value = serde_json::to_value(&lines[0]).unwrap();
        assert_eq!(json["type"], "requestInit");
        assert_eq!(json["source"], "10.0.0.5:51234");
        assert_eq!(json["pod"], "web-1");
        let error = TapLine::error("demo", "web-2", "connecting: refused");
        let json = serde_json::to_string(&error).unwrap();
        assert_eq!(json, r#"{"namespace":"demo","pod":"web-2","type":"error","message":"connecting: refused"}"#);
        assert_eq!(serde_json::from_str::<TapLine>(&json).unwrap(), error);
    }

    #[test]
    fn an_event_without_http_is_skipped() {
        let mut e = event(ProxyDirection::Outbound, http::Event::ResponseInit(Default::default()));
        e.event = None;
        assert!(TapLine::from_event("demo", "web-1", e).is_none());
    }
}
