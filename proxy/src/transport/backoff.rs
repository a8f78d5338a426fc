//! The one reconnect delay of the proxy: jittered exponential backoff, shared by certificate
//! refresh and the Destination streams so both back off from a lost control plane alike.

use std::time::Duration;

/// The first delay after a success (or at start).
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// The next backoff: double, capped, then jittered to 50–100% so a fleet of proxies that lost the
/// control plane together does not come back in lockstep. Returns `(next, jittered)`: `next` is
/// fed back as `previous` on the following failure (`Duration::ZERO` after a success), `jittered`
/// is how long to wait now.
pub fn backoff(previous: Duration, max: Duration) -> (Duration, Duration) {
    let next = (previous * 2).max(FIRST_BACKOFF).min(max);
    let fraction = crate::transport::rng::with(|r| rand::Rng::random_range(r, 0.5..=1.0));
    (next, next.mul_f64(fraction))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_jitters() {
        let max = Duration::from_secs(30);
        let (mut d, mut seen) = (Duration::ZERO, Vec::new());
        for _ in 0..12 {
            let (next, jittered) = backoff(d, max);
            assert!(jittered <= next && jittered >= next / 2, "{jittered:?} vs {next:?}");
            seen.push(next);
            d = next;
        }
        assert_eq!(seen[0], FIRST_BACKOFF);
        assert_eq!(seen[1], FIRST_BACKOFF * 2);
        assert_eq!(*seen.last().unwrap(), max);
    }
}
