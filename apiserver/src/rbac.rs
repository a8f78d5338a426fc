//! Role-based access control, opt-in ([`crate::ClusterApi::enforce_rbac`]): a request bearing a
//! token this server issued for a service account is allowed only what the Roles, ClusterRoles
//! and their bindings stored in the server grant that account, as a real API server's RBAC
//! authorizer decides, so a test can show what a component's ServiceAccount may not do. The
//! admin token (and any request when no token is required) stays all-powerful: it stands for the
//! cluster's administrator.
//!
//! What it reads: rules' `verbs`, `apiGroups`, `resources` (with subresources, `links/status`,
//! and `*/status`), `resourceNames`; RoleBindings (their namespace only) and ClusterRoleBindings,
//! to Roles or ClusterRoles; subjects of kind ServiceAccount, User and Group, with the groups a
//! service account is in (`system:serviceaccounts`, `system:serviceaccounts:<ns>`,
//! `system:authenticated`). What every authenticated caller may do anyway, as the default
//! ClusterRoles `system:discovery` and `system:basic-user` grant: discovery (any request that
//! names no resource) and its own access reviews. Aggregated ClusterRoles are not expanded.

use serde_json::{Value, json};

use crate::call::Call;
use crate::kinds::{Resource, Target, parse_path};
use crate::store::Store;

const RBAC: &str = "rbac.authorization.k8s.io/v1";

/// An authenticated service account, as a token review names it.
#[derive(Debug, Clone)]
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) groups: Vec<String>,
    /// The service account's namespace and name.
    pub(crate) service_account: (String, String),
}

impl User {
    pub(crate) fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_string(),
            ],
            service_account: (namespace.to_string(), name.to_string()),
        }
    }
}

/// What a request asks to do, in RBAC's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attributes {
    pub(crate) verb: String,
    /// `""` for the core group.
    pub(crate) group: String,
    pub(crate) resource: String,
    pub(crate) subresource: Option<String>,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
}

impl Attributes {
    /// The request's attributes; `None` for a request that names no resource (discovery,
    /// `/version`, an unknown path), which every authenticated caller may make.
    pub(crate) fn of_call(call: &Call) -> Option<Self> {
        if let Some(proxy) = crate::pod_proxy::parse(&call.path) {
            return Some(Self {
                verb: verb_of_method(&call.method, true, false).to_string(),
                group: String::new(),
                resource: match proxy.via {
                    crate::pod_proxy::Via::Pod => "pods",
                    crate::pod_proxy::Via::Service => "services",
                }
                .to_string(),
                subresource: Some("proxy".to_string()),
                namespace: Some(proxy.namespace),
                name: Some(proxy.name),
            });
        }
        let Target { resource, namespace, name, subresource } = parse_path(&call.path)?;
        let verb = verb_of_method(&call.method, name.is_some(), call.is_watch()).to_string();
        // A list or watch of one name (`fieldSelector=metadata.name=x`) is of that name, so a
        // rule's resourceNames can allow it, as on a real server.
        let name = name.or_else(|| {
            let selected = call.param("fieldSelector")?.strip_prefix("metadata.name=")?;
            (matches!(verb.as_str(), "list" | "watch") && !selected.contains(',')).then(|| selected.to_string())
        });
        // A namespace's own requests are in that namespace, as on a real server.
        let namespace = if resource.plural == "namespaces" { name.clone().or(namespace) } else { namespace };
        Some(Self { verb, group: group_of(&resource), resource: resource.plural, subresource, namespace, name })
    }

    /// A SelfSubjectAccessReview's `spec.resourceAttributes`; `None` when it has none (it asks
    /// about a non-resource URL).
    pub(crate) fn of_review(spec: &Value) -> Option<Self> {
        let attributes = spec.get("resourceAttributes")?;
        let field = |key: &str| attributes[key].as_str().filter(|s| !s.is_empty()).map(String::from);
        Some(Self {
            verb: field("verb").unwrap_or_default(),
            group: field("group").unwrap_or_default(),
            resource: field("resource").unwrap_or_default(),
            subresource: field("subresource"),
            namespace: field("namespace"),
            name: field("name"),
        })
    }

    /// `links/status`, or the resource alone.
    fn full_resource(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }

    /// What a 403 says, in a real API server's words.
    pub(crate) fn forbidden_message(&self, user: &User) -> String {
        let object = match &self.name {
            Some(name) => format!("{} {name:?}", self.resource),
            None => self.resource.clone(),
        };
        let scope = match &self.namespace {
            Some(ns) => format!("in the namespace {ns:?}"),
            None => "at the cluster scope".to_string(),
        };
        format!(
            "{object} is forbidden: User {:?} cannot {} resource {:?} in API group {:?} {scope}",
            user.name,
            self.verb,
            self.full_resource(),
            self.group
        )
    }
}

/// The 403 a real API server answers: a `Status` with reason `Forbidden`, its details naming
/// the object.
pub(crate) fn forbidden(user: &User, attributes: &Attributes) -> http::Response<crate::response::Body> {
    crate::response::json_response(
        http::StatusCode::FORBIDDEN,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden",
            "code": 403, "message": attributes.forbidden_message(user),
            "details": {"name": attributes.name.clone().unwrap_or_default(), "group": attributes.group,
                "kind": attributes.resource}}),
    )
}

fn verb_of_method(method: &http::Method, named: bool, watch: bool) -> &'static str {
    match *method {
        http::Method::GET | http::Method::HEAD if watch => "watch",
        http::Method::GET | http::Method::HEAD if named => "get",
        http::Method::GET | http::Method::HEAD => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "unknown",
    }
}

fn group_of(resource: &Resource) -> String {
    resource.api_version.rsplit_once('/').map(|(group, _)| group.to_string()).unwrap_or_default()
}

/// Whether `user` may do what `attributes` ask, by the roles bound to it in `store`.
pub(crate) fn allows(store: &Store, user: &User, attributes: &Attributes) -> bool {
    if is_always_allowed(attributes) {
        return true;
    }
    let objects = |plural: &str| {
        let resource = Resource { api_version: RBAC.to_string(), plural: plural.to_string() };
        store.objects.get(&resource).map(|o| o.values().cloned().collect::<Vec<_>>()).unwrap_or_default()
    };
    let role = |kind: &str, namespace: &str, name: &str| -> Option<Value> {
        let plural = if kind == "ClusterRole" { "clusterroles" } else { "roles" };
        let namespace = if kind == "ClusterRole" { "" } else { namespace };
        let resource = Resource { api_version: RBAC.to_string(), plural: plural.to_string() };
        store.get(&resource, &(namespace.to_string(), name.to_string())).cloned()
    };
    let cluster_wide = objects("clusterrolebindings").into_iter().filter_map(|binding| {
        let granted = binds(&binding, user, "") && binding["roleRef"]["kind"] == "ClusterRole";
        granted.then(|| role("ClusterRole", "", binding["roleRef"]["name"].as_str().unwrap_or_default())).flatten()
    });
    let in_namespace = objects("rolebindings").into_iter().filter_map(|binding| {
        let namespace = binding["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        let granted = attributes.namespace.as_deref() == Some(namespace.as_str()) && binds(&binding, user, &namespace);
        let kind = binding["roleRef"]["kind"].as_str().unwrap_or_default().to_string();
        granted.then(|| role(&kind, &namespace, binding["roleRef"]["name"].as_str().unwrap_or_default())).flatten()
    });
    cluster_wide
        .chain(in_namespace)
        .any(|role| role["rules"].as_array().into_iter().flatten().any(|rule| rule_allows(rule, attributes)))
}

/// `system:discovery` and `system:basic-user`: a caller may always review its own access.
fn is_always_allowed(attributes: &Attributes) -> bool {
    attributes.verb == "create"
        && attributes.group == "authorization.k8s.io"
        && matches!(attributes.resource.as_str(), "selfsubjectaccessreviews" | "selfsubjectrulesreviews")
}

/// Whether the binding names `user` among its subjects (a ServiceAccount subject without a
/// namespace is in the binding's own, `binding_namespace`).
fn binds(binding: &Value, user: &User, binding_namespace: &str) -> bool {
    binding["subjects"].as_array().into_iter().flatten().any(|subject| {
        let name = subject["name"].as_str().unwrap_or_default();
        match subject["kind"].as_str().unwrap_or_default() {
            "ServiceAccount" => {
                let namespace = subject["namespace"].as_str().filter(|n| !n.is_empty()).unwrap_or(binding_namespace);
                (namespace, name) == (user.service_account.0.as_str(), user.service_account.1.as_str())
            }
            "User" => name == user.name,
            "Group" => user.groups.iter().any(|g| g == name),
            _ => false,
        }
    })
}

fn rule_allows(rule: &Value, attributes: &Attributes) -> bool {
    let list =
        |key: &str| -> Vec<&str> { rule[key].as_array().into_iter().flatten().filter_map(Value::as_str).collect() };
    let verbs = list("verbs");
    let groups = list("apiGroups");
    let resources = list("resources");
    let names = list("resourceNames");
    let full = attributes.full_resource();
    let resource_matches = resources.iter().any(|r| {
        *r == "*" || *r == full || attributes.subresource.as_ref().is_some_and(|sub| *r == format!("*/{sub}"))
    });
    let name_matches = names.is_empty() || attributes.name.as_deref().is_some_and(|name| names.contains(&name));
    verbs.iter().any(|v| *v == "*" || *v == attributes.verb)
        && groups.iter().any(|g| *g == "*" || *g == attributes.group)
        && resource_matches
        && name_matches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributes(verb: &str, resource: &str, subresource: Option<&str>, name: Option<&str>) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: "multicluster.cnimesh.io".into(),
            resource: resource.into(),
            subresource: subresource.map(String::from),
            namespace: Some("cnimesh".into()),
            name: name.map(String::from),
        }
    }

    #[test]
    fn a_rule_names_subresources_and_resource_names_exactly() {
        let rule = json!({"apiGroups": ["multicluster.cnimesh.io"], "resources": ["links/status"],
            "verbs": ["patch"], "resourceNames": ["west"]});
        assert!(rule_allows(&rule, &attributes("patch", "links", Some("status"), Some("west"))));
        assert!(!rule_allows(&rule, &attributes("patch", "links", None, Some("west"))), "the Link itself");
        assert!(!rule_allows(&rule, &attributes("patch", "links", Some("status"), Some("east"))), "another name");
        assert!(!rule_allows(&rule, &attributes("update", "links", Some("status"), Some("west"))), "another verb");
        let wildcard = json!({"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["*"]});
        assert!(rule_allows(&wildcard, &attributes("update", "links", Some("status"), None)));
        assert!(!rule_allows(&wildcard, &attributes("update", "links", None, None)));
    }
}
