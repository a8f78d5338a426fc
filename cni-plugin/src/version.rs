//! CNI spec versions this plugin speaks.

pub const SUPPORTED: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
pub const LATEST: &str = "1.1.0";

/// The version a call asked for in its stdin object, if it is one we speak; else [`LATEST`].
/// Used where the configuration may be unparseable (VERSION, error objects).
pub fn requested(stdin: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion").and_then(|v| v.as_str()).map(str::to_string))
        .filter(|v| is_supported(v))
        .unwrap_or_else(|| LATEST.to_string())
}

/// A spec version as comparable numbers.
pub fn parse(version: &str) -> Option<(u32, u32, u32)> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let v = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(v)
}

pub fn is_supported(version: &str) -> bool {
    SUPPORTED.contains(&version)
}

/// Whether `version` is at least `min` (both well-formed).
pub fn at_least(version: &str, min: &str) -> bool {
    matches!((parse(version), parse(min)), (Some(v), Some(m)) if v >= m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering() {
        assert!(at_least("1.0.0", "0.4.0"));
        assert!(!at_least("0.3.1", "0.4.0"));
        assert!(at_least("1.1.0", "1.1.0"));
        assert_eq!(parse("1.0"), None);
        assert_eq!(parse("1.0.0.0"), None);
        assert!(!is_supported("0.2.0"));
    }
}
