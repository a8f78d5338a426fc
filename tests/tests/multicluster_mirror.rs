//! The mirror controller with real processes: two control planes with the files
//! backend (east, which runs the mirror, and west, the linked cluster), each in a pod of its own.
//! East's Link points at west's cluster directory (`file://`), exactly as local mode links them;
//! the tests change west's directory and watch east's: its mirror files, its Link status file,
//! its metrics, and what its Destination answers for the mirrors.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cnimesh_common::names::{
    MIRROR_CLUSTER_NAME_LABEL, MIRROR_GATEWAY_IDENTITY_ANNOTATION, MIRROR_LINK_STATE_ANNOTATION,
    MIRROR_REMOTE_IDENTITY_ANNOTATION, MIRROR_REMOTE_SERVICE_ANNOTATION, MIRRORED_SERVICE_LABEL,
};
use cnimesh_e2e::control::{Control, identity, write_atomically};
use cnimesh_e2e::netns::block_on_in;
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use cnimesh_identity::Name;
use cnimesh_mirror::crd::{LinkState, LinkStatus};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use linkerd2_proxy_api::destination::GetDestination;
use linkerd2_proxy_api::destination::destination_client::DestinationClient;
use linkerd2_proxy_api::destination::update::Update as Up;
use serde_json::json;

/// Only guards against a hung test; nothing here measures time.
const PATIENCE: Duration = Duration::from_secs(30);
const GATEWAY_IDENTITY: &str = "cnimesh-gateway.cnimesh-multicluster.serviceaccount.identity.cnimesh.west.local";

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

/// The Link to `cluster` and, unless `secret` is false, its credentials Secret (a kubeconfig
/// whose server is `file://<dir>`), as `cnimesh multicluster link --local` writes them.
fn link_yaml(cluster: &str, dir: &Path, secret: bool) -> String {
    let link = format!(
        "apiVersion: multicluster.cnimesh.io/v1alpha1\nkind: Link\nmetadata: {{name: {cluster}, namespace: cnimesh}}\nspec:\n  targetClusterName: {cluster}\n  targetTrustDomain: {cluster}.local\n  clusterCredentialsSecret: cluster-credentials-{cluster}\n  gatewayAddress: 192.0.2.10\n  gatewayIdentity: {GATEWAY_IDENTITY}\n  probe: {{period: 1s}}\n"
    );
    if !secret {
        return link;
    }
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: {cluster}, cluster: {{server: \"file://{}\"}}}}]\ncontexts: [{{name: {cluster}, context: {{cluster: {cluster}, user: mirror}}}}]\ncurrent-context: {cluster}\nusers: [{{name: mirror, user: {{}}}}]\n",
        dir.display()
    );
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("cluster-credentials-{cluster}"), "namespace": "cnimesh"},
        "type": "mirror.cnimesh.io/remote-kubeconfig", "stringData": {"kubeconfig": kubeconfig}});
    format!("{link}---\n{}\n", serde_json::to_string(&secret).unwrap())
}

/// East and west, each a control plane on its own cluster directory; east mirrors.
struct Clusters<'n> {
    east: Control,
    _west: Control,
    east_dir: tempfile::TempDir,
    /// Holds `west/`, which a test may move away and back.
    root: tempfile::TempDir,
    client: Pod<'n>,
    _pods: Vec<Pod<'n>>,
}

impl Clusters<'_> {
    fn west_dir(&self) -> PathBuf {
        self.root.path().join("west")
    }

    fn east(&self, file: &str) -> PathBuf {
        self.east_dir.path().join(file)
    }

    fn west(&self, file: &str) -> PathBuf {
        self.west_dir().join(file)
    }

    /// East's mirror `name` (Service and slices), if its file is there.
    fn mirror(&self, name: &str) -> Option<(Service, Vec<EndpointSlice>)> {
        cnimesh_e2e::multicluster::mirror_in(self.east_dir.path(), name)
    }

    fn mirror_addresses(&self, name: &str) -> BTreeSet<String> {
        cnimesh_e2e::multicluster::mirror_addresses_in(self.east_dir.path(), name)
    }

    fn status(&self, cluster: &str) -> Option<LinkStatus> {
        let text = std::fs::read_to_string(self.east(&format!(".status/link-{cluster}.json"))).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Waits until east's Destination answers `path` with exactly `want` (addresses), following
    /// one Get stream's adds and removes.
    fn destination_answers(&self, path: &str, want: &[&str]) {
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        let expected = want.clone();
        let (addr, issuer) = (self.east.addr.to_string(), self.east.issuer_dir());
        let anchors = std::fs::read(self.east.trust_anchors()).unwrap();
        let path = path.to_string();
        let seen = block_on_in(&self.client.netns.path(), async move {
            let client_name = Name::parse(&identity("shop", "client")).unwrap();
            let cert =
                cnimesh_control::identity::own_cert::issue_from_dir(&issuer, &client_name, Duration::from_secs(600))
                    .unwrap();
            let roots =
                cnimesh_identity::tls::roots(&cnimesh_identity::pem::certs(&anchors, "anchors").unwrap()).unwrap();
            let control = Name::parse(&identity("cnimesh", "cnimesh-control")).unwrap();
            let channel = cnimesh_identity::grpc_channel::connect(&addr, &control, roots, Some(cert)).await.unwrap();
            let request = GetDestination { path, ..Default::default() };
            let mut stream = DestinationClient::new(channel).get(request).await.unwrap().into_inner();
            let mut seen = BTreeSet::new();
            let deadline = tokio::time::Instant::now() + PATIENCE;
            while seen != want {
                let Ok(message) = tokio::time::timeout_at(deadline, stream.message()).await else { break };
                match message.unwrap().and_then(|u| u.update) {
                    Some(Up::Add(set)) => seen.extend(set.addrs.iter().filter_map(|a| a.addr).map(to_string)),
                    Some(Up::Remove(set)) => {
                        for a in set.addrs.into_iter().map(to_string) {
                            seen.remove(&a);
                        }
                    }
                    Some(Up::NoEndpoints(_)) => seen.clear(),
                    None => break,
                }
            }
            seen
        });
        assert_eq!(seen, expected, "east's Destination for the mirror");
    }
}

fn to_string(a: linkerd2_proxy_api::net::TcpAddress) -> String {
    std::net::SocketAddr::try_from(a).unwrap().to_string()
}

fn labels(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, key: &str) -> Option<String> {
    meta.labels.as_ref()?.get(key).cloned()
}

fn annotation(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, key: &str) -> Option<String> {
    meta.annotations.as_ref()?.get(key).cloned()
}

/// West with `web` (gateway export) and `db` (remote-discovery export); east with `east_files`;
/// both control planes running, east with the mirror's Service range.
fn clusters<'n>(net: &'n Network, east_files: &[(&str, String)]) -> Clusters<'n> {
    let bins = bins!();
    let root = tempfile::tempdir().unwrap();
    let west_dir = root.path().join("west");
    std::fs::create_dir(&west_dir).unwrap();
    write_atomically(
        &west_dir.join("web.yaml"),
        &service_yaml("web", "mirror.cnimesh.io/exported: \"true\"", &[("web-0", "10.2.0.4", true)]),
    );
    write_atomically(
        &west_dir.join("db.yaml"),
        &service_yaml("db", "mirror.cnimesh.io/exported: remote-discovery", &[("db-0", "10.2.0.5", true)]),
    );
    let east_dir = tempfile::tempdir().unwrap();
    for (file, text) in east_files {
        write_atomically(&east_dir.path().join(file), text);
    }
    let east_pod = Pod::unmeshed(net, "cnimesh", "east").unwrap();
    let west_pod = Pod::unmeshed(net, "cnimesh", "west").unwrap();
    let east_arg = east_dir.path().display().to_string();
    let west_arg = west_dir.display().to_string();
    let east = Control::start(
        &bins.control,
        &east_pod,
        &["--cluster-dir", &east_arg, "--mirror-service-cidr", "10.96.0.0/12"],
    )
    .unwrap();
    let west =
        Control::start_sharing_anchor(&bins.control, &west_pod, &["--cluster-dir", &west_arg], &east, "west.local")
            .unwrap();
    let client = Pod::unmeshed(net, "shop", "client").unwrap();
    Clusters { east, _west: west, east_dir, root, client, _pods: vec![east_pod, west_pod] }
}

#[test]
fn an_exported_service_is_mirrored_with_its_ports_and_endpoints_follows_them_and_goes_when_unexported_or_unlinked() {
    if !require_root(
        "an_exported_service_is_mirrored_with_its_ports_and_endpoints_follows_them_and_goes_when_unexported_or_unlinked",
    ) {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let c = clusters(&net, &[]);
    // The Link is written once both control planes run: east starts with no mirror.
    write_atomically(&c.east("link-west.yaml"), &link_yaml("west", &c.west_dir(), true));

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
        "{ip} is in --mirror-service-cidr 10.96.0.0/12"
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
    // East's Destination serves the mirrors from east's directory like any Service.
    c.destination_answers("web-west.shop.svc.cluster.local:80", &["192.0.2.10:4143"]);
    c.destination_answers("db-west.shop.svc.cluster.local:80", &["10.2.0.5:8080"]);
    eventually("the status says up with both mirrors", PATIENCE, || {
        c.status("west").is_some_and(|s| s.state == Some(LinkState::Up) && s.mirrors.len() == 2)
    });
    let metrics = c.east.metrics();
    assert!(metrics.contains("multicluster_link_up{cluster=\"west\"} 1"), "{metrics}");
    assert!(metrics.contains("multicluster_mirrors{cluster=\"west\"} 2"), "{metrics}");

    // Endpoints follow: a replica added in west, then one removed.
    let two = [("db-0", "10.2.0.5", true), ("db-1", "10.2.0.6", true)];
    write_atomically(&c.west("db.yaml"), &service_yaml("db", "mirror.cnimesh.io/exported: remote-discovery", &two));
    eventually("the new replica is mirrored", PATIENCE, || c.mirror_addresses("db-west").len() == 2);
    c.destination_answers("db-west.shop.svc.cluster.local:80", &["10.2.0.5:8080", "10.2.0.6:8080"]);
    write_atomically(
        &c.west("db.yaml"),
        &service_yaml("db", "mirror.cnimesh.io/exported: remote-discovery", &two[1..]),
    );
    eventually("the removed replica leaves the mirror", PATIENCE, || {
        c.mirror_addresses("db-west") == BTreeSet::from(["10.2.0.6".to_string()])
    });

    // Unexported: its mirror goes; the other stays.
    write_atomically(&c.west("db.yaml"), &service_yaml("db", "app: db", &two[1..]));
    eventually("the unexported Service's mirror is gone", PATIENCE, || c.mirror("db-west").is_none());
    assert!(c.mirror("web-west").is_some());

    // The Link removed (`unlink`): every mirror it made goes.
    std::fs::remove_file(c.east("link-west.yaml")).unwrap();
    eventually("the Link's mirrors are gone", PATIENCE, || c.mirror("web-west").is_none());
    assert!(
        !std::fs::read_dir(c.east_dir.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("mirror-"))
    );
}

#[test]
fn a_lost_link_keeps_its_mirrors_marked_lost_until_it_is_back_and_a_link_without_credentials_is_named() {
    if !require_root(
        "a_lost_link_keeps_its_mirrors_marked_lost_until_it_is_back_and_a_link_without_credentials_is_named",
    ) {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let c = clusters(&net, &[]);
    write_atomically(&c.east("link-west.yaml"), &link_yaml("west", &c.west_dir(), true));
    eventually("east mirrors db", PATIENCE, || c.mirror_addresses("db-west").len() == 1);

    // West's directory goes away: the link is lost, the mirrors stay with their endpoints.
    let away = c.root.path().join("west-away");
    std::fs::rename(c.west_dir(), &away).unwrap();
    eventually("the status says lost", PATIENCE, || c.status("west").is_some_and(|s| s.state == Some(LinkState::Lost)));
    let status = c.status("west").unwrap();
    assert!(status.reason.as_deref().is_some_and(|r| r.contains("west")), "{status:?}");
    eventually("the mirrors are marked lost", PATIENCE, || {
        c.mirror("db-west")
            .is_some_and(|(s, _)| annotation(&s.metadata, MIRROR_LINK_STATE_ANNOTATION).as_deref() == Some("lost"))
    });
    assert_eq!(c.mirror_addresses("db-west"), BTreeSet::from(["10.2.0.5".to_string()]), "the last endpoints are kept");
    c.destination_answers("db-west.shop.svc.cluster.local:80", &["10.2.0.5:8080"]);
    assert!(c.east.metrics().contains("multicluster_link_up{cluster=\"west\"} 0"));

    // Back: resynced, the mark goes.
    std::fs::rename(&away, c.west_dir()).unwrap();
    eventually("the status says up again", PATIENCE, || {
        c.status("west").is_some_and(|s| s.state == Some(LinkState::Up))
    });
    eventually("the lost mark is gone", PATIENCE, || {
        c.mirror("db-west").is_some_and(|(s, _)| annotation(&s.metadata, MIRROR_LINK_STATE_ANNOTATION).is_none())
    });

    // A Link whose Secret is missing: refused by name; a mirror already made for it stays.
    write_atomically(&c.east("link-north.yaml"), &link_yaml("north", Path::new("/nonexistent"), false));
    eventually("the north Link's status names the missing Secret", PATIENCE, || {
        c.status("north")
            .and_then(|s| s.reason)
            .is_some_and(|r| r.contains("cnimesh/cluster-credentials-north") && r.contains("does not exist"))
    });
    // The mirror is written only once the Link is seen: before that it is a mirror of no Link,
    // which is rightly deleted. A change in west then forces a later round to plan with it.
    let made = std::fs::read_to_string(c.east("mirror-shop-db-west.yaml")).unwrap().replace("west", "north");
    write_atomically(&c.east("mirror-shop-db-north.yaml"), &made);
    let two = [("db-0", "10.2.0.5", true), ("db-1", "10.2.0.6", true)];
    write_atomically(&c.west("db.yaml"), &service_yaml("db", "mirror.cnimesh.io/exported: remote-discovery", &two));
    eventually("a later round mirrors west's second endpoint", PATIENCE, || c.mirror_addresses("db-west").len() == 2);
    assert_eq!(std::fs::read_to_string(c.east("mirror-shop-db-north.yaml")).unwrap(), made, "untouched");
}

#[test]
fn a_federated_service_unites_the_local_member_and_the_linked_ones() {
    if !require_root("a_federated_service_unites_the_local_member_and_the_linked_ones") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let local = service_yaml("api", "mirror.cnimesh.io/federated: member", &[("api-0", "10.1.0.7", true)]);
    let c = clusters(&net, &[("api.yaml", local)]);
    write_atomically(
        &c.west("api.yaml"),
        &service_yaml("api", "mirror.cnimesh.io/federated: member", &[("api-0", "10.2.0.7", true)]),
    );
    write_atomically(&c.east("link-west.yaml"), &link_yaml("west", &c.west_dir(), true));
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
    c.destination_answers("api-federated.shop.svc.cluster.local:80", &["10.1.0.7:8080", "10.2.0.7:8080"]);
}
