//! A port's authorization policy as plain structures: who may connect ([`Authz`]: networks and
//! authentication) and which route a request takes ([`Route`]). Built by the proxy from the
//! control plane's answer, and by the CLI from the policy objects it lists.

use std::sync::Arc;

use ipnet::IpNet;

/// A policy resource (server, route, authorization), as Linkerd names them in metrics:
/// `<prefix>_group`, `<prefix>_kind`, `<prefix>_name`. `Arc<str>` so a copy is a reference count,
/// not a string copy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Resource {
    pub group: Arc<str>,
    pub kind: Arc<str>,
    pub name: Arc<str>,
}

impl Resource {
    pub fn new(group: &str, kind: &str, name: &str) -> Self {
        Self { group: group.into(), kind: kind.into(), name: name.into() }
    }
}

/// The kind of the authorization audit mode adds (metadata `Default("audit")` on the wire, as
/// Linkerd's policy controller sends it): `authz_kind="audit"` in the metrics finds the requests
/// only it admitted — the would-be denials.
pub const AUDIT_KIND: &str = "audit";

/// The kind and name of the route the control plane adds for a port's kubelet probe paths
/// (metadata `Default("probe")`); a route of the cluster's own (an HTTPRoute) never has kind
/// `default`.
pub const PROBE_ROUTE: (&str, &str) = ("default", "probe");

/// Whether `meta` is the kubelet probe route's: open to every client and, so that no client can
/// spend the budget the kubelet's probes need, outside every rate limit.
pub fn is_probe_route(meta: &Resource) -> bool {
    meta.group.is_empty() && (&*meta.kind, &*meta.name) == PROBE_ROUTE
}

/// One authorization: a client is admitted when its address is in one of `networks` and its
/// authentication satisfies `authn`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authz {
    pub meta: Resource,
    pub networks: Vec<Network>,
    pub authn: Authn,
}

/// A network and the networks inside it that are not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    pub net: IpNet,
    pub except: Vec<IpNet>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authn {
    Unauthenticated,
    /// An mTLS client whose identity is one of `identities` or ends in one of `suffixes`
    /// (each stored with its leading dot, see [`suffix`]; an empty suffix admits any identity).
    MeshTls {
        identities: Vec<Arc<str>>,
        suffixes: Vec<Arc<str>>,
    },
}

/// An identity suffix as [`Authn::MeshTls`] stores it, from its DNS labels (as the control
/// plane sends them): `["ns", "serviceaccount", …]` is `.ns.serviceaccount.…`; no labels is the
/// empty suffix, which matches every identity.
pub fn suffix<S: AsRef<str>>(labels: &[S]) -> Arc<str> {
    labels
        .iter()
        .fold(String::new(), |mut out, label| {
            out.push('.');
            out.push_str(label.as_ref());
            out
        })
        .into()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub meta: Resource,
    /// Any one matching selects the route.
    pub matches: Vec<RouteMatch>,
    /// Empty: the server's authorizations apply (what the control plane sends for its default
    /// route); see [`Route::authorizations_or`].
    pub authorizations: Vec<Authz>,
}

impl Route {
    /// The authorizations a request on this route is held to: its own, or the server's when it
    /// carries none.
    pub fn authorizations_or<'a>(&'a self, server: &'a [Authz]) -> &'a [Authz] {
        if self.authorizations.is_empty() { server } else { &self.authorizations }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteMatch {
    pub path: PathMatch,
    pub method: Option<http::Method>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    Any,
    Exact(Box<str>),
    /// Gateway API semantics: whole path segments (`/a` matches `/a` and `/a/b`, not `/ab`).
    Prefix(Box<str>),
}
