//! A Link read once into what the mirror controller can carry out: every field checked, with the
//! reason named when it cannot. A Link that fails here is refused as a whole (its mirrors stay as
//! they were); a gateway that is only half described (no address or no identity) skips the
//! gateway exports of that Link, and its remote-discovery exports still work.
//!
//! Layer: model (pure).

use std::net::IpAddr;
use std::time::Duration;

use super::crd::Link;

/// A Link the controller can carry out.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidLink {
    /// The Link object's own name (`cnimesh/<name>`): where its status goes.
    pub name: String,
    /// The target cluster's name: a DNS label, the suffix of its mirrors' names.
    pub cluster: String,
    pub cluster_domain: String,
    pub trust_domain: String,
    /// The Secret (in the Link's namespace) holding the kubeconfig for the target.
    pub credentials_secret: String,
    /// The gateway, or why gateway exports of this Link are skipped.
    pub gateway: Result<Gateway, String>,
    pub probe: Probe,
}

/// The target's multicluster gateway, as the Link names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    /// An IP or a DNS name (resolved by the controller).
    pub address: String,
    pub port: u16,
    pub identity: String,
}

impl Gateway {
    /// The address when it is an IP already (no resolution needed).
    pub fn ip(&self) -> Option<IpAddr> {
        self.address.parse().ok()
    }
}

/// How the gateway is probed: `GET http://<address>:<port><path>` every `period`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub path: String,
    pub port: u16,
    pub period: Duration,
}

/// Why a Link is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("targetClusterName {0:?} is not a DNS label (lower-case letters, digits and '-', at most 63)")]
    ClusterName(String),
    #[error("gatewayPort must not be 0")]
    GatewayPort,
    #[error("probe.port must not be 0")]
    ProbePort,
    #[error("probe.period {0:?}: {1}")]
    ProbePeriod(String, String),
    #[error("probe.path {0:?} must start with '/'")]
    ProbePath(String),
    #[error("targetTrustDomain must not be empty")]
    TrustDomain,
    #[error("targetClusterDomain must not be empty")]
    ClusterDomain,
    #[error("clusterCredentialsSecret must not be empty")]
    CredentialsSecret,
}

/// Whether `s` is a DNS label (RFC 1123), as Kubernetes checks names.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl ValidLink {
    /// Stands for a refused Link in the planner (whose mirrors stay as they are): its cluster
    /// name is all that is needed.
    pub fn refused(name: &str, cluster: &str) -> Self {
        Self {
            name: name.to_string(),
            cluster: cluster.to_string(),
            cluster_domain: String::new(),
            trust_domain: String::new(),
            credentials_secret: String::new(),
            gateway: Err("the Link is refused".into()),
            probe: Probe { path: "/".into(), port: 1, period: Duration::from_secs(3) },
        }
    }

    pub fn from_link(link: &Link) -> Result<Self, LinkError> {
        let spec = &link.spec;
        if !is_dns_label(&spec.target_cluster_name) {
            return Err(LinkError::ClusterName(spec.target_cluster_name.clone()));
        }
        if spec.gateway_port == 0 {
            return Err(LinkError::GatewayPort);
        }
        if spec.probe.port == 0 {
            return Err(LinkError::ProbePort);
        }
        if !spec.probe.path.starts_with('/') {
            return Err(LinkError::ProbePath(spec.probe.path.clone()));
        }
        let period = humantime::parse_duration(spec.probe.period.trim())
            .map_err(|e| LinkError::ProbePeriod(spec.probe.period.clone(), e.to_string()))?;
        if period.is_zero() {
            return Err(LinkError::ProbePeriod(spec.probe.period.clone(), "must be positive".into()));
        }
        if spec.target_trust_domain.trim().is_empty() {
            return Err(LinkError::TrustDomain);
        }
        if spec.target_cluster_domain.trim().is_empty() {
            return Err(LinkError::ClusterDomain);
        }
        if spec.cluster_credentials_secret.trim().is_empty() {
            return Err(LinkError::CredentialsSecret);
        }
        let address = spec.gateway_address.as_deref().map(str::trim).filter(|a| !a.is_empty());
        let identity = spec.gateway_identity.as_deref().map(str::trim).filter(|i| !i.is_empty());
        let gateway = match (address, identity) {
            (Some(address), Some(identity)) => {
                Ok(Gateway { address: address.to_string(), port: spec.gateway_port, identity: identity.to_string() })
            }
            (None, _) => Err("the Link has no gatewayAddress".to_string()),
            (Some(_), None) => Err("the Link has a gatewayAddress but no gatewayIdentity".to_string()),
        };
        Ok(Self {
            name: link.metadata.name.clone().unwrap_or_else(|| spec.target_cluster_name.clone()),
            cluster: spec.target_cluster_name.clone(),
            cluster_domain: spec.target_cluster_domain.clone(),
            trust_domain: spec.target_trust_domain.clone(),
            credentials_secret: spec.cluster_credentials_secret.clone(),
            gateway,
            probe: Probe { path: spec.probe.path.clone(), port: spec.probe.port, period },
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::crd::{LinkSpec, ProbeSpec};

    pub(crate) fn link(cluster: &str) -> Link {
        let mut link = Link::new(
            cluster,
            LinkSpec {
                target_cluster_name: cluster.into(),
                target_cluster_domain: "cluster.local".into(),
                target_trust_domain: format!("{cluster}.local"),
                cluster_credentials_secret: format!("cluster-credentials-{cluster}"),
                gateway_address: Some("192.0.2.10".into()),
                gateway_port: 4143,
                gateway_identity: Some(format!(
                    "cnimesh-gateway.cnimesh-multicluster.serviceaccount.identity.cnimesh.{cluster}.local"
                )),
                probe: ProbeSpec::default(),
            },
        );
        link.metadata.namespace = Some("cnimesh".into());
        link
    }

    #[test]
    fn a_complete_link_is_valid_with_its_gateway_and_probe() {
        let valid = ValidLink::from_link(&link("west")).unwrap();
        assert_eq!(valid.cluster, "west");
        assert_eq!(valid.gateway.as_ref().unwrap().ip(), Some("192.0.2.10".parse().unwrap()));
        assert_eq!(valid.probe, Probe { path: "/ready".into(), port: 4191, period: Duration::from_secs(3) });
    }

    #[test]
    fn a_cluster_name_that_is_not_a_dns_label_is_refused_by_name() {
        for bad in ["West", "-west", "west-", "", "we_st", &"a".repeat(64)] {
            let mut l = link("west");
            l.spec.target_cluster_name = bad.to_string();
            let error = ValidLink::from_link(&l).unwrap_err();
            assert_eq!(error, LinkError::ClusterName(bad.to_string()));
            assert!(error.to_string().contains(&format!("{bad:?}")));
        }
    }

    #[test]
    fn a_gateway_port_of_zero_and_a_bad_probe_period_are_refused() {
        let mut l = link("west");
        l.spec.gateway_port = 0;
        assert_eq!(ValidLink::from_link(&l).unwrap_err(), LinkError::GatewayPort);
        let mut l = link("west");
        l.spec.probe.period = "soon".into();
        let error = ValidLink::from_link(&l).unwrap_err();
        assert!(matches!(&error, LinkError::ProbePeriod(p, _) if p == "soon"), "{error}");
        l.spec.probe.period = "0s".into();
        assert!(ValidLink::from_link(&l).is_err());
    }

    #[test]
    fn a_gateway_without_its_identity_skips_gateway_exports_but_keeps_the_link() {
        let mut l = link("west");
        l.spec.gateway_identity = None;
        let valid = ValidLink::from_link(&l).unwrap();
        assert!(valid.gateway.unwrap_err().contains("no gatewayIdentity"));
        l.spec.gateway_address = None;
        assert!(ValidLink::from_link(&l).unwrap().gateway.unwrap_err().contains("no gatewayAddress"));
    }
}
