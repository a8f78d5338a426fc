//! Upstream HTTP clients, and so connection pools, per target, protocol and expected server
//! identity: what the proxy's connections share, apart from the per-request proxying in
//! [`crate::http`].

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use cnimesh_identity::Name;
use http::Uri;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use crate::tls::{self, UpstreamIo, UpstreamTls};

/// Connects every request of a client to one fixed target: the connection's original
/// destination, over mTLS when it is a meshed endpoint.
#[derive(Clone)]
pub struct FixedConnector {
    pub target: SocketAddr,
    pub timeout: Duration,
    pub tls: Option<UpstreamTls>,
}

impl FixedConnector {
    pub async fn connect(self) -> io::Result<UpstreamIo> {
        tls::connect(self.target, self.timeout, self.tls.as_ref()).await
    }
}

impl tower::Service<Uri> for FixedConnector {
    type Response = TokioIo<UpstreamIo>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.connect().await.map(TokioIo::new) })
    }
}

pub type UpstreamClient = Client<FixedConnector, Incoming>;

/// Pools are per target, protocol and expected server identity.
type PoolKey = (SocketAddr, bool, Option<Name>);

/// Upstream clients (and so connection pools) per target and protocol.
pub struct Clients {
    map: Mutex<HashMap<PoolKey, UpstreamClient>>,
    pub connect_timeout: Duration,
}

/// Targets kept before the cache is reset (their idle connections then close).
const MAX_TARGETS: usize = 4096;

impl Clients {
    pub fn new(connect_timeout: Duration) -> Self {
        Self { map: Mutex::default(), connect_timeout }
    }

    pub fn get(&self, target: SocketAddr, h2: bool, tls: Option<&UpstreamTls>) -> UpstreamClient {
        let key = (target, h2, tls.map(|t| t.server_id.clone()));
        let mut map = self.map.lock().expect("not poisoned");
        if map.len() >= MAX_TARGETS && !map.contains_key(&key) {
            map.clear();
        }
        map.entry(key)
            .or_insert_with(|| {
                let connector = FixedConnector { target, timeout: self.connect_timeout, tls: tls.cloned() };
                Client::builder(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .pool_timer(TokioTimer::new())
                    .pool_idle_timeout(Duration::from_secs(90))
                    .http2_only(h2)
                    .build(connector)
            })
            .clone()
    }
}
