//! The outbound route metrics, as linkerd2-proxy names them: parent, route and backend labels,
//! the families (handles into the app's registry) and the bound on their series.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::model::ResourceRef;

/// Distinct (parent, route, backend) series of route metrics.
const MAX_ROUTE_SERIES: usize = 1024;

/// `outbound_http_route_request_duration_seconds`: Linkerd's `parent_*` and `route_*` labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteLabels {
    pub parent: ResourceRef,
    pub route: ResourceRef,
}

/// `outbound_http_route_backend_requests_total`: the route's labels and `backend_*`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteBackendLabels {
    pub route: RouteLabels,
    pub backend: ResourceRef,
}

/// `outbound_http_route_request_statuses_total`: the route's labels, the response's
/// `http_status` and `error` (empty when the upstream answered, `PROXY` when the proxy answered
/// for it: a timeout, no endpoint, a refused connection), as Linkerd writes them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteStatusLabels {
    pub route: RouteLabels,
    pub http_status: u16,
    pub error: &'static str,
}

impl EncodeLabelSet for RouteStatusLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.route.encode(encoder)?;
        let labels = vec![
            ("http_status".to_string(), self.http_status.to_string()),
            ("error".to_string(), self.error.to_string()),
        ];
        labels.encode(encoder)
    }
}

/// `<prefix>_group`, `_kind`, `_namespace`, `_name` and, for parents and backends, `_port` and
/// `_section_name`, as linkerd2-proxy writes them.
fn resource_labels(prefix: &str, r: &ResourceRef, with_port: bool) -> Vec<(String, String)> {
    let mut labels = vec![
        (format!("{prefix}_group"), r.group.to_string()),
        (format!("{prefix}_kind"), r.kind.to_string()),
        (format!("{prefix}_namespace"), r.namespace.to_string()),
        (format!("{prefix}_name"), r.name.to_string()),
    ];
    if with_port {
        labels.push((format!("{prefix}_port"), r.port.to_string()));
        labels.push((format!("{prefix}_section_name"), r.section.to_string()));
    }
    labels
}

impl EncodeLabelSet for RouteLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut labels = resource_labels("parent", &self.parent, true);
        labels.extend(resource_labels("route", &self.route, false));
        labels.encode(encoder)
    }
}

impl EncodeLabelSet for RouteBackendLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.route.encode(encoder)?;
        resource_labels("backend", &self.backend, true).encode(encoder)
    }
}

/// One (parent, route, backend)'s metric handles.
#[derive(Clone)]
pub struct RouteHandles {
    pub backend_requests: Counter,
    pub duration: Histogram,
    pub retries: Counter,
    pub retry_overflow: Counter,
    /// The route's answers by status (statuses are known once answered).
    statuses: Arc<RouteStatuses>,
}

impl RouteHandles {
    /// Counts one answer of the route: its status, and whether the proxy made it.
    pub fn answered(&self, status: u16, by_proxy: bool) {
        self.statuses.counter(status, by_proxy).inc();
    }
}

/// A route's `outbound_http_route_request_statuses_total` counters: each (status, by proxy)'s is
/// made once and kept, so that counting an answer on the request path clones no label and hashes
/// no label set.
struct RouteStatuses {
    family: Family<RouteStatusLabels, Counter>,
    route: RouteLabels,
    /// A route sees a handful of statuses: a short list beats a map.
    made: Mutex<Vec<(u16, bool, Counter)>>,
}

impl RouteStatuses {
    fn counter(&self, status: u16, by_proxy: bool) -> Counter {
        let mut made = self.made.lock();
        if let Some((.., counter)) = made.iter().find(|(s, p, _)| (*s, *p) == (status, by_proxy)) {
            return counter.clone();
        }
        let labels = RouteStatusLabels {
            route: self.route.clone(),
            http_status: status,
            error: if by_proxy { "PROXY" } else { "" },
        };
        let counter = self.family.get_or_create(&labels).clone();
        made.push((status, by_proxy, counter.clone()));
        counter
    }
}

/// The buckets of `outbound_http_route_request_duration_seconds`, in seconds.
pub fn route_duration_histogram() -> Histogram {
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
}

/// The route families and the series seen so far.
pub struct RouteMetrics {
    pub outbound_http_route_request_duration_seconds: Family<RouteLabels, Histogram, fn() -> Histogram>,
    pub outbound_http_route_backend_requests_total: Family<RouteBackendLabels, Counter>,
    pub outbound_http_route_retry_requests_total: Family<RouteLabels, Counter>,
    pub outbound_http_route_retry_overflow_total: Family<RouteLabels, Counter>,
    pub outbound_http_route_request_statuses_total: Family<RouteStatusLabels, Counter>,
    /// Distinct route series so far (routes and backends come from the control plane, parents
    /// from destinations: the product is capped).
    route_series: Mutex<HashSet<RouteBackendLabels>>,
}

impl RouteMetrics {
    pub fn new(
        outbound_http_route_request_duration_seconds: Family<RouteLabels, Histogram, fn() -> Histogram>,
        outbound_http_route_backend_requests_total: Family<RouteBackendLabels, Counter>,
        outbound_http_route_retry_requests_total: Family<RouteLabels, Counter>,
        outbound_http_route_retry_overflow_total: Family<RouteLabels, Counter>,
        outbound_http_route_request_statuses_total: Family<RouteStatusLabels, Counter>,
    ) -> Self {
        Self {
            outbound_http_route_request_duration_seconds,
            outbound_http_route_backend_requests_total,
            outbound_http_route_retry_requests_total,
            outbound_http_route_retry_overflow_total,
            outbound_http_route_request_statuses_total,
            route_series: Mutex::default(),
        }
    }

    /// The handles of one (parent, route, backend): beyond [`MAX_ROUTE_SERIES`] distinct ones,
    /// the route and backend read `other`.
    pub fn route_handles(&self, mut labels: RouteBackendLabels) -> RouteHandles {
        {
            let mut seen = self.route_series.lock();
            if !seen.contains(&labels) {
                if seen.len() >= MAX_ROUTE_SERIES {
                    let other = ResourceRef::default_named("other");
                    labels.route.route = other.clone();
                    labels.backend = other;
                } else {
                    seen.insert(labels.clone());
                }
            }
        }
        RouteHandles {
            duration: self.outbound_http_route_request_duration_seconds.get_or_create(&labels.route).clone(),
            retries: self.outbound_http_route_retry_requests_total.get_or_create(&labels.route).clone(),
            retry_overflow: self.outbound_http_route_retry_overflow_total.get_or_create(&labels.route).clone(),
            backend_requests: self.outbound_http_route_backend_requests_total.get_or_create(&labels).clone(),
            statuses: Arc::new(RouteStatuses {
                family: self.outbound_http_route_request_statuses_total.clone(),
                route: labels.route,
                made: Mutex::default(),
            }),
        }
    }
}
