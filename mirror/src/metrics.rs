//! The mirror's Prometheus metrics, per linked cluster (`multicluster_*`), and its writer
//! Lease (`mirror_leader`), for its admin listener.
//!
//! Layer: model: depends on nothing else in the crate, so every layer may report to it.

use prometheus_client::encoding::{EncodeLabelSet, text::encode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabel {
    cluster: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterResultLabel {
    cluster: String,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    role: String,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    leader: Family<RoleLabel, Gauge>,
    link_up: Family<ClusterLabel, Gauge>,
    gateway_alive: Family<ClusterLabel, Gauge>,
    gateway_latency: Family<ClusterLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    mirrors: Family<ClusterLabel, Gauge>,
    mirror_syncs: Family<ClusterResultLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let leader = Family::<RoleLabel, Gauge>::default();
        registry.register("mirror_leader", "1 while this replica holds the mirror's writer Lease", leader.clone());
        let link_up = Family::<ClusterLabel, Gauge>::default();
        registry.register("multicluster_link_up", "1 while a linked cluster's API answers the mirror", link_up.clone());
        let gateway_alive = Family::<ClusterLabel, Gauge>::default();
        registry.register(
            "multicluster_gateway_alive",
            "1 while a linked cluster's gateway answers its probe",
            gateway_alive.clone(),
        );
        let gateway_latency = Family::<ClusterLabel, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "multicluster_gateway_probe_latency_ms",
            "The last successful gateway probe's round trip, in milliseconds",
            gateway_latency.clone(),
        );
        let mirrors = Family::<ClusterLabel, Gauge>::default();
        registry.register("multicluster_mirrors", "Mirror Services made from a linked cluster", mirrors.clone());
        let mirror_syncs = Family::<ClusterResultLabel, Counter>::default();
        registry.register(
            "multicluster_mirror_sync",
            "Mirror writes (create, update, delete) by linked cluster and result",
            mirror_syncs.clone(),
        );
        Self { registry, leader, link_up, gateway_alive, gateway_latency, mirrors, mirror_syncs }
    }
}

impl cnimesh_runtime::leader::LeaderGauge for Metrics {
    fn set_leader(&self, role: &str, leading: bool) {
        self.leader.get_or_create(&RoleLabel { role: role.to_string() }).set(i64::from(leading));
    }
}

impl Metrics {
    /// Whether a linked cluster's API answers.
    pub fn set_link_up(&self, cluster: &str, up: bool) {
        self.link_up.get_or_create(&ClusterLabel { cluster: cluster.to_string() }).set(i64::from(up));
    }

    /// A gateway probe's result (latency of a successful one).
    pub fn gateway_probed(&self, cluster: &str, latency_ms: Option<f64>) {
        let label = ClusterLabel { cluster: cluster.to_string() };
        self.gateway_alive.get_or_create(&label).set(i64::from(latency_ms.is_some()));
        if let Some(latency) = latency_ms {
            self.gateway_latency.get_or_create(&label).set(latency);
        }
    }

    /// How many mirrors a linked cluster has here.
    pub fn set_mirrors(&self, cluster: &str, count: usize) {
        self.mirrors
            .get_or_create(&ClusterLabel { cluster: cluster.to_string() })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// One mirror write, `ok` or `error`.
    pub fn mirror_synced(&self, cluster: &str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.mirror_syncs.get_or_create(&ClusterResultLabel { cluster: cluster.to_string(), result }).inc();
    }

    /// A Link is gone: its series go with it.
    pub fn forget_cluster(&self, cluster: &str) {
        let label = ClusterLabel { cluster: cluster.to_string() };
        self.link_up.remove(&label);
        self.gateway_alive.remove(&label);
        self.gateway_latency.remove(&label);
        self.mirrors.remove(&label);
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
