//! The `EgressNetwork` custom resource (group `policy.cnimesh.io`, version `v1alpha1`), with the
//! shape and semantics of Linkerd 2.18's `policy.linkerd.io` EgressNetwork: a set of networks
//! outside the cluster (`networks`, by default everything outside the cluster networks) and what
//! happens to traffic no route attached to it describes (`trafficPolicy`: `Allow` or `Deny`).
//!
//! The schema (derived with `schemars`, checked into `daemonset/control-policy-crds.yaml` with
//! the policy CRDs) rejects what a schema can: a missing or unknown `trafficPolicy`. A CIDR that
//! does not parse, or an `except` outside its `cidr`, is refused when the object is read into
//! the model ([`super::model`]), logged with its name, and the last good version stays.
//!
//! Layer: model/index (pure): serde + schemars types.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `apiVersion` of EgressNetwork (the policy resources' group and version).
pub const API_VERSION: &str = "policy.cnimesh.io/v1alpha1";
/// The kind and group, as route parentRefs and policy metadata name them.
pub use crate::routes::model::{EGRESS_NETWORK_GROUP as GROUP, EGRESS_NETWORK_KIND as KIND};

/// `EgressNetwork`: destinations outside the cluster, and the policy for their traffic.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "policy.cnimesh.io", version = "v1alpha1", kind = "EgressNetwork", namespaced)]
#[kube(shortname = "egressnet", category = "policy")]
#[kube(
    doc = "EgressNetwork describes destinations outside the cluster (networks; by default everything outside the cluster networks) for the meshed clients of its namespace, or of every namespace when it lives in the control plane's namespace. Traffic no attached route (HTTPRoute, GRPCRoute, TLSRoute, TCPRoute with the EgressNetwork as parentRef) describes is allowed or denied by trafficPolicy."
)]
#[kube(
    printcolumn = r#"{"name": "Policy", "type": "string", "description": "What happens to traffic no route describes", "jsonPath": ".spec.trafficPolicy"}"#
)]
#[kube(
    printcolumn = r#"{"name": "Networks", "type": "string", "description": "The networks it covers (empty: everything outside the cluster networks)", "jsonPath": ".spec.networks[*].cidr"}"#
)]
#[kube(printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct EgressNetworkSpec {
    /// The destination networks. Empty or absent: every address outside the control plane's
    /// cluster networks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<Vec<EgressNet>>,
    /// What happens to traffic no attached route describes: `Allow` forwards it to its original
    /// destination, `Deny` refuses it (HTTP 403, TLS and TCP connections closed).
    pub traffic_policy: TrafficPolicy,
}

/// A CIDR (`203.0.113.0/24`, `2001:db8::/32`; a bare address is one host) minus `except`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct EgressNet {
    /// The network, IPv4 or IPv6, in CIDR notation; a bare address is one host.
    pub cidr: String,
    /// Networks inside `cidr` that are not part of this EgressNetwork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub except: Option<Vec<String>>,
}

/// `Allow` or `Deny`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TrafficPolicy {
    /// Traffic no route describes goes to its original destination.
    Allow,
    /// Traffic no route describes is refused.
    Deny,
}
