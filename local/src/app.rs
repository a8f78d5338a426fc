//! The demo's workload (`cnimesh-local app`): answers every HTTP/1 or HTTP/2 request with the
//! pod's name, so the client can see which replica the mesh picked.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use http::Response;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

pub async fn serve(listen: SocketAddr, name: String) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    tracing::info!(%listen, name, "serving");
    let name: Arc<str> = name.into();
    loop {
        let (stream, _) = listener.accept().await?;
        let name = name.clone();
        tokio::spawn(async move {
            let service = service_fn(move |_req| {
                let body = Bytes::from(name.to_string());
                async move { Ok::<_, Infallible>(Response::new(Full::new(body))) }
            });
            if let Err(e) =
                auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), service).await
            {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
}
