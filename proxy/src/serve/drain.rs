//! Graceful shutdown bookkeeping: a signal every connection watches, and a count of connections
//! still running so shutdown can wait for them (up to the grace period).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, watch};

#[derive(Clone)]
pub struct Drain {
    signal: watch::Sender<bool>,
    active: Arc<(AtomicUsize, Notify)>,
}

/// Held by each connection; dropping it marks the connection finished.
pub struct Guard(Arc<(AtomicUsize, Notify)>);

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.0.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.1.notify_waiters();
        }
    }
}

impl Default for Drain {
    fn default() -> Self {
        Self { signal: watch::channel(false).0, active: Arc::new((AtomicUsize::new(0), Notify::new())) }
    }
}

impl Drain {
    pub fn guard(&self) -> Guard {
        self.active.0.fetch_add(1, Ordering::SeqCst);
        Guard(self.active.clone())
    }

    /// Resolves once draining has started.
    pub fn signalled(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.signal.subscribe();
        async move {
            let _ = rx.wait_for(|draining| *draining).await;
        }
    }

    pub fn is_draining(&self) -> bool {
        *self.signal.borrow()
    }

    pub fn start(&self) {
        self.signal.send_replace(true);
    }

    pub fn active(&self) -> usize {
        self.active.0.load(Ordering::SeqCst)
    }

    /// Waits until no connection is active.
    pub async fn idle(&self) {
        loop {
            let notified = self.active.1.notified();
            if self.active() == 0 {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn waits_for_guards() {
        let d = Drain::default();
        let g = d.guard();
        let signalled = d.signalled();
        d.start();
        signalled.await;
        assert!(d.is_draining());
        assert!(tokio::time::timeout(Duration::from_millis(50), d.idle()).await.is_err());
        drop(g);
        tokio::time::timeout(Duration::from_secs(1), d.idle()).await.unwrap();
    }
}
