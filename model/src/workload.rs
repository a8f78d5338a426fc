//! The owner labels of a meshed pod (`cnimesh.io/proxy-deployment: web`, …, and
//! `cnimesh.io/workload-ns`), which `cnimesh stat`, the scrape config and the dashboards aggregate by.
//!
//! Linkerd's injector looks the owner up in the API server (a ReplicaSet's owner is its
//! Deployment, a Job's may be a CronJob), which puts API calls and informers on the admission
//! path. We resolve from the pod alone: a Deployment's ReplicaSet is named
//! `<deployment>-<pod-template-hash>` and its pods carry that `pod-template-hash` label, so the
//! Deployment's name is the ReplicaSet's without the suffix. A ReplicaSet whose name does not end
//! in its pods' hash was made by hand and is labelled as a ReplicaSet. A Job made by a CronJob
//! cannot be told from the pod alone and is labelled as a Job; `cnimesh inject`, which sees the
//! CronJob itself, labels its template as the CronJob's.
//!
//! Layer: model (pure).

use std::collections::BTreeMap;

use cnimesh_common::names::{OWNER_LABEL_PREFIX, WORKLOAD_NAMESPACE_LABEL};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The workload that manages a pod: `kind` lower case (`deployment`), as in the label key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub kind: String,
    pub name: String,
}

impl Workload {
    pub fn new(kind: &str, name: &str) -> Self {
        Self { kind: kind.to_lowercase(), name: name.into() }
    }

    /// The pod's controlling owner, with a Deployment's ReplicaSet resolved to the Deployment.
    pub fn of_pod(meta: &ObjectMeta) -> Option<Self> {
        let owner = meta.owner_references.iter().flatten().find(|o| o.controller == Some(true))?;
        let hash = meta.labels.as_ref().and_then(|l| l.get("pod-template-hash"));
        if owner.kind == "ReplicaSet"
            && let Some(deployment) = hash.and_then(|h| owner.name.strip_suffix(&format!("-{h}")))
            && !deployment.is_empty()
        {
            return Some(Self::new("Deployment", deployment));
        }
        Some(Self::new(&owner.kind, &owner.name))
    }
}

/// The labels injection adds: the owner's (when there is one) and the workload namespace.
pub fn owner_labels(workload: Option<&Workload>, namespace: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([(WORKLOAD_NAMESPACE_LABEL.to_string(), namespace.to_string())]);
    if let Some(w) = workload {
        labels.insert(format!("{OWNER_LABEL_PREFIX}{}", w.kind), w.name.clone());
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn meta(kind: &str, name: &str, hash: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                kind: kind.into(),
                name: name.into(),
                controller: Some(true),
                ..Default::default()
            }]),
            labels: hash.map(|h| BTreeMap::from([("pod-template-hash".to_string(), h.to_string())])),
            ..Default::default()
        }
    }

    #[test]
    fn a_deployments_replicaset_resolves_to_the_deployment() {
        let w = Workload::of_pod(&meta("ReplicaSet", "web-7d9f8c6b5", Some("7d9f8c6b5"))).unwrap();
        assert_eq!(w, Workload::new("Deployment", "web"));
        assert_eq!(
            owner_labels(Some(&w), "shop"),
            BTreeMap::from([
                ("cnimesh.io/proxy-deployment".to_string(), "web".to_string()),
                ("cnimesh.io/workload-ns".to_string(), "shop".to_string()),
            ])
        );
    }

    #[test]
    fn other_owners_are_taken_as_they_are() {
        let by_hand = Workload::of_pod(&meta("ReplicaSet", "frontend", Some("abc"))).unwrap();
        assert_eq!(by_hand, Workload::new("ReplicaSet", "frontend"));
        for kind in ["StatefulSet", "DaemonSet", "Job"] {
            assert_eq!(Workload::of_pod(&meta(kind, "x-1", None)), Some(Workload::new(kind, "x-1")));
        }
        let mut not_controller = meta("Deployment", "web", None);
        not_controller.owner_references.as_mut().unwrap()[0].controller = None;
        assert_eq!(Workload::of_pod(&not_controller), None);
        assert_eq!(owner_labels(None, "shop").len(), 1, "a bare pod still gets its namespace");
    }
}
