//! The kinds the server serves: a built-in table of those the mesh and its users touch (core,
//! apps, batch, discovery, coordination, admissionregistration, rbac, apiextensions, the mesh's
//! CRDs, Gateway API), plus any CustomResourceDefinition written to it. Discovery lists them, and
//! a written object's `kind` is checked against its path's plural through them.
//!
//! Collections are stored whatever their path names, so an unlisted kind still works for clients
//! that know its plural (kube-rs); only discovery (kubectl) needs it listed.

use serde_json::Value;

/// Which collection a path names: `/api/v1/...` or `/apis/<group>/<version>/...`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Resource {
    /// `v1` or `<group>/<version>`: the objects' `apiVersion`.
    pub(crate) api_version: String,
    /// The plural, lower case (`services`).
    pub(crate) plural: String,
}

/// What a resource path names.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) resource: Resource,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
}

pub(crate) fn parse_path(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => (version.to_string(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let owned = |s: &&str| Some(s.to_string());
    let (namespace, plural, name, subresource) = match rest {
        // A namespace's own subresources (`namespaces/x/status`, `namespaces/x/finalize`).
        ["namespaces", name, sub @ ("status" | "finalize")] => (None, &"namespaces", owned(name), owned(sub)),
        ["namespaces", ns, plural] => (owned(ns), plural, None, None),
        ["namespaces", ns, plural, name] => (owned(ns), plural, owned(name), None),
        ["namespaces", ns, plural, name, sub] => (owned(ns), plural, owned(name), owned(sub)),
        [plural] => (None, plural, None, None),
        [plural, name] => (None, plural, owned(name), None),
        [plural, name, sub] => (None, plural, owned(name), owned(sub)),
        _ => return None,
    };
    Some(Target { resource: Resource { api_version, plural: plural.to_string() }, namespace, name, subresource })
}

/// One served kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kind {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) kind: String,
    pub(crate) plural: String,
    pub(crate) namespaced: bool,
    pub(crate) short_names: Vec<String>,
    /// `status`, `token`: each is listed in discovery as `<plural>/<sub>`.
    pub(crate) subresources: Vec<String>,
    /// Only these verbs (`create` for reviews); empty: every verb of a stored collection.
    pub(crate) verbs: Vec<&'static str>,
}

impl Kind {
    /// `v1` or `<group>/<version>`.
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }
}

const NAMESPACED: bool = true;
const CLUSTER: bool = false;

/// `(apiVersion, kind, plural, namespaced, short names, subresources)` of every built-in kind.
type Row = (&'static str, &'static str, &'static str, bool, &'static [&'static str], &'static [&'static str]);

const BUILT_IN: &[Row] = &[
    ("v1", "Pod", "pods", NAMESPACED, &["po"], &["status", "proxy"]),
    ("v1", "Service", "services", NAMESPACED, &["svc"], &["status"]),
    ("v1", "Endpoints", "endpoints", NAMESPACED, &["ep"], &[]),
    ("v1", "Namespace", "namespaces", CLUSTER, &["ns"], &["status"]),
    ("v1", "Node", "nodes", CLUSTER, &["no"], &["status"]),
    ("v1", "Secret", "secrets", NAMESPACED, &[], &[]),
    ("v1", "ConfigMap", "configmaps", NAMESPACED, &["cm"], &[]),
    ("v1", "ServiceAccount", "serviceaccounts", NAMESPACED, &["sa"], &["token"]),
    ("v1", "Event", "events", NAMESPACED, &["ev"], &[]),
    ("apps/v1", "Deployment", "deployments", NAMESPACED, &["deploy"], &["status", "scale"]),
    ("apps/v1", "DaemonSet", "daemonsets", NAMESPACED, &["ds"], &["status"]),
    ("apps/v1", "StatefulSet", "statefulsets", NAMESPACED, &["sts"], &["status", "scale"]),
    ("apps/v1", "ReplicaSet", "replicasets", NAMESPACED, &["rs"], &["status", "scale"]),
    ("batch/v1", "Job", "jobs", NAMESPACED, &[], &["status"]),
    ("batch/v1", "CronJob", "cronjobs", NAMESPACED, &["cj"], &["status"]),
    ("discovery.k8s.io/v1", "EndpointSlice", "endpointslices", NAMESPACED, &[], &[]),
    ("coordination.k8s.io/v1", "Lease", "leases", NAMESPACED, &[], &[]),
    (
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        CLUSTER,
        &[],
        &[],
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        CLUSTER,
        &[],
        &[],
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        CLUSTER,
        &[],
        &["status"],
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        CLUSTER,
        &[],
        &[],
    ),
    ("rbac.authorization.k8s.io/v1", "Role", "roles", NAMESPACED, &[], &[]),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", NAMESPACED, &[], &[]),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", CLUSTER, &[], &[]),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", CLUSTER, &[], &[]),
    (
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        CLUSTER,
        &["crd", "crds"],
        &["status"],
    ),
    ("policy.cnimesh.io/v1alpha1", "Server", "servers", NAMESPACED, &["srv"], &[]),
    ("policy.cnimesh.io/v1alpha1", "AuthorizationPolicy", "authorizationpolicies", NAMESPACED, &["authzpolicy"], &[]),
    (
        "policy.cnimesh.io/v1alpha1",
        "MeshTLSAuthentication",
        "meshtlsauthentications",
        NAMESPACED,
        &["meshtlsauthn"],
        &[],
    ),
    ("policy.cnimesh.io/v1alpha1", "NetworkAuthentication", "networkauthentications", NAMESPACED, &["netauthn"], &[]),
    (
        "policy.cnimesh.io/v1alpha1",
        "HTTPLocalRateLimitPolicy",
        "httplocalratelimitpolicies",
        NAMESPACED,
        &["ratelimit"],
        &[],
    ),
    ("policy.cnimesh.io/v1alpha1", "EgressNetwork", "egressnetworks", NAMESPACED, &["egressnet"], &[]),
    ("workload.cnimesh.io/v1alpha1", "ExternalWorkload", "externalworkloads", NAMESPACED, &["ew"], &[]),
    ("multicluster.cnimesh.io/v1alpha1", "Link", "links", NAMESPACED, &[], &["status"]),
    ("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes", NAMESPACED, &[], &["status"]),
    ("gateway.networking.k8s.io/v1", "GRPCRoute", "grpcroutes", NAMESPACED, &[], &["status"]),
    ("gateway.networking.k8s.io/v1beta1", "ReferenceGrant", "referencegrants", NAMESPACED, &["refgrant"], &[]),
    ("gateway.networking.k8s.io/v1alpha2", "TLSRoute", "tlsroutes", NAMESPACED, &[], &["status"]),
    ("gateway.networking.k8s.io/v1alpha2", "TCPRoute", "tcproutes", NAMESPACED, &[], &["status"]),
];

/// Reviews: answered on create, never stored.
const REVIEWS: &[(&str, &str, &str)] = &[
    ("authentication.k8s.io/v1", "TokenReview", "tokenreviews"),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews"),
];

/// The built-in kinds.
pub(crate) fn built_in() -> Vec<Kind> {
    let stored = BUILT_IN.iter().map(|&(api_version, kind, plural, namespaced, short, sub)| {
        row(api_version, kind, plural, namespaced, short, sub)
    });
    let reviews = REVIEWS.iter().map(|&(api_version, kind, plural)| Kind {
        verbs: vec!["create"],
        ..row(api_version, kind, plural, CLUSTER, &[], &[])
    });
    stored.chain(reviews).collect()
}

fn row(api_version: &str, kind: &str, plural: &str, namespaced: bool, short: &[&str], sub: &[&str]) -> Kind {
    let (group, version) = split_api_version(api_version);
    Kind {
        group: group.to_string(),
        version: version.to_string(),
        kind: kind.to_string(),
        plural: plural.to_string(),
        namespaced,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        subresources: sub.iter().map(|s| s.to_string()).collect(),
        verbs: Vec::new(),
    }
}

/// `("", "v1")` or `("apps", "v1")`.
pub(crate) fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

/// The kinds a CustomResourceDefinition object serves (one per served version).
pub(crate) fn from_crd(crd: &Value) -> Vec<Kind> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let (Some(group), Some(kind), Some(plural)) =
        (spec["group"].as_str(), names["kind"].as_str(), names["plural"].as_str())
    else {
        return Vec::new();
    };
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(Value::as_str).map(String::from).collect()
    };
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"].as_bool() != Some(false))
        .filter_map(|v| {
            let subresources = v["subresources"].as_object().map(|s| s.keys().cloned().collect()).unwrap_or_default();
            Some(Kind {
                group: group.to_string(),
                version: v["name"].as_str()?.to_string(),
                kind: kind.to_string(),
                plural: plural.to_string(),
                namespaced: spec["scope"].as_str() != Some("Cluster"),
                short_names: strings(&names["shortNames"]),
                subresources,
                verbs: Vec::new(),
            })
        })
        .collect()
}

/// The plural of `kind` in `api_version`: the served kind's when there is one, else the
/// guess kube-rs makes for kinds it does not know.
pub(crate) fn plural_of(kinds: &[Kind], api_version: &str, kind: &str) -> String {
    kinds.iter().find(|k| k.kind == kind && k.api_version() == api_version).map(|k| k.plural.clone()).unwrap_or_else(
        || {
            let (group, version) = split_api_version(api_version);
            kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(group, version, kind)).plural
        },
    )
}

/// The kind stored under `resource`, if it is a served one.
pub(crate) fn kind_of<'a>(kinds: &'a [Kind], resource: &Resource) -> Option<&'a Kind> {
    kinds.iter().find(|k| k.plural == resource.plural && k.api_version() == resource.api_version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn plurals_come_from_the_table_then_from_crds_then_from_the_usual_rule() {
        let mut kinds = built_in();
        assert_eq!(plural_of(&kinds, "policy.cnimesh.io/v1alpha1", "AuthorizationPolicy"), "authorizationpolicies");
        assert_eq!(plural_of(&kinds, "v1", "Endpoints"), "endpoints");
        let crd = json!({"spec": {"group": "example.io", "scope": "Cluster",
            "names": {"kind": "Widget", "plural": "widgetz", "shortNames": ["wz"]},
            "versions": [{"name": "v1", "served": true, "subresources": {"status": {}}}, {"name": "v0", "served": false}]}});
        let served = from_crd(&crd);
        assert_eq!(served.len(), 1);
        assert!(!served[0].namespaced);
        assert_eq!(served[0].subresources, ["status"]);
        kinds.extend(served);
        assert_eq!(plural_of(&kinds, "example.io/v1", "Widget"), "widgetz");
        assert_eq!(plural_of(&kinds, "example.io/v1", "Gadget"), "gadgets");
    }

    #[test]
    fn a_namespace_status_path_names_the_namespace_not_a_collection_in_it() {
        let target = parse_path("/api/v1/namespaces/shop/status").unwrap();
        assert_eq!(target.resource.plural, "namespaces");
        assert_eq!(target.name.as_deref(), Some("shop"));
        assert_eq!(target.subresource.as_deref(), Some("status"));
        let pods = parse_path("/api/v1/namespaces/shop/pods").unwrap();
        assert_eq!((pods.namespace.as_deref(), pods.resource.plural.as_str()), (Some("shop"), "pods"));
    }
}
