//! A connection's writes gathered over one round of the scheduler and written at once.
//!
//! A change fans out to every stream that follows it: each stream's task sends its update into
//! its HTTP/2 connection, which wakes the connection's task, and tokio runs a task woken that way
//! right after the one that woke it. Left alone, the connection would encrypt and write each
//! stream's frame on its own, one TLS record and one `writev` per subscriber. Here the
//! connection's first flush after a write is put off once: the task yields to the back of the run
//! queue, the other streams' tasks (already queued by the same change) add their frames
//! meanwhile, and the next flush writes them all in one TLS record and one system call.
//!
//! Nothing waits on a timer: the put-off flush happens as soon as the tasks queued before it
//! have run, and a buffer grown past [`LIMIT`] is written at once.
//!
//! Layer: gRPC: an I/O adapter under hyper's HTTP/2 server.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Written through once this much is gathered (HTTP/2's default frame size is 16 KiB).
const LIMIT: usize = 64 * 1024;
/// A buffer larger than this is given back after it is written, so an idle connection holds
/// little; smaller ones are kept for the next round.
const KEEP: usize = 4 * 1024;

/// Wraps a connection's I/O; reads pass through.
#[derive(Debug)]
pub struct BatchedWrites<T> {
    inner: T,
    buf: Vec<u8>,
    /// How much of `buf` has been written to `inner`.
    written: usize,
    /// The flush has been put off once since the last write through.
    deferred: bool,
}

impl<T> BatchedWrites<T> {
    pub fn new(inner: T) -> Self {
        Self { inner, buf: Vec::new(), written: 0, deferred: false }
    }
}

impl<T: AsyncWrite + Unpin> BatchedWrites<T> {
    /// Writes out what is gathered.
    fn poll_write_through(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        if self.buf.capacity() > KEEP {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        self.written = 0;
        Poll::Ready(Ok(()))
    }

    fn poll_gather(&mut self, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        if self.buf.len() >= LIMIT {
            ready!(self.poll_write_through(cx))?;
        }
        let mut n = 0;
        for b in bufs {
            self.buf.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for BatchedWrites<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for BatchedWrites<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.get_mut().poll_gather(cx, &[io::IoSlice::new(data)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_gather(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.written < this.buf.len() && !this.deferred {
            // Woken from inside its own poll, the task is queued behind those already waiting.
            this.deferred = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(this.poll_write_through(cx))?;
        this.deferred = false;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_through(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn writes_reach_the_peer_in_order_once_flushed() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let mut batched = BatchedWrites::new(a);
        batched.write_all(b"one ").await.unwrap();
        batched.write_all(&vec![b'x'; 3 * LIMIT]).await.unwrap();
        batched.write_all(b" two").await.unwrap();
        batched.flush().await.unwrap();
        let mut got = vec![0; 8 + 3 * LIMIT];
        b.read_exact(&mut got).await.unwrap();
        assert!(got.starts_with(b"one xxx") && got.ends_with(b"xx two"));
        batched.shutdown().await.unwrap();
        assert_eq!(b.read(&mut [0; 1]).await.unwrap(), 0, "shut down after the last write");
    }
}
