//! The gRPC face: `io.linkerd.proxy.destination.Destination` over the index.
//!
//! Layer: gRPC: maps index state (via `destination::resolve`) to linkerd2-proxy-api streams.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::{self, BoxStream};
use linkerd2_proxy_api::destination::destination_server::{self, Destination, DestinationServer};
use linkerd2_proxy_api::destination::{DestinationProfile, GetDestination, Update};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::preencoded::PreEncoded;
use cnimesh_model::destination::follower::{self, Follower};
use cnimesh_model::destination::index::Index;
use cnimesh_model::destination::path::{self, Target};
use cnimesh_model::destination::{Caller, Config, resolve};

/// The path of `Get`, which [`DestinationRoutes`] serves itself.
const GET: &str = "/io.linkerd.proxy.destination.Destination/Get";

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

    /// The service to add to a server's routes.
    pub fn into_server(self) -> DestinationRoutes {
        let generated =
            DestinationServer::new(self.clone()).max_decoding_message_size(crate::grpc::limits::MAX_REQUEST_LEN);
        DestinationRoutes { service: self, generated }
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

    /// `Get`: a stream of encoded `Update`s, each shared with every stream of the same service
    /// port that stood at the same state ([`cnimesh_model::destination::updates`]).
    ///
    /// Unknown services are answered with a live `no_endpoints{exists: false}` rather than
    /// NotFound: the stream then turns into adds if the service appears, and the client may use
    /// DNS meanwhile, which is what the API defines `exists: false` for.
    async fn get_shared(&self, request: Request<GetDestination>) -> Result<Response<SharedStream>, Status> {
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
        let mut follower = Follower::new(caller, port, self.config.clone());
        Ok(Response::new(follow(rx, move |view| follower::messages(follower.step(view)))))
    }
}

/// `Get`'s response: encoded `Update` messages.
type SharedStream = BoxStream<'static, Result<Bytes, Status>>;

/// Destination as served: `Get` by hand, so that its stream can carry updates encoded once and
/// shared (the generated server's `Get` takes typed `Update`s and encodes each per stream), and
/// `GetProfile` by the generated server.
#[derive(Clone)]
pub struct DestinationRoutes {
    service: DestinationService,
    generated: DestinationServer<DestinationService>,
}

impl tonic::server::NamedService for DestinationRoutes {
    const NAME: &'static str = destination_server::SERVICE_NAME;
}

impl<B> tower::Service<http::Request<B>> for DestinationRoutes
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != GET {
            return self.generated.call(request);
        }
        let service = self.service.clone();
        Box::pin(async move {
            let get = tower::service_fn(move |request| {
                let service = service.clone();
                async move { service.get_shared(request).await }
            });
            let mut grpc = tonic::server::Grpc::new(PreEncoded::<GetDestination>::default())
                .apply_max_message_size_config(Some(crate::grpc::limits::MAX_REQUEST_LEN), None);
            Ok(grpc.server_streaming(get, request).await)
        })
    }
}

/// A stream that follows a watch channel: `step` turns each new value into zero or more messages.
/// The current value is handled at once, so every stream answers without waiting for a change.
/// No task or timer of our own per stream: it is polled by the server's own stream task and costs
/// nothing while the channel is quiet.
pub(crate) fn follow<V, T, I>(
    rx: watch::Receiver<V>,
    step: impl FnMut(&V) -> I + Send + 'static,
) -> BoxStream<'static, Result<T, Status>>
where
    V: Clone + Send + Sync + 'static,
    T: Send + 'static,
    I: IntoIterator<Item = T>,
    I::IntoIter: Send + 'static,
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

#[tonic::async_trait]
impl Destination for DestinationService {
    type GetStream = BoxStream<'static, Result<Update, Status>>;
    type GetProfileStream = BoxStream<'static, Result<DestinationProfile, Status>>;

    /// Never reached: [`DestinationRoutes`] serves `Get` itself, with updates encoded once and
    /// shared, which this typed stream could only carry by encoding them again per stream.
    async fn get(&self, _request: Request<GetDestination>) -> Result<Response<Self::GetStream>, Status> {
        Err(Status::internal("Get is served by DestinationRoutes"))
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::SocketAddr;
    use std::time::Duration;

    use linkerd2_proxy_api::destination::destination_client::DestinationClient;
    use linkerd2_proxy_api::destination::update::Update as Up;
    use linkerd2_proxy_api::destination::{AddrSet, NoEndpoints, Update};
    use tonic::Streaming;
    use tonic::transport::{Channel, Endpoint};

    use super::*;
    use cnimesh_model::destination::test_objects::object;
    use cnimesh_model::destination::{Change, Kind, Object};
    use cnimesh_model::meta::NsName;

    /// Only guards against a hung test; nothing here measures time.
    const PATIENCE: Duration = Duration::from_secs(60);
    const PATH: &str = "web.shop.svc.cluster.local:80";

    fn service() -> Object {
        let value = serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80, "targetPort": 8080}]},
        });
        object(value)
    }

    /// The slice of `web` listing the address [`ip`] of each of `hosts`.
    fn slice(hosts: impl IntoIterator<Item = u32>) -> Object {
        let endpoints: Vec<_> = hosts.into_iter().map(|h| serde_json::json!({"addresses": [ip(h)]})).collect();
        let value = serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-a", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "endpoints": endpoints,
        });
        object(value)
    }

    /// A distinct address in 10.0.0.0/8 for each host number.
    fn ip(host: u32) -> String {
        format!("10.{}.{}.{}", (host >> 16) & 255, (host >> 8) & 255, host & 255)
    }

    fn addr(host: u32) -> SocketAddr {
        format!("{}:8080", ip(host)).parse().unwrap()
    }

    /// A ready index with `web` listing `hosts`, served in plaintext.
    async fn serve(hosts: impl IntoIterator<Item = u32>) -> (Index, SocketAddr) {
        let index = Index::new();
        index.apply([
            Change::Reset(Kind::Service, vec![service()]),
            Change::Reset(Kind::EndpointSlice, vec![slice(hosts)]),
            Change::Reset(Kind::Pod, vec![]),
        ]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        DestinationService::new(index.clone(), Config::default()).spawn_plaintext(listener);
        (index, addr)
    }

    async fn client(addr: SocketAddr) -> DestinationClient<Channel> {
        DestinationClient::connect(format!("http://{addr}")).await.unwrap()
    }

    async fn get(client: &DestinationClient<Channel>) -> Streaming<Update> {
        let request = GetDestination { path: PATH.to_string(), ..Default::default() };
        client.clone().get(request).await.unwrap().into_inner()
    }

    async fn next(stream: &mut Streaming<Update>) -> Up {
        let message = tokio::time::timeout(PATIENCE, stream.message()).await.expect("a message in time");
        message.unwrap().expect("stream open").update.expect("update set")
    }

    /// An update in the shape the tests compare: what it adds or removes, sorted, or its `exists`.
    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Add(Vec<SocketAddr>),
        Remove(Vec<SocketAddr>),
        NoEndpoints(bool),
    }

    fn seen(update: Up) -> Seen {
        let sorted = |mut addrs: Vec<SocketAddr>| {
            addrs.sort();
            addrs
        };
        match update {
            Up::Add(set) => {
                assert_eq!(set.metric_labels["service"], "web", "adds carry the service's labels");
                Seen::Add(sorted(set.addrs.into_iter().map(|a| a.addr.unwrap().try_into().unwrap()).collect()))
            }
            Up::Remove(AddrSet { addrs }) => {
                Seen::Remove(sorted(addrs.into_iter().map(|a| a.try_into().unwrap()).collect()))
            }
            Up::NoEndpoints(NoEndpoints { exists }) => Seen::NoEndpoints(exists),
        }
    }

    #[tokio::test]
    async fn many_subscribers_of_one_service_each_receive_the_same_adds_and_removes() {
        let (index, server) = serve([1, 2]).await;
        let client = client(server).await;
        let mut streams = Vec::new();
        for _ in 0..40 {
            streams.push(get(&client).await);
        }
        // Each change, then what every subscriber must be sent for it, in order.
        let steps: Vec<(Vec<Change>, Vec<Seen>)> = vec![
            (vec![], vec![Seen::Add(vec![addr(1), addr(2)])]),
            (vec![Change::Upsert(slice([1, 2, 3]))], vec![Seen::Add(vec![addr(3)])]),
            (vec![Change::Upsert(slice([2, 3]))], vec![Seen::Remove(vec![addr(1)])]),
            (vec![Change::Upsert(slice([3, 4]))], vec![Seen::Remove(vec![addr(2)]), Seen::Add(vec![addr(4)])]),
            (vec![Change::Upsert(slice([]))], vec![Seen::Remove(vec![addr(3), addr(4)]), Seen::NoEndpoints(true)]),
            (vec![Change::Delete(Kind::Service, NsName::new("shop", "web"))], vec![Seen::NoEndpoints(false)]),
            (vec![Change::Upsert(service()), Change::Upsert(slice([5]))], vec![Seen::Add(vec![addr(5)])]),
        ];
        for (changes, expected) in steps {
            index.apply(changes);
            for stream in &mut streams {
                let mut got = Vec::new();
                for _ in 0..expected.len() {
                    got.push(seen(next(stream).await));
                }
                assert_eq!(got, expected);
            }
        }
    }

    #[tokio::test]
    async fn a_subscriber_that_joins_late_gets_the_full_set() {
        let (index, server) = serve([1, 2]).await;
        let client = client(server).await;
        let mut early = get(&client).await;
        assert_eq!(seen(next(&mut early).await), Seen::Add(vec![addr(1), addr(2)]));
        index.apply([Change::Upsert(slice([2, 3, 4]))]);
        assert_eq!(seen(next(&mut early).await), Seen::Remove(vec![addr(1)]));
        assert_eq!(seen(next(&mut early).await), Seen::Add(vec![addr(3), addr(4)]));
        let mut late = get(&client).await;
        assert_eq!(seen(next(&mut late).await), Seen::Add(vec![addr(2), addr(3), addr(4)]));
        // Both stand at the same state now, and are sent the same from here on.
        index.apply([Change::Upsert(slice([]))]);
        for stream in [&mut early, &mut late] {
            assert_eq!(seen(next(stream).await), Seen::Remove(vec![addr(2), addr(3), addr(4)]));
            assert_eq!(seen(next(stream).await), Seen::NoEndpoints(true));
        }
        let mut empty = get(&client).await;
        assert_eq!(seen(next(&mut empty).await), Seen::NoEndpoints(true), "nothing to add: no_endpoints at once");
    }

    #[tokio::test]
    async fn a_subscriber_that_does_not_read_gets_the_latest_state_coalesced() {
        const SET: u32 = 400;
        const CHANGES: u32 = 200;
        let (index, server) = serve(0..SET).await;
        // The idle subscriber's connection lets little wait in flight (h2's default windows).
        let small = Endpoint::from_shared(format!("http://{server}"))
            .unwrap()
            .initial_stream_window_size(65_535)
            .initial_connection_window_size(65_535)
            .connect()
            .await
            .unwrap();
        let request = GetDestination { path: PATH.into(), ..Default::default() };
        let mut idle = DestinationClient::new(small).get(request).await.unwrap().into_inner();
        let mut reader = get(&client(server).await).await;
        // Every change replaces the whole set with the next one: each update is large.
        let set = |c: u32| (c * SET)..((c + 1) * SET);
        for c in 1..=CHANGES {
            index.apply([Change::Upsert(slice(set(c)))]);
        }
        let last: BTreeSet<SocketAddr> = set(CHANGES).map(addr).collect();
        let follow = async |stream: &mut Streaming<Update>| {
            let (mut held, mut messages) = (BTreeSet::new(), 0u32);
            while held != last {
                messages += 1;
                match seen(next(stream).await) {
                    Seen::Add(addrs) => held.extend(addrs),
                    Seen::Remove(addrs) => addrs.iter().for_each(|a| assert!(held.remove(a), "{a} was not held")),
                    Seen::NoEndpoints(exists) => panic!("no_endpoints{{exists: {exists}}} while the set is full"),
                }
            }
            messages
        };
        follow(&mut reader).await;
        let messages = follow(&mut idle).await;
        assert!(
            messages < CHANGES,
            "{messages} messages for {CHANGES} changes: the idle stream was queued every change, not the latest state"
        );
    }
}
