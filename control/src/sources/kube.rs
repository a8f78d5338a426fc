//! Cluster state from the Kubernetes API: one kube-rs watcher per kind, all namespaces.
//!
//! A watcher lists, then watches from the list's resourceVersion, resumes from the last version it
//! saw when a watch ends, and re-lists when the server says that version is gone (410). Each list
//! becomes one [`Change::Reset`], so objects deleted while the watch was down disappear too. The
//! index is the store: no reflector cache of full objects is kept beside it.
//!
//! Layer: sources (kube).

use std::fmt::Debug;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use super::{Source, SourceError};
use crate::destination::{Change, Index, Kind, Object};

pub struct KubeSource {
    client: kube::Client,
}

impl KubeSource {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Source for KubeSource {
    /// Watch errors are logged and retried with kube-rs' default backoff, so this does not return
    /// while the process is healthy.
    async fn run(self, index: Index) -> Result<(), SourceError> {
        futures::join!(
            follow(Api::<Service>::all(self.client.clone()), Kind::Service, &index),
            follow(Api::<EndpointSlice>::all(self.client.clone()), Kind::EndpointSlice, &index),
            follow(Api::<Pod>::all(self.client), Kind::Pod, &index),
        );
        Ok(())
    }
}

async fn follow<K>(api: Api<K>, kind: Kind, index: &Index)
where
    Object: From<K>,
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut listed = Vec::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(object)) => listed.push(Object::from(object)),
            Ok(Event::InitDone) => {
                tracing::debug!(?kind, objects = listed.len(), "listed");
                index.apply([Change::Reset(kind, std::mem::take(&mut listed))]);
            }
            Ok(Event::Apply(object)) => index.apply([Change::Upsert(Object::from(object))]),
            Ok(Event::Delete(object)) => index.apply([Change::Delete(kind, Object::from(object).key())]),
            Err(error) => tracing::warn!(?kind, %error, "watch failed; retrying"),
        }
    }
}
