//! The proxy's reconnect delay: cnimesh-common's jittered exponential backoff (one home, shared
//! with the trace exporter), jittered from the proxy's own per-thread generator.

use std::time::Duration;

pub use cnimesh_common::backoff::FIRST_BACKOFF;

/// The next backoff: see [`cnimesh_common::backoff::backoff`]; the jitter is drawn here.
pub fn backoff(previous: Duration, max: Duration) -> (Duration, Duration) {
    let fraction = crate::transport::rng::with(|r| rand::Rng::random_range(r, 0.5..=1.0));
    cnimesh_common::backoff::backoff(previous, max, fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxys_backoff_jitters_within_half_to_all_of_the_step() {
        let max = Duration::from_secs(30);
        let mut d = Duration::ZERO;
        for _ in 0..12 {
            let (next, jittered) = backoff(d, max);
            assert!(jittered <= next && jittered >= next / 2, "{jittered:?} vs {next:?}");
            d = next;
        }
        assert_eq!(d, max);
    }
}
