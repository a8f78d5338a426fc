//! The plugin's object from the conflist, as a runtime passes it on stdin.

use std::path::PathBuf;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use crate::agent::AgentConfig;
use crate::backend::BackendChoice;
use crate::error::{CniError, ErrorCode, Result};
use crate::spec::{PortRange, RedirectSpec};
use crate::version;

/// Namespaces whose pods are never captured unless the configuration lists others: the cluster's
/// own (`kube-system`), the control plane's (`cnimesh`) and the node agent's (`cnimesh-system`).
/// Their pods must start while the node agent is down (its own pod first of all), so ADD never
/// waits on the agent for them. The plugin's `excludeNamespaces` default, the agent's
/// `--exclude-namespaces` default and the entry the agent chains all come from this one list
/// (docs/architecture.md, "Names and numbers", in `cnimesh-common`), re-exported here where the plugin's configuration is read.
pub use cnimesh_common::names::DEFAULT_EXCLUDED_NAMESPACES;

/// One entry of `cni.dev/valid-attachments` (GC).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// Settings of the plugin object; every field is optional with the defaults of docs/architecture.md, "Names and numbers".
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginSettings {
    pub inbound_proxy_port: Option<u16>,
    pub outbound_proxy_port: Option<u16>,
    #[serde(rename = "proxyUID")]
    pub proxy_uid: Option<u32>,
    #[serde(rename = "proxyGID")]
    pub proxy_gid: Option<u32>,
    pub skip_inbound_ports: Option<Vec<PortRange>>,
    pub skip_outbound_ports: Option<Vec<PortRange>>,
    pub skip_inbound_subnets: Option<Vec<IpNet>>,
    pub skip_outbound_subnets: Option<Vec<IpNet>>,
    #[serde(default)]
    pub backend: BackendChoice,
    pub state_dir: Option<PathBuf>,
    pub exclude_namespaces: Option<Vec<String>>,
    pub log_level: Option<String>,
    pub log_file: Option<PathBuf>,
    /// Ask the node agent which pods to capture, and with which spec.
    pub node_agent: Option<AgentConfig>,
}

/// The whole stdin object.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    pub cni_version: String,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    #[serde(default)]
    pub prev_result: Option<Value>,
    #[serde(rename = "cni.dev/valid-attachments", default)]
    pub valid_attachments: Option<Vec<Attachment>>,
    #[serde(flatten)]
    pub settings: PluginSettings,
}

impl NetConf {
    /// Parses stdin. Malformed JSON is a decode error (6); an unsupported version is 1; a value
    /// of the wrong type or range is an invalid network config (7).
    pub fn parse(stdin: &[u8]) -> Result<Self> {
        let raw: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(ErrorCode::Decode, "network configuration is not valid JSON").with_details(e.to_string())
        })?;
        let Some(v) = raw.get("cniVersion").and_then(Value::as_str) else {
            return Err(CniError::new(ErrorCode::InvalidConfig, "network configuration has no cniVersion"));
        };
        if !version::is_supported(v) {
            return Err(CniError::new(
                ErrorCode::IncompatibleVersion,
                format!("cniVersion {v:?} is not supported; supported: {}", version::SUPPORTED.join(", ")),
            ));
        }
        // The redirect spec is validated where it is used (ADD): a later bad edit of the config
        // must not make DEL or GC of pods set up before it fail.
        serde_json::from_value(raw).map_err(|e| {
            CniError::new(ErrorCode::InvalidConfig, "invalid cnimesh-cni configuration").with_details(e.to_string())
        })
    }

    /// The redirect spec this configuration asks for, validated.
    pub fn spec(&self) -> Result<RedirectSpec> {
        let s = &self.settings;
        let d = RedirectSpec::default();
        let spec = RedirectSpec {
            inbound_proxy_port: s.inbound_proxy_port.unwrap_or(d.inbound_proxy_port),
            outbound_proxy_port: s.outbound_proxy_port.unwrap_or(d.outbound_proxy_port),
            proxy_uid: s.proxy_uid.unwrap_or(d.proxy_uid),
            proxy_gid: s.proxy_gid,
            skip_inbound_ports: s.skip_inbound_ports.clone().unwrap_or(d.skip_inbound_ports),
            skip_outbound_ports: s.skip_outbound_ports.clone().unwrap_or(d.skip_outbound_ports),
            skip_inbound_subnets: s.skip_inbound_subnets.clone().unwrap_or_default(),
            skip_outbound_subnets: s.skip_outbound_subnets.clone().unwrap_or_default(),
        }
        .normalized();
        spec.validate()
            .map_err(|e| CniError::new(ErrorCode::InvalidConfig, format!("invalid cnimesh-cni configuration: {e}")))?;
        Ok(spec)
    }

    pub fn state_dir(&self) -> PathBuf {
        self.settings.state_dir.clone().unwrap_or_else(|| PathBuf::from(cnimesh_common::names::STATE_DIR))
    }

    /// Whether pods of `namespace` are left alone (default: [`DEFAULT_EXCLUDED_NAMESPACES`]; a
    /// configured list replaces the default, so it can opt `kube-system` in).
    pub fn excludes(&self, namespace: Option<&str>) -> bool {
        let Some(ns) = namespace else { return false };
        match &self.settings.exclude_namespaces {
            Some(list) => list.iter().any(|n| n == ns),
            None => DEFAULT_EXCLUDED_NAMESPACES.contains(&ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parsing as ADD does it: the configuration and its spec.
    fn parse(json: &str) -> Result<NetConf> {
        let conf = NetConf::parse(json.as_bytes())?;
        conf.spec()?;
        Ok(conf)
    }

    #[test]
    fn defaults_apply() {
        let c = parse(r#"{"cniVersion":"1.0.0","name":"net","type":"cnimesh-cni"}"#).unwrap();
        assert_eq!(c.spec().unwrap(), RedirectSpec::default());
        assert_eq!(c.settings.backend, BackendChoice::Nftables);
        for ns in ["kube-system", "cnimesh", "cnimesh-system"] {
            assert!(c.excludes(Some(ns)), "{ns} is excluded by default");
        }
        assert!(!c.excludes(Some("default")));
        assert!(!c.excludes(None));
        assert_eq!(c.state_dir(), PathBuf::from("/var/lib/cnimesh"));
    }

    #[test]
    fn all_settings_parse() {
        let c = parse(
            r#"{"cniVersion":"0.4.0","name":"net","type":"cnimesh-cni","inboundProxyPort":5143,
            "outboundProxyPort":5140,"proxyUID":1337,"proxyGID":1338,"skipInboundPorts":[22,"8000-8100"],
            "skipOutboundPorts":["25"],"skipInboundSubnets":["10.0.0.0/8"],"skipOutboundSubnets":["fd00::/8"],
            "backend":"iptables-legacy","stateDir":"/tmp/x","excludeNamespaces":["a"],"logLevel":"debug",
            "logFile":"/tmp/log","somethingElse":{"ignored":true}}"#,
        )
        .unwrap();
        let s = c.spec().unwrap();
        assert_eq!(
            (s.inbound_proxy_port, s.outbound_proxy_port, s.proxy_uid, s.proxy_gid),
            (5143, 5140, 1337, Some(1338))
        );
        assert_eq!(s.skip_inbound_ports[1], PortRange { first: 8000, last: 8100 });
        assert_eq!(c.settings.backend, BackendChoice::IptablesLegacy);
        assert!(c.excludes(Some("a")) && !c.excludes(Some("kube-system")));
    }

    #[test]
    fn bad_input_gets_the_right_code() {
        for (json, code, needle) in [
            ("{not json", ErrorCode::Decode, "not valid JSON"),
            (r#"{"name":"x"}"#, ErrorCode::InvalidConfig, "no cniVersion"),
            (r#"{"cniVersion":"0.2.0"}"#, ErrorCode::IncompatibleVersion, "0.2.0"),
            (r#"{"cniVersion":"9.9.9"}"#, ErrorCode::IncompatibleVersion, "supported"),
            (r#"{"cniVersion":"1.0.0","skipInboundPorts":[70000]}"#, ErrorCode::InvalidConfig, "70000"),
            (r#"{"cniVersion":"1.0.0","skipOutboundPorts":["a-b"]}"#, ErrorCode::InvalidConfig, "a-b"),
            (r#"{"cniVersion":"1.0.0","inboundProxyPort":70000}"#, ErrorCode::InvalidConfig, "70000"),
            (r#"{"cniVersion":"1.0.0","skipInboundSubnets":["10.0.0.0/33"]}"#, ErrorCode::InvalidConfig, "invalid"),
            (r#"{"cniVersion":"1.0.0","backend":"ebpf"}"#, ErrorCode::InvalidConfig, "ebpf"),
            (r#"{"cniVersion":"1.0.0","inboundProxyPort":4140}"#, ErrorCode::InvalidConfig, "must differ"),
        ] {
            let e = parse(json).unwrap_err();
            assert_eq!(e.code, code, "{json}: {e}");
            assert!(e.to_string().contains(needle), "{json}: {e}");
        }
    }
}
