//! TapEvents as linkerd2-proxy writes them: one base event per tapped request (direction,
//! addresses, endpoint and route labels) and the request/response events built on it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use linkerd2_proxy_api::http_types::{self, Headers, headers::Header};
use linkerd2_proxy_api::tap::TapEvent;
use linkerd2_proxy_api::tap::tap_event::{self, EndpointMeta, ProxyDirection, RouteMeta, http::Event};

use crate::transport::labels::{Direction, TlsLabel};

/// What a tapped request's events carry besides its HTTP parts; built only while a tap is open.
pub struct Meta {
    pub direction: Direction,
    /// The client's address: the app's (outbound) or the remote peer's (inbound).
    pub source: SocketAddr,
    /// The connection's original destination.
    pub destination: SocketAddr,
    pub source_labels: HashMap<String, String>,
    pub destination_labels: HashMap<String, String>,
    /// Present when a route took the request.
    pub route_labels: Option<HashMap<String, String>>,
}

/// linkerd2-proxy's `tls` label values when a side is not mTLS.
const NO_TLS_FROM_REMOTE: &str = "no_tls_from_remote";
const LOOPBACK: &str = "loopback";
const NOT_MESHED: &str = "not_provided_by_service_discovery";

fn labels<const N: usize>(pairs: [(&str, &str); N]) -> HashMap<String, String> {
    pairs.into_iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

impl Meta {
    /// A request on an inbound connection secured as `tls`, to this proxy (identity `own`).
    pub fn inbound(source: SocketAddr, destination: SocketAddr, tls: &TlsLabel, own: Option<&str>) -> Self {
        let (source_labels, destination_labels) = if tls.tls {
            let client = tls.client_id.as_deref().unwrap_or_default();
            (
                labels([("tls", "true"), ("client_id", client)]),
                labels([("tls", "true"), ("server_id", own.unwrap_or(""))]),
            )
        } else {
            (labels([("tls", NO_TLS_FROM_REMOTE)]), labels([("tls", NO_TLS_FROM_REMOTE)]))
        };
        Self {
            direction: Direction::inbound,
            source,
            destination,
            source_labels,
            destination_labels,
            route_labels: None,
        }
    }

    /// A request from the local app, sent upstream secured as `tls`; `service` is the
    /// destination's service (`name.namespace.svc.<domain>:port`) when discovery named one.
    pub fn outbound(
        source: SocketAddr,
        destination: SocketAddr,
        tls: &TlsLabel,
        service: Option<&str>,
        route: Option<&str>,
    ) -> Self {
        let mut destination_labels = match (&tls.server_id, tls.tls) {
            (Some(server), true) => labels([("tls", "true"), ("server_id", server)]),
            _ => labels([("tls", NOT_MESHED)]),
        };
        if let Some(service) = service {
            destination_labels.insert("authority".into(), service.into());
            let host = service.rsplit_once(':').map_or(service, |(h, _)| h);
            if let Some((name, rest)) = host.split_once('.')
                && let Some((namespace, _)) = rest.split_once(".svc")
            {
                destination_labels.insert("service".into(), name.into());
                destination_labels.insert("namespace".into(), namespace.into());
            }
        }
        Self {
            direction: Direction::outbound,
            source,
            destination,
            source_labels: labels([("tls", LOOPBACK)]),
            destination_labels,
            route_labels: route.map(|r| labels([("route", r)])),
        }
    }

    /// A request to an EgressNetwork's destination, as the destination's labels say it
    /// (`dst_kind=egress`, `egress_network=<ns>/<name>`, `dst_hostname`), so that a tap shows and
    /// matches it by hostname (`DestinationLabel` matches) rather than by its IP.
    pub fn egress(mut self, network: &str, hostname: &str) -> Self {
        let egress = labels([("dst_kind", "egress"), ("egress_network", network), ("dst_hostname", hostname)]);
        self.destination_labels.extend(egress);
        self
    }

    /// The event every one of the request's events is built on.
    pub fn base_event(self) -> TapEvent {
        TapEvent {
            source: Some(self.source.into()),
            source_meta: Some(EndpointMeta { labels: self.source_labels }),
            route_meta: self.route_labels.map(|labels| RouteMeta { labels }),
            destination: Some(self.destination.into()),
            destination_meta: Some(EndpointMeta { labels: self.destination_labels }),
            proxy_direction: match self.direction {
                Direction::inbound => ProxyDirection::Inbound,
                Direction::outbound => ProxyDirection::Outbound,
            }
            .into(),
            event: None,
        }
    }
}

/// `base` with one HTTP event.
pub fn http_event(base: &TapEvent, event: Event) -> TapEvent {
    TapEvent { event: Some(tap_event::Event::Http(tap_event::Http { event: Some(event) })), ..base.clone() }
}

/// Headers as the proto carries them, HTTP/2 pseudo-headers first.
pub fn headers<'a>(pseudo: impl IntoIterator<Item = (&'a str, &'a [u8])>, map: &http::HeaderMap) -> Headers {
    let pseudo = pseudo.into_iter().map(|(n, v)| Header { name: n.to_string(), value: v.to_vec() });
    let rest = map.iter().map(|(n, v)| Header { name: n.as_str().to_string(), value: v.as_bytes().to_vec() });
    http_types::Headers { headers: pseudo.chain(rest).collect() }
}

pub fn duration(d: Duration) -> Option<prost_types::Duration> {
    d.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_tls_and_identities_as_linkerd_does() {
        let (src, dst) = ("10.0.0.5:40000".parse().unwrap(), "10.0.0.7:8080".parse().unwrap());
        let mtls = TlsLabel { tls: true, client_id: Some("client.shop".into()), server_id: None };
        let inbound = Meta::inbound(src, dst, &mtls, Some("web.shop")).base_event();
        assert_eq!(inbound.proxy_direction, ProxyDirection::Inbound as i32);
        let source = &inbound.source_meta.unwrap().labels;
        assert_eq!((source["tls"].as_str(), source["client_id"].as_str()), ("true", "client.shop"));
        assert_eq!(inbound.destination_meta.unwrap().labels["server_id"], "web.shop");
        let plain = Meta::inbound(src, dst, &TlsLabel::plaintext(), Some("web.shop")).base_event();
        assert_eq!(plain.source_meta.unwrap().labels["tls"], "no_tls_from_remote");

        let upstream = TlsLabel { tls: true, client_id: None, server_id: Some("web.shop".into()) };
        let outbound =
            Meta::outbound(src, dst, &upstream, Some("web.shop.svc.cluster.local:80"), Some("api")).base_event();
        let dst_labels = outbound.destination_meta.unwrap().labels;
        assert_eq!(dst_labels["server_id"], "web.shop");
        assert_eq!((dst_labels["service"].as_str(), dst_labels["namespace"].as_str()), ("web", "shop"));
        assert_eq!(dst_labels["authority"], "web.shop.svc.cluster.local:80");
        assert_eq!(outbound.source_meta.unwrap().labels["tls"], "loopback");
        assert_eq!(outbound.route_meta.unwrap().labels["route"], "api");
        let unmeshed = Meta::outbound(src, dst, &TlsLabel::plaintext(), None, None).base_event();
        assert_eq!(unmeshed.destination_meta.unwrap().labels["tls"], "not_provided_by_service_discovery");
        assert!(unmeshed.route_meta.is_none());
        let egress = Meta::outbound(src, dst, &TlsLabel::plaintext(), None, None)
            .egress("shop/world", "api.example.test")
            .base_event();
        let dst_labels = egress.destination_meta.unwrap().labels;
        assert_eq!((dst_labels["dst_kind"].as_str(), dst_labels["egress_network"].as_str()), ("egress", "shop/world"));
        assert_eq!(dst_labels["dst_hostname"], "api.example.test");
        assert_eq!(dst_labels["tls"], "not_provided_by_service_discovery", "the mesh's own labels stay");
    }
}
