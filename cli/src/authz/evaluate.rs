//! The report, from listed objects: they go into cnimesh-control's policy index as a source would
//! deliver them, each of the workload's ports is asked of it as a proxy would ask
//! (`watch_inbound`), and a client is checked against the authorizations it returns with the
//! proxy's own rules ([`cnimesh_policy_rules`]: an identity listed or under a listed suffix; an
//! address in a network, outside its exceptions, IPv4-mapped addresses as IPv4). Pure: no I/O.

use std::collections::BTreeSet;
use std::net::IpAddr;

use cnimesh_common::names::PROXY_CONTAINER;
use std::sync::Arc;

use cnimesh_model::egress;
use cnimesh_model::meta::NsName;
use cnimesh_model::outbound::{self, Parent};
use cnimesh_model::policy::DefaultPolicy;
use cnimesh_model::policy::index::{
    Authentication, Authorization, AuthzMeta, Change, Config, Index, Kind, Object, ServerMeta,
};
use cnimesh_policy_rules::{self as rules, Refusal};
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::list::Objects;
use crate::query_error::QueryError;

/// A client to check: its identity (none: not meshed, so plaintext) and, when known, its address.
#[derive(Debug, Clone, Serialize)]
pub struct Client {
    pub name: String,
    pub identity: Option<String>,
    pub ip: Option<IpAddr>,
}

impl Client {
    /// `SA.NS` or a full identity name (`SA.NS.serviceaccount.identity.cnimesh.DOMAIN`).
    pub fn from_identity(text: &str, trust_domain: &str) -> Result<Self, QueryError> {
        let name = if text.contains(".serviceaccount.") {
            cnimesh_identity::Name::parse(text)
                .map_err(|e| QueryError::bad_query(format!("--identity {text:?}: {e}")))?
        } else {
            let Some((sa, ns)) = text.split_once('.').filter(|(sa, ns)| !sa.is_empty() && !ns.contains('.')) else {
                return Err(QueryError::bad_query(format!(
                    "--identity {text:?}: expected SERVICEACCOUNT.NAMESPACE or a full identity name"
                )));
            };
            cnimesh_identity::Name::for_service_account(sa, ns, trust_domain)
                .map_err(|e| QueryError::bad_query(format!("--identity {text:?}: {e}")))?
        };
        Ok(Self { name: text.to_string(), identity: Some(name.to_string()), ip: None })
    }

    /// A client pod: its ServiceAccount's identity when meshed, and its address.
    pub fn from_pod(workload: &str, pod: &Pod, trust_domain: &str) -> Result<Self, QueryError> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let meshed =
            spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(|c| c.name == PROXY_CONTAINER);
        let sa = spec.service_account_name.clone().unwrap_or_else(|| "default".into());
        let identity = if meshed {
            Some(
                cnimesh_identity::Name::for_service_account(&sa, &ns, trust_domain)
                    .map_err(|e| QueryError::invalid(format!("{workload}'s ServiceAccount {ns}/{sa}"), e))?
                    .to_string(),
            )
        } else {
            None
        };
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()).and_then(|ip| ip.parse().ok());
        Ok(Self { name: workload.to_string(), identity, ip })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub resource: String,
    pub namespace: String,
    pub ports: Vec<PortReport>,
    /// Routes attached to the Services that select the workload's pods.
    pub routes: Vec<RouteReport>,
    pub client: Option<Client>,
    /// For ports in audit mode: what the proxies let through only because of it.
    pub would_be_denials: Vec<super::audit::WouldBeDenial>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PortReport {
    pub pod: String,
    pub port: u16,
    /// `server/NAME`, or `default/POLICY` when no Server selects the port.
    pub server: String,
    pub protocol: String,
    pub authorizations: Vec<AuthzReport>,
    /// Paths kubelet probes: allowed to anyone whatever the policy.
    pub probe_paths: Vec<String>,
    pub verdict: Option<Verdict>,
    /// In audit mode: what no authorization admits is let through as a would-be denial.
    pub audit: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct AuthzReport {
    /// `authorizationpolicy/NAME`, or `default/POLICY`.
    pub name: String,
    /// `any client`, or the mTLS identities (`*.suffix` for suffixes).
    pub clients: String,
    pub networks: Vec<String>,
    /// The policy's requiredAuthenticationRefs, as `kind/name`.
    pub requires: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub allowed: bool,
    pub why: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RouteReport {
    /// `httproute/NAME` or `grpcroute/NAME`.
    pub route: String,
    /// `svc/NAME[:PORT]` of the parents that select this workload.
    pub parents: Vec<String>,
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn objects(listed: &Objects) -> Vec<Change> {
    let of = |kind, items: Vec<Object>| Change::Reset(kind, items);
    vec![
        of(Kind::Namespace, listed.namespace.iter().cloned().map(Object::from).collect()),
        of(Kind::Pod, listed.pods.iter().cloned().map(Object::from).collect()),
        of(Kind::Server, listed.servers.iter().cloned().map(Object::from).collect()),
        of(Kind::AuthorizationPolicy, listed.policies.iter().cloned().map(Object::from).collect()),
        of(Kind::MeshTlsAuthentication, listed.mesh_tls.iter().cloned().map(Object::from).collect()),
        of(Kind::NetworkAuthentication, listed.networks.iter().cloned().map(Object::from).collect()),
        of(Kind::HttpLocalRateLimitPolicy, Vec::new()),
    ]
}

/// `a` as the proxy receives it (the control plane sends it so) and enforces it.
fn rules_authz(a: &Authorization) -> rules::Authz {
    let meta = match &a.meta {
        AuthzMeta::Default(DefaultPolicy::Audit) => rules::Resource::new("", rules::AUDIT_KIND, "audit"),
        AuthzMeta::Default(p) => rules::Resource::new("", "default", p.as_str()),
        AuthzMeta::Policy(key) => rules::Resource::new("policy.cnimesh.io", "authorizationpolicy", &key.name),
    };
    let authn = match &a.authentication {
        Authentication::Unauthenticated => rules::Authn::Unauthenticated,
        Authentication::MeshTls(ids) => rules::Authn::MeshTls {
            identities: ids.names.iter().map(|n| n.as_str().into()).collect(),
            suffixes: ids.suffixes.iter().map(|labels| rules::suffix(labels)).collect(),
        },
    };
    let networks = a.networks.iter().map(|n| rules::Network { net: n.net, except: n.except.clone() }).collect();
    rules::Authz { meta, networks, authn }
}

fn authz_name(a: &Authorization) -> String {
    match &a.meta {
        AuthzMeta::Default(p) => format!("default/{p}"),
        AuthzMeta::Policy(key) => format!("authorizationpolicy/{}", key.name),
    }
}

fn authz_report(a: &Authorization, listed: &Objects) -> AuthzReport {
    let clients = match &a.authentication {
        Authentication::Unauthenticated => "any client".to_string(),
        Authentication::MeshTls(ids) => {
            let mut all: Vec<String> = ids.names.iter().cloned().collect();
            all.extend(
                ids.suffixes.iter().map(|s| if s.is_empty() { "*".into() } else { format!("*.{}", s.join(".")) }),
            );
            format!("mTLS: {}", all.join(", "))
        }
    };
    let requires = match &a.meta {
        AuthzMeta::Policy(key) => listed
            .policies
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(key.name.as_str()))
            .map(|p| {
                p.spec
                    .required_authentication_refs
                    .iter()
                    .map(|r| {
                        let kind = serde_json::to_value(r.kind).ok().and_then(|v| v.as_str().map(str::to_lowercase));
                        format!("{}/{}", kind.unwrap_or_default(), r.name)
                    })
                    .collect()
            })
            .unwrap_or_default(),
        AuthzMeta::Default(_) => Vec::new(),
    };
    let networks = a
        .networks
        .iter()
        .map(|n| {
            let except: Vec<String> = n.except.iter().map(ToString::to_string).collect();
            if except.is_empty() { n.net.to_string() } else { format!("{} except {}", n.net, except.join(", ")) }
        })
        .collect();
    AuthzReport { name: authz_name(a), clients, networks, requires }
}

/// May `client` reach a port whose policy is `server` with `authorizations`? Decided by the
/// proxy's own rules ([`rules::decide`]): the first authorization admitting both its identity
/// and its address; each one before it says why it refused.
fn verdict(server: &str, authorizations: &[Authorization], client: &Client) -> Verdict {
    let enforced: Vec<rules::Authz> = authorizations.iter().map(rules_authz).collect();
    let decision = rules::decide(&enforced, client.identity.as_deref(), client.ip);
    let refused: Vec<String> = decision
        .refused
        .iter()
        .map(|&(i, why)| {
            let name = authz_name(&authorizations[i]);
            match why {
                Refusal::NeedsMeshTls => format!("{name} needs mTLS and {} is not meshed", client.name),
                Refusal::IdentityNotListed => {
                    format!("{name} does not list {}", client.identity.as_deref().unwrap_or("-"))
                }
                Refusal::AddressOutside => {
                    format!(
                        "{name} does not admit the address {}",
                        client.ip.map(|ip| ip.to_string()).unwrap_or_default()
                    )
                }
            }
        })
        .collect();
    if let Some(i) = decision.allowed_by {
        let a = &authorizations[i];
        if a.meta == AuthzMeta::Default(DefaultPolicy::Audit) {
            let why = format!("let through by audit mode, a would-be denial ({})", refused.join("; "));
            return Verdict { allowed: true, why: why.replace(" ()", "") };
        }
        let everywhere = a.networks.iter().any(|n| n.net.prefix_len() == 0 && n.except.is_empty());
        let note = if client.ip.is_some() || everywhere {
            ""
        } else {
            " (if its address is in the networks: use --from to check it)"
        };
        return Verdict { allowed: true, why: format!("allowed by {}{note}", authz_name(a)) };
    }
    let why = if authorizations.is_empty() {
        if server.starts_with("default/") {
            format!("denied: the default policy {} admits no one", server.trim_start_matches("default/"))
        } else {
            format!("denied: no AuthorizationPolicy targets {server}")
        }
    } else {
        format!("denied: {}", refused.join("; "))
    };
    Verdict { allowed: false, why }
}

/// The ports a pod's containers declare (the proxy's own excluded).
fn declared_ports(pod: &Pod) -> Vec<u16> {
    let spec = pod.spec.clone().unwrap_or_default();
    let ports: BTreeSet<u16> = spec
        .containers
        .iter()
        .filter(|c| c.name != PROXY_CONTAINER)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| u16::try_from(p.container_port).ok())
        .collect();
    ports.into_iter().collect()
}

/// The report for `pods` (for a Deployment and the like, the first pod stands for its replicas).
pub fn report(
    resource: &str,
    namespace: &str,
    pods: &[Pod],
    listed: &Objects,
    config: Config,
    client: Option<&Client>,
) -> Report {
    let index = Index::new(config);
    index.apply(objects(listed));
    let mut notes: Vec<String> = listed
        .missing
        .iter()
        .map(|kind| format!("{kind} could not be listed (CRD not installed?): none assumed"))
        .collect();
    let replicas = !resource.starts_with("pod/") && !resource.starts_with("ns/");
    let evaluated = if replicas { &pods[..1] } else { pods };
    if replicas && pods.len() > 1 {
        notes.push(format!("{} pods; {} stands for them (one template)", pods.len(), name_of(&pods[0].metadata)));
    }
    let mut ports = Vec::new();
    for pod in evaluated {
        let pod_name = name_of(&pod.metadata);
        let key = NsName::new(namespace, &pod_name);
        let declared = declared_ports(pod);
        if declared.is_empty() {
            notes.push(format!("pod {pod_name} declares no container ports: nothing to report"));
        }
        for port in declared {
            let Some(server) = index.watch_inbound(&key, port).borrow().clone() else { continue };
            let server_name = match &server.meta {
                ServerMeta::Server(name) => format!("server/{name}"),
                ServerMeta::Default(p) => format!("default/{p}"),
            };
            ports.push(PortReport {
                pod: pod_name.clone(),
                port,
                protocol: format!("{:?}", server.protocol).to_lowercase(),
                authorizations: server.authorizations.iter().map(|a| authz_report(a, listed)).collect(),
                probe_paths: server.probe_paths.iter().cloned().collect(),
                verdict: client.map(|c| verdict(&server_name, &server.authorizations, c)),
                server: server_name,
                audit: server.authorizations.iter().any(|a| a.meta == AuthzMeta::Default(DefaultPolicy::Audit)),
            });
        }
    }
    let routes = routes(&outbound_index(listed), namespace, evaluated, listed);
    Report {
        resource: resource.into(),
        namespace: namespace.into(),
        ports,
        routes,
        client: client.cloned(),
        would_be_denials: Vec::new(),
        notes,
    }
}

/// The outbound index over the listed routes: the one that attaches routes to Services for the
/// proxies' outbound policy.
fn outbound_index(listed: &Objects) -> outbound::Index {
    use cnimesh_model::index_list::{Change, Consumer, Kind, Object};
    let index = outbound::Index::new(egress::Index::new(egress::Config::new(Vec::new())));
    let http = listed.http_routes.iter().map(|r| Object::HttpRoute(Arc::new(r.clone())));
    let grpc = listed.grpc_routes.iter().map(|r| Object::GrpcRoute(Arc::new(r.clone())));
    index.apply(&Change::Reset(Kind::HttpRoute, http.collect()));
    index.apply(&Change::Reset(Kind::GrpcRoute, grpc.collect()));
    index.apply(&Change::Reset(Kind::ReferenceGrant, Vec::new()));
    index
}

/// Routes attached to the Services selecting any of `pods`, as the outbound index attaches them.
fn routes(index: &outbound::Index, namespace: &str, pods: &[Pod], listed: &Objects) -> Vec<RouteReport> {
    let empty = Default::default();
    let mut out: Vec<RouteReport> = Vec::new();
    for service in &listed.services {
        let Some(selector) = service.spec.as_ref().and_then(|s| s.selector.as_ref()).filter(|s| !s.is_empty()) else {
            continue;
        };
        let selects = pods.iter().any(|p| {
            let labels = p.metadata.labels.as_ref().unwrap_or(&empty);
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        });
        if !selects {
            continue;
        }
        let key = NsName::new(namespace, name_of(&service.metadata));
        for route in index.watch(&Parent::Service(key.clone())).borrow().iter() {
            let kind = match route.kind {
                cnimesh_model::routes::RouteKind::Http => "httproute",
                cnimesh_model::routes::RouteKind::Grpc => "grpcroute",
            };
            let name = format!("{kind}/{}", route.key.name);
            let parents = route.parents.iter().filter(|p| p.service == key).map(|p| match p.port {
                Some(port) => format!("svc/{}:{port}", key.name),
                None => format!("svc/{}", key.name),
            });
            match out.iter_mut().find(|r| r.route == name) {
                Some(r) => r.parents.extend(parents),
                None => out.push(RouteReport { route: name, parents: parents.collect() }),
            }
        }
    }
    out
}

#[cfg(test)]
mod agreement_tests {
    use cnimesh_model::meta::NsName;
    use cnimesh_model::policy::index::{Authentication, Authorization, AuthzMeta};
    use cnimesh_model::policy::model::Network;

    use super::{Client, rules, rules_authz, verdict};

    /// An IPv4 client the proxy sees through its IPv6 socket (`::ffff:a.b.c.d`) is matched as
    /// IPv4 by the proxy; `cnimesh authz` must give the same answer for the same address.
    #[test]
    fn the_cli_decides_an_ipv4_mapped_client_as_the_proxy_does() {
        let office = Authorization {
            meta: AuthzMeta::Policy(NsName::new("shop", "office")),
            networks: vec![Network {
                net: "10.1.0.0/16".parse().unwrap(),
                except: vec!["10.1.9.0/24".parse().unwrap()],
            }],
            authentication: Authentication::Unauthenticated,
        };
        let decide = |ip: &str| {
            let client = Client { name: "c".into(), identity: None, ip: Some(ip.parse().unwrap()) };
            verdict("server/web-http", std::slice::from_ref(&office), &client).allowed
        };
        // The proxy's decision: the function its request path calls, on the authorization as it
        // receives it.
        let proxy = |ip: &str| {
            let client = rules::Client { ip: ip.parse().unwrap(), identity: None };
            rules::authorized(&[rules_authz(&office)], client).is_some()
        };
        // What the proxy decides for these clients (its `authorize` tests: "IPv4-mapped", "except").
        for (ip, proxy_allows) in [
            ("10.1.2.3", true),
            ("::ffff:10.1.2.3", true),
            ("10.1.9.3", false),
            ("::ffff:10.1.9.3", false),
            ("10.2.0.1", false),
        ] {
            assert_eq!(proxy(ip), proxy_allows, "client {ip}: the proxy's rules changed");
            assert_eq!(decide(ip), proxy_allows, "client {ip}: the CLI disagrees with the proxy");
        }
    }
}
