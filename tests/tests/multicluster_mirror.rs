//! The mirror with real processes: two control planes (east and west), each on its own API
//! server served in its pod, both installed for multicluster; east linked to west with what
//! `cnimesh multicluster link` prints (west reached only through the Link's kubeconfig), and
//! east's mirror (`cnimesh-mirror serve`) in a pod of its own. The tests change west's API
//! server and watch east's: the mirrors, the Link's status, the mirror's metrics, and what
//! east's Destination answers for the mirrors.

use std::collections::BTreeSet;
use std::time::Duration;

use cnimesh_common::names::{
    MIRROR_CLUSTER_NAME_LABEL, MIRROR_GATEWAY_IDENTITY_ANNOTATION, MIRROR_LINK_STATE_ANNOTATION,
    MIRROR_REMOTE_IDENTITY_ANNOTATION, MIRROR_REMOTE_SERVICE_ANNOTATION, MIRRORED_SERVICE_LABEL,
};
use cnimesh_e2e::mirror_process::MirrorProcess;
use cnimesh_e2e::multicluster::{Clusters, destination_endpoints, link_without_secret};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use cnimesh_mirror::crd::LinkState;
use serde_json::{Value, json};

/// Only guards against a hung test; nothing here measures time.
const PATIENCE: Duration = Duration::from_secs(30);
const GATEWAY_IDENTITY: &str = "cnimesh-gateway.cnimesh-multicluster.serviceaccount.identity.cnimesh.west.local";
const MIRROR: &str = env!("CARGO_BIN_EXE_cnimesh-mirror-e2e");

/// A Service of namespace `shop` (port 80 `http` → 8080) with `labels`, and its ready replicas
/// (pod name, IP, meshed).
fn service_yaml(name: &str, labels: &str, replicas: &[(&str, &str, bool)]) -> String {
    let mut docs = vec![format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop, resourceVersion: \"3\", labels: {{{labels}}}}}\nspec:\n  clusterIP: 10.96.7.7\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n  selector: {{app: {name}}}\n"
    )];
    let endpoints: String = replicas
        .iter()
        .map(|(pod, ip, _)| {
            format!("  - addresses: [\"{ip}\"]\n    conditions: {{ready: true}}\n    targetRef: {{kind: Pod, name: {pod}, namespace: shop}}\n")
        })
        .collect();
    docs.push(format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n{}",
        if endpoints.is_empty() { "  []\n".to_string() } else { endpoints }
    ));
    for (pod, ip, meshed) in replicas {
        let proxy = if *meshed { "\n    - name: cnimesh-proxy\n      image: cnimesh/proxy" } else { "" };
        docs.push(format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: shop, labels: {{app: {name}}}}}\nspec:\n  serviceAccountName: {name}\n  containers:\n    - name: app\n      image: app{proxy}\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"
        ));
    }
    docs.join("---\n")
}

/// East and west, linked (west's gateway at 192.0.2.10:4143, which no one answers), east's
/// mirror running, and an unmeshed client pod to ask east's Destination from.
struct Linked<'n> {
    c: Clusters<'n>,
    mirror: MirrorProcess,
    client: Pod<'n>,
}

impl Linked<'_> {
    /// Waits until east's Destination answers `path` with exactly `want` (addresses).
    fn destination_answers(&self, path: &str, want: &[&str]) {
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        let served = destination_endpoints(&self.c.east, &self.client.netns.path(), path, PATIENCE, |s| {
            s.keys().cloned().collect::<BTreeSet<_>>() == want
        });
        assert_eq!(served.keys().cloned().collect::<BTreeSet<_>>(), want, "east's Destination for the mirror");
    }
}

fn labels(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, key: &str) -> Option<String> {
    meta.labels.as_ref()?.get(key).cloned()
}

fn annotation(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, key: &str) -> Option<String> {
    meta.annotations.as_ref()?.get(key).cloned()
}

/// West with `web` (gateway export) and `db` (remote-discovery export); east with `east_objects`
/// (name, YAML); both control planes running, then the Link (east starts with no mirror), then
/// east's mirror.
fn clusters<'n>(net: &'n Network, east_objects: &[(&str, String)], west_objects: &[(&str, String)]) -> Linked<'n> {
    let c = Clusters::start(&bins!(), net);
    let west = &c.west.cluster;
    west.apply_yaml(
        "web.yaml",
        &service_yaml("web", "mirror.cnimesh.io/exported: \"true\"", &[("web-0", "10.2.0.4", true)]),
    )
    .unwrap();
    west.apply_yaml(
        "db.yaml",
        &service_yaml("db", "mirror.cnimesh.io/exported: remote-discovery", &[("db-0", "10.2.0.5", true)]),
    )
    .unwrap();
    for (name, yaml) in west_objects {
        west.apply_yaml(name, yaml).unwrap();
    }
    for (name, yaml) in east_objects {
        c.east.cluster.apply_yaml(name, yaml).unwrap();
    }
    c.link(Some("192.0.2.10:4143".parse().unwrap()));
    let mirror = c.start_mirror(MIRROR.as_ref());
    let client = Pod::unmeshed(net, "shop", "client").unwrap();
    Linked { c, mirror, client }
}

/// Objects as the test put them: without what the API server added.
fn as_put(mut object: Value) -> Value {
    let meta = object["metadata"].as_object_mut().unwrap();
    for added in ["resourceVersion", "uid", "managedFields", "creationTimestamp", "generation"] {
        meta.remove(added);
    }
    object
}

#[test]
fn an_exported_service_is_mirrored_with_its_ports_and_endpoints_follows_them_and_goes_when_unexported_or_unlinked() {
    if !require_root(
        "an_exported_service_is_mirrored_with_its_ports_and_endpoints_follows_them_and_goes_when_unexported_or_unlinked",
    ) {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let cs = clusters(&net, &[], &[]);
    let (c, west) = (&cs.c, &cs.c.west.cluster);

    eventually("east mirrors web (gateway) and db (remote discovery)", PATIENCE, || {
        c.mirror("web-west").is_some() && c.mirror_addresses("db-west").len() == 1
    });
    let (web, slices) = c.mirror("web-west").unwrap();
    assert_eq!(labels(&web.metadata, MIRRORED_SERVICE_LABEL).as_deref(), Some("true"));
    assert_eq!(labels(&web.metadata, MIRROR_CLUSTER_NAME_LABEL).as_deref(), Some("west"));
    assert_eq!(
        annotation(&web.metadata, MIRROR_REMOTE_SERVICE_ANNOTATION).as_deref(),
        Some("web.shop.svc.cluster.local")
    );
    let spec = web.spec.as_ref().unwrap();
    let ports: Vec<_> = spec.ports.iter().flatten().map(|p| (p.name.clone(), p.port)).collect();
    assert_eq!(ports, [(Some("http".to_string()), 80)]);
    let ip: std::net::Ipv4Addr = spec.cluster_ip.as_deref().unwrap().parse().unwrap();
    assert!(
        ip.octets()[0] == 10 && (96..112).contains(&ip.octets()[1]),
        "{ip} is from east's API server's Service range 10.96.0.0/12"
    );
    let [slice] = slices.as_slice() else { panic!("one gateway slice: {slices:?}") };
    assert_eq!(annotation(&slice.metadata, MIRROR_GATEWAY_IDENTITY_ANNOTATION).as_deref(), Some(GATEWAY_IDENTITY));
    assert_eq!(slice.endpoints[0].addresses, ["192.0.2.10"]);
    assert_eq!(slice.ports.as_ref().unwrap()[0].port, Some(4143));
    let (_, db_slices) = c.mirror("db-west").unwrap();
    assert_eq!(
        annotation(&db_slices[0].metadata, MIRROR_REMOTE_IDENTITY_ANNOTATION).as_deref(),
        Some("db.shop.serviceaccount.identity.cnimesh.west.local")
    );
    // East's Destination serves the mirrors from east's API server like any Service.
    cs.destination_answers("web-west.shop.svc.cluster.local:80", &["192.0.2.10:4143"]);
    cs.destination_answers("db-west.shop.svc.cluster.local:80", &["10.2.0.5:8080"]);
    eventually("the status says up with both mirrors", PATIENCE, || {
        c.link_status("west").is_some_and(|s| s.state == Some(LinkState::Up) && s.mirrors.len() == 2)
    });
    let metrics = cs.mirror.metrics();
    assert!(metrics.contains("multicluster_link_up{cluster=\"west\"} 1"), "{metrics}");
    assert!(metrics.contains("multicluster_mirrors{cluster=\"west\"} 2"), "{metrics}");

    // Endpoints follow: a replica added in west, then one removed.
    let two = [("db-0", "10.2.0.5", true), ("db-1", "10.2.0.6", true)];
    west.apply_yaml("db.yaml", &service_yaml("db", "mirror.cnimesh.io/exported: remote-discovery", &two)).unwrap();
    eventually("the new replica is mirrored", PATIENCE, || c.mirror_addresses("db-west").len() == 2);
    cs.destination_answers("db-west.shop.svc.cluster.local:80", &["10.2.0.5:8080", "10.2.0.6:8080"]);
    west.apply_yaml("db.yaml", &service_yaml("db", "mirror.cnimesh.io/exported: remote-discovery", &two[1..])).unwrap();
    eventually("the removed replica leaves the mirror", PATIENCE, || {
        c.mirror_addresses("db-west") == BTreeSet::from(["10.2.0.6".to_string()])
    });

    // Unexported: its mirror goes; the other stays.
    west.apply_yaml("db.yaml", &service_yaml("db", "app: db", &two[1..])).unwrap();
    eventually("the unexported Service's mirror is gone", PATIENCE, || c.mirror("db-west").is_none());
    assert!(c.mirror("web-west").is_some());

    // The Link removed (`unlink`): every mirror it made goes.
    c.east.cluster.delete_file("link-west.yaml");
    eventually("the Link's mirrors are gone", PATIENCE, || c.mirror("web-west").is_none());
    let mirrored: Vec<Value> = c
        .east
        .cluster
        .api
        .list("v1", "Service")
        .into_iter()
        .filter(|s| s["metadata"]["labels"][MIRRORED_SERVICE_LABEL] == "true")
        .collect();
    assert!(mirrored.is_empty(), "no mirror is left: {mirrored:#?}");
}

#[test]
fn a_lost_link_keeps_its_mirrors_marked_lost_until_it_is_back_and_a_link_without_credentials_is_named() {
    if !require_root(
        "a_lost_link_keeps_its_mirrors_marked_lost_until_it_is_back_and_a_link_without_credentials_is_named",
    ) {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let cs = clusters(&net, &[], &[]);
    let (c, west) = (&cs.c, &cs.c.west.cluster);
    eventually("east mirrors db", PATIENCE, || c.mirror_addresses("db-west").len() == 1);

    // West's API server refuses everything: the link is lost, the mirrors stay with their
    // endpoints.
    west.api.refuse(true);
    eventually("the status says lost", PATIENCE, || {
        c.link_status("west").is_some_and(|s| s.state == Some(LinkState::Lost))
    });
    let status = c.link_status("west").unwrap();
    assert!(status.reason.as_deref().is_some_and(|r| r.contains("the API server has been failing")), "{status:?}");
    eventually("the mirrors are marked lost", PATIENCE, || {
        c.mirror("db-west")
            .is_some_and(|(s, _)| annotation(&s.metadata, MIRROR_LINK_STATE_ANNOTATION).as_deref() == Some("lost"))
    });
    assert_eq!(c.mirror_addresses("db-west"), BTreeSet::from(["10.2.0.5".to_string()]), "the last endpoints are kept");
    cs.destination_answers("db-west.shop.svc.cluster.local:80", &["10.2.0.5:8080"]);
    let metrics = cs.mirror.metrics();
    assert!(metrics.contains("multicluster_link_up{cluster=\"west\"} 0"), "{metrics}");

    // Back: resynced, the mark goes.
    west.api.refuse(false);
    eventually("the status says up again", PATIENCE, || {
        c.link_status("west").is_some_and(|s| s.state == Some(LinkState::Up))
    });
    eventually("the lost mark is gone", PATIENCE, || {
        c.mirror("db-west").is_some_and(|(s, _)| annotation(&s.metadata, MIRROR_LINK_STATE_ANNOTATION).is_none())
    });

    // A Link whose Secret is missing: refused by name; a mirror already made for it stays.
    c.east.cluster.apply_yaml("link-north.yaml", &link_without_secret("north")).unwrap();
    eventually("the north Link's status names the missing Secret", PATIENCE, || {
        c.link_status("north")
            .and_then(|s| s.reason)
            .is_some_and(|r| r.contains("cnimesh/cluster-credentials-north") && r.contains("does not exist"))
    });
    // The mirror is made only once the Link is seen: before that it is a mirror of no Link,
    // which is rightly deleted. A change in west then forces a later round to plan with it.
    let api = &c.east.cluster.api;
    let service = api.get("v1", "Service", "shop", "db-west").unwrap();
    let slices = api
        .list("discovery.k8s.io/v1", "EndpointSlice")
        .into_iter()
        .filter(|s| s["metadata"]["labels"]["kubernetes.io/service-name"] == "db-west");
    for object in std::iter::once(service).chain(slices) {
        api.put(serde_json::from_str(&as_put(object).to_string().replace("west", "north")).unwrap());
    }
    let before = c.mirror("db-north").expect("the north mirror as put");
    let two = [("db-0", "10.2.0.5", true), ("db-1", "10.2.0.6", true)];
    west.apply_yaml("db.yaml", &service_yaml("db", "mirror.cnimesh.io/exported: remote-discovery", &two)).unwrap();
    eventually("a later round mirrors west's second endpoint", PATIENCE, || c.mirror_addresses("db-west").len() == 2);
    assert_eq!(c.mirror("db-north"), Some(before), "untouched");
}

#[test]
fn a_federated_service_unites_the_local_member_and_the_linked_ones() {
    if !require_root("a_federated_service_unites_the_local_member_and_the_linked_ones") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let local = service_yaml("api", "mirror.cnimesh.io/federated: member", &[("api-0", "10.1.0.7", true)]);
    let remote = service_yaml("api", "mirror.cnimesh.io/federated: member", &[("api-0", "10.2.0.7", true)]);
    let cs = clusters(&net, &[("api.yaml", local)], &[("api.yaml", remote)]);
    let c = &cs.c;
    eventually("east has api-federated with both members' endpoints", PATIENCE, || {
        c.mirror_addresses("api-federated").len() == 2
    });
    let (service, slices) = c.mirror("api-federated").unwrap();
    assert_eq!(labels(&service.metadata, MIRROR_CLUSTER_NAME_LABEL), None);
    let per_cluster: BTreeSet<(String, String)> = slices
        .iter()
        .map(|s| {
            (
                labels(&s.metadata, MIRROR_CLUSTER_NAME_LABEL).unwrap(),
                annotation(&s.metadata, MIRROR_REMOTE_IDENTITY_ANNOTATION).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        per_cluster,
        BTreeSet::from([
            ("local".to_string(), "api.shop.serviceaccount.identity.cnimesh.cluster.local".to_string()),
            ("west".to_string(), "api.shop.serviceaccount.identity.cnimesh.west.local".to_string()),
        ])
    );
    cs.destination_answers("api-federated.shop.svc.cluster.local:80", &["10.1.0.7:8080", "10.2.0.7:8080"]);
}
