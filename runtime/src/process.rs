//! What every long-running binary of the control plane (the control plane, the mirror) and the
//! operator's command line share about their process: durations on the command line and the
//! signals that stop it.

use std::time::Duration;

/// humantime's durations (`10s`, `500ms`, `30m`, `24h`, `7d`, `1h30m`); a bare number is
/// seconds, as it always was here (humantime itself insists on a unit). Mind that humantime's
/// `y` is 365.25 days: the defaults say `365d` / `3650d` to stay whole days.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().map(Duration::from_secs).map_err(|_| format!("{s:?} is too long"));
    }
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (e.g. 10s, 24h, 365d)"))
}

/// SIGTERM (the kubelet) or SIGINT (a terminal); the mirror's process stops on them too.
pub async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the process");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86400));
        assert_eq!(parse_duration("3650d").unwrap(), Duration::from_secs(3650 * 86400));
        // humantime's years are 365.25 days (the old parser's were 365).
        assert_eq!(parse_duration("10y").unwrap(), Duration::from_secs(3652 * 86400 + 43200));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        // humantime accepts weeks, fractions and sums, which the old parser refused.
        assert_eq!(parse_duration("10w").unwrap(), Duration::from_secs(70 * 86400));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        for bad in ["", "s", "10x", "-1s", "99999999999999999999y", "99999999999999999999"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
