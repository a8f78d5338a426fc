//! Waiting, bounded, for effects that land asynchronously (a proxy closing descriptors, a limit
//! freeing up): a test polls instead of sleeping a guessed time, and fails with what it waited for.

use std::time::{Duration, Instant};

/// Polls `check` every 100 ms until it holds; panics naming `what` after `limit`.
pub fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
