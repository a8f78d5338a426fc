//! The manifests under `daemonset/`, compiled in: `install` prints exactly these documents (plus
//! the certificates it generates), so the files and the command cannot drift apart.
//!
//! Layer: runtime (operator CLI).

use serde_json::Value;

use super::yaml;

/// In the order `kubectl apply` should see them: namespaces come first in each file.
/// The policy CRDs come before the control plane that watches their kinds.
pub const FILES: [(&str, &str); 5] = [
    ("daemonset/cnimesh-node.yaml", include_str!("../../daemonset/cnimesh-node.yaml")),
    // Needs Kubernetes >= 1.30 (ValidatingAdmissionPolicy v1); see the file's header.
    ("daemonset/cnimesh-node-admission.yaml", include_str!("../../daemonset/cnimesh-node-admission.yaml")),
    ("daemonset/control-policy-crds.yaml", include_str!("../../daemonset/control-policy-crds.yaml")),
    ("daemonset/control-plane.yaml", include_str!("../../daemonset/control-plane.yaml")),
    ("daemonset/control-webhook.yaml", include_str!("../../daemonset/control-webhook.yaml")),
];

/// `cnimesh multicluster install`'s files, in apply order: the Link CRD, the gateway
/// (its namespace first), the mirror reader, the control plane's permissions for mirrors.
pub const MULTICLUSTER_FILES: [(&str, &str); 4] = [
    ("daemonset/multicluster/link-crd.yaml", include_str!("../../daemonset/multicluster/link-crd.yaml")),
    ("daemonset/multicluster/gateway.yaml", include_str!("../../daemonset/multicluster/gateway.yaml")),
    ("daemonset/multicluster/mirror-reader.yaml", include_str!("../../daemonset/multicluster/mirror-reader.yaml")),
    ("daemonset/multicluster/mirror.yaml", include_str!("../../daemonset/multicluster/mirror.yaml")),
];

/// Every document of every file, in order.
pub fn documents() -> Vec<Value> {
    FILES
        .iter()
        .flat_map(|(name, text)| yaml::documents(text, name).expect("the shipped manifests parse (tested)"))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shipped_manifests_parse() {
        assert!(super::documents().len() > 10);
    }
}
