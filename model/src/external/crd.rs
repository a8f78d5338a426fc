//! The `ExternalWorkload` custom resource (group `workload.cnimesh.io`, version `v1alpha1`,
//! namespaced), as Linkerd's `workload.linkerd.io` ExternalWorkload: a workload outside
//! Kubernetes (a database on a VM, a service on bare metal) that runs a proxy and that Services
//! select by its labels like a pod. Its addresses (`workloadIPs`), named ports (`ports`) and the
//! one identity it may hold (`serviceAccountName`: the usual service-account identity of the
//! ExternalWorkload's namespace, so Servers and AuthorizationPolicies name it as they name pods).
//!
//! The schema (derived with `schemars`, checked into `daemonset/control-workload-crds.yaml`)
//! rejects what a schema can (missing fields, ports out of range); what it cannot (an address
//! that does not parse, a reserved service account) is refused when the object is read into the
//! model ([`super::ExternalRecord::from_crd`]), logged with its name, and the last good version
//! stays.
//!
//! Layer: model (pure): serde + schemars types.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of ExternalWorkloads.
pub const GROUP: &str = "workload.cnimesh.io";
/// `apiVersion` of ExternalWorkload.
pub const API_VERSION: &str = "workload.cnimesh.io/v1alpha1";
/// The resource kind, as `cnimesh stat`, tap and the policy API name it (lower case, no
/// separator: `externalworkload/NAME`).
pub const RESOURCE_KIND: &str = "externalworkload";

/// `ExternalWorkload`: a meshed workload outside Kubernetes, selected by Services like a pod.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "workload.cnimesh.io", version = "v1alpha1", kind = "ExternalWorkload", namespaced)]
#[kube(shortname = "ew", category = "cnimesh")]
#[kube(
    doc = "ExternalWorkload is a meshed workload outside Kubernetes (a VM, a bare-metal host) running a cnimesh proxy. Services whose selector matches its labels get its workloadIPs as endpoints, proven by the identity of serviceAccountName in its namespace; Servers whose podSelector matches its labels apply to its proxy. The host gets its first certificate with a one-time join token (`cnimesh external-workload join`) and renews with that certificate while the ExternalWorkload exists and is not revoked."
)]
#[kube(
    printcolumn = r#"{"name": "IPs", "type": "string", "description": "The workload's addresses", "jsonPath": ".spec.workloadIPs[*]"}"#
)]
#[kube(
    printcolumn = r#"{"name": "Identity", "type": "string", "description": "The service account whose identity it holds", "jsonPath": ".spec.serviceAccountName"}"#
)]
#[kube(
    printcolumn = r#"{"name": "Revoked", "type": "boolean", "description": "Whether its certificate may no longer be renewed", "jsonPath": ".spec.revoked"}"#
)]
#[kube(printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct ExternalWorkloadSpec {
    /// The workload's addresses (IPv4 or IPv6, at least one): the endpoints of the Services that
    /// select it, and the addresses GetProfile answers for with its identity.
    #[serde(rename = "workloadIPs")]
    #[schemars(length(min = 1, max = 16))]
    pub workload_ips: Vec<String>,
    /// The ports it serves, by name (what a Service's or a Server's named targetPort resolves to).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub ports: Vec<ExternalPort>,
    /// The ServiceAccount (of the ExternalWorkload's namespace) whose identity the workload holds:
    /// `<serviceAccountName>.<namespace>.serviceaccount.identity.<trust domain>`. Use a service
    /// account of its own: any proxy holding that identity can renew it while the
    /// ExternalWorkload exists.
    pub service_account_name: String,
    /// `true` stops the workload's certificate from being renewed and its pending join token
    /// from being used (deleting the ExternalWorkload does the same).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoked: bool,
}

/// A named port of the workload.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ExternalPort {
    /// The port's name, as Services' and Servers' named ports refer to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The port number (1-65535).
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// `TCP` (the default; the mesh carries nothing else).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}
