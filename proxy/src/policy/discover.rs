//! Inbound policy discovery: one `InboundServerPolicies.WatchPort` stream per port of this pod,
//! opened on the port's first connection and kept (reconnected with backoff by the same loop as
//! Destination, [`crate::discovery::follow::retrying`]). The last good answer stays in force while
//! the control plane is away; a port never answered uses the configured default after a short
//! wait, so a `deny` default fails closed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use linkerd2_proxy_api::inbound::{self as api, inbound_server_policies_client::InboundServerPoliciesClient};
use tokio::sync::watch;
use tonic::transport::Channel;

use super::model::PortPolicy;

/// Ports watched at most: inbound capture takes connections to any port, and a scan must not
/// open a stream per port. Beyond it, ports get the default.
const MAX_PORTS: usize = 128;

/// A port's policy as it stands now: the control plane's last answer, else the default.
#[derive(Clone)]
pub struct PortWatch {
    rx: Option<watch::Receiver<Option<Arc<PortPolicy>>>>,
    default: Arc<PortPolicy>,
}

impl PortWatch {
    /// Always `default` (no control plane, or a port beyond [`MAX_PORTS`]).
    pub fn fixed(default: Arc<PortPolicy>) -> Self {
        Self { rx: None, default }
    }

    pub fn current(&self) -> Arc<PortPolicy> {
        match &self.rx {
            Some(rx) => rx.borrow().clone().unwrap_or_else(|| self.default.clone()),
            None => self.default.clone(),
        }
    }
}

pub struct Policies {
    client: InboundServerPoliciesClient<Channel>,
    /// `ns:pod`, as the control plane accepts it.
    workload: String,
    default: Arc<PortPolicy>,
    first_answer: Duration,
    max_backoff: Duration,
    ports: Mutex<HashMap<u16, watch::Receiver<Option<Arc<PortPolicy>>>>>,
}

impl Policies {
    pub fn new(
        channel: Channel,
        workload: String,
        default: PortPolicy,
        first_answer: Duration,
        max_backoff: Duration,
    ) -> Self {
        Self {
            client: InboundServerPoliciesClient::new(channel),
            workload,
            default: Arc::new(default),
            first_answer,
            max_backoff,
            ports: Mutex::default(),
        }
    }

    /// The policy of `port`; its first caller starts the watch and waits up to the first-answer
    /// bound for it.
    pub async fn port(&self, port: u16) -> PortWatch {
        let mut rx = {
            let mut ports = self.ports.lock().expect("not poisoned");
            match ports.get(&port) {
                Some(rx) => rx.clone(),
                None if ports.len() >= MAX_PORTS => return PortWatch::fixed(self.default.clone()),
                None => {
                    let (tx, rx) = watch::channel(None);
                    tokio::spawn(follow(self.client.clone(), self.workload.clone(), port, tx, self.max_backoff));
                    ports.insert(port, rx.clone());
                    rx
                }
            }
        };
        if rx.borrow().is_none() {
            let _ = tokio::time::timeout(self.first_answer, rx.wait_for(Option::is_some)).await;
        }
        PortWatch { rx: Some(rx), default: self.default.clone() }
    }
}

/// Streams `port`'s policy into `tx`; an answer the proxy cannot enforce is logged and the last
/// good one kept.
async fn follow(
    client: InboundServerPoliciesClient<Channel>,
    workload: String,
    port: u16,
    tx: watch::Sender<Option<Arc<PortPolicy>>>,
    max_backoff: Duration,
) {
    let spec = api::PortSpec { workload: workload.clone(), port: u32::from(port) };
    let open = || {
        let (mut client, spec) = (client.clone(), spec.clone());
        async move { client.watch_port(spec).await.map(tonic::Response::into_inner) }
    };
    let apply = |server: api::Server, _first| match PortPolicy::from_api(server) {
        Ok(policy) => {
            tracing::debug!(port, server = %policy.server.name, authorizations = policy.authorizations.len(), "inbound policy updated");
            tx.send_if_modified(|current| {
                let changed = current.as_deref() != Some(&policy);
                if changed {
                    *current = Some(Arc::new(policy));
                }
                changed
            });
        }
        Err(why) => tracing::error!(port, %workload, %why, "inbound policy refused; keeping the last good one"),
    };
    crate::discovery::follow::retrying(format!("inbound policy {workload} port {port}"), max_backoff, open, apply)
        .await;
}
