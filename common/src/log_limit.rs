//! Log lines for events that come in floods (shed connections, failing accepts): at most one per
//! period, saying how many were left out, so a flood cannot turn into a flood of log lines.
//!
//! Lock-free (atomics only): common takes no dependencies, so no parking_lot here, and the
//! workspace bans std's poisoning locks.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// `last` holds when the last line was allowed, in nanoseconds since `epoch` plus one; 0 is
/// "never".
#[derive(Debug)]
pub struct LogLimit {
    period: Duration,
    epoch: OnceLock<std::time::Instant>,
    last: AtomicU64,
    left_out: AtomicU64,
}

impl LogLimit {
    pub const fn new(period: Duration) -> Self {
        Self { period, epoch: OnceLock::new(), last: AtomicU64::new(0), left_out: AtomicU64::new(0) }
    }

    /// `Some(n)` when a line may be logged now, `n` being how many were left out since the last
    /// one; `None` (and one more left out) otherwise.
    pub fn allow(&self) -> Option<u64> {
        let epoch = *self.epoch.get_or_init(std::time::Instant::now);
        let now = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1;
        let period = u64::try_from(self.period.as_nanos()).unwrap_or(u64::MAX);
        let mut last = self.last.load(Ordering::Acquire);
        loop {
            if last != 0 && now.saturating_sub(last) < period {
                self.left_out.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            // Only the caller that moves `last` forward logs; a racing one retries against it.
            match self.last.compare_exchange_weak(last, now, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(self.left_out.swap(0, Ordering::Relaxed)),
                Err(seen) => last = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_with_the_count_left_out() {
        let limit = LogLimit::new(Duration::from_millis(50));
        assert_eq!(limit.allow(), Some(0));
        assert_eq!((0..5).filter_map(|_| limit.allow()).count(), 0);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(limit.allow(), Some(5));
    }
}
