//! Repairing meshed pods that run without capture: they started before the plugin was installed
//! (or the plugin was bypassed), so their traffic skips the proxy. By default they are deleted so
//! their controller recreates them through the plugin; an Event on the pod says why.

use cnimesh_cni::state::AttachmentRecord;
use k8s_openapi::api::core::v1::Pod;

use crate::cluster::{Cluster, pod_key};
use crate::decide;

pub const UNCAPTURED_LABEL: &str = "cnimesh.io/uncaptured";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum RepairMode {
    /// Delete the pod; its controller recreates it, captured.
    #[default]
    Delete,
    /// Only label it `cnimesh.io/uncaptured=true` (and record an Event).
    Label,
    /// Do nothing.
    Off,
}

/// Meshed, running pods of this node with no attachment record.
pub fn uncaptured<'a>(pods: &'a [Pod], records: &[AttachmentRecord], excluded: &[String]) -> Vec<&'a Pod> {
    pods.iter()
        .filter(|pod| {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let deleting = pod.metadata.deletion_timestamp.is_some();
            let already_labelled = pod.metadata.labels.as_ref().is_some_and(|l| l.contains_key(UNCAPTURED_LABEL));
            running && !deleting && !already_labelled && !excluded.iter().any(|e| e == ns) && decide::is_meshed(pod)
        })
        .filter(|pod| {
            let (ns, name, uid) =
                (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref(), pod.metadata.uid.as_deref());
            !records.iter().any(|r| {
                r.pod_namespace.as_deref() == ns
                    && r.pod_name.as_deref() == name
                    && (r.pod_uid.is_none() || uid.is_none() || r.pod_uid.as_deref() == uid)
            })
        })
        .collect()
}

/// Pods repaired per pass at most: a mass deletion (e.g. after a stale cache) stays bounded.
pub const MAX_PER_PASS: usize = 5;

/// Applies `mode` to each uncaptured pod (at most [`MAX_PER_PASS`]); returns what was done.
pub async fn repair(cluster: &dyn Cluster, mode: RepairMode, pods: &[&Pod]) -> Vec<(String, anyhow::Result<()>)> {
    let mut out = Vec::new();
    for pod in pods.iter().take(MAX_PER_PASS) {
        let key = pod_key(pod);
        let reason = "meshed pod is running without cnimesh capture (it started before the CNI plugin was installed or bypassed it); recreating it through the plugin";
        let result = match mode {
            RepairMode::Delete => cluster.delete_pod(pod, reason).await,
            RepairMode::Label => cluster.label_pod(pod, UNCAPTURED_LABEL, "true").await,
            RepairMode::Off => Ok(()),
        };
        match &result {
            Ok(()) => tracing::warn!(pod = key, ?mode, "repaired uncaptured pod"),
            Err(e) => tracing::warn!(pod = key, error = %e, "could not repair uncaptured pod"),
        }
        out.push((key, result));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnimesh_cni::backend::Backend;
    use cnimesh_cni::spec::RedirectSpec;
    use serde_json::json;

    fn pod(ns: &str, name: &str, phase: &str, meshed: bool) -> Pod {
        let containers =
            if meshed { json!([{"name": "app"}, {"name": "cnimesh-proxy"}]) } else { json!([{"name": "app"}]) };
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}")},
            "spec": {"containers": containers},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn record(ns: &str, name: &str, uid: Option<&str>) -> AttachmentRecord {
        AttachmentRecord {
            version: 1,
            network: "k8s".into(),
            container_id: format!("c-{name}"),
            ifname: "eth0".into(),
            netns: "/var/run/netns/x".into(),
            netns_id: None,
            pod_namespace: Some(ns.into()),
            pod_name: Some(name.into()),
            pod_uid: uid.map(str::to_string),
            backend: Backend::Nftables,
            spec: RedirectSpec::default(),
            created_at: 0,
        }
    }

    #[test]
    fn only_running_meshed_pods_without_records_are_repaired() {
        let pods = vec![
            pod("shop", "captured", "Running", true),
            pod("shop", "raced", "Running", true),
            pod("shop", "starting", "Pending", true),
            pod("shop", "plain", "Running", false),
            pod("kube-system", "sys", "Running", true),
            pod("shop", "recreated", "Running", true),
        ];
        let records =
            vec![record("shop", "captured", Some("uid-captured")), record("shop", "recreated", Some("uid-old"))];
        let found: Vec<String> =
            uncaptured(&pods, &records, &["kube-system".into()]).into_iter().map(pod_key).collect();
        assert_eq!(found, ["shop/raced", "shop/recreated"]);
    }

    #[test]
    fn labelled_and_terminating_pods_are_left_alone() {
        let mut labelled = pod("shop", "l", "Running", true);
        labelled.metadata.labels = Some([(UNCAPTURED_LABEL.to_string(), "true".to_string())].into());
        let mut deleting = pod("shop", "d", "Running", true);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
        assert!(uncaptured(&[labelled, deleting], &[], &[]).is_empty());
    }

    #[tokio::test]
    async fn modes_act_on_the_cluster() {
        let api = cnimesh_apiserver::ClusterApi::new();
        let mut raced = pod("shop", "raced", "Running", true);
        raced.spec.as_mut().unwrap().node_name = Some("node-1".into());
        let mut object = serde_json::to_value(&raced).unwrap();
        object["apiVersion"] = json!("v1");
        object["kind"] = json!("Pod");
        api.put(object);
        let (cluster, driver) = crate::kube_cluster::KubeCluster::start(api.client(), "node-1");
        tokio::spawn(driver);
        let cluster = &*cluster;
        let stored = || api.get("v1", "Pod", "shop", "raced");
        let done = repair(cluster, RepairMode::Label, &[&raced]).await;
        assert!(done[0].1.is_ok(), "{:?}", done[0].1);
        assert_eq!(stored().unwrap()["metadata"]["labels"][UNCAPTURED_LABEL], "true");
        repair(cluster, RepairMode::Off, &[&raced]).await;
        assert!(stored().is_some());
        repair(cluster, RepairMode::Delete, &[&raced]).await;
        assert!(stored().is_none());
    }
}
