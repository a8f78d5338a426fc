//! Where the webhook reads the pod's namespace, for its `config.cnimesh.io/default-inbound-policy`
//! annotation and its tracing annotations: the API server (the control plane's ClusterRole already
//! grants `get` on namespaces, for inbound policy).
//!
//! Read at admission, not from a cache: a namespace annotated a moment ago must already count
//! for the next pod. A namespace that cannot be read fails closed (see
//! [`super::policy_env::effective_default`]).
//!
//! Layer: sources (the webhook's one read of cluster state).

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

use cnimesh_model::inject::{NamespaceDefault, TraceSettings};
use cnimesh_model::policy::model::NamespaceRecord;

/// Well inside the API server's webhook timeout (10 s by default), so that a slow read still
/// leaves time to answer (with `deny`) rather than fail the admission.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone)]
pub enum Namespaces {
    /// GET from the API server.
    Kube(kube::Client),
}

impl std::fmt::Debug for Namespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Namespaces::Kube(_) => f.write_str("Namespaces::Kube"),
        }
    }
}

impl Namespaces {
    /// The namespace's default-inbound-policy annotation, read as the control plane reads it.
    pub async fn default_of(&self, name: &str) -> NamespaceDefault {
        self.settings_of(name).await.0
    }

    /// The namespace's default-inbound-policy and its tracing annotations, from one read. A
    /// namespace that cannot be read has no tracing settings (the cluster's stand): tracing is
    /// not a security setting, and the policy's warning already reports the failure.
    pub async fn settings_of(&self, name: &str) -> (NamespaceDefault, TraceSettings) {
        let namespace = match self {
            Namespaces::Kube(client) => {
                let api: Api<Namespace> = Api::all(client.clone());
                match tokio::time::timeout(LOOKUP_TIMEOUT, api.get_opt(name)).await {
                    Ok(Ok(ns)) => ns,
                    Ok(Err(error)) => return unreadable(error.to_string()),
                    Err(_) => return unreadable(format!("no answer within {LOOKUP_TIMEOUT:?}")),
                }
            }
        };
        let tracing = TraceSettings::annotated(
            namespace.as_ref().and_then(|ns| ns.metadata.annotations.as_ref()),
            &format!("namespace {name}"),
        );
        // A namespace that does not exist has no annotation; the API server will refuse the pod.
        (NamespaceDefault::Read(namespace.and_then(|ns| NamespaceRecord::from_k8s(&ns).default_policy)), tracing)
    }
}

fn unreadable(why: String) -> (NamespaceDefault, TraceSettings) {
    (NamespaceDefault::Unreadable(why), TraceSettings::default())
}
