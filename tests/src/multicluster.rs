//! Two clusters on one host: [`Clusters`], control planes `east` (cluster.local) and `west`
//! (west.local, its issuer signed by east's anchor), each on its own API server served in its
//! pod and installed for multicluster ([`install`]), linked when a test says ([`link`], with what
//! `cnimesh multicluster link` prints) and east's real mirror in a pod of its own; what the
//! mirror wrote in east ([`mirror`], [`link_status`]) and what a Destination serves per endpoint
//! ([`destination_endpoints`]).
//!
//! On them, for the gateway path's tests and benchmark, [`Meshed`]: west's meshed `web` with the
//! test apps and its multicluster gateway (a proxy in gateway mode), an east client, and the
//! mirror objects applied to east's API server by hand as the multicluster contract shapes them:
//! `web-west` through the gateway, `web-flat` straight to web's pod (remote discovery).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Deref;
use std::path::Path;
use std::time::Duration;

use cnimesh_common::names::{
    CONTROL_NAMESPACE, GATEWAY_NAME, MIRROR_NAME, MIRROR_READER_SERVICE_ACCOUNT, MULTICLUSTER_NAMESPACE,
};
use cnimesh_identity::Name;
use cnimesh_mirror::crd::{self, LinkStatus};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::apps::{self, Apps};
use crate::cluster::Cluster;
use crate::cni::{Bins, Network};
use crate::control::{Control, env_refs};
use crate::mirror_process::MirrorProcess;
use crate::netns::block_on_in;
use crate::pod::Pod;
use crate::sidecar::Sidecar;
use crate::wait::eventually;

pub const MIRROR_IP: &str = "10.96.0.50";
pub const FLAT_IP: &str = "10.96.0.51";
pub const WEB_FQDN: &str = "web.shop.svc.cluster.local";

/// West's `web` Service (HTTP on 80, the half-close app on its port, opaque), exported through
/// the gateway (`mirror.cnimesh.io/exported=true`: the gateway forwards to nothing else), and its pod
/// (the half-close port declared opaque on it too: the gateway forwards opaque sessions only to
/// ports its Destination says the pods take as opaque).
pub fn west_web_yaml(ip: Ipv4Addr) -> String {
    let (http, tcp) = (apps::HTTP_PORT, apps::HALF_CLOSE_PORT);
    [
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop, labels: {{mirror.cnimesh.io/exported: 'true'}}}}\nspec:\n  clusterIP: 10.97.0.10\n  selector: {{app: web}}\n  ports: [{{name: http, port: 80, targetPort: {http}}}, {{name: tcp, port: {tcp}, targetPort: {tcp}, appProtocol: cnimesh.io/opaque}}]\n"),
        format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{{name: http, port: {http}}}, {{name: tcp, port: {tcp}}}]\nendpoints:\n  - addresses: [\"{ip}\"]\n    targetRef: {{kind: Pod, name: web-0, namespace: shop}}\n"),
        format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-0\n  namespace: shop\n  labels: {{app: web}}\n  annotations: {{config.cnimesh.io/opaque-ports: '{tcp}'}}\nspec:\n  serviceAccountName: web\n  containers:\n    - name: app\n      ports: [{{name: http, containerPort: {http}}}, {{name: tcp, containerPort: {tcp}}}]\n    - name: cnimesh-proxy\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"),
    ]
    .join("---\n")
}

/// West's policy on web's HTTP port: only `allowed` (a full identity) may call it.
pub fn west_policy_yaml(allowed: &str) -> String {
    [
        "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {name: web-http, namespace: shop}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  port: http\n  proxyProtocol: HTTP/1\n".to_string(),
        format!("apiVersion: policy.cnimesh.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {{name: callers, namespace: shop}}\nspec:\n  identities: [\"{allowed}\"]\n"),
        "apiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {name: callers-to-web, namespace: shop}\nspec:\n  targetRef: {group: policy.cnimesh.io, kind: Server, name: web-http}\n  requiredAuthenticationRefs: [{group: policy.cnimesh.io, kind: MeshTLSAuthentication, name: callers}]\n".to_string(),
    ]
    .join("---\n")
}

/// East's mirror of west's `web` through the gateway, by hand as the contract shapes it.
pub fn mirror_yaml(gateway: Ipv4Addr, gateway_identity: &str) -> String {
    let tcp = apps::HALF_CLOSE_PORT;
    let port = cnimesh_common::names::PROXY_INBOUND_PORT;
    [
        format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: web-west\n  namespace: shop\n  labels: {{mirror.cnimesh.io/mirrored-service: 'true', mirror.cnimesh.io/cluster-name: west}}\n  annotations: {{mirror.cnimesh.io/remote-svc-fq-name: {WEB_FQDN}}}\nspec:\n  clusterIP: {MIRROR_IP}\n  ports: [{{name: http, port: 80, targetPort: 80}}, {{name: tcp, port: {tcp}, targetPort: {tcp}, appProtocol: cnimesh.io/opaque}}]\n"),
        format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-west-gateway\n  namespace: shop\n  labels: {{kubernetes.io/service-name: web-west, mirror.cnimesh.io/mirrored-service: 'true', mirror.cnimesh.io/cluster-name: west}}\n  annotations: {{mirror.cnimesh.io/remote-gateway-identity: {gateway_identity}}}\naddressType: IPv4\nports: [{{name: http, port: {port}}}, {{name: tcp, port: {port}}}]\nendpoints:\n  - addresses: [\"{gateway}\"]\n"),
    ]
    .join("---\n")
}

/// East's remote-discovery mirror of west's `web`: web's pod itself, with its west identity.
pub fn flat_yaml(web: Ipv4Addr, web_identity: &str) -> String {
    let http = apps::HTTP_PORT;
    [
        format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: web-flat\n  namespace: shop\n  labels: {{mirror.cnimesh.io/mirrored-service: 'true', mirror.cnimesh.io/cluster-name: west}}\n  annotations: {{mirror.cnimesh.io/remote-svc-fq-name: {WEB_FQDN}}}\nspec:\n  clusterIP: {FLAT_IP}\n  ports: [{{name: http, port: 80, targetPort: 80}}]\n"),
        format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-flat-web\n  namespace: shop\n  labels: {{kubernetes.io/service-name: web-flat, mirror.cnimesh.io/mirrored-service: 'true', mirror.cnimesh.io/cluster-name: west}}\n  annotations: {{mirror.cnimesh.io/remote-identity: {web_identity}}}\naddressType: IPv4\nports: [{{name: http, port: {http}}}]\nendpoints:\n  - addresses: [\"{web}\"]\n"),
    ]
    .join("---\n")
}

/// [`Clusters`] with the gateway path: west's meshed `web` (the test apps, its proxy), west's
/// gateway, east's meshed `client`, and east's hand-made mirrors `web-west` (through the gateway)
/// and `web-flat` (to web's pod), each ready and known to its Destination. It derefs to its
/// [`Clusters`].
pub struct Meshed<'n> {
    pub clusters: Clusters<'n>,
    pub client: Pod<'n>,
    pub web: Pod<'n>,
    pub gateway_pod: Pod<'n>,
    pub client_proxy: Sidecar,
    pub web_proxy: Sidecar,
    pub gateway: Sidecar,
    _apps: Apps,
}

impl<'n> Meshed<'n> {
    /// Both clusters, the pods and their proxies, each ready.
    pub fn start(bins: &Bins, net: &'n Network) -> Self {
        Self::start_with(bins, net, &[])
    }

    /// [`Meshed::start`] with `settings` added to every proxy's (client, web, gateway).
    pub fn start_with(bins: &Bins, net: &'n Network, settings: &[(&str, &str)]) -> Self {
        let with = |mut env: Vec<(String, String)>| {
            env.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            env
        };
        let clusters = Clusters::start(bins, net);
        let (east, west) = (&clusters.east, &clusters.west);
        let client = Pod::named(net, "shop", "client").unwrap();
        // ClusterIPs are routed out of the pod, where capture takes them (as kube-proxy's range).
        client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
        let web = Pod::named(net, "shop", "web-0").unwrap();
        // Not captured: the gateway is reached at its own address, and dials B's pods itself.
        let gateway_pod = Pod::unmeshed(net, MULTICLUSTER_NAMESPACE, GATEWAY_NAME).unwrap();
        west.cluster.apply_yaml("web.yaml", &west_web_yaml(web.ipv4())).unwrap();
        let gateway_identity = west.identity(MULTICLUSTER_NAMESPACE, GATEWAY_NAME);
        east.cluster.apply_yaml("mirror.yaml", &mirror_yaml(gateway_pod.ipv4(), &gateway_identity)).unwrap();
        east.cluster.apply_yaml("flat.yaml", &flat_yaml(web.ipv4(), &west.identity("shop", "web"))).unwrap();
        for (control, service) in [(west, "web"), (east, "web-west"), (east, "web-flat")] {
            eventually(&format!("the Destination knows {service}"), Duration::from_secs(30), || {
                control
                    .admin(&format!("/destination.json?authority={service}.shop:80"))
                    .is_ok_and(|(_, page)| page.contains("\"exists\": true"))
            });
        }

        let apps = Apps::start(&web.netns.path(), web.ipv4().into(), "web-0").unwrap();
        let mut web_env = west.proxy_env("shop", "web", &west.token("shop", "web").unwrap());
        web_env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), west.addr.to_string()));
        web_env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), "shop:web-0".into()));
        // As the injector sets it from the pod's opaque-ports annotation.
        web_env.push(("CNIMESH_PROXY_OPAQUE_PORTS".into(), apps::HALF_CLOSE_PORT.to_string()));
        let web_proxy = Sidecar::start(&bins.proxy, &web.netns, &env_refs(&with(web_env))).unwrap();
        let gateway = start_gateway_with(bins, west, &gateway_pod, settings);
        let mut client_env = east.proxy_env("shop", "client", &east.token("shop", "client").unwrap());
        client_env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), east.addr.to_string()));
        let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&with(client_env))).unwrap();
        Self { clusters, client, web, gateway_pod, client_proxy, web_proxy, gateway, _apps: apps }
    }

    /// The gateway's listener.
    pub fn gateway_addr(&self) -> SocketAddr {
        SocketAddr::new(self.gateway_pod.ipv4().into(), cnimesh_common::names::PROXY_INBOUND_PORT)
    }
}

impl<'n> Deref for Meshed<'n> {
    type Target = Clusters<'n>;

    fn deref(&self) -> &Clusters<'n> {
        &self.clusters
    }
}

/// West's gateway proxy in `pod`, in gateway mode with west's identity and Destination.
pub fn start_gateway(bins: &Bins, west: &Control, pod: &Pod<'_>) -> Sidecar {
    start_gateway_with(bins, west, pod, &[])
}

/// [`start_gateway`] with `settings` added.
pub fn start_gateway_with(bins: &Bins, west: &Control, pod: &Pod<'_>, settings: &[(&str, &str)]) -> Sidecar {
    let mut env = west.proxy_env(
        MULTICLUSTER_NAMESPACE,
        GATEWAY_NAME,
        &west.token(MULTICLUSTER_NAMESPACE, GATEWAY_NAME).unwrap(),
    );
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), west.addr.to_string()));
    env.push(("CNIMESH_PROXY_MODE".into(), "gateway".into()));
    // Refusals of silent clients come sooner (the default wait is the detection timeout).
    env.push(("CNIMESH_PROXY_DETECT_TIMEOUT_MS".into(), "2000".into()));
    env.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Sidecar::start(&bins.proxy, &pod.netns, &env_refs(&env)).unwrap()
}

/// What `cnimesh multicluster install` applies on `cluster` (as `multicluster.yaml`), with
/// `anchors_pem` the trust anchors it publishes and `trust_domain` its gateway's.
pub fn install(cluster: &Cluster, anchors_pem: &str, trust_domain: &str) {
    let args = cnimesh_cli::multicluster::install::InstallArgs::default();
    let docs = cnimesh_cli::multicluster::install::render(&args, anchors_pem, trust_domain).unwrap();
    cluster.apply_yaml("multicluster.yaml", &cnimesh_cli::yaml::render(&docs)).unwrap();
}

/// Links `cluster` to `target` as an operator does: what `cnimesh multicluster link
/// --cluster-name <name>` prints when run against `target` (trust domain `trust_domain`, its
/// gateway if any) — the Link, its credentials Secret (a kubeconfig for target's API server
/// with a token target issued its mirror reader) and the Role that lets the mirror read that
/// Secret — applied to `cluster` as `link-<name>.yaml`.
pub fn link(cluster: &Cluster, name: &str, target: &Cluster, trust_domain: &str, gateway: Option<SocketAddr>) {
    let token = target.api.issue_token(MULTICLUSTER_NAMESPACE, MIRROR_READER_SERVICE_ACCOUNT, &[]).unwrap();
    let target = cnimesh_cli::multicluster::link::Target {
        cluster_name: name.into(),
        cluster_domain: "cluster.local".into(),
        trust_domain: trust_domain.into(),
        gateway: gateway.map(|g| (g.ip().to_string(), g.port())),
        server: target.server(),
        ca_pem: Some(target.ca_pem().as_bytes().to_vec()),
        token: Some(token),
    };
    let linked = cnimesh_cli::multicluster::link::render(&target).unwrap();
    cluster.apply_yaml(&format!("link-{name}.yaml"), &cnimesh_cli::yaml::render(&linked)).unwrap();
}

/// A Link to `cluster` as `link` prints it, without its credentials Secret.
pub fn link_without_secret(cluster: &str) -> String {
    format!(
        "apiVersion: multicluster.cnimesh.io/v1alpha1\nkind: Link\nmetadata: {{name: {cluster}, namespace: cnimesh}}\nspec:\n  targetClusterName: {cluster}\n  targetTrustDomain: {cluster}.local\n  clusterCredentialsSecret: cluster-credentials-{cluster}\n"
    )
}

/// The mirror `name` (Service and slices) of namespace `shop` in `cluster`, if it is there.
pub fn mirror(cluster: &Cluster, name: &str) -> Option<(Service, Vec<EndpointSlice>)> {
    let service = serde_json::from_value(cluster.api.get("v1", "Service", "shop", name)?).unwrap();
    let slices = cluster
        .api
        .list("discovery.k8s.io/v1", "EndpointSlice")
        .into_iter()
        .filter(|s| {
            s["metadata"]["namespace"] == "shop" && s["metadata"]["labels"]["kubernetes.io/service-name"] == name
        })
        .map(|s| serde_json::from_value(s).unwrap())
        .collect();
    Some((service, slices))
}

/// The endpoint addresses of mirror `name` in `cluster` (none when it is not there).
pub fn mirror_addresses(cluster: &Cluster, name: &str) -> BTreeSet<String> {
    let Some((_, slices)) = mirror(cluster, name) else { return BTreeSet::new() };
    slices.iter().flat_map(|s| &s.endpoints).flat_map(|e| e.addresses.clone()).collect()
}

/// The status the mirror keeps on `cluster`'s Link `name`.
pub fn link_status(cluster: &Cluster, name: &str) -> Option<LinkStatus> {
    let link = cluster.api.get(crd::API_VERSION, crd::KIND, CONTROL_NAMESPACE, name)?;
    serde_json::from_value(link.get("status")?.clone()).ok()
}

/// East (cluster.local) and west (west.local, its issuer signed by east's anchor), each a
/// control plane on its own API server served in its pod, both as `cnimesh multicluster
/// install` leaves them. The Link and east's mirror come when a test says
/// ([`Clusters::link`], [`Clusters::start_mirror`]); the gateway path's pods and proxies with
/// [`Meshed`].
pub struct Clusters<'n> {
    pub east: Control,
    pub west: Control,
    /// East's control plane's pod, where east's API server is served.
    pub east_pod: Pod<'n>,
    mirror_pod: Pod<'n>,
    _west_pod: Pod<'n>,
}

impl<'n> Clusters<'n> {
    /// Both control planes, ready, with their trust anchors ConfigMap and multicluster installed.
    pub fn start(bins: &Bins, net: &'n Network) -> Self {
        let east_pod = Pod::unmeshed(net, "cnimesh", "control-east").unwrap();
        let west_pod = Pod::unmeshed(net, "cnimesh", "control-west").unwrap();
        let mirror_pod = Pod::unmeshed(net, CONTROL_NAMESPACE, MIRROR_NAME).unwrap();
        let east = Control::start(&bins.control, &east_pod, &[]).unwrap();
        let west = Control::start_sharing_anchor(&bins.control, &west_pod, &[], &east, "west.local").unwrap();
        let anchors = std::fs::read_to_string(east.trust_anchors()).unwrap();
        for control in [&east, &west] {
            // The trust anchors ConfigMap the mesh's own install publishes (what `check` compares).
            use cnimesh_cli::install::{TRUST_ANCHORS_CONFIG_MAP, TRUST_ANCHORS_KEY};
            let anchors_map = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": TRUST_ANCHORS_CONFIG_MAP, "namespace": CONTROL_NAMESPACE},
                "data": {TRUST_ANCHORS_KEY: anchors}});
            control.cluster.apply("trust-anchors.yaml", &anchors_map).unwrap();
            install(&control.cluster, &anchors, &control.trust_domain);
        }
        Self { east, west, east_pod, mirror_pod, _west_pod: west_pod }
    }

    /// East linked to west as `west`, through west's `gateway` if any.
    pub fn link(&self, gateway: Option<SocketAddr>) {
        link(&self.east.cluster, "west", &self.west.cluster, &self.west.trust_domain, gateway);
    }

    /// East's mirror (`bin`: `CARGO_BIN_EXE_cnimesh-mirror-e2e`) in its own pod, as its own
    /// ServiceAccount on east's API server.
    pub fn start_mirror(&self, bin: &Path) -> MirrorProcess {
        let kubeconfig = self.east.cluster.kubeconfig_for(CONTROL_NAMESPACE, MIRROR_NAME).unwrap();
        MirrorProcess::start(bin, &self.mirror_pod, &kubeconfig, &self.east.trust_domain).unwrap()
    }

    /// East's mirror `name` of namespace `shop`.
    pub fn mirror(&self, name: &str) -> Option<(Service, Vec<EndpointSlice>)> {
        mirror(&self.east.cluster, name)
    }

    /// The endpoint addresses of east's mirror `name`.
    pub fn mirror_addresses(&self, name: &str) -> BTreeSet<String> {
        mirror_addresses(&self.east.cluster, name)
    }

    /// The status of east's Link `name`.
    pub fn link_status(&self, name: &str) -> Option<LinkStatus> {
        link_status(&self.east.cluster, name)
    }
}

/// A Service `name` of namespace `shop` (port 80 `http` → the apps' HTTP port) with `labels`
/// (YAML flow-map entries) and ClusterIP `ip`, and its ready meshed pods `(pod, IP)` with
/// service account `name`, as one file of a cluster directory.
pub fn service_yaml(name: &str, labels: &str, ip: &str, pods: &[(&str, Ipv4Addr)]) -> String {
    let http = apps::HTTP_PORT;
    let mut docs = vec![format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop, labels: {{{labels}}}}}\nspec:\n  clusterIP: {ip}\n  selector: {{app: {name}}}\n  ports: [{{name: http, port: 80, targetPort: {http}}}]\n"
    )];
    let endpoints: String = pods
        .iter()
        .map(|(pod, ip)| {
            format!("  - addresses: [\"{ip}\"]\n    conditions: {{ready: true}}\n    targetRef: {{kind: Pod, name: {pod}, namespace: shop}}\n")
        })
        .collect();
    docs.push(format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: http, port: {http}, protocol: TCP}}]\nendpoints:\n{}",
        if endpoints.is_empty() { "  []\n".to_string() } else { endpoints }
    ));
    for (pod, ip) in pods {
        docs.push(format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: shop, labels: {{app: {name}}}}}\nspec:\n  serviceAccountName: {name}\n  containers:\n    - name: app\n      ports: [{{name: http, containerPort: {http}}}]\n    - name: cnimesh-proxy\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"
        ));
    }
    docs.join("---\n")
}

/// One endpoint of a Destination answer: its identity and its metric labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub identity: Option<String>,
    pub labels: BTreeMap<String, String>,
}

/// What `control`'s Destination serves for `path` (`name.ns.svc.cluster.local:port`), asked from
/// the netns at `netns` as a meshed client of `control`'s trust domain, following one Get
/// stream's adds and removes until `done` holds of the endpoints (by address), or the patience
/// runs out: the endpoints then.
pub fn destination_endpoints(
    control: &Control,
    netns: &Path,
    path: &str,
    patience: Duration,
    done: impl Fn(&BTreeMap<String, Served>) -> bool + Send,
) -> BTreeMap<String, Served> {
    use linkerd2_proxy_api::destination::GetDestination;
    use linkerd2_proxy_api::destination::destination_client::DestinationClient;
    use linkerd2_proxy_api::destination::update::Update as Up;
    use linkerd2_proxy_api::destination::{TlsIdentity, tls_identity::Strategy};

    let (addr, issuer) = (control.addr.to_string(), control.issuer_dir());
    let anchors = std::fs::read(control.trust_anchors()).unwrap();
    let client_name = Name::parse(&control.identity("shop", "client")).unwrap();
    let control_name = Name::parse(&control.identity("cnimesh", "cnimesh-control")).unwrap();
    let path = path.to_string();
    let key = |a: Option<linkerd2_proxy_api::net::TcpAddress>| {
        a.and_then(|a| SocketAddr::try_from(a).ok()).map(|a| a.to_string()).unwrap_or_default()
    };
    let identity = |id: Option<TlsIdentity>| match id?.strategy? {
        Strategy::DnsLikeIdentity(d) => Some(d.name),
        other => Some(format!("{other:?}")),
    };
    block_on_in(netns, async move {
        let cert =
            cnimesh_model::identity::own_cert::issue_from_dir(&issuer, &client_name, Duration::from_secs(600)).unwrap();
        let roots = cnimesh_identity::tls::roots(&cnimesh_identity::pem::certs(&anchors, "anchors").unwrap()).unwrap();
        let channel = cnimesh_identity::grpc_channel::connect(&addr, &control_name, roots, Some(cert)).await.unwrap();
        let request = GetDestination { path, ..Default::default() };
        let mut stream = DestinationClient::new(channel).get(request).await.unwrap().into_inner();
        let mut seen = BTreeMap::new();
        let deadline = tokio::time::Instant::now() + patience;
        while !done(&seen) {
            let Ok(message) = tokio::time::timeout_at(deadline, stream.message()).await else { break };
            match message.unwrap().and_then(|u| u.update) {
                Some(Up::Add(set)) => {
                    for a in set.addrs {
                        let labels = a.metric_labels.into_iter().collect();
                        seen.insert(key(a.addr), Served { identity: identity(a.tls_identity), labels });
                    }
                }
                Some(Up::Remove(set)) => {
                    for a in set.addrs {
                        seen.remove(&key(Some(a)));
                    }
                }
                Some(Up::NoEndpoints(_)) => seen.clear(),
                None => break,
            }
        }
        seen
    })
}
