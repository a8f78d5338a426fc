//! Log lines for events that come in floods (shed connections, failing accepts): at most one per
//! period, saying how many were left out, so a flood cannot turn into a flood of log lines.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct LogLimit {
    period: Duration,
    last: Mutex<Option<Instant>>,
    left_out: AtomicU64,
}

impl LogLimit {
    pub const fn new(period: Duration) -> Self {
        Self { period, last: Mutex::new(None), left_out: AtomicU64::new(0) }
    }

    /// `Some(n)` when a line may be logged now, `n` being how many were left out since the last
    /// one; `None` (and one more left out) otherwise.
    pub fn allow(&self) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock().expect("not poisoned");
        match *last {
            Some(at) if now.duration_since(at) < self.period => {
                self.left_out.fetch_add(1, Ordering::Relaxed);
                None
            }
            _ => {
                *last = Some(now);
                Some(self.left_out.swap(0, Ordering::Relaxed))
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
