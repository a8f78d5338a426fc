//! [`Cluster`] over the Kubernetes API: a reflector on this node's pods (one long-lived watch,
//! field selector `spec.nodeName`), a single GET for pods the cache does not know yet (a pod's
//! sandbox can be set up before the watch event arrives), and the few writes repair needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Event, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::cluster::{Cluster, pod_key};

pub struct KubeCluster {
    client: Client,
    node: String,
    store: Store<Pod>,
    synced: Arc<AtomicBool>,
}

impl KubeCluster {
    /// The cluster view and the future that drives its watch (spawn it).
    pub fn start(client: Client, node: &str) -> (Arc<Self>, BoxFuture<'static, ()>) {
        let api: Api<Pod> = Api::all(client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (store, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        let stream = reflector::reflector(writer, watcher(api, config)).default_backoff().touched_objects();
        let ready_store = store.clone();
        let ready_flag = synced.clone();
        let driver = async move {
            let mark_ready = async move {
                if ready_store.wait_until_ready().await.is_ok() {
                    ready_flag.store(true, Ordering::SeqCst);
                    tracing::info!("pod cache synced");
                }
            };
            let watch = stream.for_each(|event| async move {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "pod watch error (retrying with backoff)");
                }
            });
            futures::join!(mark_ready, watch);
        };
        let cluster = Arc::new(Self { client, node: node.to_string(), store, synced });
        (cluster, Box::pin(driver))
    }

    async fn event(&self, pod: &Pod, reason: &str, message: &str) {
        let ns = pod.namespace().unwrap_or_else(|| "default".into());
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta { generate_name: Some(format!("{}.", pod.name_any())), ..Default::default() },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                namespace: Some(ns.clone()),
                uid: pod.metadata.uid.clone(),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Warning".into()),
            reporting_component: Some("cnimesh-node".into()),
            reporting_instance: Some(self.node.clone()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some("Repair".into()),
            count: Some(1),
            ..Default::default()
        };
        if let Err(e) = Api::<Event>::namespaced(self.client.clone(), &ns).create(&PostParams::default(), &event).await
        {
            tracing::warn!(pod = pod_key(pod), error = %e, "could not record an Event");
        }
    }
}

impl Cluster for KubeCluster {
    fn pod<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, anyhow::Result<Option<Pod>>> {
        Box::pin(async move {
            if let Some(pod) = self.store.get(&ObjectRef::new(name).within(namespace)) {
                return Ok(Some((*pod).clone()));
            }
            Ok(Api::<Pod>::namespaced(self.client.clone(), namespace).get_opt(name).await?)
        })
    }

    fn node_pods(&self) -> BoxFuture<'_, anyhow::Result<Vec<Pod>>> {
        Box::pin(async move { Ok(self.store.state().iter().map(|p| (**p).clone()).collect()) })
    }

    fn delete_pod<'a>(&'a self, pod: &'a Pod, reason: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let ns = pod.namespace().unwrap_or_else(|| "default".into());
            // Only this incarnation of the pod: a recreated pod of the same name is left alone.
            let params = DeleteParams {
                preconditions: Some(Preconditions { uid: pod.metadata.uid.clone(), resource_version: None }),
                ..Default::default()
            };
            Api::<Pod>::namespaced(self.client.clone(), &ns).delete(&pod.name_any(), &params).await?;
            self.event(pod, "CnimeshUncaptured", reason).await;
            Ok(())
        })
    }

    fn label_pod<'a>(&'a self, pod: &'a Pod, key: &'a str, value: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let ns = pod.namespace().unwrap_or_else(|| "default".into());
            self.event(pod, "CnimeshUncaptured", &format!("labelled {key}={value}: running without capture")).await;
            let patch = Patch::Merge(json!({"metadata": {"labels": {key: value}}}));
            Api::<Pod>::namespaced(self.client.clone(), &ns)
                .patch(&pod.name_any(), &PatchParams::default(), &patch)
                .await?;
            Ok(())
        })
    }

    fn remove_node_taint<'a>(&'a self, key: &'a str) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async move {
            let nodes: Api<Node> = Api::all(self.client.clone());
            let node = nodes.get(&self.node).await?;
            let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
            let kept: Vec<_> = taints.iter().filter(|t| t.key != key).cloned().collect();
            if kept.len() == taints.len() {
                return Ok(false);
            }
            // The resourceVersion makes this a compare-and-swap: a concurrent taint change wins
            // and we try again later instead of overwriting it.
            let patch = Patch::Merge(json!({
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": kept},
            }));
            nodes.patch(&self.node, &PatchParams::default(), &patch).await?;
            Ok(true)
        })
    }

    fn ready(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }
}
