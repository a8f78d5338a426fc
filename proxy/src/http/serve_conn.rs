//! Serving one client connection with hyper, sized for a sidecar: buffers bounded, HTTP/1
//! half-closed clients answered, and a graceful finish once draining starts.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use super::Body;
use crate::transport::Io;

/// The largest HTTP/1 read buffer per connection: headers beyond this are refused. hyper's own
/// default (~400 KiB) lets a thousand clients hold hundreds of MiB.
pub const H1_MAX_BUF: usize = 64 * 1024;
/// HTTP/2 flow-control windows: enough to keep a fast stream busy on a pod network, small enough
/// that a slow reader cannot make us buffer megabytes per connection.
pub const H2_STREAM_WINDOW: u32 = 256 * 1024;
pub const H2_CONN_WINDOW: u32 = 1024 * 1024;
pub const H2_MAX_SEND_BUF: usize = 64 * 1024;

/// Serves `io` as HTTP/2 (`h2`) or HTTP/1 with `service` until the client is done or `stop`
/// resolves; then in-flight requests finish and no new ones are taken.
pub async fn serve<I, S>(
    io: I,
    h2: bool,
    service: S,
    header_timeout: Duration,
    stop: impl Future<Output = ()>,
) -> hyper::Result<()>
where
    I: Io,
    S: Service<http::Request<Incoming>, Response = http::Response<Body>, Error = std::convert::Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let io = TokioIo::new(io);
    if h2 {
        let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONN_WINDOW)
            .max_send_buf_size(H2_MAX_SEND_BUF)
            .serve_connection(io, service);
        until_drained(conn, stop, |c| c.graceful_shutdown()).await
    } else {
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            // Slowloris: a client that does not finish its headers in time is cut off.
            .header_read_timeout(header_timeout)
            .max_buf_size(H1_MAX_BUF)
            // A client that half-closes after its request (`nc`, HTTP/1.0 tools, health checkers)
            // still waits for the response: its FIN is not a cancellation. hyper's default would
            // drop the in-flight request and close without a reply.
            .half_close(true)
            .serve_connection(io, service)
            .with_upgrades();
        until_drained(conn, stop, |c| c.graceful_shutdown()).await
    }
}

/// Drives a hyper connection; once draining starts, asks it to finish gracefully (complete the
/// in-flight requests, accept no new ones) and waits for that.
async fn until_drained<C, E>(conn: C, stop: impl Future<Output = ()>, graceful: fn(Pin<&mut C>)) -> Result<(), E>
where
    C: Future<Output = Result<(), E>>,
{
    tokio::pin!(conn);
    tokio::pin!(stop);
    tokio::select! {
        r = conn.as_mut() => r,
        () = stop => {
            graceful(conn.as_mut());
            conn.await
        }
    }
}
