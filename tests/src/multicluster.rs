//! issue 28: two clusters on one host for the gateway path's tests and benchmark: control planes
//! `east` (cluster.local) and `west` (west.local, its issuer signed by east's anchor), west's
//! meshed `web` with the test apps and its multicluster gateway (a proxy in gateway mode), an
//! east client, and the mirror objects in east's cluster directory written by hand as the
//! multicluster contract shapes them: `web-west` through the gateway, `web-flat` straight to
//! web's pod (remote discovery).

use std::net::{Ipv4Addr, SocketAddr};

use cnimesh_common::names::{GATEWAY_NAME, MULTICLUSTER_NAMESPACE};

use crate::apps::{self, Apps};
use crate::cni::{Bins, Network};
use crate::control::{Control, env_refs, write_atomically};
use crate::pod::Pod;
use crate::sidecar::Sidecar;

pub const MIRROR_IP: &str = "10.96.0.50";
pub const FLAT_IP: &str = "10.96.0.51";
pub const WEB_FQDN: &str = "web.shop.svc.cluster.local";

/// West's `web` Service (HTTP on 80, the half-close app on its port, opaque), exported through
/// the gateway (`mirror.cnimesh.io/exported=true`: the gateway forwards to nothing else), and its pod.
pub fn west_web_yaml(ip: Ipv4Addr) -> String {
    let (http, tcp) = (apps::HTTP_PORT, apps::HALF_CLOSE_PORT);
    [
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop, labels: {{mirror.cnimesh.io/exported: 'true'}}}}\nspec:\n  clusterIP: 10.97.0.10\n  selector: {{app: web}}\n  ports: [{{name: http, port: 80, targetPort: {http}}}, {{name: tcp, port: {tcp}, targetPort: {tcp}, appProtocol: cnimesh.io/opaque}}]\n"),
        format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{{name: http, port: {http}}}, {{name: tcp, port: {tcp}}}]\nendpoints:\n  - addresses: [\"{ip}\"]\n    targetRef: {{kind: Pod, name: web-0, namespace: shop}}\n"),
        format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-0\n  namespace: shop\n  labels: {{app: web}}\nspec:\n  serviceAccountName: web\n  containers:\n    - name: app\n      ports: [{{name: http, containerPort: {http}}}, {{name: tcp, containerPort: {tcp}}}]\n    - name: cnimesh-proxy\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"),
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

pub struct Clusters<'n> {
    pub east: Control,
    pub west: Control,
    pub client: Pod<'n>,
    pub web: Pod<'n>,
    pub gateway_pod: Pod<'n>,
    pub client_proxy: Sidecar,
    pub web_proxy: Sidecar,
    pub gateway: Sidecar,
    pub west_dir: tempfile::TempDir,
    _east_dir: tempfile::TempDir,
    _apps: Apps,
    _control_pods: (Pod<'n>, Pod<'n>),
}

impl<'n> Clusters<'n> {
    /// Both clusters, the pods and their proxies, each ready.
    pub fn start(bins: &Bins, net: &'n Network) -> Self {
        let (east_dir, west_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let east_pod = Pod::unmeshed(net, "cnimesh", "control-east").unwrap();
        let west_pod = Pod::unmeshed(net, "cnimesh", "control-west").unwrap();
        let client = Pod::named(net, "shop", "client").unwrap();
        // ClusterIPs are routed out of the pod, where capture takes them (as kube-proxy's range).
        client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
        let web = Pod::named(net, "shop", "web-0").unwrap();
        // Not captured: the gateway is reached at its own address, and dials B's pods itself.
        let gateway_pod = Pod::unmeshed(net, MULTICLUSTER_NAMESPACE, GATEWAY_NAME).unwrap();
        write_atomically(&west_dir.path().join("web.yaml"), &west_web_yaml(web.ipv4()));
        let west_cluster = west_dir.path().display().to_string();
        let east_cluster = east_dir.path().display().to_string();
        let east = Control::start(&bins.control, &east_pod, &["--cluster-dir", &east_cluster]).unwrap();
        let west = Control::start_sharing_anchor(
            &bins.control,
            &west_pod,
            &["--cluster-dir", &west_cluster],
            &east,
            "west.local",
        )
        .unwrap();
        let gateway_identity = west.identity(MULTICLUSTER_NAMESPACE, GATEWAY_NAME);
        write_atomically(&east_dir.path().join("mirror.yaml"), &mirror_yaml(gateway_pod.ipv4(), &gateway_identity));
        write_atomically(&east_dir.path().join("flat.yaml"), &flat_yaml(web.ipv4(), &west.identity("shop", "web")));

        let apps = Apps::start(&web.netns.path(), web.ipv4().into(), "web-0").unwrap();
        let mut web_env = west.proxy_env("shop", "web", &west.token("shop", "web").unwrap());
        web_env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), west.addr.to_string()));
        web_env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), "shop:web-0".into()));
        let web_proxy = Sidecar::start(&bins.proxy, &web.netns, &env_refs(&web_env)).unwrap();
        let gateway = start_gateway(bins, &west, &gateway_pod);
        let mut client_env = east.proxy_env("shop", "client", &east.token("shop", "client").unwrap());
        client_env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), east.addr.to_string()));
        let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&client_env)).unwrap();
        Self {
            east,
            west,
            client,
            web,
            gateway_pod,
            client_proxy,
            web_proxy,
            gateway,
            west_dir,
            _east_dir: east_dir,
            _apps: apps,
            _control_pods: (east_pod, west_pod),
        }
    }

    /// The gateway's listener.
    pub fn gateway_addr(&self) -> SocketAddr {
        SocketAddr::new(self.gateway_pod.ipv4().into(), cnimesh_common::names::PROXY_INBOUND_PORT)
    }
}

/// West's gateway proxy in `pod`, in gateway mode with west's identity and Destination.
pub fn start_gateway(bins: &Bins, west: &Control, pod: &Pod<'_>) -> Sidecar {
    let mut env = west.proxy_env(
        MULTICLUSTER_NAMESPACE,
        GATEWAY_NAME,
        &west.token(MULTICLUSTER_NAMESPACE, GATEWAY_NAME).unwrap(),
    );
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), west.addr.to_string()));
    env.push(("CNIMESH_PROXY_MODE".into(), "gateway".into()));
    // Refusals of silent clients come sooner (the default wait is the detection timeout).
    env.push(("CNIMESH_PROXY_DETECT_TIMEOUT_MS".into(), "2000".into()));
    Sidecar::start(&bins.proxy, &pod.netns, &env_refs(&env)).unwrap()
}
