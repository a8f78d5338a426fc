//! The facts policy needs from Pods, Namespaces and the policy resources, validated once when
//! they arrive. A resource that fails validation is reported with its name and reason
//! ([`Invalid`]) and the index keeps its last good version, so one bad edit never widens or
//! drops a policy that was in force.
//!
//! Layer: model/index (pure): Kubernetes and CRD types in, plain records out.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::str::FromStr;

use cnimesh_common::names::{DEFAULT_INBOUND_POLICY_ANNOTATION, PROXY_CONTAINER};
use cnimesh_identity::Name;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::crd::{self, AuthenticationKind, IdentityRefKind, LabelSelector, Port, SelectorOperator, TargetKind};
use crate::destination::PortSet;
use crate::destination::app_protocol::AppProtocol;
use crate::external::ExternalRecord;
use crate::meta::key_of;
use crate::meta::{Invalid, NsName};

/// What a port gets when no Server names it (the subset of Linkerd's default
/// policies that cnimesh supports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DefaultPolicy {
    /// Anyone, with or without mesh TLS: today's behaviour, so the default.
    #[default]
    AllUnauthenticated,
    /// Any client with a mesh TLS identity, from anywhere.
    AllAuthenticated,
    /// Any client with a mesh TLS identity, from the cluster networks.
    ClusterAuthenticated,
    /// Nobody (kubelet probes excepted).
    Deny,
    /// Anyone, but what no other authorization admits is logged and counted as a would-be
    /// denial (`authz_kind="audit"`): deny's roll-out mode (Linkerd 2.16's `audit`).
    Audit,
}

impl DefaultPolicy {
    pub const ALL: [DefaultPolicy; 5] =
        [Self::AllUnauthenticated, Self::AllAuthenticated, Self::ClusterAuthenticated, Self::Deny, Self::Audit];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllUnauthenticated => "all-unauthenticated",
            Self::AllAuthenticated => "all-authenticated",
            Self::ClusterAuthenticated => "cluster-authenticated",
            Self::Deny => "deny",
            Self::Audit => "audit",
        }
    }
}

impl FromStr for DefaultPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not a default policy ({})", Self::ALL.map(Self::as_str).join(", ")))
    }
}

impl std::fmt::Display for DefaultPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn invalid<T>(reason: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid(reason.into()))
}

/// A default-inbound-policy annotation. An unreadable value fails closed (deny): a typo in a
/// stricter policy must not open the port.
pub(crate) fn default_policy_of(owner: &str, meta: &ObjectMeta) -> Option<DefaultPolicy> {
    let value = meta.annotations.as_ref()?.get(DEFAULT_INBOUND_POLICY_ANNOTATION)?;
    Some(value.parse().unwrap_or_else(|error: String| {
        tracing::error!(object = owner, annotation = DEFAULT_INBOUND_POLICY_ANNOTATION, %error, "denying by default");
        DefaultPolicy::Deny
    }))
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceRecord {
    pub default_policy: Option<DefaultPolicy>,
}

impl NamespaceRecord {
    pub fn from_k8s(ns: &Namespace) -> Self {
        let name = ns.metadata.name.as_deref().unwrap_or_default();
        Self { default_policy: default_policy_of(name, &ns.metadata) }
    }
}

/// A pod as inbound policy sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRecord {
    pub labels: BTreeMap<String, String>,
    pub service_account: String,
    /// Container port name → number: Servers may name ports.
    pub named_ports: BTreeMap<String, u16>,
    /// Port → HTTP paths kubelet probes (liveness, readiness, startup `httpGet`): these stay
    /// reachable under any policy, or `all-authenticated` and `deny` would kill every pod.
    pub probes: BTreeMap<u16, BTreeSet<String>>,
    pub opaque_ports: PortSet,
    pub default_policy: Option<DefaultPolicy>,
    pub meshed: bool,
}

impl PodRecord {
    pub fn from_k8s(pod: &Pod) -> Self {
        let key = key_of(&pod.metadata);
        let spec = pod.spec.as_ref();
        let sidecars = spec
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or_default()
            .iter()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let containers: Vec<&Container> =
            spec.map(|s| s.containers.iter()).into_iter().flatten().chain(sidecars).collect();
        let named_ports: BTreeMap<String, u16> = containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.protocol.as_deref().is_none_or(|p| p == "TCP"))
            .filter_map(|p| Some((p.name.clone()?, u16::try_from(p.container_port).ok()?)))
            .collect();
        let mut probes: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
        for probe in containers.iter().flat_map(|c| [&c.liveness_probe, &c.readiness_probe, &c.startup_probe]) {
            if let Some((port, path)) = http_probe(probe.as_ref(), &named_ports) {
                probes.entry(port).or_default().insert(path);
            }
        }
        Self {
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            service_account: spec
                .and_then(|s| s.service_account_name.clone())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".to_string()),
            named_ports,
            probes,
            opaque_ports: PortSet::of(&key, &pod.metadata),
            default_policy: default_policy_of(&key.to_string(), &pod.metadata),
            meshed: containers.iter().any(|c| c.name == PROXY_CONTAINER),
        }
    }

    /// An ExternalWorkload's proxy, as policy sees it: its labels (Servers select it by them), its
    /// named ports, its opaque-ports and default-policy annotations; no probes (no kubelet).
    pub fn of_external(key: &NsName, workload: &ExternalRecord) -> Self {
        let meta = ObjectMeta { annotations: Some(workload.annotations.clone()), ..ObjectMeta::default() };
        Self {
            labels: workload.labels.clone(),
            service_account: workload.service_account.clone(),
            named_ports: workload.named_ports.clone(),
            probes: BTreeMap::new(),
            opaque_ports: PortSet::of(key, &meta),
            default_policy: default_policy_of(&key.to_string(), &meta),
            meshed: true,
        }
    }

    /// The number of a Server's port on this pod; a name no container declares selects nothing.
    pub fn resolve(&self, port: &Port) -> Option<u16> {
        match port {
            Port::Number(n) => Some(*n),
            Port::Name(name) => self.named_ports.get(name).copied(),
        }
    }
}

fn http_probe(probe: Option<&Probe>, named: &BTreeMap<String, u16>) -> Option<(u16, String)> {
    let get = probe?.http_get.as_ref()?;
    let port = match &get.port {
        IntOrString::Int(n) => u16::try_from(*n).ok()?,
        IntOrString::String(s) => s.parse().ok().or_else(|| named.get(s).copied())?,
    };
    Some((port, get.path.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "/".to_string())))
}

/// A label selector that is known to parse.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    labels: BTreeMap<String, String>,
    expressions: Vec<(String, SelectorOperator, BTreeSet<String>)>,
}

impl Selector {
    /// Kubernetes' rules: `In`/`NotIn` need values, `Exists`/`DoesNotExist` take none.
    pub fn new(selector: &LabelSelector) -> Result<Self, Invalid> {
        let mut expressions = Vec::new();
        for e in selector.match_expressions.iter().flatten() {
            let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
            let needs_values = matches!(e.operator, SelectorOperator::In | SelectorOperator::NotIn);
            if e.key.is_empty() || needs_values == values.is_empty() {
                return invalid(format!(
                    "podSelector expression {:?} {:?} {:?} selects nothing Kubernetes would accept",
                    e.key, e.operator, values
                ));
            }
            expressions.push((e.key.clone(), e.operator, values));
        }
        Ok(Self { labels: selector.match_labels.clone().unwrap_or_default(), expressions })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.expressions.iter().all(|(key, op, values)| {
                let value = labels.get(key);
                match op {
                    SelectorOperator::In => value.is_some_and(|v| values.contains(v)),
                    SelectorOperator::NotIn => value.is_none_or(|v| !values.contains(v)),
                    SelectorOperator::Exists => value.is_some(),
                    SelectorOperator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// How a port's connections are proxied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Detect HTTP, else forward bytes (`unknown`).
    Detect,
    Http1,
    Http2,
    Grpc,
    Opaque,
    Tls,
}

impl From<crd::ProxyProtocol> for Protocol {
    fn from(p: crd::ProxyProtocol) -> Self {
        match p {
            crd::ProxyProtocol::Unknown => Self::Detect,
            crd::ProxyProtocol::Http1 => Self::Http1,
            crd::ProxyProtocol::Http2 => Self::Http2,
            crd::ProxyProtocol::Grpc => Self::Grpc,
            crd::ProxyProtocol::Opaque => Self::Opaque,
            crd::ProxyProtocol::Tls => Self::Tls,
        }
    }
}

/// What a Service port's `appProtocol` declares, as the inbound proxy serves it.
impl From<AppProtocol> for Protocol {
    fn from(p: AppProtocol) -> Self {
        match p {
            AppProtocol::Http1 => Self::Http1,
            AppProtocol::Http2 => Self::Http2,
            AppProtocol::Opaque => Self::Opaque,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerRecord {
    pub selector: Selector,
    pub port: Port,
    pub protocol: Protocol,
    /// What clients no AuthorizationPolicy admits get (`accessPolicy`, default deny).
    pub access_policy: DefaultPolicy,
}

impl ServerRecord {
    pub fn from_crd(server: &crd::Server) -> Result<Self, Invalid> {
        let port = match &server.spec.port {
            Port::Number(0) => return invalid("port 0 is not a port"),
            Port::Name(name) if !valid_port_name(name) => {
                return invalid(format!("port name {name:?} is not a container port name (IANA_SVC_NAME)"));
            }
            port => port.clone(),
        };
        // Fail closed: a value we cannot read is refused (the last good Server stays), never
        // read as a wider mode.
        let access_policy = match server.spec.access_policy.as_deref() {
            None => DefaultPolicy::Deny,
            Some(value) => value.parse().map_err(|e: String| Invalid(format!("accessPolicy: {e}")))?,
        };
        Ok(Self {
            selector: Selector::new(&server.spec.pod_selector)?,
            port,
            protocol: server.spec.proxy_protocol.into(),
            access_policy,
        })
    }
}

fn valid_port_name(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

/// What an AuthorizationPolicy applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Server(String),
    /// Every Server of the policy's namespace.
    Namespace,
    /// Not served yet (no routes); kept so the policy is not reported as invalid.
    HttpRoute(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthzPolicyRecord {
    pub target: Target,
    /// At most one: a MeshTLSAuthentication or a ServiceAccount.
    pub identity: Option<IdentityRef>,
    /// At most one NetworkAuthentication.
    pub network: Option<NsName>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityRef {
    MeshTls(NsName),
    /// A ServiceAccount's identity (namespace, name).
    ServiceAccount(NsName),
}

impl AuthzPolicyRecord {
    pub fn from_crd(policy: &crd::AuthorizationPolicy) -> Result<Self, Invalid> {
        let ns = key_of(&policy.metadata).namespace;
        let spec = &policy.spec;
        let target = match spec.target_ref.kind {
            TargetKind::Server => Target::Server(spec.target_ref.name.clone()),
            TargetKind::Namespace if spec.target_ref.name == ns => Target::Namespace,
            TargetKind::Namespace => {
                return invalid(format!(
                    "targetRef names namespace {:?}; a policy may only target its own ({ns:?})",
                    spec.target_ref.name
                ));
            }
            TargetKind::HttpRoute => Target::HttpRoute(spec.target_ref.name.clone()),
        };
        let (mut identity, mut network) = (None, None);
        for r in &spec.required_authentication_refs {
            let key = NsName::new(r.namespace.clone().unwrap_or_else(|| ns.clone()), &r.name);
            let (slot, value, what) = match r.kind {
                AuthenticationKind::MeshTls => (&mut identity, Some(IdentityRef::MeshTls(key.clone())), "identity"),
                AuthenticationKind::ServiceAccount => {
                    (&mut identity, Some(IdentityRef::ServiceAccount(key.clone())), "identity")
                }
                AuthenticationKind::NetworkAuthentication => {
                    if network.replace(key).is_some() {
                        return invalid("more than one NetworkAuthentication in requiredAuthenticationRefs");
                    }
                    continue;
                }
            };
            if slot.replace(value.expect("set above")).is_some() {
                return invalid(format!(
                    "more than one {what} authentication (MeshTLSAuthentication or ServiceAccount) in requiredAuthenticationRefs"
                ));
            }
        }
        Ok(Self { target, identity, network })
    }
}

/// The largest rate a policy may name, per proxy: more is a typo, not a limit (a proxy does not
/// serve a million requests a second).
pub const MAX_REQUESTS_PER_SECOND: u32 = 1_000_000;

/// A validated `HTTPLocalRateLimitPolicy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitRecord {
    /// The Server it limits (in the policy's namespace).
    pub server: String,
    /// When it was created: of two policies for one Server, the older wins.
    pub created: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    pub total: Option<u32>,
    pub identity: Option<u32>,
    /// Per override: its rate and the client identity names it applies to.
    pub overrides: Vec<(u32, BTreeSet<String>)>,
}

impl RateLimitRecord {
    pub fn from_crd(policy: &crd::HttpLocalRateLimitPolicy, trust_domain: &str) -> Result<Self, Invalid> {
        let ns = key_of(&policy.metadata).namespace;
        let spec = &policy.spec;
        let target = &spec.target_ref;
        if target.kind != "Server" || !(target.group.is_empty() || target.group == crd::GROUP) {
            return invalid(format!(
                "targetRef {}/{} {:?}: a rate limit can only target a Server (group {})",
                if target.group.is_empty() { "<core>" } else { &target.group },
                target.kind,
                target.name,
                crd::GROUP
            ));
        }
        if target.name.is_empty() {
            return invalid("targetRef names no Server");
        }
        let rate = |what: &str, rps: u32| {
            if (1..=MAX_REQUESTS_PER_SECOND).contains(&rps) {
                Ok(rps)
            } else {
                invalid(format!("{what} {rps} requests per second: expected 1 to {MAX_REQUESTS_PER_SECOND}"))
            }
        };
        let total = spec.total.map(|l| rate("total", l.requests_per_second)).transpose()?;
        let identity = spec.identity.map(|l| rate("identity", l.requests_per_second)).transpose()?;
        let at_most_total = |what: &str, rps: u32| match total {
            Some(t) if rps > t => invalid(format!("{what} {rps} requests per second is above total ({t})")),
            _ => Ok(()),
        };
        if let Some(i) = identity {
            at_most_total("identity", i)?;
        }
        let mut overrides = Vec::new();
        for (i, o) in spec.overrides.iter().enumerate() {
            let rps = rate(&format!("overrides[{i}]"), o.requests_per_second)?;
            at_most_total(&format!("overrides[{i}]"), rps)?;
            if o.client_refs.is_empty() {
                return invalid(format!("overrides[{i}] has no clientRefs: it would apply to nobody"));
            }
            let mut names = BTreeSet::new();
            for c in &o.client_refs {
                if c.kind != "ServiceAccount" || !c.group.is_empty() {
                    return invalid(format!(
                        "overrides[{i}].clientRefs kind {:?}: only ServiceAccount (core group) is supported",
                        c.kind
                    ));
                }
                let c_ns = c.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| ns.clone());
                let name = Name::for_service_account(&c.name, &c_ns, trust_domain)
                    .map_err(|e| Invalid(format!("overrides[{i}].clientRefs ServiceAccount {c_ns}/{}: {e}", c.name)))?;
                names.insert(name.to_string());
            }
            overrides.push((rps, names));
        }
        if total.is_none() && identity.is_none() && overrides.is_empty() {
            return invalid("sets no limit: give total, identity or overrides");
        }
        Ok(Self {
            server: target.name.clone(),
            created: policy.metadata.creation_timestamp.clone(),
            total,
            identity,
            overrides,
        })
    }
}

/// Client identities: exact names and suffixes (`*` is the empty suffix, which matches all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identities {
    pub names: BTreeSet<String>,
    pub suffixes: BTreeSet<Vec<String>>,
}

impl Identities {
    pub fn from_crd(authn: &crd::MeshTlsAuthentication, trust_domain: &str) -> Result<Self, Invalid> {
        let ns = key_of(&authn.metadata).namespace;
        let spec = &authn.spec;
        let (ids, refs) =
            (spec.identities.as_deref().unwrap_or_default(), spec.identity_refs.as_deref().unwrap_or_default());
        if ids.is_empty() == refs.is_empty() {
            return invalid("exactly one of identities and identityRefs must be given");
        }
        let mut out = Self::default();
        for id in ids {
            if id == "*" {
                out.suffixes.insert(Vec::new());
            } else if let Some(suffix) = id.strip_prefix("*.") {
                Name::parse(suffix).map_err(|e| Invalid(format!("identity {id:?}: {e}")))?;
                out.suffixes.insert(suffix.split('.').map(String::from).collect());
            } else {
                out.names.insert(Name::parse(id).map_err(|e| Invalid(format!("identity {id:?}: {e}")))?.to_string());
            }
        }
        for r in refs {
            let r_ns = r.namespace.clone().unwrap_or_else(|| ns.clone());
            match r.kind {
                IdentityRefKind::ServiceAccount if r.name == "*" => {
                    out.suffixes.insert(namespace_suffix(&r_ns, trust_domain));
                }
                IdentityRefKind::ServiceAccount => {
                    let name = Name::for_service_account(&r.name, &r_ns, trust_domain)
                        .map_err(|e| Invalid(format!("identityRef ServiceAccount {r_ns}/{}: {e}", r.name)))?;
                    out.names.insert(name.to_string());
                }
                IdentityRefKind::Namespace => {
                    out.suffixes.insert(namespace_suffix(&r.name, trust_domain));
                }
            }
        }
        Ok(out)
    }

    pub fn service_account(key: &NsName, trust_domain: &str) -> Result<Self, Invalid> {
        let name = Name::for_service_account(&key.name, &key.namespace, trust_domain)
            .map_err(|e| Invalid(format!("ServiceAccount {key}: {e}")))?;
        Ok(Self { names: [name.to_string()].into(), suffixes: BTreeSet::new() })
    }

    /// Any mesh TLS identity.
    pub fn any() -> Self {
        Self { names: BTreeSet::new(), suffixes: [Vec::new()].into() }
    }
}

/// The identities of every ServiceAccount of a namespace end in this.
fn namespace_suffix(ns: &str, trust_domain: &str) -> Vec<String> {
    [ns, "serviceaccount", "identity", "cnimesh"]
        .into_iter()
        .map(String::from)
        .chain(trust_domain.split('.').map(String::from))
        .collect()
}

/// A client network: a CIDR minus exceptions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Network {
    pub net: IpNet,
    pub except: Vec<IpNet>,
}

impl Network {
    /// Every address, IPv4 and IPv6.
    pub fn all() -> Vec<Network> {
        ["0.0.0.0/0", "::/0"].map(|n| Network { net: n.parse().expect("valid"), except: Vec::new() }).to_vec()
    }
}

/// A CIDR, or a bare address as a host network.
pub fn parse_net(s: &str) -> Result<IpNet, Invalid> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| Invalid(format!("{s:?} is not a CIDR or an IP address")))
}

pub fn networks_from_crd(authn: &crd::NetworkAuthentication) -> Result<Vec<Network>, Invalid> {
    if authn.spec.networks.is_empty() {
        return invalid("networks is empty");
    }
    authn
        .spec
        .networks
        .iter()
        .map(|n| {
            Ok(Network {
                net: parse_net(&n.cidr)?,
                except: n.except.iter().flatten().map(|e| parse_net(e)).collect::<Result<_, _>>()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
        serde_saphyr::from_str(text).unwrap()
    }

    #[test]
    fn pods_yield_labels_named_ports_and_probe_paths() {
        let pod: Pod = yaml(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: n, labels: {app: web}, annotations: {config.cnimesh.io/default-inbound-policy: deny}}\nspec:\n  containers:\n  - name: app\n    ports: [{name: http, containerPort: 8080}]\n    livenessProbe: {httpGet: {port: http, path: /live}}\n    readinessProbe: {httpGet: {port: 8080}}\n    startupProbe: {tcpSocket: {port: 9}}\n",
        );
        let rec = PodRecord::from_k8s(&pod);
        assert_eq!(rec.labels["app"], "web");
        assert_eq!(rec.resolve(&Port::Name("http".into())), Some(8080));
        assert_eq!(rec.resolve(&Port::Name("nope".into())), None);
        assert_eq!(rec.probes[&8080], BTreeSet::from(["/".to_string(), "/live".to_string()]));
        assert_eq!(rec.default_policy, Some(DefaultPolicy::Deny));
        assert!(!rec.meshed);
    }

    #[test]
    fn a_misspelt_default_policy_denies() {
        let ns: Namespace = yaml(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: n, annotations: {config.cnimesh.io/default-inbound-policy: all-unauthenticatd}}\n",
        );
        assert_eq!(NamespaceRecord::from_k8s(&ns).default_policy, Some(DefaultPolicy::Deny));
        assert_eq!("cluster-authenticated".parse(), Ok(DefaultPolicy::ClusterAuthenticated));
    }

    #[test]
    fn selectors_follow_kubernetes_rules() {
        let sel: LabelSelector = yaml(
            "matchLabels: {app: web}\nmatchExpressions: [{key: tier, operator: In, values: [a, b]}, {key: canary, operator: DoesNotExist}]\n",
        );
        let sel = Selector::new(&sel).unwrap();
        let labels = |l: &[(&str, &str)]| l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert!(sel.matches(&labels(&[("app", "web"), ("tier", "a")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "c")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "a"), ("canary", "1")])));
        for bad in ["{key: a, operator: In}", "{key: a, operator: Exists, values: [x]}", "{key: '', operator: Exists}"]
        {
            let sel: LabelSelector = yaml(&format!("matchExpressions: [{bad}]"));
            assert!(Selector::new(&sel).is_err(), "{bad}");
        }
        assert!(Selector::new(&LabelSelector::default()).unwrap().matches(&BTreeMap::new()), "empty selects all");
    }

    #[test]
    fn bad_servers_and_authentications_are_refused_with_a_reason() {
        let server: crd::Server = yaml(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {name: s, namespace: n}\nspec: {podSelector: {}, port: Not_A_Name}\n",
        );
        assert!(ServerRecord::from_crd(&server).unwrap_err().0.contains("IANA_SVC_NAME"));
        let authn: crd::MeshTlsAuthentication = yaml(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {name: m, namespace: n}\nspec: {identities: ['web..n']}\n",
        );
        assert!(Identities::from_crd(&authn, "cluster.local").unwrap_err().0.contains("web..n"));
        let net: crd::NetworkAuthentication = yaml(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: NetworkAuthentication\nmetadata: {name: m, namespace: n}\nspec: {networks: [{cidr: 10.0.0.0/33}]}\n",
        );
        assert!(networks_from_crd(&net).unwrap_err().0.contains("10.0.0.0/33"));
        let policy: crd::AuthorizationPolicy = yaml(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {name: a, namespace: n}\nspec:\n  targetRef: {kind: Server, name: s}\n  requiredAuthenticationRefs: [{kind: ServiceAccount, name: x}, {kind: MeshTLSAuthentication, name: m}]\n",
        );
        assert!(AuthzPolicyRecord::from_crd(&policy).unwrap_err().0.contains("more than one identity"));
    }

    fn rate_limit(spec: &str) -> Result<RateLimitRecord, Invalid> {
        let policy: crd::HttpLocalRateLimitPolicy = yaml(&format!(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: HTTPLocalRateLimitPolicy\nmetadata: {{name: r, namespace: n}}\nspec:\n{spec}"
        ));
        RateLimitRecord::from_crd(&policy, "cluster.local")
    }

    #[test]
    fn rate_limits_parse_with_overrides_as_identities() {
        let r = rate_limit(
            "  targetRef: {group: policy.cnimesh.io, kind: Server, name: api}\n  total: {requestsPerSecond: 100}\n  identity: {requestsPerSecond: 20}\n  overrides:\n  - requestsPerSecond: 80\n    clientRefs: [{kind: ServiceAccount, name: web}, {kind: ServiceAccount, name: ops, namespace: tools}]\n",
        )
        .unwrap();
        assert_eq!((r.server.as_str(), r.total, r.identity), ("api", Some(100), Some(20)));
        let ids: Vec<&str> = r.overrides[0].1.iter().map(String::as_str).collect();
        assert_eq!(
            (r.overrides[0].0, ids),
            (
                80,
                vec![
                    "ops.tools.serviceaccount.identity.cnimesh.cluster.local",
                    "web.n.serviceaccount.identity.cnimesh.cluster.local"
                ]
            )
        );
    }

    #[test]
    fn bad_rate_limits_are_refused_with_the_reason() {
        let target = "  targetRef: {kind: Server, name: api}\n";
        let cases = [
            (format!("{target}  total: {{requestsPerSecond: 0}}\n"), "total 0 requests per second"),
            (format!("{target}  total: {{requestsPerSecond: 2000000}}\n"), "expected 1 to 1000000"),
            (
                format!("{target}  total: {{requestsPerSecond: 10}}\n  identity: {{requestsPerSecond: 20}}\n"),
                "identity 20 requests per second is above total (10)",
            ),
            (
                format!("{target}  overrides: [{{requestsPerSecond: 5, clientRefs: []}}]\n"),
                "overrides[0] has no clientRefs",
            ),
            (
                format!(
                    "{target}  overrides: [{{requestsPerSecond: 5, clientRefs: [{{kind: Namespace, name: x}}]}}]\n"
                ),
                "only ServiceAccount",
            ),
            (
                "  targetRef: {kind: Service, name: api}\n  total: {requestsPerSecond: 5}\n".into(),
                "can only target a Server",
            ),
            (target.to_string(), "sets no limit"),
        ];
        for (spec, why) in cases {
            let e = rate_limit(&spec).unwrap_err().0;
            assert!(e.contains(why), "{spec}: {e}");
        }
    }

    #[test]
    fn access_policies_parse_and_an_unknown_one_is_refused() {
        let server = |mode: &str| -> crd::Server {
            yaml(&format!(
                "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {{name: s, namespace: n}}\nspec: {{podSelector: {{}}, port: 80{mode}}}\n"
            ))
        };
        assert_eq!(ServerRecord::from_crd(&server("")).unwrap().access_policy, DefaultPolicy::Deny);
        assert_eq!(
            ServerRecord::from_crd(&server(", accessPolicy: audit")).unwrap().access_policy,
            DefaultPolicy::Audit
        );
        let e = ServerRecord::from_crd(&server(", accessPolicy: audti")).unwrap_err().0;
        assert!(e.contains("accessPolicy: \"audti\" is not a default policy"), "{e}");
    }

    #[test]
    fn identity_refs_become_names_and_suffixes() {
        let authn: crd::MeshTlsAuthentication = yaml(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {name: m, namespace: n}\nspec:\n  identityRefs: [{kind: ServiceAccount, name: web}, {kind: Namespace, name: ops}]\n",
        );
        let ids = Identities::from_crd(&authn, "cluster.local").unwrap();
        assert_eq!(ids.names, BTreeSet::from(["web.n.serviceaccount.identity.cnimesh.cluster.local".to_string()]));
        let suffix: Vec<String> =
            ["ops", "serviceaccount", "identity", "cnimesh", "cluster", "local"].map(String::from).to_vec();
        assert_eq!(ids.suffixes, BTreeSet::from([suffix]));
    }
}
