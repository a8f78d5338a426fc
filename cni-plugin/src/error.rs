//! CNI errors: every failure leaves the plugin as the JSON object of the CNI spec, with the code a
//! runtime (and the operator reading its logs) can act on.

use serde::Serialize;

/// Error codes of the CNI spec (§ "Error"); values ≥ 100 are ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorCode {
    IncompatibleVersion = 1,
    UnsupportedField = 2,
    ContainerUnknown = 3,
    InvalidEnv = 4,
    Io = 5,
    Decode = 6,
    InvalidConfig = 7,
    TryAgainLater = 11,
    StatusNotAvailable = 50,
    /// The redirect rules could not be programmed in the pod's netns.
    RulesFailed = 100,
    /// CHECK found the live rules differ from the desired ones.
    RulesDrifted = 101,
}

/// A failure the plugin reports to the runtime.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{msg}{}", details.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
pub struct CniError {
    pub code: ErrorCode,
    pub msg: String,
    pub details: Option<String>,
}

impl CniError {
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        Self { code, msg: msg.into(), details: None }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = Some(details.into());
        self
    }

    /// The spec's error object, as printed on stdout.
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            details: Option<&'a str>,
        }
        serde_json::to_string(&Wire {
            cni_version,
            code: self.code as u32,
            msg: &self.msg,
            details: self.details.as_deref(),
        })
        .expect("error object always serialises")
    }
}

pub type Result<T, E = CniError> = std::result::Result<T, E>;

/// Shorthand for the common "wrap a lower-level error" case.
pub fn err(code: ErrorCode, msg: impl Into<String>, cause: impl std::fmt::Display) -> CniError {
    CniError::new(code, msg).with_details(cause.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_spec_fields() {
        let e = CniError::new(ErrorCode::InvalidConfig, "bad port").with_details("70000");
        let v: serde_json::Value = serde_json::from_str(&e.to_json("1.0.0")).unwrap();
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["code"], 7);
        assert_eq!(v["msg"], "bad port");
        assert_eq!(v["details"], "70000");
        let bare = CniError::new(ErrorCode::Io, "x").to_json("0.4.0");
        assert!(!bare.contains("details"));
    }
}
