//! The accept loop of every admin listener (the control plane's, the mirror's): plain HTTP/1,
//! which probes, scrapers and the API server's service proxy speak; what each serves is its own.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use http::Response;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Plain HTTP/1 on `listener`, each request answered by `handle`, until `shutdown` resolves: the
/// accept loop of every admin listener (the control plane's, the mirror's).
pub async fn serve_http<F, Fut, B>(listener: TcpListener, shutdown: impl Future<Output = ()>, handle: F)
where
    F: Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let response = handle(req);
                async move { Ok::<_, Infallible>(response.await) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
