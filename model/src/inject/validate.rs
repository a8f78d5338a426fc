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

/// An OTLP/gRPC collector address as the proxy reads `CNIMESH_PROXY_TRACE_COLLECTOR`:
/// `host:port`, `http://host:port` or `https://host:port` (host a DNS name, an IPv4 address or a
/// bracketed IPv6 address; no path, user or query). Returned trimmed.
pub fn check_trace_collector(value: &str) -> Result<String, String> {
    let expected = || {
        format!("{value:?} is not a collector address such as `otel-collector.tracing:4317` or `http://10.0.0.5:4317`")
    };
    let trimmed = value.trim();
    let rest = trimmed.strip_prefix("http://").or_else(|| trimmed.strip_prefix("https://")).unwrap_or(trimmed);
    if rest.contains("://") {
        return Err(format!("{} (the scheme must be http or https)", expected()));
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| format!("{} (no port)", expected()))?;
    if port.parse::<u16>().ok().filter(|p| *p != 0).is_none() {
        return Err(format!("{} (port {port:?} is not 1-65535)", expected()));
    }
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    };
    if !host_ok {
        return Err(format!("{} (host {host:?} is not a DNS name or an IP address)", expected()));
    }
    // The proxy's own parser has the last word: never inject what the proxy would refuse.
    trimmed.parse::<cnimesh_trace::Collector>().map_err(|e| e.to_string())?;
    Ok(trimmed.to_string())
}

/// A sampling ratio for `CNIMESH_PROXY_TRACE_SAMPLING`: a number from 0 to 1 (`0.05` samples one
/// untraced request in twenty). Returned trimmed.
pub fn check_trace_sampling(value: &str) -> Result<String, String> {
    let trimmed = value.trim();
    match trimmed.parse::<f64>() {
        Ok(ratio) if ratio.is_finite() && (0.0..=1.0).contains(&ratio) => {
            cnimesh_trace::export::parse_sampling("CNIMESH_PROXY_TRACE_SAMPLING", trimmed)
                .map_err(|e| e.to_string())?;
            Ok(trimmed.to_string())
        }
        _ => Err(format!("{value:?} is not a sampling ratio from 0 to 1, such as `0.05`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_collector_is_host_and_port_with_an_optional_http_or_https_scheme() {
        for good in [
            "otel-collector.cnimesh-tracing:4317",
            "http://otel-collector.cnimesh-tracing.svc.cluster.local:4317",
            "https://collector.example.com:443/",
            "10.0.0.5:4317",
            "http://[fd00::5]:4317",
            " collector:4317 ",
        ] {
            assert_eq!(check_trace_collector(good).unwrap(), good.trim(), "{good}");
        }
        for (bad, why) in [
            ("collector", "no port"),
            ("collector:0", "not 1-65535"),
            ("collector:http", "not 1-65535"),
            ("grpc://collector:4317", "scheme"),
            ("http://user@collector:4317", "host"),
            ("http://collector:4317/v1/traces", "not 1-65535"),
            ("collector:4317\nEVIL=1", "not 1-65535"),
            ("[fd00::zz]:4317", "host"),
            (":4317", "host"),
        ] {
            let error = check_trace_collector(bad).unwrap_err();
            assert!(error.contains(&format!("{bad:?}")) && error.contains(why), "{bad:?}: {error}");
        }
    }

    #[test]
    fn a_sampling_ratio_is_a_number_from_zero_to_one() {
        for good in ["0", "1", "0.05", "1.0", " 0.5 "] {
            assert_eq!(check_trace_sampling(good).unwrap(), good.trim());
        }
        for bad in ["", "-0.1", "1.5", "NaN", "inf", "5%", "half"] {
            assert!(check_trace_sampling(bad).unwrap_err().contains(&format!("{bad:?}")), "{bad:?}");
        }
    }
}
