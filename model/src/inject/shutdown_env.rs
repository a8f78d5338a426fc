//! The proxy's shutdown timing for a pod's `terminationGracePeriodSeconds`. After SIGTERM the
//! proxy keeps accepting for a delay (its clients learn a moment later that the endpoint is
//! gone), then drains in-flight work; the kubelet kills it when the period is over. Its defaults
//! (5 s + 20 s) fit the default period of 30 s. A pod with a shorter period gets timings that
//! fit it, so that no drain the proxy believes it has is cut by SIGKILL; a longer one keeps the
//! defaults (the app's own shutdown may use the rest: a native sidecar is stopped only after
//! the app containers have exited, within the same period).

use cnimesh_common::names::{PROXY_SHUTDOWN_DELAY_MS, PROXY_SHUTDOWN_GRACE_MS};

/// The proxy's defaults.
const DEFAULT_DELAY_MS: i64 = PROXY_SHUTDOWN_DELAY_MS as i64;
const DEFAULT_DRAIN_MS: i64 = PROXY_SHUTDOWN_GRACE_MS as i64;
/// Left between the drain's end and the kubelet's SIGKILL.
const MARGIN_MS: i64 = 1_000;

/// The environment that fits the proxy's shutdown into `grace_seconds` (none: the defaults
/// fit): a quarter of the period still accepting, the rest but a second draining.
pub fn shutdown_env(grace_seconds: Option<i64>) -> Vec<(&'static str, String)> {
    let Some(grace_ms) = grace_seconds.map(|s| s.max(0).saturating_mul(1000)) else { return Vec::new() };
    if grace_ms >= DEFAULT_DELAY_MS + DEFAULT_DRAIN_MS + MARGIN_MS {
        return Vec::new();
    }
    let delay = (grace_ms / 4).min(DEFAULT_DELAY_MS);
    let drain = (grace_ms - delay - MARGIN_MS).max(0);
    vec![("CNIMESH_PROXY_SHUTDOWN_DELAY_MS", delay.to_string()), ("CNIMESH_PROXY_SHUTDOWN_GRACE_MS", drain.to_string())]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(env: &[(&str, String)], name: &str) -> i64 {
        env.iter().find(|(n, _)| *n == name).map(|(_, v)| v.parse().unwrap()).unwrap()
    }

    #[test]
    fn the_defaults_stay_when_the_period_holds_them() {
        assert!(shutdown_env(None).is_empty());
        assert!(shutdown_env(Some(30)).is_empty());
        assert!(shutdown_env(Some(120)).is_empty());
    }

    #[test]
    fn a_shorter_period_gets_a_delay_and_drain_that_end_before_the_kill() {
        for seconds in [0, 1, 2, 10, 25] {
            let env = shutdown_env(Some(seconds));
            let (delay, drain) =
                (ms(&env, "CNIMESH_PROXY_SHUTDOWN_DELAY_MS"), ms(&env, "CNIMESH_PROXY_SHUTDOWN_GRACE_MS"));
            assert!(delay >= 0 && drain >= 0, "{seconds}: {env:?}");
            assert!(delay + drain <= (seconds * 1000 - MARGIN_MS).max(delay), "{seconds}: {env:?}");
        }
        let env = shutdown_env(Some(10));
        assert_eq!(
            (ms(&env, "CNIMESH_PROXY_SHUTDOWN_DELAY_MS"), ms(&env, "CNIMESH_PROXY_SHUTDOWN_GRACE_MS")),
            (2500, 6500)
        );
    }
}
