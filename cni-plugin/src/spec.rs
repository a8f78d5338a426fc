//! The redirect spec: what a pod's capture must look like, independent of how it is programmed.
//!
//! It is the single input of the rule model (`rules`), stored in every attachment record, and what
//! the node agent will compute from pod annotations. Keeping it backend-neutral is what lets the
//! plugin, the agent's repair loop and the debug CLI agree on one encoding of the rules.

use std::fmt;
use std::str::FromStr;

use cnimesh_common::names::{
    DEFAULT_SKIP_INBOUND_PORTS, DEFAULT_SKIP_OUTBOUND_PORTS, PROXY_INBOUND_PORT, PROXY_OUTBOUND_PORT, PROXY_UID,
};
use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Upper bound on skipped ports and subnets together: one rule each, and the whole ruleset must
/// fit one netlink transaction (about 300 bytes a rule).
pub const MAX_SKIP_ENTRIES: usize = 400;

/// An inclusive TCP port range; a single port is `first == last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub const fn single(port: u16) -> Self {
        Self { first: port, last: port }
    }

    pub fn is_single(&self) -> bool {
        self.first == self.last
    }

    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_single() { write!(f, "{}", self.first) } else { write!(f, "{}-{}", self.first, self.last) }
    }
}

/// Why a port or range was refused; the message names the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid port {text:?}: {why}")]
pub struct PortError {
    pub text: String,
    pub why: &'static str,
}

fn parse_port(text: &str, whole: &str) -> Result<u16, PortError> {
    let bad = |why| PortError { text: whole.to_string(), why };
    let n: u32 = text.trim().parse().map_err(|_| bad("not a number or an \"a-b\" range"))?;
    match n {
        0 => Err(bad("port 0 cannot be skipped")),
        1..=65535 => Ok(n as u16),
        _ => Err(bad("ports go up to 65535")),
    }
}

impl FromStr for PortRange {
    type Err = PortError;

    fn from_str(s: &str) -> Result<Self, PortError> {
        let range = match s.split_once('-') {
            Some((a, b)) => Self { first: parse_port(a, s)?, last: parse_port(b, s)? },
            None => Self::single(parse_port(s, s)?),
        };
        if range.first > range.last {
            return Err(PortError { text: s.to_string(), why: "range start is above its end" });
        }
        Ok(range)
    }
}

impl Serialize for PortRange {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.is_single() { s.serialize_u16(self.first) } else { s.collect_str(self) }
    }
}

impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(i64),
            Text(String),
        }
        let text = match Raw::deserialize(d)? {
            Raw::Num(n) => n.to_string(),
            Raw::Text(t) => t,
        };
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Parses a list such as `"4190,4191,4567-4568"` (the annotation form).
pub fn parse_port_list(text: &str) -> Result<Vec<PortRange>, PortError> {
    text.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::parse).collect()
}

/// Everything that decides a pod's capture rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedirectSpec {
    pub inbound_proxy_port: u16,
    pub outbound_proxy_port: u16,
    #[serde(rename = "proxyUID")]
    pub proxy_uid: u32,
    #[serde(rename = "proxyGID", default, skip_serializing_if = "Option::is_none")]
    pub proxy_gid: Option<u32>,
    pub skip_inbound_ports: Vec<PortRange>,
    pub skip_outbound_ports: Vec<PortRange>,
    pub skip_inbound_subnets: Vec<IpNet>,
    pub skip_outbound_subnets: Vec<IpNet>,
}

impl Default for RedirectSpec {
    fn default() -> Self {
        let singles = |ports: &[u16]| ports.iter().copied().map(PortRange::single).collect();
        Self {
            inbound_proxy_port: PROXY_INBOUND_PORT,
            outbound_proxy_port: PROXY_OUTBOUND_PORT,
            proxy_uid: PROXY_UID,
            proxy_gid: None,
            skip_inbound_ports: singles(DEFAULT_SKIP_INBOUND_PORTS),
            skip_outbound_ports: singles(DEFAULT_SKIP_OUTBOUND_PORTS),
            skip_inbound_subnets: Vec::new(),
            skip_outbound_subnets: Vec::new(),
        }
    }
}

impl RedirectSpec {
    /// Checks invariants that serde alone cannot: a spec that fails here must never reach a netns.
    pub fn validate(&self) -> Result<(), String> {
        for (name, port) in
            [("inboundProxyPort", self.inbound_proxy_port), ("outboundProxyPort", self.outbound_proxy_port)]
        {
            if port == 0 {
                return Err(format!("{name} must be between 1 and 65535"));
            }
        }
        let entries = self.skip_inbound_ports.len()
            + self.skip_outbound_ports.len()
            + self.skip_inbound_subnets.len()
            + self.skip_outbound_subnets.len();
        if entries > MAX_SKIP_ENTRIES {
            return Err(format!(
                "{entries} skipped ports and subnets exceed the limit of {MAX_SKIP_ENTRIES}: use port ranges or wider subnets"
            ));
        }
        if self.inbound_proxy_port == self.outbound_proxy_port {
            return Err("inboundProxyPort and outboundProxyPort must differ".into());
        }
        // Skipping the proxy's own inbound port would send inbound traffic around the proxy to a
        // port nothing listens on; it is always a configuration mistake.
        if let Some(r) = self.skip_inbound_ports.iter().find(|r| r.contains(self.inbound_proxy_port)) {
            return Err(format!("skipInboundPorts entry {r} contains the inbound proxy port"));
        }
        Ok(())
    }

    /// Ports and subnets deduplicated and sorted, so equal intent always yields equal rules.
    pub fn normalized(mut self) -> Self {
        for list in [&mut self.skip_inbound_ports, &mut self.skip_outbound_ports] {
            list.sort();
            list.dedup();
        }
        for list in [&mut self.skip_inbound_subnets, &mut self.skip_outbound_subnets] {
            for net in list.iter_mut() {
                *net = net.trunc();
            }
            list.sort();
            list.dedup();
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_ranges_parse() {
        assert_eq!("443".parse::<PortRange>().unwrap(), PortRange::single(443));
        assert_eq!("4567-4568".parse::<PortRange>().unwrap(), PortRange { first: 4567, last: 4568 });
        assert_eq!(
            parse_port_list("4190, 4191,4567-4568,").unwrap(),
            vec![PortRange::single(4190), PortRange::single(4191), PortRange { first: 4567, last: 4568 }]
        );
    }

    #[test]
    fn bad_ports_are_named() {
        for (text, why) in [
            ("70000", "ports go up to 65535"),
            ("a-b", "not a number"),
            ("0", "port 0"),
            ("9-3", "range start"),
            ("", "not a number"),
        ] {
            let e = text.parse::<PortRange>().unwrap_err();
            assert!(e.why.contains(why), "{text}: {e}");
            assert!(e.to_string().contains(&format!("{text:?}")));
        }
    }

    #[test]
    fn json_accepts_numbers_and_ranges() {
        let v: Vec<PortRange> = serde_json::from_str(r#"[443, "1000-2000", "8080"]"#).unwrap();
        assert_eq!(serde_json::to_string(&v).unwrap(), r#"[443,"1000-2000",8080]"#);
        assert!(serde_json::from_str::<Vec<PortRange>>("[-1]").is_err());
        assert!(serde_json::from_str::<Vec<PortRange>>("[70000]").is_err());
    }

    #[test]
    fn validation_catches_self_skip() {
        let mut s = RedirectSpec::default();
        assert!(s.validate().is_ok());
        s.skip_inbound_ports.push("4000-5000".parse().unwrap());
        assert!(s.validate().unwrap_err().contains("4000-5000"));
    }

    #[test]
    fn normalization_sorts_and_truncates() {
        let s = RedirectSpec {
            skip_outbound_ports: vec![PortRange::single(6443), PortRange::single(443), PortRange::single(443)],
            skip_inbound_subnets: vec!["10.1.2.3/8".parse().unwrap()],
            ..Default::default()
        }
        .normalized();
        assert_eq!(s.skip_outbound_ports, vec![PortRange::single(443), PortRange::single(6443)]);
        assert_eq!(s.skip_inbound_subnets[0].to_string(), "10.0.0.0/8");
    }
}
