//! The CNI_* environment a runtime sets for each call.

use std::collections::BTreeMap;

use crate::error::{CniError, ErrorCode, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

/// The call's environment, validated for the command it carries.
#[derive(Debug, Clone, Default)]
pub struct CniEnv {
    pub container_id: String,
    /// Empty when the runtime has no netns any more (second DEL).
    pub netns: String,
    pub ifname: String,
    /// `CNI_ARGS` as key/value pairs (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, …).
    pub args: BTreeMap<String, String>,
}

impl CniEnv {
    pub fn pod_namespace(&self) -> Option<&str> {
        self.args.get("K8S_POD_NAMESPACE").map(String::as_str)
    }
    pub fn pod_name(&self) -> Option<&str> {
        self.args.get("K8S_POD_NAME").map(String::as_str)
    }
    pub fn pod_uid(&self) -> Option<&str> {
        self.args.get("K8S_POD_UID").map(String::as_str)
    }
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::InvalidEnv, msg)
}

pub fn parse_command(value: Option<&str>) -> Result<Command> {
    match value {
        Some("ADD") => Ok(Command::Add),
        Some("DEL") => Ok(Command::Del),
        Some("CHECK") => Ok(Command::Check),
        Some("GC") => Ok(Command::Gc),
        Some("STATUS") => Ok(Command::Status),
        Some("VERSION") => Ok(Command::Version),
        Some(other) => Err(invalid(format!("unknown CNI_COMMAND {other:?}"))),
        None => Err(invalid("CNI_COMMAND is not set: this binary is a CNI plugin, run by a container runtime")),
    }
}

/// `K=V;K=V`; unknown keys are kept (and ignored by the caller), empty segments skipped.
pub fn parse_args(raw: &str) -> Result<BTreeMap<String, String>> {
    raw.split(';')
        .filter(|s| !s.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(invalid(format!("CNI_ARGS entry {pair:?} is not KEY=VALUE"))),
        })
        .collect()
}

/// Reads the variables the command needs from `get` (the process environment in production).
pub fn from_vars(command: Command, get: impl Fn(&str) -> Option<String>) -> Result<CniEnv> {
    let required = |name: &str| {
        get(name).filter(|v| !v.is_empty()).ok_or_else(|| invalid(format!("{name} is required for this command")))
    };
    let attachment = matches!(command, Command::Add | Command::Del | Command::Check);
    let mut env = CniEnv::default();
    if attachment {
        env.container_id = required("CNI_CONTAINERID")?;
        env.ifname = required("CNI_IFNAME")?;
        env.netns = match command {
            Command::Del => get("CNI_NETNS").unwrap_or_default(),
            _ => required("CNI_NETNS")?,
        };
    }
    env.args = parse_args(&get("CNI_ARGS").unwrap_or_default())?;
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn containerd_and_podman_args() {
        let a = parse_args(
            "K8S_POD_UID=u-1;IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=abc",
        )
        .unwrap();
        assert_eq!(a["K8S_POD_NAMESPACE"], "ns");
        assert_eq!(a["K8S_POD_INFRA_CONTAINER_ID"], "abc");
        assert_eq!(parse_args("IgnoreUnknown=1;K8S_POD_NAME=x").unwrap()["K8S_POD_NAME"], "x");
        assert!(parse_args("").unwrap().is_empty());
        assert!(parse_args("novalue").unwrap_err().msg.contains("novalue"));
    }

    #[test]
    fn netns_required_for_add_not_for_del() {
        let base = [("CNI_CONTAINERID", "c1"), ("CNI_IFNAME", "eth0")];
        let e = from_vars(Command::Add, vars(&base)).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidEnv);
        assert!(e.msg.contains("CNI_NETNS"));
        assert_eq!(from_vars(Command::Del, vars(&base)).unwrap().netns, "");
        assert!(from_vars(Command::Gc, vars(&[])).is_ok());
        assert_eq!(parse_command(Some("BOGUS")).unwrap_err().code, ErrorCode::InvalidEnv);
    }
}
