//! ExternalWorkloads: meshed workloads outside Kubernetes ([`crd`]), read once into an
//! [`ExternalRecord`] that Destination (its addresses as endpoints of the Services selecting it,
//! with its identity) and inbound policy (the Servers selecting it apply to its proxy) both use.
//!
//! A proxy running as an ExternalWorkload names itself to the policy API as Linkerd's do:
//! `{"ns": "<namespace>", "kind": "external_workload", "name": "<name>"}`; the policy index keeps
//! it under [`policy_key`], which no pod can have.
//!
//! [`join_store`]: the pending join tokens of ExternalWorkloads and their use (kube).
//!
//! Layer: model (pure, but [`join_store`]: kube): above `identity` (the reserved namespaces, the
//! join tokens), below the indexes.

pub mod crd;
pub mod join_store;

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use crd::{ExternalPort, ExternalWorkload, ExternalWorkloadSpec};

use crate::identity::Reserved;
use crate::meta::{Invalid, NsName};

/// The `kind` a proxy sends in its JSON workload for an ExternalWorkload.
pub const WORKLOAD_KIND: &str = "external_workload";

/// The key the policy index keeps ExternalWorkload `name` of `namespace` under, beside pods: a
/// `/` cannot appear in a pod's name, so the two never meet.
pub fn policy_key(namespace: &str, name: &str) -> NsName {
    NsName::new(namespace, format!("{}/{name}", crd::RESOURCE_KIND))
}

/// The ExternalWorkload a [`policy_key`] stands for; `None` for a pod's key.
pub fn of_policy_key(key: &NsName) -> Option<NsName> {
    let name = key.name.strip_prefix(crd::RESOURCE_KIND)?.strip_prefix('/')?;
    Some(NsName::new(&key.namespace, name))
}

/// What the indexes need of an ExternalWorkload, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalRecord {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Sorted, without duplicates, never empty.
    pub ips: Vec<IpAddr>,
    /// Port name → number.
    pub named_ports: BTreeMap<String, u16>,
    pub service_account: String,
    pub revoked: bool,
}

impl ExternalRecord {
    /// The record, or why the object cannot be used (its name is the caller's to log).
    pub fn from_crd(workload: &ExternalWorkload) -> Result<Self, Invalid> {
        Self::from_parts(&workload.metadata, &workload.spec)
    }

    pub fn from_parts(meta: &ObjectMeta, spec: &ExternalWorkloadSpec) -> Result<Self, Invalid> {
        let key = NsName::of(meta);
        if spec.workload_ips.is_empty() {
            return Err(Invalid("workloadIPs: at least one address is required".into()));
        }
        let mut ips = Vec::with_capacity(spec.workload_ips.len());
        for ip in &spec.workload_ips {
            let addr: IpAddr =
                ip.trim().parse().map_err(|_| Invalid(format!("workloadIPs: {ip:?} is not an IP address")))?;
            if addr.is_unspecified() || addr.is_loopback() || addr.is_multicast() {
                return Err(Invalid(format!(
                    "workloadIPs: {ip} is an unspecified, loopback or multicast address, never a workload's"
                )));
            }
            ips.push(addr);
        }
        ips.sort();
        ips.dedup();
        let mut named_ports = BTreeMap::new();
        for (i, port) in spec.ports.iter().enumerate() {
            let number = u16::try_from(port.port)
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| Invalid(format!("ports[{i}].port: {} is not a port (1-65535)", port.port)))?;
            if port.protocol.as_deref().is_some_and(|p| p != "TCP") {
                return Err(Invalid(format!("ports[{i}].protocol: {:?}: only TCP is meshed", port.protocol)));
            }
            if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty())
                && named_ports.insert(name.to_string(), number).is_some()
            {
                return Err(Invalid(format!("ports[{i}].name: {name:?} is named twice")));
            }
        }
        let sa = spec.service_account_name.as_str();
        if sa.is_empty()
            || sa.len() > 253
            || !sa.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return Err(Invalid(format!("serviceAccountName: {sa:?} is not a ServiceAccount name")));
        }
        Reserved::default().check(&key.namespace, sa).map_err(|e| Invalid(format!("serviceAccountName: {e}")))?;
        Ok(Self {
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta.annotations.clone().unwrap_or_default(),
            ips,
            named_ports,
            service_account: sa.to_string(),
            revoked: spec.revoked,
        })
    }

    /// Whether a Service's selector picks it: equality on every selector label, as for pods; an
    /// empty selector picks nothing (a Service without one has hand-written endpoints).
    pub fn selected_by(&self, selector: &BTreeMap<String, String>) -> bool {
        !selector.is_empty() && selector.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(spec: serde_json::Value) -> ExternalWorkload {
        serde_json::from_value(serde_json::json!({
            "apiVersion": crd::API_VERSION, "kind": "ExternalWorkload",
            "metadata": {"name": "db-vm", "namespace": "shop", "labels": {"app": "db"}},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn a_good_external_workload_reads_into_its_record() {
        let record = ExternalRecord::from_crd(&workload(serde_json::json!({
            "workloadIPs": ["192.0.2.10", "2001:db8::10", "192.0.2.10"],
            "ports": [{"name": "pg", "port": 5432}, {"port": 9000, "protocol": "TCP"}],
            "serviceAccountName": "db",
        })))
        .unwrap();
        assert_eq!(record.ips.len(), 2, "duplicates go: {:?}", record.ips);
        assert_eq!(record.named_ports, BTreeMap::from([("pg".to_string(), 5432)]));
        assert_eq!(record.service_account, "db");
        assert!(record.selected_by(&BTreeMap::from([("app".to_string(), "db".to_string())])));
        assert!(!record.selected_by(&BTreeMap::new()), "an empty selector picks nothing");
    }

    #[test]
    fn bad_external_workloads_are_refused_naming_the_field_and_the_reason() {
        let refused = |spec: serde_json::Value| ExternalRecord::from_crd(&workload(spec)).unwrap_err().0;
        let sa = "\"serviceAccountName\": \"db\"";
        let with = |extra: &str| serde_json::from_str::<serde_json::Value>(&format!("{{{extra}, {sa}}}")).unwrap();
        assert!(refused(with(r#""workloadIPs": []"#)).contains("at least one address"));
        assert!(refused(with(r#""workloadIPs": ["10.0.0.300"]"#)).contains("\"10.0.0.300\" is not an IP address"));
        assert!(refused(with(r#""workloadIPs": ["127.0.0.1"]"#)).contains("loopback"));
        assert!(refused(with(r#""workloadIPs": ["0.0.0.0"]"#)).contains("unspecified"));
        let e = refused(with(r#""workloadIPs": ["192.0.2.1"], "ports": [{"port": 70000}]"#));
        assert!(e.contains("ports[0].port: 70000"), "{e}");
        let e = refused(with(r#""workloadIPs": ["192.0.2.1"], "ports": [{"port": 0}]"#));
        assert!(e.contains("ports[0].port: 0"), "{e}");
        let e = refused(with(r#""workloadIPs": ["192.0.2.1"], "ports": [{"port": 53, "protocol": "UDP"}]"#));
        assert!(e.contains("only TCP"), "{e}");
        let e = refused(with(
            r#""workloadIPs": ["192.0.2.1"], "ports": [{"name": "a", "port": 1}, {"name": "a", "port": 2}]"#,
        ));
        assert!(e.contains("\"a\" is named twice"), "{e}");
        let e = refused(serde_json::json!({"workloadIPs": ["192.0.2.1"], "serviceAccountName": "Not_An_SA"}));
        assert!(e.contains("serviceAccountName"), "{e}");
        let e = refused(serde_json::json!({"workloadIPs": ["192.0.2.1"], "serviceAccountName": ""}));
        assert!(e.contains("serviceAccountName"), "{e}");
    }

    #[test]
    fn an_external_workload_in_the_control_planes_namespace_is_refused() {
        let mut w =
            workload(serde_json::json!({"workloadIPs": ["192.0.2.1"], "serviceAccountName": "cnimesh-control"}));
        w.metadata.namespace = Some(cnimesh_common::names::CONTROL_NAMESPACE.into());
        let e = ExternalRecord::from_crd(&w).unwrap_err().0;
        assert!(e.contains("belongs to the control plane"), "{e}");
    }

    #[test]
    fn policy_keys_never_meet_a_pods_and_read_back() {
        let key = policy_key("shop", "db-vm");
        assert_eq!(key.name, "externalworkload/db-vm");
        assert_eq!(of_policy_key(&key), Some(NsName::new("shop", "db-vm")));
        assert_eq!(of_policy_key(&NsName::new("shop", "db-vm")), None);
        assert_eq!(of_policy_key(&NsName::new("shop", "externalworkloadx/a")), None);
    }
}
