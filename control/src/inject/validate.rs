//! Validation of the values a pod annotation or a `serve` flag hands to the proxy. Its own module
//! because both the webhook's mutation (annotations) and the configuration (flags, checked at
//! start) use it, and neither should depend on the other for it. Pure layer: no I/O.

/// A comma-separated list of ports 1..=65535, normalised to `a,b,c` (what the proxy parses).
pub fn check_ports(value: &str) -> Result<String, String> {
    let ports: Vec<u16> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| format!("{s:?} is not a port (1-65535)")))
        .collect::<Result<_, _>>()?;
    if ports.is_empty() {
        return Err(format!("{value:?} names no port"));
    }
    Ok(ports.iter().map(u16::to_string).collect::<Vec<_>>().join(","))
}

/// A tracing filter (`info`, `warn,cnimesh_proxy=debug`): only the characters such filters use,
/// so a pod annotation cannot smuggle anything odd into the proxy's environment.
pub fn check_log_level(value: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_-:=,.[]{}\"".contains(c);
    if value.is_empty() || value.len() > 256 || !value.chars().all(allowed) {
        return Err(format!("{value:?} is not a log filter such as `info` or `warn,cnimesh_proxy=debug`"));
    }
    Ok(())
}
