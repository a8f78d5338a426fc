//! What the mesh carried into a namespace's workloads, read from their proxies' own inbound
//! authorization counters (`inbound_{http,tcp}_authz_allow_total`): per workload and port, the
//! client identities that were let in, the HTTPRoutes they used, and how much traffic came
//! without a mesh identity. Only traffic a policy authorized over mTLS is evidence: a request
//! some policy denied is not, and neither is one let in only because it hit a kubelet probe
//! route (open to anyone, by design) or only because the Server is in audit mode (a would-be
//! denial): those are kept as "seen, not granted" for the output's comments (audit ones are
//! evidence with `--include-audited`). The Server that already governs a port (its samples' `srv_*`
//! labels) is recorded, so its policy is extended rather than a second Server written.
//!
//! Layer: model (pure): the samples are read by the caller.

use std::collections::{BTreeMap, BTreeSet};

use cnimesh_common::names::{OWNER_KINDS, OWNER_LABEL_PREFIX};
use cnimesh_common::prom_text::Sample;
use cnimesh_policy_rules::{AUDIT_KIND, Resource, is_probe_route};

use crate::stat::mesh::PodView;

/// The pods a generated Server selects: one workload, by the label the injector gives its pods
/// (`cnimesh.io/proxy-deployment: web`), else by the labels all its pods share.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Workload {
    /// `deployment`, `statefulset`, … or `pod` for a pod without a controller.
    pub kind: String,
    pub name: String,
    pub selector: BTreeMap<String, String>,
}

/// Where the traffic of an HTTP request was authorized: an HTTPRoute on the port, or the
/// port's Server as a whole.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    Server,
    /// `group`, `name` of an inbound HTTPRoute the request matched.
    Route {
        group: String,
        name: String,
    },
}

/// Why traffic that was let in is not turned into a grant.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum NotGranted {
    /// It hit the kubelet probe route, which admits anyone (`route_kind="default"`,
    /// `route_name="probe"`).
    ProbeRoute,
    /// Only audit mode let it in (`authz_kind="audit"`): a would-be denial.
    Audit,
    /// An AuthorizationPolicy already allows it (`authz_kind="authorizationpolicy"`, this name).
    AlreadyAllowed(String),
}

/// One workload's port, as its proxies saw it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PortTraffic {
    /// Requests were seen (HTTP); otherwise only opaque connections were.
    pub http: bool,
    /// Requests (HTTP) or connections (opaque) authorized over mTLS, per client identity, per
    /// target: what is granted.
    pub clients: BTreeMap<Target, BTreeMap<String, f64>>,
    /// Allowed requests or connections without a mesh identity (plaintext or no client
    /// certificate), off the probe route: no generated policy admits them, and the output says so.
    pub unauthenticated: f64,
    /// Let in, but not evidence: per (client identity, or empty without one; why), how much.
    pub not_granted: BTreeMap<(String, NotGranted), f64>,
    /// The Server that already governs the port (`srv_kind="server"`): its policy is extended.
    pub server: Option<String>,
}

/// The namespace's observed traffic, and the pods left out with the reason.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    pub ports: BTreeMap<(Workload, u16), PortTraffic>,
    pub skipped: Vec<String>,
    /// Count what only audit mode let in as evidence (`--include-audited`).
    pub include_audited: bool,
}

/// The families read (`allow` only).
pub const SERIES: [&str; 2] = ["inbound_http_authz_allow_total", "inbound_tcp_authz_allow_total"];

/// The workload `pod` belongs to, and the labels that select exactly its pods.
pub fn workload_of(pod: &PodView, siblings: &[&PodView]) -> Option<Workload> {
    for kind in OWNER_KINDS {
        let key = format!("{OWNER_LABEL_PREFIX}{kind}");
        if let Some(name) = pod.labels.get(&key) {
            return Some(Workload {
                kind: kind.to_string(),
                name: name.clone(),
                selector: BTreeMap::from([(key, name.clone())]),
            });
        }
    }
    // Injected before the owner labels, or not by the webhook: the labels its workload's pods
    // share, minus the ones that differ per revision or per pod.
    const PER_POD: [&str; 3] = ["pod-template-hash", "controller-revision-hash", "statefulset.kubernetes.io/pod-name"];
    let (kind, name) = match &pod.owner {
        Some(owner) => (owner.kind.clone(), owner.name.clone()),
        None => ("pod".to_string(), pod.name.clone()),
    };
    let same: Vec<&&PodView> = siblings
        .iter()
        .filter(|p| {
            p.namespace == pod.namespace && p.owner.as_ref().map(|o| (&o.kind, &o.name)) == Some((&kind, &name))
        })
        .collect();
    let mut selector: BTreeMap<String, String> = pod
        .labels
        .iter()
        .filter(|(k, _)| !PER_POD.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    selector.retain(|k, v| same.iter().all(|p| p.labels.get(k) == Some(v)));
    (!selector.is_empty()).then_some(Workload { kind, name, selector })
}

/// The port of a `target_addr` label (`10.0.0.5:8080`, `[fd00::5]:8080`).
fn port_of(target_addr: &str) -> Option<u16> {
    target_addr.rsplit_once(':').and_then(|(_, port)| port.parse().ok())
}

/// The Server kind in the `srv_kind` label of a port governed by a Server resource.
const SERVER_KIND: &str = "server";
/// The authorization kind in `authz_kind` of an AuthorizationPolicy (audit mode's is the rules'
/// [`AUDIT_KIND`]): neither grants anything new by itself.
const POLICY_KIND: &str = "authorizationpolicy";

/// Whether a sample is of the kubelet probe route (the control plane's probe route and its
/// authorization, which admit anyone on the probe paths), as the proxy's rules know it.
fn on_probe_route(sample: &Sample) -> bool {
    let probe = |prefix: &str| {
        let label = |name: &str| sample.label(&format!("{prefix}_{name}"));
        is_probe_route(&Resource::new(label("group"), label("kind"), label("name")))
    };
    probe("route") || probe("authz")
}

/// Adds one pod's allow counters (`samples`, counts over the window) to `observed`.
pub fn add_pod(observed: &mut Observed, workload: &Workload, samples: &[(Sample, f64)]) {
    let include_audited = observed.include_audited;
    for (sample, count) in samples {
        let http = match sample.name.as_str() {
            "inbound_http_authz_allow_total" => true,
            "inbound_tcp_authz_allow_total" => false,
            _ => continue,
        };
        if *count <= 0.0 {
            continue;
        }
        let Some(port) = port_of(sample.label("target_addr")) else { continue };
        let traffic = observed.ports.entry((workload.clone(), port)).or_default();
        traffic.http |= http;
        if sample.label("srv_kind") == SERVER_KIND && !sample.label("srv_name").is_empty() {
            traffic.server = Some(sample.label("srv_name").to_string());
        }
        let identified = sample.label("tls") == "true" && !sample.label("client_id").is_empty();
        let client = if identified { sample.label("client_id") } else { "" };
        let not_granted = match sample.label("authz_kind") {
            _ if on_probe_route(sample) => Some(NotGranted::ProbeRoute),
            AUDIT_KIND if !include_audited => Some(NotGranted::Audit),
            POLICY_KIND if identified => Some(NotGranted::AlreadyAllowed(sample.label("authz_name").to_string())),
            _ => None,
        };
        if let Some(why) = not_granted {
            *traffic.not_granted.entry((client.to_string(), why)).or_default() += count;
            continue;
        }
        if !identified {
            traffic.unauthenticated += count;
            continue;
        }
        let target = match (http, sample.label("route_kind")) {
            (true, "HTTPRoute") => Target::Route {
                group: sample.label("route_group").to_string(),
                name: sample.label("route_name").into(),
            },
            _ => Target::Server,
        };
        *traffic.clients.entry(target).or_default().entry(client.to_string()).or_default() += count;
    }
}

impl PortTraffic {
    /// Every identity seen on the port, whatever the target.
    pub fn identities(&self) -> BTreeSet<&str> {
        self.clients.values().flat_map(|c| c.keys().map(String::as_str)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, labels: &[(&str, &str)]) -> PodView {
        PodView {
            namespace: "demo".into(),
            name: name.into(),
            ip: None,
            meshed: true,
            service_account: "web".into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            owner: None,
        }
    }

    fn sample(name: &str, labels: &[(&str, &str)]) -> Sample {
        Sample {
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            value: 0.0,
        }
    }

    #[test]
    fn the_injectors_owner_label_selects_the_workload() {
        let web = pod("web-1", &[("app", "web"), ("cnimesh.io/proxy-deployment", "web"), ("pod-template-hash", "x")]);
        let w = workload_of(&web, &[&web]).unwrap();
        assert_eq!((w.kind.as_str(), w.name.as_str()), ("deployment", "web"));
        assert_eq!(w.selector, BTreeMap::from([("cnimesh.io/proxy-deployment".into(), "web".into())]));
        let bare = pod("lonely", &[]);
        assert_eq!(workload_of(&bare, &[&bare]), None, "nothing could select it");
    }

    #[test]
    fn only_allowed_identified_traffic_names_clients_and_routes_are_kept_apart() {
        let web = workload_of(&pod("web-1", &[("cnimesh.io/proxy-deployment", "web")]), &[]).unwrap();
        let client = "client.demo.serviceaccount.identity.cnimesh.cluster.local";
        let samples = vec![
            (
                sample(
                    "inbound_http_authz_allow_total",
                    &[
                        ("target_addr", "10.0.0.5:8080"),
                        ("tls", "true"),
                        ("client_id", client),
                        ("route_kind", "default"),
                    ],
                ),
                40.0,
            ),
            (
                sample(
                    "inbound_http_authz_allow_total",
                    &[
                        ("target_addr", "10.0.0.5:8080"),
                        ("tls", "true"),
                        ("client_id", client),
                        ("route_kind", "HTTPRoute"),
                        ("route_group", "policy.cnimesh.io"),
                        ("route_name", "api"),
                    ],
                ),
                2.0,
            ),
            (
                sample(
                    "inbound_http_authz_deny_total",
                    &[("target_addr", "10.0.0.5:8080"), ("tls", "true"), ("client_id", "intruder.demo")],
                ),
                9.0,
            ),
            (sample("inbound_http_authz_allow_total", &[("target_addr", "10.0.0.5:8080"), ("tls", "false")]), 3.0),
            (
                sample(
                    "inbound_tcp_authz_allow_total",
                    &[("target_addr", "10.0.0.5:5432"), ("tls", "true"), ("client_id", client)],
                ),
                1.0,
            ),
            (
                sample(
                    "inbound_tcp_authz_allow_total",
                    &[("target_addr", "10.0.0.5:6379"), ("tls", "true"), ("client_id", client)],
                ),
                0.0,
            ),
        ];
        let mut observed = Observed::default();
        add_pod(&mut observed, &web, &samples);
        let http = &observed.ports[&(web.clone(), 8080)];
        assert!(http.http);
        assert_eq!(http.clients[&Target::Server][client], 40.0);
        assert_eq!(http.clients[&Target::Route { group: "policy.cnimesh.io".into(), name: "api".into() }][client], 2.0);
        assert_eq!(http.unauthenticated, 3.0);
        assert_eq!(http.identities(), BTreeSet::from([client]), "the denied intruder is not evidence");
        assert!(!observed.ports[&(web.clone(), 5432)].http);
        assert!(!observed.ports.contains_key(&(web, 6379)), "no traffic in the window");
    }
}
