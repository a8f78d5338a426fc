//! The policy custom resources, group `policy.cnimesh.io`, version `v1alpha1` (docs/architecture.md, "Names and numbers"), with
//! the semantics Linkerd users know from `policy.linkerd.io`: a [`Server`] names a port of the
//! pods a selector picks, an [`AuthorizationPolicy`] lets clients reach a Server (or every Server
//! of a Namespace) when all of its required authentications hold, a [`MeshTlsAuthentication`]
//! names client identities, a [`NetworkAuthentication`] client networks.
//!
//! The OpenAPI schemas (derived with `schemars`, checked into `daemonset/control-policy-crds.yaml`
//! and compared with these types by `control/tests/policy_crds.rs`) reject what a schema can:
//! unknown protocols and operators, port numbers out of range, port names that are not
//! IANA_SVC_NAMEs, identities with characters no identity has, target kinds we do not serve.
//! What a schema cannot express (a CIDR, a selector that selects nothing, a reference to a kind it
//! cannot name) is checked when the object is read into the model ([`super::model`]), and such an
//! object is logged with its name and reason and ignored.
//!
//! Layer: model/index (pure): serde + schemars types; the kube derive generates the `kube::Resource`
//! glue only, no client.

use std::borrow::Cow;
use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// The API group of the policy resources.
pub const GROUP: &str = "policy.cnimesh.io";
/// `apiVersion` of every policy resource.
pub const API_VERSION: &str = "policy.cnimesh.io/v1alpha1";

/// `Server`: a port (number or container port name) on the pods `podSelector` selects in the
/// Server's namespace, and how its traffic is proxied. Ports no Server names get the default
/// policy; a port a Server names gets only what AuthorizationPolicies allow (none: denied).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "policy.cnimesh.io", version = "v1alpha1", kind = "Server", namespaced)]
#[kube(shortname = "srv", category = "policy")]
#[serde(rename_all = "camelCase")]
pub struct ServerSpec {
    pub pod_selector: LabelSelector,
    pub port: Port,
    /// How connections on the port are proxied; `unknown` detects HTTP.
    #[serde(default)]
    pub proxy_protocol: ProxyProtocol,
}

/// A Kubernetes label selector. Both parts empty selects every pod of the namespace, as in
/// Linkerd and Kubernetes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    /// Required (non-empty) for `In` and `NotIn`, forbidden for `Exists` and `DoesNotExist`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<String>>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// A port number (1–65535) or a container port name (an IANA_SVC_NAME), like a Service's
/// `targetPort`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(untagged)]
pub enum Port {
    Number(u16),
    Name(String),
}

impl JsonSchema for Port {
    fn schema_name() -> Cow<'static, str> {
        "Port".into()
    }

    fn inline_schema() -> bool {
        true
    }

    /// `x-kubernetes-int-or-string` is the structural-schema form of an int-or-string; the
    /// `anyOf` branches still validate each form.
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "x-kubernetes-int-or-string": true,
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": 65535},
                {"type": "string", "maxLength": 15, "pattern": PORT_NAME_PATTERN}
            ]
        })
    }
}

/// IANA_SVC_NAME as Kubernetes checks container port names: lowercase letters, digits and
/// inner dashes, at least one letter, at most 15 characters.
const PORT_NAME_PATTERN: &str = "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$";

/// Linkerd's `proxyProtocol` values.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ProxyProtocol {
    #[default]
    #[serde(rename = "unknown")]
    Unknown,
    #[serde(rename = "HTTP/1")]
    Http1,
    #[serde(rename = "HTTP/2")]
    Http2,
    #[serde(rename = "gRPC")]
    Grpc,
    #[serde(rename = "opaque")]
    Opaque,
    #[serde(rename = "TLS")]
    Tls,
}

/// `AuthorizationPolicy`: clients may reach the target when every required authentication
/// holds (at most one identity-based and one network-based; none means anyone).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "policy.cnimesh.io", version = "v1alpha1", kind = "AuthorizationPolicy", namespaced)]
#[kube(shortname = "authzpolicy", category = "policy")]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationPolicySpec {
    pub target_ref: TargetRef,
    #[serde(default)]
    pub required_authentication_refs: Vec<AuthenticationRef>,
}

/// What an AuthorizationPolicy applies to, in its own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct TargetRef {
    /// `policy.cnimesh.io` for Server, `""` (core) for Namespace, `gateway.networking.k8s.io` or
    /// `policy.cnimesh.io` for HTTPRoute.
    #[serde(default)]
    pub group: String,
    pub kind: TargetKind,
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TargetKind {
    Server,
    Namespace,
    #[serde(rename = "HTTPRoute")]
    HttpRoute,
}

/// A required authentication: a MeshTLSAuthentication or NetworkAuthentication (group
/// `policy.cnimesh.io`), or a ServiceAccount (core), by name; in the policy's namespace unless
/// `namespace` says otherwise.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct AuthenticationRef {
    #[serde(default)]
    pub group: String,
    pub kind: AuthenticationKind,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AuthenticationKind {
    #[serde(rename = "MeshTLSAuthentication")]
    MeshTls,
    NetworkAuthentication,
    ServiceAccount,
}

/// `MeshTLSAuthentication`: clients with one of these mesh TLS identities. `identities` are
/// identity names, `*` for any, or `*.<suffix>`; `identityRefs` name ServiceAccounts (their
/// identity) or Namespaces (any ServiceAccount in them).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "policy.cnimesh.io", version = "v1alpha1", kind = "MeshTLSAuthentication", namespaced)]
#[kube(root = "MeshTlsAuthentication")]
#[kube(shortname = "meshtlsauthn", category = "policy")]
#[serde(rename_all = "camelCase")]
pub struct MeshTlsAuthenticationSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(inner(regex(
        pattern = r"^(\*|(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)$"
    )))]
    pub identities: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_refs: Option<Vec<IdentityRef>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct IdentityRef {
    #[serde(default)]
    pub group: String,
    pub kind: IdentityRefKind,
    /// `*` with kind ServiceAccount: every ServiceAccount of the namespace.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum IdentityRefKind {
    ServiceAccount,
    Namespace,
}

/// `NetworkAuthentication`: clients whose address is in one of `networks`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "policy.cnimesh.io", version = "v1alpha1", kind = "NetworkAuthentication", namespaced)]
#[kube(shortname = "netauthn", category = "policy")]
pub struct NetworkAuthenticationSpec {
    #[schemars(length(min = 1))]
    pub networks: Vec<Network>,
}

/// A CIDR (`10.0.0.0/8`, `fd00::/8`; a bare address is one host) minus `except`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct Network {
    pub cidr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub except: Option<Vec<String>>,
}

/// Every policy CRD, in the order the manifest holds them.
pub fn definitions() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![Server::crd(), AuthorizationPolicy::crd(), MeshTlsAuthentication::crd(), NetworkAuthentication::crd()]
}
