//! The policy custom resources, group `policy.cnimesh.io`, version `v1alpha1` (docs/architecture.md, "Names and numbers"),
//! with the semantics Linkerd users know from `policy.linkerd.io`: a [`Server`] names a port of the
//! pods a selector picks, an [`AuthorizationPolicy`] lets clients reach a Server (or every Server
//! of a Namespace) when all of its required authentications hold, a [`MeshTlsAuthentication`]
//! names client identities, a [`NetworkAuthentication`] client networks.
//!
//! The OpenAPI schemas (derived with `schemars`, checked into `daemonset/control-policy-crds.yaml`
//! and compared with these types by `cli/tests/policy_crds.rs`) reject what a schema can:
//! unknown protocols and operators, port numbers out of range, port names that are not
//! IANA_SVC_NAMEs, identities with characters no identity has, target kinds we do not serve.
//! What a schema cannot express (a CIDR, a selector that selects nothing, a reference to a kind it
//! cannot name) is checked when the object is read into the model ([`super::model`]), and such an
//! object is logged with its name and reason and ignored.
//!
//! The doc comments are the descriptions `kubectl explain` shows: every kind, field and type has
//! one (`cli/tests/policy_crds.rs` fails on a property without a description), and each kind
//! has printer columns. How the version moves to v1beta1: docs/reference/crd-versioning.md.
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
#[kube(
    doc = "Server names a port of the pods its podSelector selects in its namespace, and how the port's traffic is proxied. A port a Server names is reachable only as AuthorizationPolicies targeting the Server (or its namespace) allow; ports no Server names get the default inbound policy."
)]
#[kube(
    printcolumn = r#"{"name": "Port", "type": "string", "description": "The port: a number or a container port name", "jsonPath": ".spec.port"}"#
)]
#[kube(
    printcolumn = r#"{"name": "Protocol", "type": "string", "description": "How the port's connections are proxied", "jsonPath": ".spec.proxyProtocol"}"#
)]
#[kube(printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct ServerSpec {
    /// The pods of the Server's namespace whose port this is. An empty selector selects every pod
    /// of the namespace.
    pub pod_selector: LabelSelector,
    /// The port: a number (1-65535) or the name of a container port of the selected pods, like a
    /// Service's targetPort.
    pub port: Port,
    /// How connections on the port are proxied: `unknown` (the default) detects HTTP/1 and HTTP/2,
    /// `HTTP/1`, `HTTP/2` and `gRPC` skip detection, `opaque` forwards bytes without looking at
    /// them, `TLS` forwards an application's own TLS untouched.
    #[serde(default)]
    pub proxy_protocol: ProxyProtocol,
    /// What clients no AuthorizationPolicy admits get (Linkerd 2.16's `accessPolicy`): `deny`
    /// (the default), `audit` (let through, logged and counted as would-be denials, for rolling
    /// out policy), or one of the default policies (`all-unauthenticated`, `all-authenticated`,
    /// `cluster-authenticated`) added to the policies' authorizations. An unknown value is
    /// refused and the Server's last good version stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["deny", "audit", "all-unauthenticated", "all-authenticated", "cluster-authenticated"]))]
    pub access_policy: Option<String>,
}

/// A Kubernetes label selector. Both parts empty selects every pod of the namespace, as in
/// Linkerd and Kubernetes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels a pod must carry, each with exactly this value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
    /// Requirements on a pod's labels; all must hold (and matchLabels too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
}

/// One requirement on a pod's labels: the label `key` compared with `values` by `operator`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct LabelSelectorRequirement {
    /// The label's key.
    pub key: String,
    /// `In` and `NotIn` compare the label's value with `values`; `Exists` and `DoesNotExist` test
    /// whether the pod has the label at all.
    pub operator: SelectorOperator,
    /// Required (non-empty) for `In` and `NotIn`, forbidden for `Exists` and `DoesNotExist`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<String>>,
}

/// How a label requirement compares.
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
#[kube(
    doc = "AuthorizationPolicy lets clients reach its target (a Server, every Server of its namespace, or one HTTPRoute) when every required authentication holds. Policies add up: a client may connect when any policy of the target admits it."
)]
#[kube(
    printcolumn = r#"{"name": "Target Kind", "type": "string", "description": "The kind of the target", "jsonPath": ".spec.targetRef.kind"}"#
)]
#[kube(
    printcolumn = r#"{"name": "Target Name", "type": "string", "description": "The name of the target", "jsonPath": ".spec.targetRef.name"}"#
)]
#[kube(printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationPolicySpec {
    /// What the policy applies to, in the policy's own namespace.
    pub target_ref: TargetRef,
    /// The authentications a client must all satisfy: at most one identity-based
    /// (MeshTLSAuthentication or ServiceAccount) and one network-based (NetworkAuthentication).
    /// None means every client.
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
    /// `Server`, `Namespace` (the policy's own: every Server in it) or `HTTPRoute` (requests that
    /// route takes).
    pub kind: TargetKind,
    /// The target's name.
    pub name: String,
}

/// The kinds an AuthorizationPolicy can target.
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
    /// `policy.cnimesh.io` for MeshTLSAuthentication and NetworkAuthentication, `""` (core) for
    /// ServiceAccount.
    #[serde(default)]
    pub group: String,
    /// `MeshTLSAuthentication`, `NetworkAuthentication` or `ServiceAccount` (clients with that
    /// ServiceAccount's mesh identity).
    pub kind: AuthenticationKind,
    /// The referenced object's name.
    pub name: String,
    /// The referenced object's namespace; the policy's own when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// The kinds a required authentication can name.
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
#[kube(
    doc = "MeshTLSAuthentication is satisfied by clients that prove, with a mesh TLS certificate, one of the identities it lists (by name in identities, or as ServiceAccounts and Namespaces in identityRefs). An AuthorizationPolicy requires it by name."
)]
#[kube(
    printcolumn = r#"{"name": "Identities", "type": "string", "description": "Identity names admitted", "jsonPath": ".spec.identities"}"#
)]
#[kube(printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct MeshTlsAuthenticationSpec {
    /// Identity names (`<sa>.<ns>.serviceaccount.identity.cnimesh.<trust-domain>`), `*` for any
    /// meshed client, or `*.<suffix>` for every identity ending in the suffix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(inner(regex(
        pattern = r"^(\*|(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)$"
    )))]
    pub identities: Option<Vec<String>>,
    /// ServiceAccounts (their identity) or Namespaces (every ServiceAccount in them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_refs: Option<Vec<IdentityRef>>,
}

/// A ServiceAccount or Namespace whose workloads' mesh identities are admitted.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct IdentityRef {
    /// `""` (core): both kinds are core Kubernetes kinds.
    #[serde(default)]
    pub group: String,
    /// `ServiceAccount` or `Namespace`.
    pub kind: IdentityRefKind,
    /// The ServiceAccount's or Namespace's name; `*` with kind ServiceAccount: every
    /// ServiceAccount of the namespace.
    pub name: String,
    /// The ServiceAccount's namespace; the MeshTLSAuthentication's own when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// The kinds an identity reference can name.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum IdentityRefKind {
    ServiceAccount,
    Namespace,
}

/// `NetworkAuthentication`: clients whose address is in one of `networks`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "policy.cnimesh.io", version = "v1alpha1", kind = "NetworkAuthentication", namespaced)]
#[kube(shortname = "netauthn", category = "policy")]
#[kube(
    doc = "NetworkAuthentication is satisfied by clients whose source address is in one of its networks, meshed or not. An AuthorizationPolicy requires it by name."
)]
#[kube(
    printcolumn = r#"{"name": "Networks", "type": "string", "description": "The networks admitted", "jsonPath": ".spec.networks[*].cidr"}"#
)]
#[kube(printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#)]
pub struct NetworkAuthenticationSpec {
    /// The client networks admitted (at least one).
    #[schemars(length(min = 1))]
    pub networks: Vec<Network>,
}

/// A CIDR (`10.0.0.0/8`, `fd00::/8`; a bare address is one host) minus `except`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct Network {
    /// The network, IPv4 or IPv6, in CIDR notation; a bare address is one host.
    pub cidr: String,
    /// Networks inside `cidr` that are not admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub except: Option<Vec<String>>,
}

/// `HTTPLocalRateLimitPolicy` (Linkerd's shape): requests per second a Server's proxy lets
/// through, in total, per client identity, and for named clients. Limits apply per proxy: a
/// Server on N pods admits N times the limit. At most one policy per Server: the oldest wins and
/// any other is refused with the reason.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "policy.cnimesh.io", version = "v1alpha1", kind = "HTTPLocalRateLimitPolicy", namespaced)]
#[kube(root = "HttpLocalRateLimitPolicy")]
#[kube(shortname = "ratelimit", category = "policy")]
#[kube(
    doc = "HTTPLocalRateLimitPolicy limits the HTTP requests per second each proxy of a Server's pods lets through: in total, per client identity, and for named clients (overrides). Requests over the limit get 429. Limits are per proxy: N replicas admit N times the limit."
)]
#[kube(
    printcolumn = r#"{"name": "Target", "type": "string", "description": "The Server limited", "jsonPath": ".spec.targetRef.name"}"#
)]
#[kube(
    printcolumn = r#"{"name": "Total RPS", "type": "integer", "description": "Requests per second in total, per proxy", "jsonPath": ".spec.total.requestsPerSecond"}"#
)]
#[kube(
    printcolumn = r#"{"name": "Identity RPS", "type": "integer", "description": "Requests per second per client identity, per proxy", "jsonPath": ".spec.identity.requestsPerSecond"}"#
)]
#[kube(printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct HttpLocalRateLimitPolicySpec {
    /// The Server limited, in the policy's namespace.
    pub target_ref: RateLimitTargetRef,
    /// Requests per second all clients together get from each proxy. Unset: no total limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<Limit>,
    /// Requests per second each client identity gets from each proxy; clients without a mesh
    /// identity share one bucket. At most `total`. Unset: no per-identity limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Limit>,
    /// Limits for named clients, replacing `identity` for them. Each at most `total`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<RateLimitOverride>,
}

/// The Server a rate limit applies to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct RateLimitTargetRef {
    /// `policy.cnimesh.io`.
    #[serde(default)]
    pub group: String,
    /// `Server`: the only kind a rate limit can target.
    #[schemars(extend("enum" = ["Server"]))]
    pub kind: String,
    /// The Server's name.
    pub name: String,
}

/// A rate.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Limit {
    /// Requests per second, 1 to 1000000.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub requests_per_second: u32,
}

/// A limit for named clients.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitOverride {
    /// Requests per second each of these clients gets from each proxy, 1 to 1000000.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub requests_per_second: u32,
    /// The clients (at least one), by ServiceAccount: their mesh identities.
    #[schemars(length(min = 1))]
    pub client_refs: Vec<ClientRef>,
}

/// A client of an override: a ServiceAccount, whose workloads' mesh identity it names.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct ClientRef {
    /// `""` (core).
    #[serde(default)]
    pub group: String,
    /// `ServiceAccount`.
    #[schemars(extend("enum" = ["ServiceAccount"]))]
    pub kind: String,
    /// The ServiceAccount's name.
    pub name: String,
    /// The ServiceAccount's namespace; the policy's own when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Every CRD of the control plane's manifest (the policy kinds, then ExternalWorkload), in the
/// order it holds them.
pub fn definitions() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![
        Server::crd(),
        AuthorizationPolicy::crd(),
        MeshTlsAuthentication::crd(),
        NetworkAuthentication::crd(),
        HttpLocalRateLimitPolicy::crd(),
        crate::egress::crd::EgressNetwork::crd(),
        crate::external::ExternalWorkload::crd(),
    ]
}
