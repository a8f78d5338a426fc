//! What the proxy must know about inbound policy before the control plane answers: the
//! effective default policy (pod annotation > namespace annotation > cluster setting), the ports the pod declares (so the proxy asks for their policy at start-up), and the
//! cluster networks `cluster-authenticated` admits. Also the warnings for app ports the capture
//! skips. Pure layer: the namespace's annotation is looked up by the caller.

use std::collections::BTreeSet;

use cnimesh_common::names::{
    DEFAULT_SKIP_INBOUND_PORTS, PROXY_ADMIN_PORT, PROXY_INBOUND_PORT, PROXY_OUTBOUND_PORT,
    SKIP_INBOUND_PORTS_ANNOTATION,
};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::policy::model::{DefaultPolicy, default_policy_of};

/// The proxy's start-up default for ports no Server names, until the control plane answers.
pub const POLICY_DEFAULT_ENV: &str = "CNIMESH_PROXY_POLICY_DEFAULT";
/// The pod's declared TCP ports: comma-separated, sorted, de-duplicated (agreed with the proxy).
pub const INBOUND_PORTS_ENV: &str = "CNIMESH_PROXY_INBOUND_PORTS";
/// The networks `cluster-authenticated` admits, comma-separated CIDRs.
pub const CLUSTER_NETWORKS_ENV: &str = "CNIMESH_PROXY_POLICY_CLUSTER_NETWORKS";

/// What the webhook knows of the pod's namespace's `config.cnimesh.io/default-inbound-policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceDefault {
    /// The namespace was read: its annotation, if it has one (a misspelt value already reads as
    /// `deny`, as the control plane reads it).
    Read(Option<DefaultPolicy>),
    /// Nobody can say (`cnimesh inject` offline, a webhook without a namespace source): the
    /// cluster setting stands.
    NotLooked,
    /// The namespace could not be read: fail closed.
    Unreadable(String),
}

/// The default the proxy starts with, and a warning when it had to fail closed.
///
/// An unreadable namespace gives `deny`, the strictest: the value only governs the time before
/// the control plane's first answer (every answer carries the effective default and replaces
/// it), so failing closed costs a pod at most its first seconds of unnamed ports, where failing
/// open would hand an attacker exactly that window.
pub fn effective_default(
    pod: &ObjectMeta,
    pod_key: &str,
    namespace: &NamespaceDefault,
    cluster: DefaultPolicy,
) -> (DefaultPolicy, Option<String>) {
    if let Some(own) = default_policy_of(pod_key, pod) {
        return (own, None);
    }
    match namespace {
        NamespaceDefault::Read(ns) => (ns.unwrap_or(cluster), None),
        NamespaceDefault::NotLooked => (cluster, None),
        NamespaceDefault::Unreadable(why) => (
            DefaultPolicy::Deny,
            Some(format!(
                "cannot read the namespace's default inbound policy ({why}): the proxy starts with `deny` \
                 until the control plane answers"
            )),
        ),
    }
}

/// The containers that serve: app containers and native sidecars (init containers with
/// `restartPolicy: Always`); never the proxy itself.
fn serving(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    let sidecars = spec.init_containers.iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.containers.iter().chain(sidecars).filter(|c| c.name != cnimesh_common::names::PROXY_CONTAINER)
}

/// `(container, port)` for every TCP `containerPort` of a serving container.
fn tcp_ports(spec: &PodSpec) -> impl Iterator<Item = (&str, u16)> {
    serving(spec).flat_map(|c| {
        c.ports
            .iter()
            .flatten()
            .filter(|p| p.protocol.as_deref().is_none_or(|proto| proto == "TCP"))
            .filter_map(|p| u16::try_from(p.container_port).ok().filter(|p| *p != 0))
            .map(move |p| (c.name.as_str(), p))
    })
}

/// `CNIMESH_PROXY_INBOUND_PORTS`: sorted, de-duplicated, without the proxy's own ports. `None`
/// when the pod declares none.
pub fn inbound_ports(spec: &PodSpec) -> Option<String> {
    let own = [PROXY_INBOUND_PORT, PROXY_OUTBOUND_PORT, PROXY_ADMIN_PORT];
    let ports: BTreeSet<u16> = tcp_ports(spec).map(|(_, p)| p).filter(|p| !own.contains(p)).collect();
    (!ports.is_empty()).then(|| ports.iter().map(u16::to_string).collect::<Vec<_>>().join(","))
}

/// The ports of a `skip-inbound-ports` value (`8081, 9000-9100`); unreadable entries are left to
/// the node agent, which refuses the pod with its own message.
fn annotated_skips(value: &str) -> Vec<(u16, u16)> {
    value
        .split(',')
        .map(str::trim)
        .filter_map(|entry| {
            let (first, last) = entry.split_once('-').unwrap_or((entry, entry));
            Some((first.trim().parse().ok()?, last.trim().parse().ok()?))
        })
        .collect()
}

/// One warning per app port the capture never hands to the proxy: the mesh's own ports (which
/// the proxy or the control plane use) and the pod's `skip-inbound-ports`. Traffic to those
/// ports reaches the app directly, with no mTLS and no authorization.
pub fn skipped_port_warnings(pod: &ObjectMeta, spec: &PodSpec) -> Vec<String> {
    let annotation = pod.annotations.as_ref().and_then(|a| a.get(SKIP_INBOUND_PORTS_ANNOTATION));
    let skipped = annotation.map(|v| annotated_skips(v)).unwrap_or_default();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (container, port) in tcp_ports(spec) {
        if !seen.insert((container, port)) {
            continue;
        }
        let why = if DEFAULT_SKIP_INBOUND_PORTS.contains(&port) {
            "a port the mesh reserves (4190 control plane, 4191 proxy admin, 4567/4568), which capture skips"
        } else if skipped.iter().any(|(a, b)| (*a..=*b).contains(&port)) {
            "listed in annotation config.cnimesh.io/skip-inbound-ports"
        } else {
            continue;
        };
        out.push(format!(
            "cnimesh: container {container} port {port} is not protected by the proxy ({why}): connections to it \
             bypass mTLS and authorization policy"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(annotations: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(json!({"name": "p", "annotations": annotations})).unwrap()
    }

    #[test]
    fn the_pod_beats_the_namespace_which_beats_the_cluster_and_an_unreadable_namespace_denies() {
        use DefaultPolicy::*;
        let annotated = meta(json!({"config.cnimesh.io/default-inbound-policy": "all-authenticated"}));
        let plain = meta(json!({}));
        let misspelt = meta(json!({"config.cnimesh.io/default-inbound-policy": "all-unauthenticatd"}));
        let ns = NamespaceDefault::Read(Some(ClusterAuthenticated));
        assert_eq!(effective_default(&annotated, "n/p", &ns, AllUnauthenticated), (AllAuthenticated, None));
        assert_eq!(effective_default(&plain, "n/p", &ns, AllUnauthenticated), (ClusterAuthenticated, None));
        assert_eq!(effective_default(&plain, "n/p", &NamespaceDefault::Read(None), Deny), (Deny, None));
        assert_eq!(
            effective_default(&plain, "n/p", &NamespaceDefault::NotLooked, AllAuthenticated).0,
            AllAuthenticated
        );
        // As the control plane reads it: a typo fails closed.
        assert_eq!(effective_default(&misspelt, "n/p", &ns, AllUnauthenticated).0, Deny);
        let (policy, warning) =
            effective_default(&plain, "n/p", &NamespaceDefault::Unreadable("timeout".into()), AllUnauthenticated);
        assert_eq!(policy, Deny);
        assert!(warning.unwrap().contains("timeout"));
    }

    /// `audit` is a default policy like the others, on a pod or its namespace.
    #[test]
    fn audit_is_read_as_a_default_policy_from_pod_and_namespace() {
        use DefaultPolicy::*;
        let audited = meta(json!({"config.cnimesh.io/default-inbound-policy": "audit"}));
        let plain = meta(json!({}));
        assert_eq!(effective_default(&audited, "n/p", &NamespaceDefault::Read(None), Deny), (Audit, None));
        assert_eq!(effective_default(&plain, "n/p", &NamespaceDefault::Read(Some(Audit)), Deny), (Audit, None));
        assert_eq!("audit".parse::<DefaultPolicy>(), Ok(Audit));
    }

    #[test]
    fn inbound_ports_are_sorted_unique_tcp_ports_of_serving_containers_without_the_proxys() {
        let spec: PodSpec = serde_json::from_value(json!({
            "initContainers": [
                {"name": "sidecar", "restartPolicy": "Always", "ports": [{"containerPort": 9090}]},
                {"name": "setup", "ports": [{"containerPort": 7000}]},
            ],
            "containers": [
                {"name": "app", "ports": [{"containerPort": 8080}, {"containerPort": 53, "protocol": "UDP"}, {"containerPort": 8080}]},
                {"name": "other", "ports": [{"containerPort": 443}, {"containerPort": 4143}]},
                {"name": "cnimesh-proxy", "ports": [{"containerPort": 4191}, {"containerPort": 5000}]},
            ],
        }))
        .unwrap();
        assert_eq!(inbound_ports(&spec).as_deref(), Some("443,8080,9090"));
        let none: PodSpec = serde_json::from_value(json!({"containers": [{"name": "app"}]})).unwrap();
        assert_eq!(inbound_ports(&none), None);
    }

    #[test]
    fn a_container_on_a_port_the_capture_skips_is_named_with_the_reason() {
        let spec: PodSpec = serde_json::from_value(json!({
            "containers": [
                {"name": "app", "ports": [{"containerPort": 4191}, {"containerPort": 8080}, {"containerPort": 9001}]},
                {"name": "debug", "ports": [{"containerPort": 4567}]},
            ],
        }))
        .unwrap();
        let warnings =
            skipped_port_warnings(&meta(json!({"config.cnimesh.io/skip-inbound-ports": "9000-9100, x"})), &spec);
        assert_eq!(warnings.len(), 3, "{warnings:#?}");
        assert!(warnings[0].contains("container app port 4191") && warnings[0].contains("reserves"));
        assert!(warnings[1].contains("container app port 9001") && warnings[1].contains("skip-inbound-ports"));
        assert!(warnings[2].contains("container debug port 4567"));
        assert!(skipped_port_warnings(&meta(json!({})), &spec).iter().all(|w| !w.contains("9001")));
    }
}
