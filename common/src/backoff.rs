//! The one reconnect delay of cnimesh: jittered exponential backoff. The proxy (certificate
//! refresh, Destination streams) and the trace exporter back off alike; each brings its own
//! randomness (this crate has no dependencies), so the jitter fraction is an argument.

use std::time::Duration;

/// The first delay after a success (or at start).
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// The next backoff: double, capped, then jittered to `fraction` of that (callers draw it from
/// 0.5..=1.0) so a fleet that lost its peer together does not come back in lockstep. Returns
/// `(next, jittered)`: `next` is fed back as `previous` on the following failure
/// (`Duration::ZERO` after a success), `jittered` is how long to wait now.
pub fn backoff(previous: Duration, max: Duration, fraction: f64) -> (Duration, Duration) {
    backoff_between(previous, FIRST_BACKOFF, max, fraction)
}

/// [`backoff`] with its own first step `min` instead of [`FIRST_BACKOFF`]: the proxy's failure
/// accrual penalties (a Service's `min-penalty`/`max-penalty`) step the same way.
pub fn backoff_between(previous: Duration, min: Duration, max: Duration, fraction: f64) -> (Duration, Duration) {
    let next = (previous * 2).max(min).min(max);
    (next, next.mul_f64(fraction.clamp(0.0, 1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_jitters() {
        let max = Duration::from_secs(30);
        let (mut d, mut seen) = (Duration::ZERO, Vec::new());
        for i in 0..12 {
            let fraction = 0.5 + f64::from(i) / 22.0;
            let (next, jittered) = backoff(d, max, fraction);
            assert!(jittered <= next && jittered >= next / 2, "{jittered:?} vs {next:?}");
            seen.push(next);
            d = next;
        }
        assert_eq!(seen[0], FIRST_BACKOFF);
        assert_eq!(seen[1], FIRST_BACKOFF * 2);
        assert_eq!(*seen.last().unwrap(), max);
    }

    #[test]
    fn backoff_between_starts_at_its_own_minimum() {
        let (min, max) = (Duration::from_secs(1), Duration::from_secs(5));
        let (first, _) = backoff_between(Duration::ZERO, min, max, 1.0);
        let (second, _) = backoff_between(first, min, max, 1.0);
        let (third, _) = backoff_between(second, min, max, 1.0);
        let (fourth, half) = backoff_between(third, min, max, 0.5);
        assert_eq!([first, second, third, fourth], [min, min * 2, min * 4, max]);
        assert_eq!(half, max / 2);
    }
}
