//! The install lifecycle's cluster (install, upgrade, prune): the in-process API server
//! (`cnimesh-apiserver`) holding the objects of a rendered install, as `kubectl apply` would have
//! created them, and answering `/version` with a chosen 1.x. Only the API server is stood in for;
//! the kube client, the parsing and the commands run for real.

use std::sync::Arc;

use cnimesh_apiserver::ClusterApi;
use serde_json::Value;

/// What `cnimesh install --set …` prints with freshly generated certificates: the cluster the
/// lifecycle tests start from.
pub fn rendered_install(set: &[&str]) -> String {
    let args = super::InstallArgs {
        values: super::ValuesArgs { set: set.iter().map(|s| s.to_string()).collect(), ..Default::default() },
        ..Default::default()
    };
    super::render(&super::Certificates::from_args(&args).unwrap(), &args.options().unwrap()).unwrap()
}

#[derive(Clone, Default)]
pub struct ObjectsApi {
    api: Arc<ClusterApi>,
}

impl ObjectsApi {
    /// A server of Kubernetes 1.`minor`.
    pub fn at(minor: u32) -> Self {
        let api = ObjectsApi::default();
        api.upgrade_to(minor);
        api
    }

    /// The cluster's own upgrade: `/version` answers 1.`minor` from now on.
    pub fn upgrade_to(&self, minor: u32) {
        self.api.set_minor_version(minor);
    }

    /// Every document of a rendered YAML stream, as the cluster would hold it.
    pub fn apply(&self, rendered: &str) {
        for doc in crate::yaml::documents(rendered, "rendered").expect("rendered YAML parses") {
            self.api.put(doc);
        }
    }

    pub fn insert(&self, object: Value) {
        self.api.put(object);
    }

    pub fn client(&self) -> kube::Client {
        self.api.client()
    }
}
