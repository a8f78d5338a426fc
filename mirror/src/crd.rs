//! The `Link` custom resource (group `multicluster.cnimesh.io`, version `v1alpha1`), on the model
//! of Linkerd's `multicluster.linkerd.io` Link: cluster A holds one Link per cluster B it mirrors
//! from, made by `cnimesh multicluster link --cluster-name B` run against B (which prints the Link
//! and the Secret holding a kubeconfig limited to what the mirror reads).
//!
//! What the Link says is read once into a validated record by the mirror controller; a Link that
//! cannot be carried out (no such Secret, a gateway port of 0, …) is refused with its name and the
//! reason, and the mirrors made from its last good version stay.
//!
//! Layer: model (pure): serde + schemars types.

use std::time::Duration;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `apiVersion` of Link.
pub const API_VERSION: &str = "multicluster.cnimesh.io/v1alpha1";
pub const GROUP: &str = "multicluster.cnimesh.io";
pub const KIND: &str = "Link";

/// How often the mirror controller writes a followed Link's status, changes or not, so its
/// `lastHeartbeat` moves while the controller is alive and its watch of the target runs.
pub const HEARTBEAT_PERIOD: Duration = Duration::from_secs(10);
/// A `lastHeartbeat` older than this means the mirror controller stopped following the Link:
/// three missed heartbeats (`cnimesh multicluster check` fails it).
pub const HEARTBEAT_STALE_AFTER: Duration = Duration::from_secs(3 * HEARTBEAT_PERIOD.as_secs());

/// `Link`: how this cluster reaches a linked (target) cluster, and what it mirrors from there.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "multicluster.cnimesh.io", version = "v1alpha1", kind = "Link", namespaced)]
#[kube(status = "LinkStatus", category = "multicluster")]
#[kube(
    doc = "Link connects this cluster to a target cluster: the mirror controller watches the target's API server with the credentials in clusterCredentialsSecret and mirrors its exported Services here as <name>-<targetClusterName>, through the target's gateway or, for remote-discovery exports, straight to its pods."
)]
#[kube(
    printcolumn = r#"{"name": "Cluster", "type": "string", "description": "The target cluster's name", "jsonPath": ".spec.targetClusterName"}"#
)]
#[kube(
    printcolumn = r#"{"name": "Gateway", "type": "string", "description": "The target's gateway address", "jsonPath": ".spec.gatewayAddress"}"#
)]
#[kube(
    printcolumn = r#"{"name": "State", "type": "string", "description": "up or lost", "jsonPath": ".status.state"}"#
)]
#[kube(printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct LinkSpec {
    /// The target cluster's name: mirrors are named `<service>-<targetClusterName>`. A DNS label.
    pub target_cluster_name: String,
    /// The target cluster's DNS domain (`cluster.local` unless it was installed otherwise): the
    /// gateway routes by `<service>.<namespace>.svc.<targetClusterDomain>`.
    #[serde(default = "default_cluster_domain")]
    pub target_cluster_domain: String,
    /// The target cluster's trust domain: the identities of its workloads (remote discovery) end
    /// in `identity.cnimesh.<targetTrustDomain>`.
    pub target_trust_domain: String,
    /// The Secret, in the Link's namespace, whose `kubeconfig` key holds the credentials to read
    /// the target's Services, EndpointSlices and Pods.
    pub cluster_credentials_secret: String,
    /// The target's multicluster gateway (IP or DNS name). Absent: the target has no gateway and
    /// only `remote-discovery` exports are mirrored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_address: Option<String>,
    /// The gateway's mTLS port (the proxy's inbound port, 4143).
    #[serde(default = "default_gateway_port")]
    pub gateway_port: u16,
    /// The identity the gateway's certificate carries; clients verify it on every connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_identity: Option<String>,
    /// How the gateway's liveness is probed (plain HTTP on its admin port).
    #[serde(default)]
    pub probe: ProbeSpec,
}

/// A gateway's health probe: `GET http://<gatewayAddress>:<port><path>` every `period`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeSpec {
    #[serde(default = "default_probe_path")]
    pub path: String,
    #[serde(default = "default_probe_port")]
    pub port: u16,
    /// A duration such as `3s` or `1m`.
    #[serde(default = "default_probe_period")]
    pub period: String,
}

impl Default for ProbeSpec {
    fn default() -> Self {
        Self { path: default_probe_path(), port: default_probe_port(), period: default_probe_period() }
    }
}

/// What the mirror controller last saw of the link: written by it (the Link's status
/// subresource on a cluster; a file under the cluster directory's `.status/` with the files
/// backend), read by `cnimesh multicluster check` and `gateways`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkStatus {
    /// `up` while the target's API answers, `lost` once it stopped answering (the mirrors keep
    /// their last endpoints and are annotated [`cnimesh_common::names::MIRROR_LINK_STATE_ANNOTATION`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<LinkState>,
    /// Why the link is lost or refused, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// RFC 3339: when the target last changed as the mirror controller follows it (a resync or a
    /// watch event). An idle target keeps it old: liveness is `lastHeartbeat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<String>,
    /// RFC 3339: when the mirror controller last wrote this status while its watch of the target
    /// was running and up (every [`HEARTBEAT_PERIOD`]), changes or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<String>,
    /// The gateway probe's last result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayStatus>,
    /// Every mirror this link made.
    #[serde(default)]
    pub mirrors: Vec<MirrorStatus>,
    /// Mirror names this link's exports share with another claimant (another Link's export, a
    /// federated Service, a Service of this cluster): the holder keeps the mirror, every other
    /// claimant is refused it. `cnimesh multicluster check` fails while there is any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collisions: Vec<MirrorCollision>,
    /// Links whose cluster name is this Link's, or a `-`-suffix of it, or has it as one: their
    /// mirrors `<service>-<cluster>` could share names. Of each pair the Link created later is
    /// refused as a whole; the earlier keeps working but never mirrors a name ending in
    /// `-<the longer cluster name>`. `cnimesh multicluster check` fails while there is any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_name_conflicts: Vec<ClusterNameConflict>,
}

/// Another Link whose cluster name overlaps this Link's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNameConflict {
    /// The other Link's name.
    pub link: String,
    /// The other Link's target cluster name.
    pub cluster: String,
    /// Whether THIS Link is the one refused (it was created after the other).
    pub refused: bool,
}

/// A mirror name claimed by more than this Link's export.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MirrorCollision {
    /// `namespace/name` of the contested mirror in this cluster.
    pub mirror: String,
    /// `namespace/name` of this Link's Service in the target cluster.
    pub remote: String,
    /// Whether this Link holds the mirror (it had it first); otherwise its export is refused.
    pub holder: bool,
    /// The other claimants, in words.
    pub with: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    Up,
    Lost,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    pub alive: bool,
    /// The last successful probe's round trip, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    /// RFC 3339: the last probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MirrorStatus {
    /// `namespace/name` of the mirror Service in this cluster.
    pub mirror: String,
    /// `namespace/name` of the Service in the target cluster.
    pub remote: String,
    /// `gateway`, `remote-discovery` or `federated`.
    pub mode: String,
    /// How many endpoints the mirror holds.
    pub endpoints: usize,
    /// RFC 3339: when the mirror was last brought in line with the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<String>,
}

fn default_cluster_domain() -> String {
    "cluster.local".to_string()
}

fn default_gateway_port() -> u16 {
    cnimesh_common::names::PROXY_INBOUND_PORT
}

fn default_probe_path() -> String {
    "/ready".to_string()
}

fn default_probe_port() -> u16 {
    cnimesh_common::names::PROXY_ADMIN_PORT
}

fn default_probe_period() -> String {
    "3s".to_string()
}
