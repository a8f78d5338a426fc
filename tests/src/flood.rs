//! Abusive clients for overload measurements: many connections from one pod that stay idle, or
//! dribble a request (slowloris) after its request line or from their very first byte. Each
//! records whether and when the proxy closed it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What each connection does once connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Sends nothing.
    Idle,
    /// Sends a request line and a first header at once, then one more header byte per second.
    SlowHeaders,
    /// Sends a request one byte per second from its first byte.
    SlowFromFirstByte,
}

const REQUEST: &[u8] = b"GET /hello HTTP/1.1\r\nHost: server\r\n";
const HEADER_BYTES: &[u8] = b"X-Slow: abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz";

/// How the connections fared, shared with the driving thread.
#[derive(Debug, Default)]
pub struct Counts {
    /// Connections that were established.
    pub connected: AtomicUsize,
    /// Connections that could not be established (refused, timed out, reset at once).
    pub failed: AtomicUsize,
    /// Established connections the far end closed or reset before the flood stopped.
    pub closed_by_peer: AtomicUsize,
    /// Sum of the lifetimes (ms) of the connections the far end closed.
    closed_after_ms: AtomicUsize,
}

impl Counts {
    /// Mean lifetime (s) of the connections the far end closed.
    pub fn mean_closed_after_s(&self) -> f64 {
        let n = self.closed_by_peer.load(Ordering::Relaxed);
        if n == 0 { f64::NAN } else { self.closed_after_ms.load(Ordering::Relaxed) as f64 / n as f64 / 1e3 }
    }
}

/// A running flood from one pod; dropping it closes every connection it holds.
pub struct Flood {
    pub counts: Arc<Counts>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    /// Opens `n` connections of `kind` to `to` from inside `netns`, all at once.
    pub fn start(netns: &Path, to: SocketAddr, n: usize, kind: Kind) -> anyhow::Result<Self> {
        let counts = Arc::new(Counts::default());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let thread = crate::netns::spawn_in(netns, {
            let counts = counts.clone();
            move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                rt.block_on(async move {
                    let tasks: Vec<_> =
                        (0..n).map(|_| tokio::spawn(connection(to, kind, counts.clone(), stopped.clone()))).collect();
                    for t in tasks {
                        let _ = t.await;
                    }
                });
            }
        })?;
        Ok(Self { counts, stop: Some(stop), thread: Some(thread) })
    }

    /// Connections established so far.
    pub fn connected(&self) -> usize {
        self.counts.connected.load(Ordering::Relaxed)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn connection(to: SocketAddr, kind: Kind, counts: Arc<Counts>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_secs(10), tokio::net::TcpStream::connect(to)).await else {
        counts.failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    counts.connected.fetch_add(1, Ordering::Relaxed);
    let start = Instant::now();
    let (mut next, mut sent) = (start, 0usize);
    let bytes: Vec<u8> = REQUEST.iter().chain(HEADER_BYTES.iter().cycle().take(4096)).copied().collect();
    if kind == Kind::SlowHeaders {
        // The request line and first header at once; then one byte per second.
        sent = REQUEST.len();
        if s.write_all(&bytes[..sent]).await.is_err() {
            return closed(&counts, start);
        }
        next += Duration::from_secs(1);
    }
    let mut buf = [0u8; 1024];
    loop {
        let write_due = kind != Kind::Idle && sent < bytes.len();
        tokio::select! {
            _ = stop.changed() => return,
            read = s.read(&mut buf) => match read {
                Ok(0) | Err(_) => return closed(&counts, start),
                Ok(_) => {}
            },
            () = tokio::time::sleep_until(next.into()), if write_due => {
                if s.write_all(&bytes[sent..=sent]).await.is_err() {
                    return closed(&counts, start);
                }
                sent += 1;
                next += Duration::from_secs(1);
            }
        }
    }
}

fn closed(counts: &Counts, start: Instant) {
    counts.closed_by_peer.fetch_add(1, Ordering::Relaxed);
    counts.closed_after_ms.fetch_add(start.elapsed().as_millis() as usize, Ordering::Relaxed);
}
