//! The mirror planner: from what the linked clusters hold (records, never a client) and the
//! mirrors this cluster has, the mirrors it should have and the writes that get it there. Pure,
//! so every case of the contract (docs: /work/prompts/mc-contract.md, "Objects") is a unit test:
//!
//! - a Service labelled [`MIRROR_EXPORTED_LABEL`]`=true` becomes `<name>-<cluster>` with one
//!   EndpointSlice holding the Link's gateway (ports: the gateway port under each Service port's
//!   name; annotated with the gateway's identity);
//! - `=remote-discovery` becomes `<name>-<cluster>` with one slice per (identity, opaque ports)
//!   of the remote ready pods;
//! - [`MIRROR_FEDERATED_LABEL`]`=member` in any linked cluster, and in this one, becomes one
//!   `<name>-federated` whose slices are the union of every member's pods;
//! - a mirror nobody asks for any more is deleted; a lost link's mirrors keep their last
//!   endpoints and are annotated lost; the mirrors of a Link that cannot be read (refused, not
//!   yet connected) are left exactly as they are;
//! - names collide (`web-us` of `west` and `web` of `us-west` are both `web-us-west`): a name
//!   claimed twice stays with whoever holds it now (the existing mirror's cluster), every other
//!   claimant is refused and named in [`Plan::collisions`]; when nobody holds it yet, nobody gets
//!   it. A name that is a Service of this cluster's own (not a mirror) is never a mirror.
//! - mirror names are injective across Links by construction: an export of Link `west` whose
//!   mirror name ends in `-<another Link's cluster name>` (`web-us` → `web-us-west`, with
//!   `us-west` linked) is never mirrored, that name is the other Link's; Links with equal
//!   cluster names are refused by the controller ([`super::overlap`]).
//!
//! Layer: model (pure).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use cnimesh_common::names::{
    MIRROR_CLUSTER_NAME_LABEL, MIRROR_EXPORTED_GATEWAY, MIRROR_EXPORTED_LABEL, MIRROR_EXPORTED_REMOTE_DISCOVERY,
    MIRROR_FEDERATED_LABEL, MIRROR_FEDERATED_MEMBER, MIRROR_FEDERATED_MEMBERS_ANNOTATION,
    MIRROR_GATEWAY_IDENTITY_ANNOTATION, MIRROR_LINK_STATE_ANNOTATION, MIRROR_REMOTE_IDENTITY_ANNOTATION,
    MIRROR_REMOTE_OPAQUE_PORTS_ANNOTATION, MIRROR_REMOTE_RESOURCE_VERSION_ANNOTATION, MIRROR_REMOTE_SERVICE_ANNOTATION,
    MIRRORED_SERVICE_LABEL, OPAQUE_PORTS_ANNOTATION,
};
use k8s_openapi::api::core::v1::{Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::link::ValidLink;
use cnimesh_model::destination::PodRecord;
use cnimesh_model::meta::NsName;

/// The cluster name federated slices of this cluster's own members carry (and the members
/// annotation lists).
pub const LOCAL_CLUSTER: &str = cnimesh_common::names::MIRROR_LOCAL_CLUSTER;
/// `<name>-federated`.
pub const FEDERATED_SUFFIX: &str = "federated";
/// The well-known label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// A mirror's state while its link is lost.
pub const LINK_STATE_LOST: &str = "lost";

/// What one cluster holds, as the mirror reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub pods: Vec<Pod>,
}

/// One mirror: its Service and all its EndpointSlices, written together or not at all.
#[derive(Debug, Clone, PartialEq)]
pub struct Mirror {
    pub service: Service,
    pub slices: Vec<EndpointSlice>,
}

impl Mirror {
    pub fn key(&self) -> NsName {
        NsName::of(&self.service.metadata)
    }

    /// The linked cluster it mirrors; `None` for a federated Service.
    pub fn cluster(&self) -> Option<&str> {
        label(&self.service.metadata, MIRROR_CLUSTER_NAME_LABEL)
    }

    /// `gateway`, `remote-discovery` or `federated` (as [`super::crd::MirrorStatus::mode`]).
    pub fn mode(&self) -> &'static str {
        if self.cluster().is_none() {
            "federated"
        } else if self.slices.iter().any(|s| annotation(&s.metadata, MIRROR_GATEWAY_IDENTITY_ANNOTATION).is_some()) {
            "gateway"
        } else {
            "remote-discovery"
        }
    }

    /// Endpoint addresses over all slices.
    pub fn endpoints(&self) -> usize {
        self.slices.iter().flat_map(|s| &s.endpoints).map(|e| e.addresses.len()).sum()
    }

    /// `namespace/name` of the remote Service (from its fully qualified name).
    pub fn remote(&self) -> String {
        let fq = annotation(&self.service.metadata, MIRROR_REMOTE_SERVICE_ANNOTATION).unwrap_or_default();
        let mut parts = fq.splitn(3, '.');
        match (parts.next(), parts.next()) {
            (Some(name), Some(ns)) => format!("{ns}/{name}"),
            _ => fq.to_string(),
        }
    }

    /// Whether it is marked lost.
    pub fn is_lost(&self) -> bool {
        annotation(&self.service.metadata, MIRROR_LINK_STATE_ANNOTATION) == Some(LINK_STATE_LOST)
    }

    /// What the planner decides on: without what the API server or the writer adds (the
    /// allocated ClusterIP, resource versions, uids, managed fields, timestamps), slices in order.
    pub fn normalized(&self) -> Mirror {
        fn meta(m: &ObjectMeta) -> ObjectMeta {
            ObjectMeta {
                name: m.name.clone(),
                namespace: m.namespace.clone(),
                labels: m.labels.clone().filter(|l| !l.is_empty()),
                annotations: m.annotations.clone().filter(|a| !a.is_empty()),
                ..Default::default()
            }
        }
        let mut service = self.service.clone();
        service.metadata = meta(&service.metadata);
        service.status = None;
        if let Some(spec) = service.spec.as_mut() {
            spec.cluster_ip = None;
            spec.cluster_ips = None;
            spec.ip_families = None;
            spec.ip_family_policy = None;
            spec.internal_traffic_policy = None;
            spec.session_affinity = None;
        }
        let mut slices: Vec<EndpointSlice> =
            self.slices.iter().map(|s| EndpointSlice { metadata: meta(&s.metadata), ..s.clone() }).collect();
        slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Mirror { service, slices }
    }
}

/// What the planner knows of one Link.
#[derive(Debug, Clone, Copy)]
pub enum View<'a> {
    /// The target answers: its current state.
    Up(&'a Snapshot),
    /// The target stopped answering: its last state.
    Lost(&'a Snapshot),
    /// Not read (refused, bad credentials, not connected yet): its mirrors stay as they are.
    Unavailable,
    /// Refused because its cluster name overlaps an earlier Link's ([`super::overlap`]): it
    /// mirrors nothing (its mirrors go), and its name still reserves `*-<cluster>` against the
    /// Links whose cluster names it ends in.
    Overlapping,
}

#[derive(Debug, Clone, Copy)]
pub struct LinkInput<'a> {
    pub link: &'a ValidLink,
    /// The gateway's IP (the Link's address, resolved).
    pub gateway_ip: Option<IpAddr>,
    pub view: View<'a>,
}

/// This cluster: its own federated members and the names it gives identities.
#[derive(Debug, Clone, Copy)]
pub struct Local<'a> {
    pub snapshot: Option<&'a Snapshot>,
    pub trust_domain: &'a str,
    pub cluster_domain: &'a str,
}

/// An export the planner could not mirror, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub cluster: String,
    pub service: NsName,
    pub reason: String,
}

#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Every mirror that should exist now, kept ones included.
    pub desired: Vec<Mirror>,
    /// Mirrors to create or replace.
    pub upserts: Vec<Mirror>,
    /// Mirrors to delete (their Service and slices).
    pub deletes: Vec<NsName>,
    pub skipped: Vec<Skipped>,
    /// Names claimed by more than one linked Service (or by a Service of this cluster), one entry
    /// per claimant.
    pub collisions: Vec<Collision>,
}

/// One claimant of a contested mirror name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collision {
    pub mirror: NsName,
    /// The claimant's linked cluster (None: the federated Service).
    pub cluster: Option<String>,
    /// The claimant's Service, `namespace/name` in its cluster.
    pub remote: String,
    /// Whether this claimant holds the mirror (it had it first); the others are refused.
    pub holder: bool,
    /// The other claimants, in words.
    pub with: Vec<String>,
}

/// A claimant in words: `<cluster>'s <ns>/<name>`, or the federated Service.
fn claimant(mirror: &Mirror) -> String {
    match mirror.cluster() {
        Some(cluster) => format!("{cluster}'s {}", mirror.remote()),
        None => format!("the federated Service of {}", mirror.remote()),
    }
}

/// The mirrors every Link and this cluster's own federated members ask for, against `existing`.
pub fn plan(links: &[LinkInput<'_>], local: &Local<'_>, existing: &[Mirror]) -> Plan {
    let mut plan = Plan::default();
    // Every mirror asked for, by name: more than one claimant is a collision.
    let mut claims: BTreeMap<NsName, Vec<Mirror>> = BTreeMap::new();
    let unavailable: BTreeSet<&str> =
        links.iter().filter(|l| matches!(l.view, View::Unavailable)).map(|l| l.link.cluster.as_str()).collect();
    for input in links {
        let (snapshot, lost) = match input.view {
            View::Up(s) => (s, false),
            View::Lost(s) => (s, true),
            View::Unavailable | View::Overlapping => continue,
        };
        // The longer cluster names ending in this one's: the mirror names they own.
        let longer: Vec<&str> = links
            .iter()
            .map(|l| l.link.cluster.as_str())
            .filter(|c| *c != input.link.cluster && super::overlap::overlap(c, &input.link.cluster))
            .filter(|c| c.len() > input.link.cluster.len())
            .collect();
        for service in &snapshot.services {
            let exported = label(&service.metadata, MIRROR_EXPORTED_LABEL);
            let Some(exported) = exported else { continue };
            let key = NsName::of(&service.metadata);
            let skip = |reason: String| Skipped { cluster: input.link.cluster.clone(), service: key.clone(), reason };
            let mirror = match exported {
                MIRROR_EXPORTED_GATEWAY => gateway_mirror(input, service, lost),
                MIRROR_EXPORTED_REMOTE_DISCOVERY => Ok(discovery_mirror(input.link, snapshot, service, lost)),
                other => Err(format!(
                    "{MIRROR_EXPORTED_LABEL}={other:?} is neither {MIRROR_EXPORTED_GATEWAY:?} nor {MIRROR_EXPORTED_REMOTE_DISCOVERY:?}"
                )),
            };
            match mirror {
                Ok(mirror) if !crate::link::is_dns_label(&mirror.key().name) => {
                    plan.skipped.push(skip(format!("the mirror's name {:?} is not a DNS label", mirror.key().name)))
                }
                Ok(mirror) => match longer.iter().find(|c| mirror.key().name.ends_with(&format!("-{c}"))) {
                    Some(owner) => {
                        let key = mirror.key();
                        plan.skipped.push(skip(format!(
                            "its mirror name {key} ends in \"-{owner}\", the mirror names of the Link to cluster {owner}: refused"
                        )));
                        plan.collisions.push(Collision {
                            mirror: key,
                            cluster: Some(input.link.cluster.clone()),
                            remote: mirror.remote(),
                            holder: false,
                            with: vec![format!("the mirror names of cluster {owner}")],
                        });
                    }
                    None => claims.entry(mirror.key()).or_default().push(mirror),
                },
                Err(reason) => plan.skipped.push(skip(reason)),
            }
        }
    }
    for mirror in federated(links, local, existing) {
        claims.entry(mirror.key()).or_default().push(mirror);
    }
    // The mirrors of a Link that cannot be read stay as they were: they still hold their names.
    for mirror in existing {
        if mirror.cluster().is_some_and(|c| unavailable.contains(c)) {
            claims.entry(mirror.key()).or_default().push(mirror.clone());
        }
    }
    let desired = settle(claims, local, existing, &mut plan);
    let existing: HashMap<NsName, Mirror> = existing.iter().map(|m| (m.key(), m.normalized())).collect();
    for (key, mirror) in &desired {
        if existing.get(key) != Some(&mirror.normalized()) {
            plan.upserts.push(mirror.clone());
        }
    }
    plan.deletes = existing.keys().filter(|k| !desired.contains_key(*k)).cloned().collect();
    plan.deletes.sort();
    plan.desired = desired.into_values().collect();
    plan
}

/// One mirror per name: a name claimed once is granted; claimed twice, it stays with the
/// claimant whose mirror holds it now and every other claimant is refused (all of them when none
/// holds it: the first to ask is no owner, only an accident of order); a name that is a Service
/// of this cluster's own is granted to nobody. Every refusal is a [`Collision`] and a [`Skipped`].
fn settle(
    claims: BTreeMap<NsName, Vec<Mirror>>,
    local: &Local<'_>,
    existing: &[Mirror],
    plan: &mut Plan,
) -> BTreeMap<NsName, Mirror> {
    let own: BTreeSet<NsName> = local
        .snapshot
        .map(|s| s.services.iter().filter(|s| !is_mirror(s)).map(|s| NsName::of(&s.metadata)).collect())
        .unwrap_or_default();
    let held: HashMap<NsName, Option<&str>> = existing.iter().map(|m| (m.key(), m.cluster())).collect();
    let mut desired = BTreeMap::new();
    for (key, mut claimants) in claims {
        let local_service = own.contains(&key);
        if claimants.len() == 1 && !local_service {
            desired.insert(key, claimants.remove(0));
            continue;
        }
        let holder = if local_service {
            None
        } else {
            held.get(&key).and_then(|owner| claimants.iter().position(|m| m.cluster() == *owner))
        };
        let names: Vec<String> = claimants.iter().map(claimant).collect();
        for (i, mirror) in claimants.iter().enumerate() {
            let mut with: Vec<String> =
                names.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, n)| n.clone()).collect();
            if local_service {
                with.push(format!("this cluster's own Service {key}"));
            }
            let is_holder = holder == Some(i);
            if !is_holder {
                let remote = mirror.remote();
                let service = remote.split_once('/').map_or_else(|| key.clone(), |(ns, name)| NsName::new(ns, name));
                plan.skipped.push(Skipped {
                    cluster: mirror.cluster().unwrap_or(FEDERATED_SUFFIX).to_string(),
                    service,
                    reason: format!("its mirror name {key} is also claimed by {}: refused", with.join(", ")),
                });
            }
            plan.collisions.push(Collision {
                mirror: key.clone(),
                cluster: mirror.cluster().map(str::to_string),
                remote: mirror.remote(),
                holder: is_holder,
                with,
            });
        }
        if let Some(i) = holder {
            desired.insert(key, claimants.swap_remove(i));
        }
    }
    desired
}

fn gateway_mirror(input: &LinkInput<'_>, service: &Service, lost: bool) -> Result<Mirror, String> {
    let gateway = input.link.gateway.as_ref().map_err(|reason| format!("a gateway export, but {reason}"))?;
    let ip = input.gateway_ip.ok_or_else(|| format!("the gateway address {:?} is not resolved", gateway.address))?;
    let mut mirror = mirror_service(input.link, service, lost);
    let mirror_name = mirror.key().name;
    let ports = service_ports(service)
        .iter()
        .map(|p| EndpointPort {
            name: p.name.clone(),
            port: Some(i32::from(gateway.port)),
            protocol: Some("TCP".into()),
            app_protocol: None,
        })
        .collect();
    let mut meta = slice_meta(&mirror_name, &mirror.key().namespace, "gateway", Some(&input.link.cluster));
    meta.annotations =
        Some(BTreeMap::from([(MIRROR_GATEWAY_IDENTITY_ANNOTATION.to_string(), gateway.identity.clone())]));
    mirror.slices.push(EndpointSlice {
        metadata: meta,
        address_type: if ip.is_ipv4() { "IPv4" } else { "IPv6" }.into(),
        endpoints: vec![ready_endpoint(ip.to_string())],
        ports: Some(ports),
    });
    Ok(mirror)
}

fn discovery_mirror(link: &ValidLink, snapshot: &Snapshot, service: &Service, lost: bool) -> Mirror {
    let mut mirror = mirror_service(link, service, lost);
    let key = mirror.key();
    let groups = member_groups(snapshot, service, &link.cluster, &link.trust_domain);
    mirror.slices = slices_of(&key, groups, |_| Some(link.cluster.clone()));
    mirror
}

/// The mirror Service of `service` from `link`, without slices.
fn mirror_service(link: &ValidLink, service: &Service, lost: bool) -> Mirror {
    let key = NsName::of(&service.metadata);
    let name = format!("{}-{}", key.name, link.cluster);
    let labels = BTreeMap::from([
        (MIRRORED_SERVICE_LABEL.to_string(), "true".to_string()),
        (MIRROR_CLUSTER_NAME_LABEL.to_string(), link.cluster.clone()),
    ]);
    let mut annotations = BTreeMap::from([(
        MIRROR_REMOTE_SERVICE_ANNOTATION.to_string(),
        format!("{}.{}.svc.{}", key.name, key.namespace, link.cluster_domain),
    )]);
    if let Some(version) = &service.metadata.resource_version {
        annotations.insert(MIRROR_REMOTE_RESOURCE_VERSION_ANNOTATION.to_string(), version.clone());
    }
    if lost {
        annotations.insert(MIRROR_LINK_STATE_ANNOTATION.to_string(), LINK_STATE_LOST.to_string());
    }
    Mirror {
        service: service_object(&key.namespace, &name, labels, annotations, service_ports(service)),
        slices: Vec::new(),
    }
}

fn service_object(
    namespace: &str,
    name: &str,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    ports: Vec<ServicePort>,
) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(ServiceSpec { type_: Some("ClusterIP".into()), ports: Some(ports), ..Default::default() }),
        status: None,
    }
}

/// The remote Service's ports as the mirror's: name, port, protocol, appProtocol; targetPort =
/// port (there is no selector: the slices say where traffic goes).
fn service_ports(service: &Service) -> Vec<ServicePort> {
    service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|p| ServicePort {
            name: p.name.clone(),
            port: p.port,
            protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
            app_protocol: p.app_protocol.clone(),
            target_port: Some(IntOrString::Int(p.port)),
            node_port: None,
        })
        .collect()
}

/// Endpoints of one member that share what a slice carries.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct GroupKey {
    cluster: String,
    identity: Option<String>,
    opaque: Option<String>,
    address_type: String,
    ports: Vec<PortKey>,
}

/// An EndpointSlice port: name, number, protocol, appProtocol.
type PortKey = (Option<String>, Option<i32>, Option<String>, Option<String>);

/// The ready endpoints of `service` in `snapshot`, grouped by (identity, opaque ports, address
/// type, ports). An endpoint whose pod is not (yet) known is left out: whether it is meshed is
/// unknown, and guessing plaintext for a meshed pod would be wrong.
fn member_groups(
    snapshot: &Snapshot,
    service: &Service,
    cluster: &str,
    trust_domain: &str,
) -> BTreeMap<GroupKey, BTreeSet<String>> {
    let key = NsName::of(&service.metadata);
    let pods: HashMap<NsName, &Pod> = snapshot.pods.iter().map(|p| (NsName::of(&p.metadata), p)).collect();
    let mut groups: BTreeMap<GroupKey, BTreeSet<String>> = BTreeMap::new();
    for slice in &snapshot.slices {
        let slice_key = NsName::of(&slice.metadata);
        if slice_key.namespace != key.namespace || label(&slice.metadata, SERVICE_NAME_LABEL) != Some(&key.name) {
            continue;
        }
        let ports: Vec<_> = slice
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone(), p.port, p.protocol.clone(), p.app_protocol.clone()))
            .collect();
        for endpoint in &slice.endpoints {
            if endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            let (identity, opaque) = match &endpoint.target_ref {
                Some(target) if target.kind.as_deref() == Some("Pod") => {
                    let pod_key = NsName::new(
                        target.namespace.clone().unwrap_or_else(|| key.namespace.clone()),
                        target.name.clone().unwrap_or_default(),
                    );
                    let Some(pod) = pods.get(&pod_key) else { continue };
                    let record = PodRecord::from_k8s(pod);
                    let identity = record
                        .meshed
                        .then(|| {
                            cnimesh_identity::Name::for_service_account(
                                &record.service_account,
                                &pod_key.namespace,
                                trust_domain,
                            )
                            .ok()
                        })
                        .flatten()
                        .map(|n| n.to_string());
                    (identity, annotation(&pod.metadata, OPAQUE_PORTS_ANNOTATION).map(str::to_string))
                }
                _ => (None, None),
            };
            let group = GroupKey {
                cluster: cluster.to_string(),
                identity,
                opaque,
                address_type: slice.address_type.clone(),
                ports: ports.clone(),
            };
            groups.entry(group).or_default().extend(endpoint.addresses.iter().cloned());
        }
    }
    groups
}

/// One slice per group, named `<mirror>-<hash of the group>`.
fn slices_of(
    mirror: &NsName,
    groups: BTreeMap<GroupKey, BTreeSet<String>>,
    cluster_label: impl Fn(&GroupKey) -> Option<String>,
) -> Vec<EndpointSlice> {
    let mut slices: Vec<EndpointSlice> = groups
        .into_iter()
        .map(|(group, addresses)| {
            let suffix = format!("{:010x}", fnv1a(&format!("{group:?}")) & 0xff_ffff_ffff);
            let mut meta = slice_meta(&mirror.name, &mirror.namespace, &suffix, cluster_label(&group).as_deref());
            let mut annotations = BTreeMap::new();
            if let Some(identity) = &group.identity {
                annotations.insert(MIRROR_REMOTE_IDENTITY_ANNOTATION.to_string(), identity.clone());
            }
            if let Some(opaque) = &group.opaque {
                annotations.insert(MIRROR_REMOTE_OPAQUE_PORTS_ANNOTATION.to_string(), opaque.clone());
            }
            meta.annotations = Some(annotations).filter(|a| !a.is_empty());
            EndpointSlice {
                metadata: meta,
                address_type: group.address_type.clone(),
                endpoints: addresses.into_iter().map(ready_endpoint).collect(),
                ports: Some(
                    group
                        .ports
                        .iter()
                        .map(|(name, port, protocol, app_protocol)| EndpointPort {
                            name: name.clone(),
                            port: *port,
                            protocol: protocol.clone(),
                            app_protocol: app_protocol.clone(),
                        })
                        .collect(),
                ),
            }
        })
        .collect();
    slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    slices
}

/// `<name>-federated` for every Service some member labels [`MIRROR_FEDERATED_MEMBER`]: this
/// cluster's own (as [`LOCAL_CLUSTER`]) and every readable Link's; a Link that cannot be read
/// keeps the slices it had in the existing federated Service.
fn federated(links: &[LinkInput<'_>], local: &Local<'_>, existing: &[Mirror]) -> Vec<Mirror> {
    struct Member<'a> {
        cluster: &'a str,
        trust_domain: &'a str,
        cluster_domain: &'a str,
        snapshot: &'a Snapshot,
        service: &'a Service,
    }
    let is_member = |s: &Service| label(&s.metadata, MIRROR_FEDERATED_LABEL) == Some(MIRROR_FEDERATED_MEMBER);
    let mut members: BTreeMap<NsName, Vec<Member<'_>>> = BTreeMap::new();
    if let Some(snapshot) = local.snapshot {
        for service in snapshot.services.iter().filter(|s| is_member(s)) {
            members.entry(NsName::of(&service.metadata)).or_default().push(Member {
                cluster: LOCAL_CLUSTER,
                trust_domain: local.trust_domain,
                cluster_domain: local.cluster_domain,
                snapshot,
                service,
            });
        }
    }
    for input in links {
        let snapshot = match input.view {
            View::Up(s) | View::Lost(s) => s,
            View::Unavailable | View::Overlapping => continue,
        };
        for service in snapshot.services.iter().filter(|s| is_member(s)) {
            members.entry(NsName::of(&service.metadata)).or_default().push(Member {
                cluster: &input.link.cluster,
                trust_domain: &input.link.trust_domain,
                cluster_domain: &input.link.cluster_domain,
                snapshot,
                service,
            });
        }
    }
    let unavailable: BTreeSet<&str> =
        links.iter().filter(|l| matches!(l.view, View::Unavailable)).map(|l| l.link.cluster.as_str()).collect();
    let existing: HashMap<NsName, &Mirror> =
        existing.iter().filter(|m| m.cluster().is_none()).map(|m| (m.key(), m)).collect();
    let mut mirrors = Vec::new();
    for (key, members) in members {
        let Some(first) = members.first() else { continue };
        let name = format!("{}-{FEDERATED_SUFFIX}", key.name);
        if !crate::link::is_dns_label(&name) {
            tracing::warn!(service = %key, name, "the federated Service's name is not a DNS label; not mirrored");
            continue;
        }
        let mirror_key = NsName::new(key.namespace.clone(), name.clone());
        let mut groups = BTreeMap::new();
        let mut clusters: BTreeSet<String> = BTreeSet::new();
        for member in &members {
            clusters.insert(member.cluster.to_string());
            groups.extend(member_groups(member.snapshot, member.service, member.cluster, member.trust_domain));
        }
        let mut slices = slices_of(&mirror_key, groups, |g| Some(g.cluster.clone()));
        // Slices of members whose Link cannot be read now: as they were.
        if let Some(old) = existing.get(&mirror_key) {
            for slice in &old.slices {
                if let Some(cluster) =
                    label(&slice.metadata, MIRROR_CLUSTER_NAME_LABEL).filter(|c| unavailable.contains(c))
                {
                    clusters.insert(cluster.to_string());
                    slices.push(slice.clone());
                }
            }
            slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        }
        let labels = BTreeMap::from([(MIRRORED_SERVICE_LABEL.to_string(), "true".to_string())]);
        let annotations = BTreeMap::from([
            (
                MIRROR_REMOTE_SERVICE_ANNOTATION.to_string(),
                format!("{}.{}.svc.{}", key.name, key.namespace, first.cluster_domain),
            ),
            (MIRROR_FEDERATED_MEMBERS_ANNOTATION.to_string(), clusters.into_iter().collect::<Vec<_>>().join(",")),
        ]);
        let service = service_object(&key.namespace, &name, labels, annotations, service_ports(first.service));
        mirrors.push(Mirror { service, slices });
    }
    mirrors
}

fn slice_meta(mirror: &str, namespace: &str, suffix: &str, cluster: Option<&str>) -> ObjectMeta {
    let mut labels = BTreeMap::from([
        (SERVICE_NAME_LABEL.to_string(), mirror.to_string()),
        (MIRRORED_SERVICE_LABEL.to_string(), "true".to_string()),
    ]);
    if let Some(cluster) = cluster {
        labels.insert(MIRROR_CLUSTER_NAME_LABEL.to_string(), cluster.to_string());
    }
    ObjectMeta {
        name: Some(format!("{mirror}-{suffix}")),
        namespace: Some(namespace.to_string()),
        labels: Some(labels),
        ..Default::default()
    }
}

fn ready_endpoint(address: String) -> Endpoint {
    Endpoint {
        addresses: vec![address],
        conditions: Some(EndpointConditions { ready: Some(true), serving: Some(true), terminating: Some(false) }),
        ..Default::default()
    }
}

/// Whether `service` is a mirror (labelled [`MIRRORED_SERVICE_LABEL`]`=true`): only mirrors are
/// ever written or deleted by the mirror controller.
pub fn is_mirror(service: &Service) -> bool {
    label(&service.metadata, MIRRORED_SERVICE_LABEL) == Some("true")
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// FNV-1a (64 bit): a stable, dependency-free name suffix (not a security boundary).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::link::tests::link;

    fn valid(cluster: &str) -> ValidLink {
        ValidLink::from_link(&link(cluster)).unwrap()
    }

    fn service(name: &str, labels: serde_json::Value, ports: serde_json::Value) -> Service {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "shop", "labels": labels, "resourceVersion": "7"},
            "spec": {"clusterIP": "10.96.0.10", "ports": ports, "selector": {"app": name}}}),
        )
        .unwrap()
    }

    fn http() -> serde_json::Value {
        json!([{"name": "http", "port": 80, "targetPort": 8080}])
    }

    /// `service`'s slice with `pods` (name, ip, ready), port 8080 named `http`.
    fn slice(service: &str, pods: &[(&str, &str, bool)]) -> EndpointSlice {
        let endpoints: Vec<_> = pods
            .iter()
            .map(|(pod, ip, ready)| {
                json!({"addresses": [ip], "conditions": {"ready": ready},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": "shop"}})
            })
            .collect();
        serde_json::from_value(json!({"metadata": {"name": format!("{service}-x1"), "namespace": "shop",
            "labels": {"kubernetes.io/service-name": service}}, "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": endpoints}))
        .unwrap()
    }

    fn pod(name: &str, ip: &str, sa: &str, meshed: bool, opaque: Option<&str>) -> Pod {
        let mut containers = vec![json!({"name": "app"})];
        if meshed {
            containers.push(json!({"name": "cnimesh-proxy"}));
        }
        let annotations = opaque.map(|o| json!({"config.cnimesh.io/opaque-ports": o})).unwrap_or(json!({}));
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "shop", "annotations": annotations},
            "spec": {"serviceAccountName": sa, "containers": containers},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}))
        .unwrap()
    }

    fn web(exported: &str, pods: &[(&str, &str, bool)]) -> Snapshot {
        Snapshot {
            services: vec![service("web", json!({MIRROR_EXPORTED_LABEL: exported}), http())],
            slices: vec![slice("web", pods)],
            pods: pods.iter().map(|(name, ip, _)| pod(name, ip, "web", true, None)).collect(),
        }
    }

    fn local() -> Local<'static> {
        Local { snapshot: None, trust_domain: "east.local", cluster_domain: "cluster.local" }
    }

    fn up<'a>(link: &'a ValidLink, snapshot: &'a Snapshot) -> LinkInput<'a> {
        LinkInput { link, gateway_ip: link.gateway.as_ref().ok().and_then(|g| g.ip()), view: View::Up(snapshot) }
    }

    fn labels(meta: &ObjectMeta) -> BTreeMap<String, String> {
        meta.labels.clone().unwrap_or_default()
    }

    fn addresses(mirror: &Mirror) -> Vec<String> {
        let mut all: Vec<String> =
            mirror.slices.iter().flat_map(|s| &s.endpoints).flat_map(|e| e.addresses.clone()).collect();
        all.sort();
        all
    }

    #[test]
    fn a_gateway_export_becomes_one_slice_holding_the_gateway_under_each_service_port_name() {
        let west = valid("west");
        let mut remote = web("true", &[("web-0", "10.2.0.5", true)]);
        remote.services[0] = service(
            "web",
            json!({MIRROR_EXPORTED_LABEL: "true"}),
            json!([{"name": "http", "port": 80, "targetPort": 8080,
                "appProtocol": "http"}, {"name": "grpc", "port": 9090, "targetPort": "grpc"}]),
        );
        let plan = plan(&[up(&west, &remote)], &local(), &[]);
        assert!(plan.skipped.is_empty() && plan.deletes.is_empty(), "{plan:?}");
        let [mirror] = plan.upserts.as_slice() else { panic!("{plan:?}") };
        assert_eq!(mirror.key(), NsName::new("shop", "web-west"));
        assert_eq!(mirror.mode(), "gateway");
        let meta = &mirror.service.metadata;
        assert_eq!(
            labels(meta),
            BTreeMap::from([
                (MIRRORED_SERVICE_LABEL.into(), "true".into()),
                (MIRROR_CLUSTER_NAME_LABEL.into(), "west".into())
            ])
        );
        assert_eq!(annotation(meta, MIRROR_REMOTE_SERVICE_ANNOTATION), Some("web.shop.svc.cluster.local"));
        assert_eq!(annotation(meta, MIRROR_REMOTE_RESOURCE_VERSION_ANNOTATION), Some("7"));
        let spec = mirror.service.spec.as_ref().unwrap();
        assert_eq!(
            (spec.type_.as_deref(), spec.selector.as_ref(), spec.cluster_ip.as_ref()),
            (Some("ClusterIP"), None, None)
        );
        let ports = spec.ports.as_ref().unwrap();
        assert_eq!(ports[0].app_protocol.as_deref(), Some("http"));
        assert_eq!(
            ports.iter().map(|p| (p.port, p.target_port.clone())).collect::<Vec<_>>(),
            [(80, Some(IntOrString::Int(80))), (9090, Some(IntOrString::Int(9090)))]
        );
        let [slice] = mirror.slices.as_slice() else { panic!("{mirror:?}") };
        assert_eq!(slice.metadata.name.as_deref(), Some("web-west-gateway"));
        assert_eq!(labels(&slice.metadata)[SERVICE_NAME_LABEL], "web-west");
        assert_eq!(labels(&slice.metadata)[MIRROR_CLUSTER_NAME_LABEL], "west");
        assert_eq!(
            annotation(&slice.metadata, MIRROR_GATEWAY_IDENTITY_ANNOTATION),
            west.gateway.as_ref().ok().map(|g| g.identity.as_str())
        );
        assert_eq!(addresses(mirror), ["192.0.2.10"]);
        let slice_ports: Vec<_> = slice.ports.iter().flatten().map(|p| (p.name.as_deref(), p.port)).collect();
        assert_eq!(slice_ports, [(Some("http"), Some(4143)), (Some("grpc"), Some(4143))]);
    }

    #[test]
    fn a_remote_discovery_export_gets_a_slice_per_identity_and_a_plaintext_one_for_pods_without_the_proxy() {
        let west = valid("west");
        let mut remote = web(
            "remote-discovery",
            &[
                ("web-0", "10.2.0.5", true),
                ("web-1", "10.2.0.6", true),
                ("old-0", "10.2.0.7", true),
                ("gone-0", "10.2.0.8", false),
            ],
        );
        remote.pods[2] = pod("old-0", "10.2.0.7", "web", false, None);
        remote.pods[1] = pod("web-1", "10.2.0.6", "admin", true, Some("5432"));
        let plan = plan(&[up(&west, &remote)], &local(), &[]);
        let [mirror] = plan.upserts.as_slice() else { panic!("{plan:?}") };
        assert_eq!(mirror.mode(), "remote-discovery");
        let by_identity: BTreeMap<Option<&str>, (Vec<&str>, Option<&str>)> = mirror
            .slices
            .iter()
            .map(|s| {
                let addresses = s.endpoints.iter().flat_map(|e| &e.addresses).map(String::as_str).collect();
                (
                    annotation(&s.metadata, MIRROR_REMOTE_IDENTITY_ANNOTATION),
                    (addresses, annotation(&s.metadata, MIRROR_REMOTE_OPAQUE_PORTS_ANNOTATION)),
                )
            })
            .collect();
        assert_eq!(
            by_identity,
            BTreeMap::from([
                (Some("web.shop.serviceaccount.identity.cnimesh.west.local"), (vec!["10.2.0.5"], None)),
                (Some("admin.shop.serviceaccount.identity.cnimesh.west.local"), (vec!["10.2.0.6"], Some("5432"))),
                (None, (vec!["10.2.0.7"], None)),
            ])
        );
        for slice in &mirror.slices {
            assert!(slice.metadata.name.as_deref().unwrap().starts_with("web-west-"));
            assert_eq!(slice.ports.as_ref().unwrap()[0].name.as_deref(), Some("http"));
            assert!(slice.endpoints.iter().all(|e| e.target_ref.is_none()), "remote pods are not local pods");
        }
    }

    #[test]
    fn a_gateway_export_without_a_gateway_is_skipped_with_the_reason_and_remote_discovery_still_works() {
        let mut l = link("west");
        l.spec.gateway_identity = None;
        let west = ValidLink::from_link(&l).unwrap();
        let mut remote = web("true", &[("web-0", "10.2.0.5", true)]);
        let mut flat = service("db", json!({MIRROR_EXPORTED_LABEL: "remote-discovery"}), http());
        flat.metadata.name = Some("db".into());
        remote.services.push(flat);
        remote.slices.push(slice("db", &[("web-0", "10.2.0.5", true)]));
        let plan = plan(&[up(&west, &remote)], &local(), &[]);
        assert_eq!(plan.upserts.iter().map(Mirror::key).collect::<Vec<_>>(), [NsName::new("shop", "db-west")]);
        assert_eq!(plan.skipped.len(), 1);
        assert!(plan.skipped[0].reason.contains("no gatewayIdentity"), "{:?}", plan.skipped);
    }

    #[test]
    fn an_unchanged_cluster_plans_no_writes_and_an_unexported_service_is_deleted() {
        let west = valid("west");
        let remote = web("true", &[("web-0", "10.2.0.5", true)]);
        let first = plan(&[up(&west, &remote)], &local(), &[]);
        let mut written = first.upserts.clone();
        // What a writer adds does not count as a difference.
        written[0].service.spec.as_mut().unwrap().cluster_ip = Some("10.111.255.254".into());
        written[0].service.metadata.resource_version = Some("99".into());
        let again = plan(&[up(&west, &remote)], &local(), &written);
        assert!(again.upserts.is_empty() && again.deletes.is_empty(), "{again:?}");
        let mut unexported = remote.clone();
        unexported.services[0].metadata.labels = None;
        let gone = plan(&[up(&west, &unexported)], &local(), &written);
        assert_eq!(gone.deletes, [NsName::new("shop", "web-west")]);
        // The Link itself removed: the same.
        let unlinked = plan(&[], &local(), &written);
        assert_eq!(unlinked.deletes, [NsName::new("shop", "web-west")]);
    }

    #[test]
    fn a_port_change_and_an_endpoint_change_update_the_mirror() {
        let west = valid("west");
        let remote = web("remote-discovery", &[("web-0", "10.2.0.5", true)]);
        let written = plan(&[up(&west, &remote)], &local(), &[]).upserts;
        let mut ports = remote.clone();
        ports.services[0] =
            service("web", json!({MIRROR_EXPORTED_LABEL: "remote-discovery"}), json!([{"name": "http", "port": 81}]));
        let update = plan(&[up(&west, &ports)], &local(), &written);
        assert_eq!(update.upserts[0].service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port, 81);
        let scaled = web(
            "remote-discovery",
            &[("web-0", "10.2.0.5", true), ("web-1", "10.2.0.6", true), ("web-2", "10.2.0.9", false)],
        );
        let update = plan(&[up(&west, &scaled)], &local(), &written);
        assert_eq!(addresses(&update.upserts[0]), ["10.2.0.5", "10.2.0.6"]);
        let drained = web("remote-discovery", &[]);
        let update = plan(&[up(&west, &drained)], &local(), &written);
        assert_eq!(update.upserts[0].endpoints(), 0);
    }

    #[test]
    fn a_lost_link_keeps_the_last_endpoints_and_marks_its_mirrors_lost_until_it_is_back() {
        let west = valid("west");
        let remote = web("remote-discovery", &[("web-0", "10.2.0.5", true)]);
        let written = plan(&[up(&west, &remote)], &local(), &[]).upserts;
        let lost = LinkInput { view: View::Lost(&remote), ..up(&west, &remote) };
        let plan_lost = plan(&[lost], &local(), &written);
        let [mirror] = plan_lost.upserts.as_slice() else { panic!("{plan_lost:?}") };
        assert!(mirror.is_lost());
        assert_eq!(addresses(mirror), ["10.2.0.5"]);
        let back = plan(&[up(&west, &remote)], &local(), &plan_lost.upserts);
        assert!(!back.upserts[0].is_lost());
    }

    #[test]
    fn the_mirrors_of_a_link_that_cannot_be_read_stay_exactly_as_they_are() {
        let (west, north) = (valid("west"), valid("north"));
        let remote = web("remote-discovery", &[("web-0", "10.2.0.5", true)]);
        let written = plan(&[up(&west, &remote), up(&north, &remote)], &local(), &[]).upserts;
        assert_eq!(written.len(), 2);
        let refused = LinkInput { link: &west, gateway_ip: None, view: View::Unavailable };
        let plan = plan(&[refused, up(&north, &remote)], &local(), &written);
        assert!(plan.upserts.is_empty() && plan.deletes.is_empty(), "{plan:?}");
        assert_eq!(plan.desired.len(), 2);
    }

    #[test]
    fn a_federated_service_is_the_union_of_every_links_members_and_the_local_one() {
        let (west, north) = (valid("west"), valid("north"));
        let member = |ip: &str| Snapshot {
            services: vec![service("web", json!({MIRROR_FEDERATED_LABEL: "member"}), http())],
            slices: vec![slice("web", &[("web-0", ip, true)])],
            pods: vec![pod("web-0", ip, "web", true, None)],
        };
        let (w, n, here) = (member("10.2.0.5"), member("10.3.0.5"), member("10.1.0.5"));
        let local = Local { snapshot: Some(&here), ..local() };
        let plan1 = plan(&[up(&west, &w), up(&north, &n)], &local, &[]);
        let [mirror] = plan1.upserts.as_slice() else { panic!("{plan1:?}") };
        assert_eq!(mirror.key(), NsName::new("shop", "web-federated"));
        assert_eq!(mirror.mode(), "federated");
        assert_eq!(labels(&mirror.service.metadata), BTreeMap::from([(MIRRORED_SERVICE_LABEL.into(), "true".into())]));
        assert_eq!(annotation(&mirror.service.metadata, MIRROR_FEDERATED_MEMBERS_ANNOTATION), Some("local,north,west"));
        assert_eq!(addresses(mirror), ["10.1.0.5", "10.2.0.5", "10.3.0.5"]);
        let per_slice: BTreeSet<(&str, &str)> = mirror
            .slices
            .iter()
            .map(|s| {
                (
                    label(&s.metadata, MIRROR_CLUSTER_NAME_LABEL).unwrap(),
                    annotation(&s.metadata, MIRROR_REMOTE_IDENTITY_ANNOTATION).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            per_slice,
            BTreeSet::from([
                ("local", "web.shop.serviceaccount.identity.cnimesh.east.local"),
                ("north", "web.shop.serviceaccount.identity.cnimesh.north.local"),
                ("west", "web.shop.serviceaccount.identity.cnimesh.west.local"),
            ])
        );
        // west cannot be read: its slices stay; north leaves the federation: its slices go.
        let mut gone = n.clone();
        gone.services[0].metadata.labels = None;
        let refused = LinkInput { link: &west, gateway_ip: None, view: View::Unavailable };
        let plan2 = plan(&[refused, up(&north, &gone)], &local, &plan1.upserts);
        assert_eq!(addresses(&plan2.upserts[0]), ["10.1.0.5", "10.2.0.5"]);
        assert_eq!(
            annotation(&plan2.upserts[0].service.metadata, MIRROR_FEDERATED_MEMBERS_ANNOTATION),
            Some("local,west")
        );
        // No member left anywhere: the federated Service goes.
        let plan3 = plan(&[up(&north, &gone)], &Local { snapshot: None, ..local }, &plan2.upserts);
        assert_eq!(plan3.deletes, [NsName::new("shop", "web-federated")]);
    }

    /// us-west's `web` and west's `web-us`: both are `web-us-west`.
    fn colliding() -> (ValidLink, Snapshot, ValidLink, Snapshot) {
        let mut tenant = web("remote-discovery", &[("web-0", "10.2.0.66", true)]);
        tenant.services[0].metadata.name = Some("web-us".into());
        tenant.slices[0].metadata.labels = Some(BTreeMap::from([(SERVICE_NAME_LABEL.into(), "web-us".into())]));
        (valid("us-west"), web("remote-discovery", &[("web-0", "10.3.0.7", true)]), valid("west"), tenant)
    }

    #[test]
    fn a_mirror_name_two_links_claim_stays_with_the_link_that_holds_it_and_both_are_named() {
        let (us_west, owner, west, tenant) = colliding();
        let written = plan(&[up(&us_west, &owner)], &local(), &[]).upserts;
        assert_eq!(written[0].key(), NsName::new("shop", "web-us-west"));
        // West comes along (and sorts after us-west, so it used to be written last and win).
        let both = plan(&[up(&us_west, &owner), up(&west, &tenant)], &local(), &written);
        assert!(both.upserts.is_empty() && both.deletes.is_empty(), "{both:?}");
        assert_eq!(both.desired.len(), 1);
        assert_eq!(both.desired[0].cluster(), Some("us-west"));
        assert_eq!(addresses(&both.desired[0]), ["10.3.0.7"]);
        let by_cluster: BTreeMap<Option<&str>, (bool, &str, &[String])> = both
            .collisions
            .iter()
            .map(|c| (c.cluster.as_deref(), (c.holder, c.remote.as_str(), c.with.as_slice())))
            .collect();
        // west's export ends in "-us-west": refused before it could contest the name.
        assert!(!by_cluster.contains_key(&Some("us-west")), "{by_cluster:?}");
        assert_eq!(
            by_cluster[&Some("west")],
            (false, "shop/web-us", &["the mirror names of cluster us-west".to_string()][..])
        );
        assert!(both.skipped.iter().any(|s| s.cluster == "west" && s.reason.contains("web-us-west")), "{both:?}");
        // The same when the holder cannot be read for a while: its mirror stays its own.
        let away = LinkInput { link: &us_west, gateway_ip: None, view: View::Unavailable };
        let while_away = plan(&[away, up(&west, &tenant)], &local(), &written);
        assert!(while_away.upserts.is_empty() && while_away.deletes.is_empty(), "{while_away:?}");
        assert_eq!(while_away.desired[0].cluster(), Some("us-west"));
    }

    #[test]
    fn an_export_named_like_a_longer_linked_clusters_mirrors_is_withdrawn_and_an_overlapping_link_mirrors_nothing() {
        let (us_west, owner, west, tenant) = colliding();
        // west's tenant got there first: web-us-west is west's while us-west is not linked.
        let written = plan(&[up(&west, &tenant)], &local(), &[]).upserts;
        assert_eq!(written[0].key(), NsName::new("shop", "web-us-west"));
        // us-west is linked later and refused as a whole: the name goes all the same.
        let refused = LinkInput { link: &us_west, gateway_ip: None, view: View::Overlapping };
        let after = plan(&[up(&west, &tenant), refused], &local(), &written);
        assert!(after.desired.is_empty() && after.upserts.is_empty(), "{after:?}");
        assert_eq!(after.deletes, [NsName::new("shop", "web-us-west")]);
        let [collision] = after.collisions.as_slice() else { panic!("{after:?}") };
        assert_eq!((collision.cluster.as_deref(), collision.holder), (Some("west"), false));
        assert!(after.skipped.iter().any(|s| s.cluster == "west" && s.reason.contains("us-west")), "{after:?}");
        // The other way round (west refused): us-west's web is its own, west's mirrors go.
        let west_refused = LinkInput { link: &west, gateway_ip: None, view: View::Overlapping };
        let other = plan(&[up(&us_west, &owner), west_refused], &local(), &written);
        let [mirror] = other.desired.as_slice() else { panic!("{other:?}") };
        assert_eq!((mirror.cluster(), addresses(mirror)), (Some("us-west"), vec!["10.3.0.7".to_string()]));
        assert!(other.collisions.is_empty(), "{other:?}");
    }

    #[test]
    fn a_mirror_name_ending_in_a_longer_linked_cluster_name_goes_to_that_clusters_link_whatever_the_order() {
        let (us_west, owner, west, tenant) = colliding();
        let both = plan(&[up(&west, &tenant), up(&us_west, &owner)], &local(), &[]);
        let [mirror] = both.desired.as_slice() else { panic!("{both:?}") };
        assert_eq!(mirror.cluster(), Some("us-west"));
        assert_eq!(both.collisions.len(), 1);
        assert!(both.collisions.iter().all(|c| !c.holder && c.cluster.as_deref() == Some("west")));
    }

    #[test]
    fn a_mirror_never_takes_the_name_of_a_service_of_this_cluster() {
        let west = valid("west");
        let remote = web("remote-discovery", &[("web-0", "10.2.0.5", true)]);
        let mine =
            Snapshot { services: vec![service("web-west", json!({"app": "mine"}), http())], ..Default::default() };
        let here = Local { snapshot: Some(&mine), ..local() };
        let refused = plan(&[up(&west, &remote)], &here, &[]);
        assert!(refused.desired.is_empty() && refused.upserts.is_empty(), "{refused:?}");
        let [collision] = refused.collisions.as_slice() else { panic!("{refused:?}") };
        assert!(!collision.holder && collision.with[0].contains("own Service shop/web-west"), "{collision:?}");
    }
}
