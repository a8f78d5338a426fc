//! In-process kube clients: requests answered by a function, with no socket, so a test (or a
//! hand-written mock) stands in for an API server without TLS or ports.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response};

use crate::response::Body;

/// A kube client answered by `handle` on `mock`.
pub fn client_for<M, F, Fut>(mock: Arc<M>, handle: F) -> kube::Client
where
    M: Send + Sync + 'static,
    F: Fn(Arc<M>, Request<kube::client::Body>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    let service = tower::service_fn(move |req: Request<kube::client::Body>| {
        let (mock, handle) = (mock.clone(), handle.clone());
        async move { Ok::<_, Infallible>(handle(mock, req).await) }
    });
    kube::Client::new(service, "default")
}
