//! The join tokens' Secret as the control plane last saw it: a watch of that one Secret (by
//! name, `fieldSelector=metadata.name=…`, in the control plane's namespace), so that checking a
//! join token or a renewal's key asks the API server nothing. Identity is served to callers
//! without any credential; were each guess a Secret GET, anyone reaching the port could make the
//! control plane load the API server at will. Only a caller whose token matched a stored hash (or
//! whose key is bound) makes the control plane read or write through the API server.
//!
//! A token made an instant ago may not have reached the watch yet: a check that finds no
//! matching entry waits, briefly ([`FRESH_WAIT`]), for the next change before refusing.
//!
//! Layer: sources (kube): a watcher feeding a `tokio::sync::watch`.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::identity::join::{self, JoinError};

/// How long a check that found no match waits for the Secret to change (a `join` just made
/// reaches the watch in milliseconds), and how long a first check waits for the first list.
pub const FRESH_WAIT: Duration = Duration::from_secs(2);

/// What the watch has seen: `None` until the first list is complete, then the Secret if any.
type Seen = Option<Option<Arc<Secret>>>;

/// The last seen version of the join tokens' Secret; clones share the watch.
#[derive(Clone)]
pub struct JoinSecret {
    seen: watch::Receiver<Seen>,
}

impl JoinSecret {
    /// Watches Secret [`join::SECRET_NAME`] of `namespace` until `stopped` turns true.
    pub fn watch(client: kube::Client, namespace: &str, mut stopped: watch::Receiver<bool>) -> Self {
        let (tx, seen) = watch::channel(None);
        let api: Api<Secret> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", join::SECRET_NAME));
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, config));
            let mut listing: Option<Arc<Secret>> = None;
            loop {
                let event = tokio::select! {
                    event = events.next() => event,
                    _ = stopped.wait_for(|s| *s) => return,
                };
                match event {
                    Some(Ok(watcher::Event::Init)) => listing = None,
                    Some(Ok(watcher::Event::InitApply(secret))) => listing = Some(Arc::new(secret)),
                    Some(Ok(watcher::Event::InitDone)) => {
                        tx.send_replace(Some(listing.take()));
                    }
                    Some(Ok(watcher::Event::Apply(secret))) => {
                        tx.send_replace(Some(Some(Arc::new(secret))));
                    }
                    Some(Ok(watcher::Event::Delete(_))) => {
                        tx.send_replace(Some(None));
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, secret = join::SECRET_NAME, "watching the join tokens' Secret");
                        // The watcher retries on its own; do not spin on a failing API server.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    None => return,
                }
            }
        });
        Self { seen }
    }

    /// The Secret as last seen (`None`: there is none), once the first list is done (waiting for
    /// it at most [`FRESH_WAIT`]; Unavailable after).
    pub async fn current(&self) -> Result<Option<Arc<Secret>>, JoinError> {
        let mut seen = self.seen.clone();
        match tokio::time::timeout(FRESH_WAIT, seen.wait_for(Option::is_some)).await {
            Ok(Ok(listed)) => Ok(listed.clone().flatten()),
            _ => Err(JoinError::Unavailable(format!(
                "the join tokens' Secret {} has not been read yet; try again",
                join::SECRET_NAME
            ))),
        }
    }

    /// The Secret once it is another version than `checked` (what a check just refused), or as
    /// it is when none comes within [`FRESH_WAIT`].
    pub async fn newer_than(&self, checked: &Option<Arc<Secret>>) -> Result<Option<Arc<Secret>>, JoinError> {
        let mut seen = self.seen.clone();
        let newer = |s: &Seen| match (s, checked) {
            (None, _) => false,
            (Some(Some(now)), Some(then)) => !Arc::ptr_eq(now, then),
            (Some(now), then) => now.is_some() != then.is_some(),
        };
        let _ = tokio::time::timeout(FRESH_WAIT, seen.wait_for(newer)).await;
        self.current().await
    }
}
