//! The gRPC face: `io.linkerd.proxy.destination.Destination` over the index.
//!
//! Layer: gRPC: maps index state (via `destination::resolve`) to linkerd2-proxy-api streams.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::{self, BoxStream};
use linkerd2_proxy_api::destination::destination_server::{Destination, DestinationServer};
use linkerd2_proxy_api::destination::{
    AddrSet, DestinationProfile, GetDestination, NoEndpoints, Update, WeightedAddr, WeightedAddrSet, update,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::destination::index::{Index, ServiceView};
use crate::destination::path::{self, Target};
use crate::destination::{Caller, Config, resolve};
use crate::meta::NsName;

/// Serves `Get` and `GetProfile` from an [`Index`]. Cheap to clone.
#[derive(Clone)]
pub struct DestinationService {
    index: Index,
    config: Arc<Config>,
}

impl DestinationService {
    pub fn new(index: Index, config: Config) -> Self {
        Self { index, config: Arc::new(config) }
    }

    pub fn into_server(self) -> DestinationServer<Self> {
        DestinationServer::new(self).max_decoding_message_size(crate::grpc::limits::MAX_REQUEST_LEN)
    }

    /// Serves Destination alone, in plaintext, on `listener`: for tests and benchmarks only, so
    /// behind `test-util`. The control plane serves it beside Identity over TLS (`serve::run`).
    #[cfg(any(test, feature = "test-util"))]
    pub fn spawn_plaintext(
        self,
        listener: tokio::net::TcpListener,
    ) -> tokio::task::JoinHandle<Result<(), tonic::transport::Error>> {
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(self.into_server())
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        )
    }

    fn parse(&self, request: &GetDestination) -> Result<Target, Status> {
        path::parse(&request.path, &self.config.cluster_domain).map_err(|e| Status::invalid_argument(e.to_string()))
    }
}

/// A stream that follows a watch channel: `step` turns each new value into zero or more messages.
/// The current value is handled at once, so every stream answers without waiting for a change.
/// No task or timer of our own per stream: it is polled by the server's own stream task and costs
/// nothing while the channel is quiet.
pub(crate) fn follow<V, T>(
    rx: watch::Receiver<V>,
    step: impl FnMut(&V) -> Vec<T> + Send + 'static,
) -> BoxStream<'static, Result<T, Status>>
where
    V: Clone + Send + Sync + 'static,
    T: Send + 'static,
{
    stream::unfold((rx, step, true), |(mut rx, mut step, first)| async move {
        if !first {
            // An error means the index dropped the channel, which it only does once no stream
            // holds it: unreachable while this one exists, and ending the stream is right anyway.
            rx.changed().await.ok()?;
        }
        let view = rx.borrow_and_update().clone();
        let messages = step(&view);
        Some((messages, (rx, step, false)))
    })
    .flat_map(|messages| stream::iter(messages.into_iter().map(Ok)))
    .boxed()
}

/// Sends a profile only when it differs from the last one sent.
fn dedup(
    mut profile: impl FnMut() -> DestinationProfile,
    last: &mut Option<DestinationProfile>,
) -> Vec<DestinationProfile> {
    let next = profile();
    if last.as_ref() == Some(&next) {
        return Vec::new();
    }
    *last = Some(next.clone());
    vec![next]
}

/// What one `Get` stream has told its client, so each snapshot becomes a diff.
struct EndpointDiff {
    key: NsName,
    /// Who asked; a gateway sees only exported Services ([`Caller`]).
    caller: Caller,
    port: u16,
    config: Arc<Config>,
    /// Shared with every stream of the same service port that has sent the same.
    sent: Arc<BTreeMap<SocketAddr, WeightedAddr>>,
    /// The `exists` of the last `no_endpoints` sent, while the client holds no endpoints.
    no_endpoints: Option<bool>,
}

impl EndpointDiff {
    /// Removals first, then additions (an endpoint whose metadata changed is re-added; proxies
    /// treat an add of a known address as a replacement). `no_endpoints` only when the set is empty:
    /// so the first message for a service with endpoints is an add, and a service that goes away
    /// says `exists: false` so clients may fall back to DNS.
    fn step(&mut self, view: &ServiceView) -> Vec<Update> {
        let view = self.caller.service(view);
        let next = view.map(|s| resolve::service_endpoints(s, self.port, &self.config)).unwrap_or_default();
        if Arc::ptr_eq(&next, &self.sent) && !next.is_empty() {
            return Vec::new();
        }
        let mut updates = Vec::new();
        let removed: Vec<_> = self.sent.keys().filter(|a| !next.contains_key(a)).map(|a| (*a).into()).collect();
        if !removed.is_empty() {
            updates.push(update::Update::Remove(AddrSet { addrs: removed }));
        }
        let added: Vec<_> = next.iter().filter(|(a, w)| self.sent.get(a) != Some(w)).map(|(_, w)| w.clone()).collect();
        if !added.is_empty() {
            let metric_labels = HashMap::from([
                ("namespace".to_string(), self.key.namespace.clone()),
                ("service".to_string(), self.key.name.clone()),
            ]);
            updates.push(update::Update::Add(WeightedAddrSet { addrs: added, metric_labels }));
        }
        if next.is_empty() {
            let exists = view.is_some();
            if self.no_endpoints != Some(exists) {
                updates.push(update::Update::NoEndpoints(NoEndpoints { exists }));
                self.no_endpoints = Some(exists);
            }
        } else {
            self.no_endpoints = None;
        }
        self.sent = next;
        updates.into_iter().map(|u| Update { update: Some(u) }).collect()
    }
}

#[tonic::async_trait]
impl Destination for DestinationService {
    type GetStream = BoxStream<'static, Result<Update, Status>>;
    type GetProfileStream = BoxStream<'static, Result<DestinationProfile, Status>>;

    /// Unknown services are answered with a live `no_endpoints{exists: false}` rather than
    /// NotFound: the stream then turns into adds if the service appears, and the client may use
    /// DNS meanwhile, which is what the API defines `exists: false` for.
    async fn get(&self, request: Request<GetDestination>) -> Result<Response<Self::GetStream>, Status> {
        let caller = Caller::of_context_token(&request.get_ref().context_token);
        let (key, port) = match self.parse(request.get_ref())? {
            Target::Service { key, port } => (key, port),
            Target::Addr(addr) => {
                return Err(Status::invalid_argument(format!(
                    "path {:?} is the address {addr}: Get resolves service names, GetProfile resolves addresses",
                    request.get_ref().path
                )));
            }
        };
        tracing::debug!(service = %key, port, ?caller, "Get");
        self.index.ready().await;
        let rx = self.index.watch_service(&key);
        let mut diff =
            EndpointDiff { key, caller, port, config: self.config.clone(), sent: Arc::default(), no_endpoints: None };
        Ok(Response::new(follow(rx, move |view| diff.step(view))))
    }

    async fn get_profile(&self, request: Request<GetDestination>) -> Result<Response<Self::GetProfileStream>, Status> {
        let caller = Caller::of_context_token(&request.get_ref().context_token);
        let target = self.parse(request.get_ref())?;
        self.index.ready().await;
        let config = self.config.clone();
        let mut last = None;
        let stream = match target {
            Target::Service { key, port } => {
                tracing::debug!(service = %key, port, ?caller, "GetProfile");
                let rx = self.index.watch_service(&key);
                follow(rx, move |view| {
                    dedup(|| resolve::service_profile(caller.service(view), port, &config), &mut last)
                })
            }
            Target::Addr(addr) => {
                tracing::debug!(%addr, ?caller, "GetProfile");
                let rx = self.index.watch_ip(addr.ip());
                follow(rx, move |view| {
                    dedup(|| resolve::ip_profile(caller.ip(view), addr.ip(), addr.port(), &config), &mut last)
                })
            }
        };
        Ok(Response::new(stream))
    }
}
