//! Gateway API route objects as cnimesh reads them: `gateway.networking.k8s.io/v1` `HTTPRoute` and
//! `GRPCRoute`, and `v1beta1` `ReferenceGrant` (which lets a route in one namespace send traffic
//! to a Service in another).
//!
//! Only fields the Gateway API defines are here, named as the Gateway API names them. All are in
//! the standard channel from v1.2.0 (`timeouts`) except `HTTPRouteRule.retry` (GEP-1731):
//! experimental channel from v1.2.0, standard only from v1.7.0, of which only release candidates
//! could be confirmed; docs/tasks/routes.md, "Gateway API version", has the field-by-field table.
//! Fields cnimesh does not act on (`sessionPersistence`, `requestMirror`, `extensionRef`, `cors`)
//! are left out of the types; serde skips them when reading, and the model refuses a filter whose
//! `type` it cannot carry out instead of silently dropping it. Filter types and match types are
//! strings, not enums, so an unknown value reaches the model and is refused there with the
//! route's name, rather than failing the whole file it came in.
//!
//! The CRDs themselves are the Gateway API's own (installed from its release, see
//! docs/tasks/routes.md): the kube derive here generates only the `kube::Resource` glue for the
//! watchers (`schema = "disabled"`), never a schema of ours for someone else's group.
//!
//! Layer: model/index (pure): serde types.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The Gateway API's group.
pub const GROUP: &str = "gateway.networking.k8s.io";
/// `apiVersion` of HTTPRoute and GRPCRoute.
pub const API_VERSION: &str = "gateway.networking.k8s.io/v1";
/// `apiVersion` of ReferenceGrant.
pub const REFERENCE_GRANT_API_VERSION: &str = "gateway.networking.k8s.io/v1beta1";

/// `HTTPRoute` spec (Gateway API `HTTPRouteSpec`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(group = "gateway.networking.k8s.io", version = "v1", kind = "HTTPRoute", namespaced)]
#[kube(root = "HttpRoute", schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<ParentReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<HttpRouteRule>,
}

/// `ParentReference`. GAMMA: `group: ""` (core) and `kind: Service` attach the route to a
/// Service; the default kind is Gateway, which is not ours.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// `HTTPRouteRule`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Absent: one match, `PathPrefix /` (the Gateway API default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<Vec<HttpRouteMatch>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HttpRouteFilter>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<HttpBackendRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<HttpRouteTimeouts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<HttpRouteRetry>,
}

/// `HTTPRouteMatch`: every part given must match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ValueMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<ValueMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// `HTTPPathMatch`: `type` `Exact`, `PathPrefix` (default) or `RegularExpression`; `value`
/// defaults to `/`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HttpPathMatch {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// `HTTPHeaderMatch`, `HTTPQueryParamMatch` and `GRPCHeaderMatch` (one shape): `type` `Exact`
/// (default) or `RegularExpression`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ValueMatch {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    pub value: String,
}

/// `HTTPRouteFilter`: `type` says which of the other fields applies.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteFilter {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HttpHeaderFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HttpHeaderFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<HttpRequestRedirectFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<HttpUrlRewriteFilter>,
}

/// `HTTPHeaderFilter`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HttpHeaderFilter {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<HttpHeader>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<HttpHeader>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// `HTTPHeader`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HttpHeader {
    pub name: String,
    pub value: String,
}

/// `HTTPRequestRedirectFilter`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequestRedirectFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<i32>,
}

/// `HTTPURLRewriteFilter`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HttpUrlRewriteFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathModifier>,
}

/// `HTTPPathModifier`: `type` `ReplaceFullPath` or `ReplacePrefixMatch`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpPathModifier {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_full_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_prefix_match: Option<String>,
}

/// `HTTPBackendRef` and `GRPCBackendRef` (one shape; the GRPCRoute's filters are read as
/// HTTPRoute filters and the model allows only the gRPC subset).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HttpBackendRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Default 1; 0 sends nothing to this backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HttpRouteFilter>,
}

/// `HTTPRouteTimeouts` (Gateway API durations, GEP-2257).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteTimeouts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request: Option<String>,
}

/// `HTTPRouteRetry` (GEP-1731).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HttpRouteRetry {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
}

/// `GRPCRoute` spec (Gateway API `GRPCRouteSpec`, v1 since v1.1.0).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(group = "gateway.networking.k8s.io", version = "v1", kind = "GRPCRoute", namespaced)]
#[kube(root = "GrpcRoute", schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct GrpcRouteSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<ParentReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<GrpcRouteRule>,
}

/// `GRPCRouteRule`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRouteRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<GrpcRouteMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HttpRouteFilter>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<HttpBackendRef>,
}

/// `GRPCRouteMatch`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct GrpcRouteMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<GrpcMethodMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ValueMatch>,
}

/// `GRPCMethodMatch`: `type` `Exact` (default) or `RegularExpression`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct GrpcMethodMatch {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// `ReferenceGrant` spec: routes of the `from` kinds in the `from` namespaces may refer to the
/// `to` objects in the grant's own namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(group = "gateway.networking.k8s.io", version = "v1beta1", kind = "ReferenceGrant", namespaced)]
#[kube(schema = "disabled")]
pub struct ReferenceGrantSpec {
    pub from: Vec<ReferenceGrantFrom>,
    pub to: Vec<ReferenceGrantTo>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ReferenceGrantFrom {
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ReferenceGrantTo {
    pub group: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `apiVersion` of TLSRoute and TCPRoute (experimental channel).
pub const ALPHA_API_VERSION: &str = "gateway.networking.k8s.io/v1alpha2";

/// `TLSRoute` spec (Gateway API `TLSRouteSpec`, v1alpha2): TLS connections by SNI hostname.
/// cnimesh serves it only with an EgressNetwork parent (docs/tasks/egress.md).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(group = "gateway.networking.k8s.io", version = "v1alpha2", kind = "TLSRoute", namespaced)]
#[kube(root = "TlsRoute", schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct TlsRouteSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<ParentReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<StreamRouteRule>,
}

/// `TCPRoute` spec (Gateway API `TCPRouteSpec`, v1alpha2): TCP connections by port (its
/// parentRef's). cnimesh serves it only with an EgressNetwork parent.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(group = "gateway.networking.k8s.io", version = "v1alpha2", kind = "TCPRoute", namespaced)]
#[kube(root = "TcpRoute", schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct TcpRouteSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<ParentReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<StreamRouteRule>,
}

/// `TLSRouteRule` and `TCPRouteRule` (one shape): where matching connections go.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StreamRouteRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<HttpBackendRef>,
}
