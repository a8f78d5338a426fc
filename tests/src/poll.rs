//! Waiting for a condition in a test, bounded so that a broken build fails instead of hanging.

use std::time::{Duration, Instant};

/// Polls `f` every 50 ms until it holds; panics naming `what` after 30 s.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
