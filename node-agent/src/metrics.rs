//! The agent's own `/metrics` (served on its health listener): what it decided for the plugin
//! and how fast, what it repaired, how often it re-chained the CNI configuration, and what went
//! wrong on the decision socket. prometheus-client like the proxy; names are prefixed
//! `cnimesh_node_` so they never collide with the proxies' in one Prometheus.

use std::time::Duration;

use cnimesh_cni::agent::Decision;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// Where a decision connection failed.
#[derive(Debug, Clone, Copy)]
pub enum SocketError {
    Accept,
    /// Reading the request or writing the answer.
    Io,
    Timeout,
    Malformed,
}

pub struct AgentMetrics {
    registry: Registry,
    decisions: Family<ResultLabel, Counter>,
    decision_seconds: Histogram,
    repairs: Family<ResultLabel, Counter>,
    /// Writes of our entry into the CNI configuration: the first chaining and every re-patch
    /// after another writer removed it.
    pub cni_config_writes: Counter,
    socket_errors: Family<KindLabel, Counter>,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("cnimesh_node");
        // From a cache hit (well under a millisecond) to an API server lookup near the plugin's
        // 2 s timeout.
        let decision_seconds =
            Histogram::new([0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0]);
        let m = Self {
            registry: Registry::default(),
            decisions: Family::default(),
            decision_seconds,
            repairs: Family::default(),
            cni_config_writes: Counter::default(),
            socket_errors: Family::default(),
        };
        // prometheus-client appends `_total` to counters itself.
        registry.register("decisions", "Capture decisions answered to the CNI plugin, by result", m.decisions.clone());
        registry.register(
            "decision_duration_seconds",
            "Time to decide one pod, from request read to answer",
            m.decision_seconds.clone(),
        );
        registry.register("repairs", "Uncaptured meshed pods repaired, by result", m.repairs.clone());
        registry.register(
            "cni_config_writes",
            "Writes of cnimesh-cni into the CNI configuration (first chaining and re-patches)",
            m.cni_config_writes.clone(),
        );
        registry.register("socket_errors", "Decision socket failures, by kind", m.socket_errors.clone());
        Self { registry, ..m }
    }
}

impl AgentMetrics {
    pub fn decided(&self, decision: &Decision, took: Duration) {
        let result = match decision {
            Decision::Capture { .. } => "capture",
            Decision::Skip { .. } => "skip",
            Decision::Error { retry: true, .. } => "retry",
            Decision::Error { retry: false, .. } => "error",
        };
        self.decisions.get_or_create(&ResultLabel { result }).inc();
        self.decision_seconds.observe(took.as_secs_f64());
    }

    pub fn repaired(&self, ok: bool) {
        let result = if ok { "repaired" } else { "failed" };
        self.repairs.get_or_create(&ResultLabel { result }).inc();
    }

    pub fn socket_error(&self, error: SocketError) {
        let kind = match error {
            SocketError::Accept => "accept",
            SocketError::Io => "io",
            SocketError::Timeout => "timeout",
            SocketError::Malformed => "malformed",
        };
        self.socket_errors.get_or_create(&KindLabel { kind }).inc();
    }

    /// The registry, for readers of its descriptors (the dashboards' test).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn encode(&self) -> String {
        encode(&self.registry)
    }
}

/// A registry in the OpenMetrics text format.
fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("writing to a String cannot fail");
    out
}

/// Host mode's `/metrics` (`cnimesh-node host`): the proxy it supervises and the rules it keeps.
pub struct HostMetrics {
    registry: Registry,
    proxy_exits: Counter,
    /// 1 while the proxy runs.
    pub proxy_up: Gauge,
    rule_repairs: Family<ResultLabel, Counter>,
}

impl Default for HostMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("cnimesh_node_host");
        let m = Self {
            registry: Registry::default(),
            proxy_exits: Counter::default(),
            proxy_up: Gauge::default(),
            rule_repairs: Family::default(),
        };
        registry.register(
            "proxy_exits",
            "Exits of the supervised proxy (each is followed by a restart)",
            m.proxy_exits.clone(),
        );
        registry.register("proxy_up", "1 while the supervised proxy runs", m.proxy_up.clone());
        registry.register(
            "rule_repairs",
            "Reinstalls of the host's capture rules after they were changed or flushed, by result",
            m.rule_repairs.clone(),
        );
        Self { registry, ..m }
    }
}

impl HostMetrics {
    pub fn proxy_exited(&self) {
        self.proxy_exits.inc();
    }

    pub fn rule_repaired(&self, ok: bool) {
        let result = if ok { "repaired" } else { "failed" };
        self.rule_repairs.get_or_create(&ResultLabel { result }).inc();
    }

    pub fn encode(&self) -> String {
        encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_exported_with_its_prefix() {
        let m = AgentMetrics::default();
        m.decided(&Decision::Skip { reason: "not meshed".into() }, Duration::from_micros(300));
        m.decided(&Decision::Error { message: "unknown".into(), retry: true }, Duration::from_millis(3));
        m.repaired(true);
        m.cni_config_writes.inc();
        m.socket_error(SocketError::Malformed);
        let host = HostMetrics::default();
        host.proxy_exited();
        host.proxy_up.set(1);
        host.rule_repaired(true);
        let host_text = host.encode();
        for line in [
            "cnimesh_node_host_proxy_exits_total 1",
            "cnimesh_node_host_proxy_up 1",
            "cnimesh_node_host_rule_repairs_total{result=\"repaired\"} 1",
        ] {
            assert!(host_text.contains(line), "{line} missing from\n{host_text}");
        }
        let text = m.encode();
        for line in [
            "cnimesh_node_decisions_total{result=\"skip\"} 1",
            "cnimesh_node_decisions_total{result=\"retry\"} 1",
            "cnimesh_node_decision_duration_seconds_count 2",
            "cnimesh_node_decision_duration_seconds_bucket{le=\"0.0005\"} 1",
            "cnimesh_node_repairs_total{result=\"repaired\"} 1",
            "cnimesh_node_cni_config_writes_total 1",
            "cnimesh_node_socket_errors_total{kind=\"malformed\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
