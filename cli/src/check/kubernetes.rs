//! The API server itself: reachable, which version, and whether our credentials may do what
//! `check` reads (or, with `--pre`, what `install` creates). Permissions are asked with
//! SelfSubjectAccessReview rather than discovered by failing requests, so a missing grant is
//! named precisely even when nothing would have been read yet.
//!
//! Layer: runtime (operator CLI).

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Api;
use kube::api::{ListParams, PostParams};

use super::report::{Category, Check};
use super::{AGENT_NAMESPACE, CONTROL_NAMESPACE, kube_error, read_hint};
use crate::install::guard::NodeGuard;

const CATEGORY: &Category = &Category::KubernetesApi;
const VERSION: &Category = &Category::KubernetesVersion;
const RBAC: &Category = &Category::Permissions;
const PRE: &Category = &Category::PreInstall;

/// Native sidecars (SidecarContainers) are on by default from this minor version.
pub const NATIVE_SIDECARS_MINOR: u32 = 29;
/// The oldest minor version the mesh runs on.
pub const OLDEST_MINOR: u32 = 24;

/// The server's version as the checks need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerVersion {
    pub major: u32,
    pub minor: u32,
    pub git: String,
}

impl ServerVersion {
    /// Providers decorate `minor` (GKE's `"33+"`), so digits are taken from its front; when that
    /// fails, from `gitVersion` (`v1.33.2-gke.100`).
    pub fn parse(info: &k8s_openapi::apimachinery::pkg::version::Info) -> Option<Self> {
        fn leading(s: &str) -> Option<u32> {
            let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        }
        let from_fields = leading(&info.major).zip(leading(&info.minor));
        let from_git = || {
            let mut parts = info.git_version.trim_start_matches('v').split('.');
            leading(parts.next()?).zip(leading(parts.next()?))
        };
        let (major, minor) = from_fields.or_else(from_git)?;
        Some(ServerVersion { major, minor, git: info.git_version.clone() })
    }

    /// `1.33` style, what the messages compare with.
    pub fn short(&self) -> String {
        format!("{}.{}", self.major, self.minor)
    }

    pub fn at_least(&self, minor: u32) -> bool {
        self.major > 1 || (self.major == 1 && self.minor >= minor)
    }
}

/// What to do when the API server does not answer (also shown by the dashboard).
pub const UNREACHABLE_HINT: &str = "check the kubeconfig's server address and credentials (`kubectl version` should work), or pass --kubeconfig / --context";
/// What to do when RBAC refuses (also shown by the dashboard).
pub const RBAC_HINT: &str =
    "use credentials bound to a role that grants this (e.g. cluster-admin), or ask your cluster's administrator";

/// Reachability and version; `None` when the API server cannot be used at all (every other check
/// is then skipped).
pub async fn api(client: &kube::Client, pre: bool, checks: &mut Vec<Check>) -> Option<ServerVersion> {
    let name = "can query the Kubernetes API";
    let info = match client.apiserver_version().await {
        Ok(info) => info,
        Err(e) => {
            checks.push(Check::fail(
                CATEGORY,
                name,
                format!("the API server did not answer: {}", kube_error(&e)),
                UNREACHABLE_HINT,
            ));
            return None;
        }
    };
    let Some(version) = ServerVersion::parse(&info) else {
        checks.push(Check::fail(
            CATEGORY,
            name,
            format!(
                "unparseable server version {:?} (major {:?}, minor {:?})",
                info.git_version, info.major, info.minor
            ),
            "this does not look like a Kubernetes API server; check the kubeconfig's context",
        ));
        return None;
    };
    checks.push(Check::ok(CATEGORY, name, format!("Kubernetes {}", version.git)));
    let name = "is running a supported version";
    checks.push(if !version.at_least(OLDEST_MINOR) {
        Check::fail(
            VERSION,
            name,
            format!("Kubernetes {} is older than 1.{OLDEST_MINOR}", version.short()),
            format!("upgrade the cluster to Kubernetes 1.{OLDEST_MINOR} or newer"),
        )
    } else if pre && !version.at_least(NATIVE_SIDECARS_MINOR) {
        Check::warn(
            VERSION,
            name,
            format!(
                "Kubernetes {} has no native sidecars (1.{NATIVE_SIDECARS_MINOR}+): proxies will be regular containers",
                version.short()
            ),
            "supported as is; leave CNIMESH_CONTROL_NATIVE_SIDECARS at auto (or false), and upgrade to 1.29+ for native sidecars",
        )
    } else {
        Check::ok(VERSION, name, format!("Kubernetes {}", version.short()))
    });
    Some(version)
}

/// What install will do about the node agents' ValidatingAdmissionPolicy on this server: the
/// same decision install makes ([`NodeGuard::choose`]), so the report says what will happen.
fn node_guard(version: &ServerVersion) -> Check {
    let name = "the node agents' tokens are limited to their node";
    let version = cnimesh_model::inject::ServerVersion { major: version.major, minor: version.minor };
    match NodeGuard::choose(None, Some(version)) {
        Ok(guard) if guard.policy() => Check::ok(
            PRE,
            name,
            format!("Kubernetes {version}: install adds the ValidatingAdmissionPolicy that does it"),
        ),
        Ok(guard) => Check::warn(
            PRE,
            name,
            guard.describe(),
            "supported as is (install leaves the policy out and says so); upgrade the cluster to 1.30 and run `cnimesh upgrade` to add it",
        ),
        Err(error) => Check::fail(PRE, name, error.to_string(), "see docs/install/index.md, Requirements"),
    }
}

/// One permission to ask about. `namespace: None` is cluster-wide.
struct Access {
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    subresource: Option<&'static str>,
    namespace: Option<&'static str>,
}

impl Access {
    fn describe(&self) -> String {
        let resource = match self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.to_string(),
        };
        let where_ = match self.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "cluster-wide".to_string(),
        };
        format!("{} {resource} {where_}", self.verb)
    }
}

const fn access(verb: &'static str, group: &'static str, resource: &'static str, ns: Option<&'static str>) -> Access {
    Access { verb, group, resource, subresource: None, namespace: ns }
}

/// Whether the API server says we may do `access`.
async fn allowed(client: &kube::Client, access: &Access) -> Result<bool, String> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(access.verb.to_string()),
                group: Some(access.group.to_string()),
                resource: Some(access.resource.to_string()),
                subresource: access.subresource.map(str::to_string),
                namespace: access.namespace.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await.map_err(|e| kube_error(&e))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// One check line per permission, so that a missing grant is named on its own.
async fn permissions(
    client: &kube::Client,
    category: &Category,
    wanted: &[(&str, Vec<Access>)],
    checks: &mut Vec<Check>,
) {
    for (name, accesses) in wanted {
        let mut denied = Vec::new();
        let mut errors = Vec::new();
        for access in accesses {
            match allowed(client, access).await {
                Ok(true) => {}
                Ok(false) => denied.push(access.describe()),
                Err(e) => errors.push(format!("{}: {e}", access.describe())),
            }
        }
        let described: Vec<String> = accesses.iter().map(Access::describe).collect();
        checks.push(if !errors.is_empty() {
            Check::fail(
                category,
                name,
                "could not ask the API server (SelfSubjectAccessReview)",
                "check that authorization.k8s.io/v1 is served and that your credentials are valid",
            )
            .details(errors)
        } else if !denied.is_empty() {
            Check::fail(category, name, format!("not allowed to {}", denied.join("; ")), RBAC_HINT)
        } else {
            Check::ok(category, name, format!("may {}", described.join("; ")))
        });
    }
}

/// What `check` itself reads: every pod (meshed pods live anywhere), the mesh's Secrets, and the
/// pods' proxy subresource (agent status and proxy metrics).
pub async fn check_permissions(client: &kube::Client, checks: &mut Vec<Check>) {
    let wanted = [
        ("can list pods in all namespaces", vec![access("list", "", "pods", None)]),
        ("can read the mesh's secrets", vec![access("get", "", "secrets", Some(CONTROL_NAMESPACE))]),
        (
            "can reach pods through the API server proxy",
            vec![Access { verb: "get", group: "", resource: "pods", subresource: Some("proxy"), namespace: None }],
        ),
    ];
    permissions(client, RBAC, &wanted, checks).await;
}

/// `--pre`: what `install` creates, that there are nodes to run on, which guard the node
/// agents' tokens will get, and whether the mesh is already there.
pub async fn pre_install(client: &kube::Client, version: &ServerVersion, checks: &mut Vec<Check>) {
    checks.push(node_guard(version));
    let both = |verb, group, resource| {
        vec![
            access(verb, group, resource, Some(CONTROL_NAMESPACE)),
            access(verb, group, resource, Some(AGENT_NAMESPACE)),
        ]
    };
    let wanted = [
        ("can create namespaces", vec![access("create", "", "namespaces", None)]),
        ("can create cluster roles", vec![access("create", "rbac.authorization.k8s.io", "clusterroles", None)]),
        (
            "can create cluster role bindings",
            vec![access("create", "rbac.authorization.k8s.io", "clusterrolebindings", None)],
        ),
        (
            "can create mutating webhook configurations",
            vec![access("create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", None)],
        ),
        ("can create daemon sets", both("create", "apps", "daemonsets")),
        ("can create deployments", both("create", "apps", "deployments")),
        ("can create secrets", both("create", "", "secrets")),
    ];
    permissions(client, RBAC, &wanted, checks).await;

    let nodes: Api<Node> = Api::all(client.clone());
    checks.push(match nodes.list(&ListParams::default()).await {
        Ok(list) if list.items.is_empty() => Check::fail(
            PRE,
            "the cluster has nodes",
            "no nodes: nothing to run the node agent on",
            "add nodes (kubectl get nodes)",
        ),
        Ok(list) => Check::ok(PRE, "the cluster has nodes", super::report::plural(list.items.len(), "node")),
        Err(e) => Check::fail(
            PRE,
            "the cluster has nodes",
            format!("listing nodes: {}", kube_error(&e)),
            read_hint(&e, "allow listing nodes"),
        ),
    });

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let name = "the control plane namespace does not exist yet";
    checks.push(match namespaces.get_opt(CONTROL_NAMESPACE).await {
        Ok(None) => Check::ok(PRE, name, format!("namespace {CONTROL_NAMESPACE} is free")),
        Ok(Some(_)) => Check::warn(
            PRE,
            name,
            format!("namespace {CONTROL_NAMESPACE} exists: cnimesh may already be installed"),
            "run `cnimesh check` (without --pre) to check the installed mesh, or `cnimesh uninstall | kubectl delete -f -` first",
        ),
        Err(e) => Check::warn(
            PRE,
            name,
            format!("reading namespace {CONTROL_NAMESPACE}: {}", kube_error(&e)),
            read_hint(&e, "allow reading namespaces"),
        ),
    });
}
