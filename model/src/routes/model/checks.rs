//! The small validations every route kind shares: ports, regular expressions, header names,
//! absolute paths, and the error they all return.

use crate::meta::Invalid;

pub(super) fn invalid<T>(reason: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid(reason.into()))
}

pub(super) fn port(value: i32, what: &str) -> Result<u16, Invalid> {
    u16::try_from(value).ok().filter(|p| *p > 0).ok_or_else(|| Invalid(format!("{what} {value} is not 1-65535")))
}

pub(super) fn absolute_path(value: String) -> Result<String, Invalid> {
    if value.starts_with('/') { Ok(value) } else { invalid(format!("path {value:?} does not start with /")) }
}

pub(super) fn regex(value: String, what: &str) -> Result<String, Invalid> {
    match regex::Regex::new(&value) {
        Ok(_) => Ok(value),
        Err(e) => invalid(format!("{what} regular expression {value:?}: {e}")),
    }
}

pub(super) fn header_name(name: &str) -> Result<String, Invalid> {
    http::HeaderName::from_bytes(name.as_bytes())
        .map(|n| n.as_str().to_string())
        .map_err(|_| Invalid(format!("{name:?} is not an HTTP header name")))
}
