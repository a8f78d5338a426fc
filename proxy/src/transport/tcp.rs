//! Opaque TCP forwarding: bytes both ways, half-close preserved (a FIN one way leaves the other
//! way open), an idle timeout, and byte counters.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Connects to `target` within `timeout`, with Nagle off (the proxy adds no batching delay).
pub async fn connect(target: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(target))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("connect to {target} timed out")))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Milliseconds since `start`, for lock-free activity tracking.
fn ms_since(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

/// Copy buffers start small, so thousands of quiet connections cost little, grow while reads
/// fill them (a bulk transfer), and shrink back once traffic is small again (as ztunnel does).
const MIN_BUF: usize = 1024;
const MAX_BUF: usize = 16 * 1024;

/// The buffer size after a read of `n` bytes into a buffer of `len`.
fn next_buf_len(len: usize, n: usize) -> usize {
    if n == len {
        (len * 2).min(MAX_BUF)
    } else if n < len / 4 {
        (len / 2).max(MIN_BUF)
    } else {
        len
    }
}

async fn copy_half<R, W>(
    mut from: R,
    mut to: W,
    counter: Counter,
    start: Instant,
    activity: Arc<AtomicU64>,
) -> io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; MIN_BUF];
    let mut total = 0;
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            // Propagate the FIN; the other direction keeps flowing.
            to.shutdown().await?;
            return Ok(total);
        }
        to.write_all(&buf[..n]).await?;
        total += n as u64;
        counter.inc_by(n as u64);
        activity.store(ms_since(start), Ordering::Relaxed);
        let next = next_buf_len(buf.len(), n);
        if next != buf.len() {
            buf = vec![0u8; next];
        }
    }
}

/// Byte counters of one forwarded connection: read from the client, written to it.
pub struct Counters {
    pub read: Counter,
    pub write: Counter,
}

/// Forwards `client` (with `prefix`, bytes already read from it) to `upstream` until both
/// directions end or the connection idles out.
pub async fn forward<C, U>(client: C, prefix: Bytes, upstream: U, idle: Duration, counters: Counters) -> io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (client_read, client_write) = tokio::io::split(client);
    let (upstream_read, mut upstream_write) = tokio::io::split(upstream);
    if !prefix.is_empty() {
        upstream_write.write_all(&prefix).await?;
        counters.read.inc_by(prefix.len() as u64);
    }
    let start = Instant::now();
    let activity = Arc::new(AtomicU64::new(0));
    let up = copy_half(client_read, upstream_write, counters.read, start, activity.clone());
    let down = copy_half(upstream_read, client_write, counters.write, start, activity.clone());
    let both = async { tokio::try_join!(up, down).map(drop) };
    let idle_watch = async {
        loop {
            let quiet = Duration::from_millis(ms_since(start).saturating_sub(activity.load(Ordering::Relaxed)));
            if quiet >= idle {
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    };
    tokio::select! {
        r = both => r,
        () = idle_watch => Err(io::Error::new(io::ErrorKind::TimedOut, format!("idle for {idle:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn half_close_keeps_the_other_direction() {
        // Upstream: reads until EOF, then answers with the byte count.
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = server.accept().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            s.write_all(format!("got {}", got.len()).as_bytes()).await.unwrap();
        });
        let (mut app, proxy_side) = tokio::io::duplex(1024);
        let upstream = connect(addr, Duration::from_secs(1)).await.unwrap();
        let fwd = tokio::spawn(forward(
            proxy_side,
            Bytes::from_static(b"ab"),
            upstream,
            Duration::from_secs(5),
            Counters { read: Counter::default(), write: Counter::default() },
        ));
        app.write_all(b"cdef").await.unwrap();
        app.shutdown().await.unwrap();
        let mut answer = String::new();
        app.read_to_string(&mut answer).await.unwrap();
        assert_eq!(answer, "got 6");
        fwd.await.unwrap().unwrap();
    }

    #[test]
    fn copy_buffers_grow_under_load_and_shrink_back() {
        let mut len = MIN_BUF;
        for _ in 0..10 {
            len = next_buf_len(len, len);
        }
        assert_eq!(len, MAX_BUF);
        for _ in 0..10 {
            len = next_buf_len(len, 10);
        }
        assert_eq!(len, MIN_BUF);
        assert_eq!(next_buf_len(4096, 3000), 4096, "a steady size stays");
    }

    #[tokio::test]
    async fn idle_connections_are_closed() {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            let (_s, _) = server.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let (_app, proxy_side) = tokio::io::duplex(1024);
        let upstream = connect(addr, Duration::from_secs(1)).await.unwrap();
        let e = forward(
            proxy_side,
            Bytes::new(),
            upstream,
            Duration::from_millis(100),
            Counters { read: Counter::default(), write: Counter::default() },
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}
