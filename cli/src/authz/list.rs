//! Reading what `cnimesh authz` evaluates from the API server: the workload's pods, its
//! namespace, the policy resources and routes of the namespace, and the Services that select the
//! pods. A policy or route CRD that is not installed reads as no objects of that kind (and is
//! named in the report's notes), any other error stops the command naming what was read.

use std::collections::BTreeMap;

use cnimesh_model::policy::crd;
use cnimesh_model::routes::crd as route_crd;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::ListParams;
use serde::de::DeserializeOwned;

use crate::query_error::QueryError;

/// What a command names: a workload of some kind in a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub kind: Kind,
    pub name: String,
    pub namespace: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Deployment,
    StatefulSet,
    DaemonSet,
    Pod,
    Namespace,
}

impl Workload {
    /// `deploy/web`, `pod/web-1`, `ns/shop`, …; `namespace` is the `-n` in force (`ns/NAME` sets
    /// its own).
    pub fn parse(text: &str, namespace: &str) -> Result<Self, QueryError> {
        let Some((kind, name)) = text.split_once('/') else {
            return Err(QueryError::bad_query(format!(
                "{text:?}: expected KIND/NAME (deploy/, sts/, ds/, pod/ or ns/)"
            )));
        };
        if name.is_empty() || name.contains('/') {
            return Err(QueryError::bad_query(format!("{text:?}: expected KIND/NAME")));
        }
        let kind = match kind {
            "deploy" | "deployment" | "deployments" => Kind::Deployment,
            "sts" | "statefulset" | "statefulsets" => Kind::StatefulSet,
            "ds" | "daemonset" | "daemonsets" => Kind::DaemonSet,
            "po" | "pod" | "pods" => Kind::Pod,
            "ns" | "namespace" | "namespaces" => Kind::Namespace,
            other => {
                return Err(QueryError::bad_query(format!(
                    "{text:?}: unknown kind {other:?} (expected deploy, sts, ds, pod or ns)"
                )));
            }
        };
        let namespace = if kind == Kind::Namespace { name } else { namespace };
        Ok(Self { kind, name: name.to_string(), namespace: namespace.to_string() })
    }

    pub fn display(&self) -> String {
        let kind = match self.kind {
            Kind::Deployment => "deploy",
            Kind::StatefulSet => "sts",
            Kind::DaemonSet => "ds",
            Kind::Pod => "pod",
            Kind::Namespace => "ns",
        };
        format!("{kind}/{}", self.name)
    }
}

/// Everything of one namespace the evaluation reads.
#[derive(Debug, Clone, Default)]
pub struct Objects {
    pub namespace: Option<Namespace>,
    pub pods: Vec<Pod>,
    pub services: Vec<Service>,
    pub servers: Vec<crd::Server>,
    pub policies: Vec<crd::AuthorizationPolicy>,
    pub mesh_tls: Vec<crd::MeshTlsAuthentication>,
    pub networks: Vec<crd::NetworkAuthentication>,
    pub http_routes: Vec<route_crd::HttpRoute>,
    pub grpc_routes: Vec<route_crd::GrpcRoute>,
    /// Kinds that could not be listed because their CRD is not installed.
    pub missing: Vec<&'static str>,
}

/// A namespaced list; `None` when the API server does not know the kind (CRD not installed).
async fn list_opt<K>(client: &kube::Client, namespace: &str, what: &str) -> Result<Option<Vec<K>>, QueryError>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: kube::Api<K> = kube::Api::namespaced(client.clone(), namespace);
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(Some(list.items)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(QueryError::from_kube(format!("listing {what} in {namespace}"), &e)),
    }
}

async fn list<K>(client: &kube::Client, namespace: &str, what: &str) -> Result<Vec<K>, QueryError>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    match list_opt(client, namespace, what).await? {
        Some(items) => Ok(items),
        None => Err(QueryError::NotFound {
            what: format!("listing {what} in {namespace}"),
            detail: "the API server does not serve them".into(),
        }),
    }
}

/// The pods of `namespace`.
pub async fn pods(client: &kube::Client, namespace: &str) -> Result<Vec<Pod>, QueryError> {
    list(client, namespace, "pods").await
}

/// The objects of `namespace` the evaluation reads.
pub async fn objects(client: &kube::Client, namespace: &str) -> Result<Objects, QueryError> {
    let mut objects = Objects {
        namespace: match kube::Api::<Namespace>::all(client.clone()).get_opt(namespace).await {
            Ok(ns) => ns,
            Err(e) => return Err(QueryError::from_kube(format!("reading namespace {namespace}"), &e)),
        },
        pods: pods(client, namespace).await?,
        services: list(client, namespace, "services").await?,
        ..Objects::default()
    };
    macro_rules! optional {
        ($field:ident, $what:literal) => {
            match list_opt(client, namespace, $what).await? {
                Some(items) => objects.$field = items,
                None => objects.missing.push($what),
            }
        };
    }
    optional!(servers, "servers.policy.cnimesh.io");
    optional!(policies, "authorizationpolicies.policy.cnimesh.io");
    optional!(mesh_tls, "meshtlsauthentications.policy.cnimesh.io");
    optional!(networks, "networkauthentications.policy.cnimesh.io");
    optional!(http_routes, "httproutes.gateway.networking.k8s.io");
    optional!(grpc_routes, "grpcroutes.gateway.networking.k8s.io");
    Ok(objects)
}

/// The workload's pods among `pods` (sorted by name); an error names a workload with none.
pub async fn select(client: &kube::Client, workload: &Workload, pods: &[Pod]) -> Result<Vec<Pod>, QueryError> {
    let ns = &workload.namespace;
    let name = &workload.name;
    let selector = match workload.kind {
        Kind::Pod | Kind::Namespace => None,
        Kind::Deployment => Some(get::<Deployment>(client, ns, name, "deployment").await?.spec.map(|s| s.selector)),
        Kind::StatefulSet => Some(get::<StatefulSet>(client, ns, name, "statefulset").await?.spec.map(|s| s.selector)),
        Kind::DaemonSet => Some(get::<DaemonSet>(client, ns, name, "daemonset").await?.spec.map(|s| s.selector)),
    };
    let selector = match selector {
        None => None,
        Some(selector) => {
            let selector = selector.unwrap_or_default();
            let what = || format!("{}'s selector", workload.display());
            let converted: crd::LabelSelector = serde_json::to_value(&selector)
                .and_then(serde_json::from_value)
                .map_err(|e| QueryError::invalid(what(), e))?;
            Some(cnimesh_model::policy::model::Selector::new(&converted).map_err(|e| QueryError::invalid(what(), e))?)
        }
    };
    let empty = BTreeMap::new();
    let mut chosen: Vec<Pod> = pods
        .iter()
        .filter(|p| match (workload.kind, &selector) {
            (Kind::Pod, _) => p.metadata.name.as_deref() == Some(name.as_str()),
            (Kind::Namespace, _) => true,
            (_, Some(selector)) => selector.matches(p.metadata.labels.as_ref().unwrap_or(&empty)),
            (_, None) => false,
        })
        .cloned()
        .collect();
    chosen.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    if chosen.is_empty() {
        match workload.kind {
            Kind::Pod => return Err(QueryError::not_found(format!("pod {ns}/{name}"))),
            _ => {
                return Err(QueryError::NotFound {
                    what: format!("{} in {ns}", workload.display()),
                    detail: "no pods".into(),
                });
            }
        }
    }
    Ok(chosen)
}

async fn get<K>(client: &kube::Client, namespace: &str, name: &str, what: &str) -> Result<K, QueryError>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: kube::Api<K> = kube::Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(object)) => Ok(object),
        Ok(None) => Err(QueryError::not_found(format!("{what} {namespace}/{name}"))),
        Err(e) => Err(QueryError::from_kube(format!("reading {what} {namespace}/{name}"), &e)),
    }
}
