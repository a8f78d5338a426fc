//! Graceful shutdown bookkeeping, in two steps. Terminating (SIGTERM or `/shutdown`): the proxy
//! says it is not ready but keeps accepting, because its clients learn that the endpoint is gone
//! only some time later (the endpoints controller, then discovery), and a connection refused
//! meanwhile would fail a request. Draining: the listeners stop and every connection finishes
//! its work; a count of connections still running lets shutdown wait for them (up to the grace
//! period).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, watch};

/// Where the proxy is in its shutdown; each step only ever moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Serving,
    Terminating,
    Draining,
}

#[derive(Clone)]
pub struct Drain {
    phase: watch::Sender<Phase>,
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
        Self { phase: watch::channel(Phase::Serving).0, active: Arc::new((AtomicUsize::new(0), Notify::new())) }
    }
}

impl Drain {
    pub fn guard(&self) -> Guard {
        self.active.0.fetch_add(1, Ordering::SeqCst);
        Guard(self.active.clone())
    }

    /// Resolves once `phase` is reached (or passed).
    fn reached(&self, phase: Phase) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.phase.subscribe();
        async move {
            let _ = rx.wait_for(|now| *now >= phase).await;
        }
    }

    fn advance(&self, to: Phase) {
        self.phase.send_if_modified(|now| {
            let moved = *now < to;
            *now = (*now).max(to);
            moved
        });
    }

    /// Resolves once termination was asked for (the listeners may still be accepting).
    pub fn terminating(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.reached(Phase::Terminating)
    }

    /// Whether termination was asked for: the proxy is no longer ready.
    pub fn is_terminating(&self) -> bool {
        *self.phase.borrow() >= Phase::Terminating
    }

    /// Asks for termination: not ready at once, draining after the shutdown delay
    /// (the program's run loop decides when).
    pub fn terminate(&self) {
        self.advance(Phase::Terminating);
    }

    /// Resolves once draining has started: listeners stop, connections finish.
    pub fn signalled(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.reached(Phase::Draining)
    }

    pub fn is_draining(&self) -> bool {
        *self.phase.borrow() == Phase::Draining
    }

    /// Starts draining now (termination included).
    pub fn start(&self) {
        self.advance(Phase::Draining);
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

    #[tokio::test]
    async fn terminating_is_not_draining_until_draining_starts_and_never_goes_back() {
        let d = Drain::default();
        let (terminating, draining) = (d.terminating(), d.signalled());
        tokio::pin!(draining);
        d.terminate();
        terminating.await;
        assert!(d.is_terminating() && !d.is_draining());
        let pending = tokio::select! {
            biased;
            () = &mut draining => false,
            () = std::future::ready(()) => true,
        };
        assert!(pending, "listeners keep accepting while terminating");
        d.start();
        draining.await;
        d.terminate();
        assert!(d.is_draining(), "asking to terminate again does not undo draining");
    }

    #[tokio::test]
    async fn draining_at_once_also_counts_as_terminating() {
        let d = Drain::default();
        d.start();
        d.terminating().await;
        assert!(d.is_terminating());
    }
}
