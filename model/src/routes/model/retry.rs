//! Timeouts and retries: the records, Linkerd's retry conditions as annotations write them, and
//! Gateway API durations.

use std::ops::RangeInclusive;
use std::time::Duration;

use super::checks::invalid;
use crate::meta::Invalid;

/// Retries when only the conditions are annotated (Linkerd's default).
pub(super) const DEFAULT_RETRY_LIMIT: u32 = 1;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// The whole request, retries included (`timeouts.request`).
    pub request: Option<Duration>,
    /// One attempt at a backend (`timeouts.backendRequest`).
    pub backend_request: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// Retries after the first attempt.
    pub limit: u32,
    pub conditions: RetryConditions,
    /// Per attempt.
    pub timeout: Option<Duration>,
    /// At least this long between attempts.
    pub backoff: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryConditions {
    /// HTTP status ranges.
    Http(Vec<RangeInclusive<u16>>),
    /// gRPC status codes (Linkerd's five retryable ones).
    Grpc(GrpcConditions),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GrpcConditions {
    pub cancelled: bool,
    pub deadline_exceeded: bool,
    pub resource_exhausted: bool,
    pub internal: bool,
    pub unavailable: bool,
}

/// Linkerd's `retry.linkerd.io/http`: `5xx`, `gateway-error` (502–504), a status or a range
/// `500-504`, comma-separated.
pub(super) fn http_conditions(value: &str) -> Result<RetryConditions, Invalid> {
    let mut ranges = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let range = match part {
            "5xx" => 500..=599,
            "gateway-error" => 502..=504,
            _ => {
                let (start, end) = part.split_once('-').unwrap_or((part, part));
                let status = |s: &str| {
                    s.trim().parse::<u16>().ok().filter(|s| (100..=599).contains(s)).ok_or_else(|| {
                        Invalid(format!("{part:?} is not 5xx, gateway-error, an HTTP status or a range of them"))
                    })
                };
                let (start, end) = (status(start)?, status(end)?);
                if start > end {
                    return invalid(format!("range {part:?} is empty"));
                }
                start..=end
            }
        };
        ranges.push(range);
    }
    if ranges.is_empty() {
        return invalid("no retry condition");
    }
    Ok(RetryConditions::Http(ranges))
}

/// Linkerd's `retry.linkerd.io/grpc`: `cancelled`, `deadline-exceeded`, `resource-exhausted`,
/// `internal`, `unavailable`, comma-separated.
pub(super) fn grpc_conditions(value: &str) -> Result<RetryConditions, Invalid> {
    let mut c = GrpcConditions::default();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "cancelled" => c.cancelled = true,
            "deadline-exceeded" => c.deadline_exceeded = true,
            "resource-exhausted" => c.resource_exhausted = true,
            "internal" => c.internal = true,
            "unavailable" => c.unavailable = true,
            other => {
                return invalid(format!(
                    "{other:?} is not cancelled, deadline-exceeded, resource-exhausted, internal or unavailable"
                ));
            }
        }
    }
    Ok(RetryConditions::Grpc(c))
}

/// A Gateway API duration (GEP-2257): one to four `<1–5 digits><h|m|s|ms>` parts, e.g. `1h30m`,
/// `500ms`. Zero means none (no timeout), as the Gateway API says for timeouts.
pub fn duration(text: &str) -> Result<Option<Duration>, Invalid> {
    let bad = || Invalid(format!("{text:?} is not a Gateway API duration (e.g. 10s, 1m30s, 500ms)"));
    let (mut rest, mut total, mut parts) = (text, Duration::ZERO, 0);
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(bad());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else {
            match rest.as_bytes().first() {
                Some(b'h') => (Duration::from_secs(3600), 1),
                Some(b'm') => (Duration::from_secs(60), 1),
                Some(b's') => (Duration::from_secs(1), 1),
                _ => return Err(bad()),
            }
        };
        rest = &rest[len..];
        total += unit * u32::try_from(number).map_err(|_| bad())?;
        parts += 1;
    }
    if parts == 0 || parts > 4 {
        return Err(bad());
    }
    Ok((!total.is_zero()).then_some(total))
}
