//! A route's hostnames (and a filter's): lowercase DNS names or `*.<name>` suffixes.

use super::checks::invalid;
use crate::meta::Invalid;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    Exact(String),
    /// `*.example.com`: any name ending in `.example.com`.
    Suffix(String),
}

pub fn hostnames(names: &[String]) -> Result<Vec<HostMatch>, Invalid> {
    names
        .iter()
        .map(|name| {
            let (suffix, host) = match name.strip_prefix("*.") {
                Some(rest) => (true, rest),
                None => (false, name.as_str()),
            };
            let valid = !host.is_empty()
                && host.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                });
            if !valid {
                return invalid(format!("hostname {name:?} is not a lowercase DNS name or *.<name>"));
            }
            Ok(if suffix { HostMatch::Suffix(host.to_string()) } else { HostMatch::Exact(host.to_string()) })
        })
        .collect()
}
