//! The metrics wrapper around the executor: a connection's `request_total`, `response_total`
//! and `response_latency_ms`. Handles are resolved once per (authority, TLS, cluster) and kept
//! for the connection's later requests: the common case builds no label strings and takes no
//! family lock.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderMap, Request, StatusCode};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use crate::http::classify::{Classification, classify};
use crate::outbound::egress::SeenAs;
use crate::serve::metrics::{Direction, DstKind, Metrics, RequestLabels, ResponseLabels, TargetCluster, TlsLabel};

/// (authority, TLS, cluster) triples whose handles a connection keeps: a connection's requests
/// nearly always share one (a route splitting over Services adds one per backend).
const MAX_CACHED_HANDLES: usize = 4;

/// One connection's request metrics.
pub(super) struct Measure {
    direction: Direction,
    /// The connection's original destination (`target_addr`).
    addr: SocketAddr,
    dst_kind: DstKind,
    metrics: Arc<Metrics>,
    cached: Mutex<Vec<Arc<Handles>>>,
}

impl Measure {
    pub(super) fn new(direction: Direction, addr: SocketAddr, egress: bool, metrics: Arc<Metrics>) -> Self {
        Self { direction, addr, dst_kind: DstKind::egress(egress), metrics, cached: Mutex::default() }
    }

    /// The same metrics for a connection to an EgressNetwork's destination (`dst_kind="egress"`)
    /// when `egress`.
    pub(super) fn for_egress(self, egress: bool) -> Self {
        Self { dst_kind: DstKind::egress(egress), ..self }
    }

    /// The handles for `authority` to a peer secured as `tls` in `cluster`, created on first use.
    pub(super) fn handles(&self, authority: &str, tls: &TlsLabel, cluster: &TargetCluster) -> Arc<Handles> {
        let mut cached = self.cached.lock();
        if let Some(h) = cached
            .iter()
            .find(|h| h.authority == authority && h.labels.tls == *tls && h.labels.target_cluster == *cluster)
        {
            return h.clone();
        }
        let metrics = &self.metrics;
        let labels = RequestLabels {
            direction: self.direction,
            target_addr: metrics.target_label(self.direction, self.addr),
            dst_kind: self.dst_kind,
            target_cluster: cluster.clone(),
            authority: metrics.authority_label(self.direction, authority),
            tls: tls.clone(),
        };
        let handles = Arc::new(Handles {
            authority: authority.to_string(),
            requests: metrics.request_total.get_or_create(&labels).clone(),
            latency: metrics.response_latency_ms.get_or_create(&labels).clone(),
            metrics: metrics.clone(),
            responses: Mutex::default(),
            labels,
        });
        if cached.len() >= MAX_CACHED_HANDLES {
            cached.remove(0);
        }
        cached.push(handles.clone());
        handles
    }

    /// An egress request whose Host is not bound to its destination is counted under the
    /// destination's address, never under the name it claimed.
    pub(super) fn seen_as<B>(&self, req: &Request<B>, handles: Arc<Handles>) -> Arc<Handles> {
        if self.dst_kind != DstKind::Egress {
            return handles;
        }
        match req.extensions().get::<SeenAs>() {
            Some(seen) if seen.unbound => {
                self.handles(&self.addr.to_string(), &handles.labels.tls, &handles.labels.target_cluster)
            }
            _ => handles,
        }
    }

    /// The same authority's handles under `tls` and `cluster`: a route's backend (another
    /// Service, a canary) is labelled with its own TLS and server identity, a federated
    /// Service's answer with the cluster of the endpoint it came from.
    pub(super) fn relabelled(&self, handles: Arc<Handles>, tls: &TlsLabel, cluster: &TargetCluster) -> Arc<Handles> {
        if handles.labels.tls == *tls && handles.labels.target_cluster == *cluster {
            return handles;
        }
        self.handles(&handles.authority, tls, cluster)
    }

    /// The same authority and TLS's handles in `cluster`.
    pub(super) fn in_cluster(&self, handles: Arc<Handles>, cluster: &TargetCluster) -> Arc<Handles> {
        if handles.labels.target_cluster == *cluster {
            return handles;
        }
        self.handles(&handles.authority, &handles.labels.tls, cluster)
    }
}

/// The metric handles of one (connection, authority, peer TLS, cluster).
pub(super) struct Handles {
    authority: String,
    labels: RequestLabels,
    requests: Counter,
    latency: Histogram,
    metrics: Arc<Metrics>,
    responses: Mutex<Vec<(u16, Classification, Counter)>>,
}

impl Handles {
    pub(super) fn request(&self) {
        self.requests.inc();
    }

    /// The time to the response's head, from `start`.
    pub(super) fn latency(&self, start: Instant) {
        self.latency.observe(start.elapsed().as_secs_f64() * 1e3);
    }

    /// A response with `status` and `headers` (an answer of the proxy's own, an error's).
    pub(super) fn answered(&self, status: StatusCode, headers: &HeaderMap) {
        self.count_response(status, classify(status, headers));
    }

    pub(super) fn count_response(&self, status: StatusCode, classification: Classification) {
        let code = status.as_u16();
        let mut responses = self.responses.lock();
        if let Some((_, _, counter)) = responses.iter().find(|(c, k, _)| *c == code && *k == classification) {
            counter.inc();
            return;
        }
        let labels = ResponseLabels {
            direction: self.labels.direction,
            target_addr: self.labels.target_addr.clone(),
            dst_kind: self.labels.dst_kind,
            target_cluster: self.labels.target_cluster.clone(),
            authority: self.labels.authority.clone(),
            tls: self.labels.tls.clone(),
            status_code: code.to_string(),
            classification: classification.as_str().into(),
        };
        let counter = self.metrics.response_total.get_or_create(&labels).clone();
        counter.inc();
        // A handful of (status, classification) pairs per authority at most.
        if responses.len() < 16 {
            responses.push((code, classification, counter));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_kept_per_authority_and_a_relabelled_request_counts_under_its_own_labels() {
        let metrics = Arc::new(Metrics::default());
        let measure = Measure::new(Direction::outbound, "10.0.0.1:80".parse().unwrap(), false, metrics.clone());
        let plain = TlsLabel::plaintext();
        let web = measure.handles("web:80", &plain, &TargetCluster::default());
        assert!(Arc::ptr_eq(&web, &measure.handles("web:80", &plain, &TargetCluster::default())), "kept");
        assert!(Arc::ptr_eq(&web, &measure.relabelled(web.clone(), &plain, &TargetCluster::default())));
        let meshed = TlsLabel { tls: true, client_id: None, server_id: Some("canary".into()) };
        let canary = measure.relabelled(web.clone(), &meshed, &TargetCluster::default());
        web.request();
        canary.request();
        canary.answered(StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new());
        let text = metrics.encode();
        let request = "request_total{direction=\"outbound\",target_addr=\"10.0.0.1:80\",authority=\"web:80\",tls=";
        assert!(text.contains(&format!("{request}\"false\"}} 1")), "{text}");
        assert!(text.contains(&format!("{request}\"true\",server_id=\"canary\"}} 1")), "{text}");
        assert!(text.contains("status_code=\"503\",classification=\"failure\"} 1"), "{text}");
    }
}
