//! `up --clusters 2`: the second cluster, `west`, brought up beside east by the same
//! steps (its own root `<dir>/west`, prefix `<prefix>w`, bridge, subnet, node agent, control plane
//! with trust domain `west.local` and an issuer signed by east's anchor through `cnimesh ca
//! issuer`), plus what multicluster adds: a gateway pod (cnimesh-proxy in gateway mode, not
//! captured, the only process of its pod), forwarding between the two pod networks (an nftables
//! table that `down` deletes), and the Link that `cnimesh multicluster link --local <west>` prints,
//! applied to east's API server as `kubectl apply` would. West has its own API server on its own
//! bridge; what `cnimesh multicluster install` would leave there for `link` to read (the control
//! plane's Deployment, the gateway's Service and the mirror reader's token) is written by `up`.
//!
//! East's control plane runs the mirror controller, which reaches west's API server with the
//! Link's credentials; the demo calls both mirrors from east's client.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cnimesh_common::names::{
    CONTROL_NAME, CONTROL_NAMESPACE, GATEWAY_NAME, INJECT_ANNOTATION, MIRROR_READER_SERVICE_ACCOUNT,
    MULTICLUSTER_NAMESPACE, PROXY_ADMIN_PORT, PROXY_CONTAINER, PROXY_INBOUND_PORT, PROXY_UID,
};
use serde_json::json;

use super::{
    Inputs, NODE_NAME, Running, create_pods, created_uid, gateway_of, identity, loopback, mkdir, service_account,
    start_agent, start_apiserver, start_apps, start_collector, start_control, start_proxies, wait_for, wait_for_pods,
    write_policies, write_secret, write_services,
};
use crate::host::{self, spawn_detached};
use crate::objects::Objects;
use crate::record::State;
use crate::traffic::{self, Edge, Multicluster, http_get_in, samples};
use crate::workloads::{Role, Workloads};

/// West's workloads, built in like the demo.
pub const WEST: &str = include_str!("../west.yaml");
pub const WEST_NAME: &str = "west";
pub const WEST_TRUST_DOMAIN: &str = "west.local";
/// The mirror reader's token Secret in west, as `cnimesh multicluster install` names it.
const READER_TOKEN_SECRET: &str = "cnimesh-mirror-reader-token";
/// The gateway Service's port, as `cnimesh multicluster install` names it.
const GATEWAY_PORT_NAME: &str = "mc-gateway";
/// How long east's mirror controller gets to make a mirror.
const MIRROR_WAIT: Duration = Duration::from_secs(30);

/// West, up and linked.
pub(super) struct West {
    root: PathBuf,
    prefix: String,
    workloads: Workloads,
    pods: Vec<Running>,
    gateway: SocketAddr,
    link_file: PathBuf,
}

pub(super) fn bring_up(
    east: &Inputs<'_>,
    east_api: &Objects,
    east_ca: &Path,
    east_state: &mut State,
) -> anyhow::Result<West> {
    let root = east.root.join(WEST_NAME);
    let prefix = format!("{}w", east.prefix);
    let workloads = Workloads::parse(WEST, "built-in west.yaml")?;
    let w = Inputs {
        args: east.args,
        workloads: &workloads,
        bins: east.bins,
        root: &root,
        prefix: &prefix,
        started: east.started,
        subnet: east.args.west_subnet,
        trust_domain: WEST_TRUST_DOMAIN,
    };
    east.progress(&format!("west: a second cluster in {} (prefix {prefix}, subnet {})", root.display(), w.subnet));
    let mut state = super::root_layout(&w)?;
    let ca = issuer(&w, east_ca)?;
    let api = start_apiserver(&w, &ca)?;
    write_policies(&w, &api)?;
    let conflist = start_agent(&w, &api)?;
    super::egress::masquerade(&w, &mut state)?;
    let control = start_control(&w, &api, &conflist, &ca, &mut state)?;
    let collector = start_collector(&w)?;
    let pods = create_pods(&w, &api, &conflist)?;
    write_services(&w, &api, &pods)?;
    start_apps(&w, &pods)?;
    start_proxies(&w, &api, &pods, &ca, control, collector)?;
    wait_for_pods(&w, &pods)?;
    let gateway = start_gateway(&w, &api, &conflist, &ca, control)?;
    state.gateway = Some(gateway);
    state.write(&root)?;
    installed(&w, &api, gateway)?;
    forward_between(east, east_state, w.subnet)?;
    let link_file = link(east, east_api, &root)?;
    Ok(West { root: root.clone(), prefix, workloads, pods, gateway, link_file })
}

/// West's issuer, signed by east's anchor (`cnimesh ca issuer`): one anchor, two trust domains.
fn issuer(w: &Inputs<'_>, east_ca: &Path) -> anyhow::Result<PathBuf> {
    w.progress("west: its issuer (trust domain west.local) from east's trust anchor (`cnimesh ca issuer`)");
    let ca = w.root.join("ca");
    let out = Command::new(&w.bins.cli)
        .args(["ca", "issuer", "--trust-domain", WEST_TRUST_DOMAIN, "--anchor-dir"])
        .arg(east_ca)
        .arg("--dir")
        .arg(&ca)
        .output()?;
    if !out.status.success() {
        bail!("cnimesh ca issuer: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    std::fs::set_permissions(&ca, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(ca)
}

/// The gateway pod: primary CNI only (the gateway is the proxy; nothing to capture, so annotated
/// not to be), its Pod in west's API server, the proxy as the proxy UID in gateway mode with the
/// gateway's identity.
fn start_gateway(
    w: &Inputs<'_>,
    api: &Objects,
    conflist: &serde_json::Value,
    ca: &Path,
    control: SocketAddr,
) -> anyhow::Result<SocketAddr> {
    w.progress("west: the multicluster gateway pod (cnimesh-proxy, CNIMESH_PROXY_MODE=gateway)");
    let pod = "gateway";
    api.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MULTICLUSTER_NAMESPACE}}))?;
    service_account(api, MULTICLUSTER_NAMESPACE, GATEWAY_NAME)?;
    let object = api.apply(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": MULTICLUSTER_NAMESPACE, "labels": {"app.kubernetes.io/name": GATEWAY_NAME},
            "annotations": {INJECT_ANNOTATION: "disabled"}},
        "spec": {"serviceAccountName": GATEWAY_NAME, "nodeName": NODE_NAME, "containers": [{"name": PROXY_CONTAINER, "ports": [
            {"name": "mc-gateway", "containerPort": PROXY_INBOUND_PORT}, {"name": "mc-probe", "containerPort": PROXY_ADMIN_PORT}]}]},
    }))?;
    let ip: Ipv4Addr = super::attach(w, conflist, pod, MULTICLUSTER_NAMESPACE, &created_uid(&object)?, true)?;
    api.set_status(&object, &crate::workloads::pod_status("Running", Some(ip)))?;
    let token = api.token(MULTICLUSTER_NAMESPACE, GATEWAY_NAME, &[cnimesh_identity::TOKEN_AUDIENCE])?;
    let dir = w.root.join("proxies").join(pod);
    mkdir(&dir, 0o700)?;
    std::os::unix::fs::chown(&dir, Some(PROXY_UID), Some(PROXY_UID))?;
    write_secret(&dir.join("token"), &token, Some(PROXY_UID))?;
    let mut proxy = Command::new("ip");
    proxy
        .args(["netns", "exec", &w.netns_name(pod)])
        .args(["setpriv", &format!("--reuid={PROXY_UID}"), &format!("--regid={PROXY_UID}"), "--clear-groups"])
        .arg(&w.bins.proxy)
        .env("CNIMESH_PROXY_MODE", "gateway")
        .env("CNIMESH_PROXY_IDENTITY_NAME", identity(MULTICLUSTER_NAMESPACE, GATEWAY_NAME, w.trust_domain))
        .env("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS", ca.join("ca.crt"))
        .env("CNIMESH_PROXY_IDENTITY_TOKEN_FILE", dir.join("token"))
        .env("CNIMESH_PROXY_IDENTITY_ADDR", control.to_string())
        .env("CNIMESH_PROXY_IDENTITY_SVC_NAME", identity(CONTROL_NAMESPACE, CONTROL_NAME, w.trust_domain))
        .env("CNIMESH_PROXY_DESTINATION_ADDR", control.to_string())
        .env("CNIMESH_PROXY_POLICY_WORKLOAD", format!("{MULTICLUSTER_NAMESPACE}:{pod}"))
        .env("CNIMESH_POD_NAME", pod)
        .env("CNIMESH_POD_NAMESPACE", MULTICLUSTER_NAMESPACE);
    spawn_detached(w.root, "proxy-gateway", proxy)?;
    let netns = w.netns(pod);
    wait_for(w.root, "west's gateway", "proxy-gateway", || {
        matches!(http_get_in(&netns, loopback(PROXY_ADMIN_PORT), "proxy", "/ready"), Ok((200, _)))
    })?;
    Ok(SocketAddr::from((ip, PROXY_INBOUND_PORT)))
}

/// The nftables table of this local mode's forwarding between the pod networks.
pub fn forward_table(prefix: &str) -> String {
    format!("cnimesh-local-{prefix}")
}

/// Pods route to their bridge's gateway: the host forwards between the two bridges. Forwarding
/// is turned on, and an nftables table accepts (and counts) forwarded traffic between the two
/// subnets, so that a filter that drops by default elsewhere in nftables does not see it first.
fn forward_between(east: &Inputs<'_>, state: &mut State, west: ipnet::Ipv4Net) -> anyhow::Result<()> {
    east.progress(&format!(
        "routing between {} and {west} (forwarding, nftables table inet {})",
        east.subnet,
        forward_table(east.prefix)
    ));
    let table = forward_table(east.prefix);
    // Recorded first: `down` deletes the table even if `up` stops halfway.
    state.forward_table = Some(table.clone());
    state.write(east.root)?;
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").context("enabling IPv4 forwarding")?;
    let (e, w) = (east.subnet, west);
    let rules = format!(
        "table inet {table} {{\n  chain forward {{\n    type filter hook forward priority filter - 1; policy accept;\n    ip saddr {e} ip daddr {w} counter accept comment \"cnimesh-local east to west\"\n    ip saddr {w} ip daddr {e} counter accept comment \"cnimesh-local west to east\"\n  }}\n}}\n"
    );
    let file = east.root.join("run").join("forward.nft");
    std::fs::write(&file, rules)?;
    host::run("nft", &["-f", &file.display().to_string()]).context("installing the forwarding rules")?;
    // Pods only route their own subnet (and the service range): each side's pods get a route
    // to the other subnet through their bridge's gateway, as a node's routes would give them.
    let (east_gw, west_gw) = (gateway_of(e)?, gateway_of(w)?);
    for (prefix, other, via) in [(east.prefix.to_string(), w, east_gw), (format!("{}w", east.prefix), e, west_gw)] {
        for netns in host::netns_with_prefix(&prefix) {
            host::run(
                "ip",
                &["netns", "exec", &netns, "ip", "route", "replace", &other.to_string(), "via", &via.to_string()],
            )?;
        }
    }
    Ok(())
}

/// What `cnimesh multicluster install` leaves in west for `link` to read: the control plane's
/// Deployment (its trust domain), the gateway's Service with the gateway pod's address as its
/// load balancer's, and the mirror reader's ServiceAccount with its token (of west's API server)
/// and the API server's CA in a Secret.
fn installed(w: &Inputs<'_>, api: &Objects, gateway: SocketAddr) -> anyhow::Result<()> {
    let labels = json!({"app": CONTROL_NAME});
    api.apply(&json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": CONTROL_NAME, "namespace": CONTROL_NAMESPACE},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "serviceAccountName": CONTROL_NAME,
            "containers": [{"name": CONTROL_NAME, "args": ["serve", "--kube", "--trust-domain", w.trust_domain]}]}}},
    }))?;
    let service = api.apply(&json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": GATEWAY_NAME, "namespace": MULTICLUSTER_NAMESPACE},
        "spec": {"type": "LoadBalancer", "selector": {"app.kubernetes.io/name": GATEWAY_NAME},
            "ports": [{"name": GATEWAY_PORT_NAME, "port": gateway.port(), "targetPort": gateway.port()}]},
    }))?;
    api.set_status(&service, &json!({"loadBalancer": {"ingress": [{"ip": gateway.ip().to_string()}]}}))?;
    service_account(api, MULTICLUSTER_NAMESPACE, MIRROR_READER_SERVICE_ACCOUNT)?;
    let token = api.token(MULTICLUSTER_NAMESPACE, MIRROR_READER_SERVICE_ACCOUNT, &[])?;
    let kubeconfig: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(w.kubeconfig())?)?;
    let ca = kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"].clone();
    api.apply(&json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": READER_TOKEN_SECRET, "namespace": MULTICLUSTER_NAMESPACE,
            "annotations": {"kubernetes.io/service-account.name": MIRROR_READER_SERVICE_ACCOUNT}},
        "data": {"token": base64_of(&token), "ca.crt": ca},
    }))?;
    Ok(())
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// `cnimesh multicluster link --local <west> --cluster-name west` (west's kubeconfig), applied to
/// east's API server; its output is kept in east's `kubeconfigs/` (root's alone: it holds west's
/// credentials).
fn link(east: &Inputs<'_>, east_api: &Objects, west_root: &Path) -> anyhow::Result<PathBuf> {
    east.progress(
        "linking east to west: `cnimesh multicluster link --local <west> --cluster-name west`, applied to east",
    );
    let out = Command::new(&east.bins.cli)
        .args(["multicluster", "link", "--cluster-name", WEST_NAME, "--local"])
        .arg(west_root)
        .output()?;
    if !out.status.success() {
        bail!("cnimesh multicluster link: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let file = east.root.join("kubeconfigs").join(format!("link-{WEST_NAME}.yaml"));
    write_secret(&file, &String::from_utf8_lossy(&out.stdout), None)?;
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout))
        .context("the output of `cnimesh multicluster link`")?;
    for doc in docs.iter().filter(|d| d.is_object()) {
        east_api.apply(doc)?;
    }
    Ok(file)
}

/// The mirror `name` in east once the mirror controller wrote it: its ClusterIP and port
/// (bounded wait).
fn wait_for_mirror(east_api: &Objects, ns: &str, mirror: &str) -> Result<(Ipv4Addr, u16), String> {
    let deadline = Instant::now() + MIRROR_WAIT;
    loop {
        if let Ok(Some(service)) = east_api.get("v1", "Service", ns, mirror)
            && let Some(ip) = service["spec"]["clusterIP"].as_str().and_then(|s| s.parse().ok())
            && let Some(port) = service["spec"]["ports"][0]["port"].as_u64()
        {
            return Ok((ip, port as u16));
        }
        if Instant::now() > deadline {
            return Err(format!("the mirror Service {ns}/{mirror} did not appear within {} s", MIRROR_WAIT.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metrics_in(netns: &Path) -> Vec<traffic::Sample> {
    http_get_in(netns, loopback(PROXY_ADMIN_PORT), "proxy", "/metrics")
        .map(|(_, body)| samples(&body))
        .unwrap_or_default()
}

/// East's first meshed client to each mirror of west's exports, and the client identities west's
/// gateway and servers saw.
pub(super) fn send_traffic(east: &Inputs<'_>, east_api: &Objects, west: &West) -> Multicluster {
    let mut mc = Multicluster {
        west_root: west.root.display().to_string(),
        gateway: west.gateway.to_string(),
        link_file: west.link_file.display().to_string(),
        edges: Vec::new(),
        notes: Vec::new(),
        identities_seen: Default::default(),
    };
    let ns = west.workloads.namespace.as_str();
    let Some(client) = east.workloads.clients.iter().find(|c| c.meshed) else {
        mc.notes.push("no meshed client in east: no cross-cluster traffic".into());
        return mc;
    };
    east.progress("sending traffic from east to west's exports through their mirrors");
    let netns = east.netns(&client.name);
    for s in west.workloads.services.iter().filter(|s| s.export.is_some()) {
        let mirror = format!("{}-{WEST_NAME}", s.name);
        let (ip, port) = match wait_for_mirror(east_api, ns, &mirror) {
            Ok(found) => found,
            Err(note) => {
                mc.notes.push(note);
                continue;
            }
        };
        let host = format!("{mirror}.{ns}.svc.cluster.local");
        let duration = Duration::from_secs_f64(east.args.traffic_seconds);
        let load = traffic::load(&netns, SocketAddr::from((ip, port)), &host, east.args.concurrency, duration);
        let replicas: Vec<&Running> =
            west.pods.iter().filter(|p| p.spec.role == Role::Server { service: s.name.clone() }).collect();
        let names: Vec<String> = replicas.iter().map(|p| p.spec.name.clone()).collect();
        let mut edge = Edge::new(&client.name, &mirror, true, &load, &names);
        let endpoints: Vec<String> =
            replicas.iter().map(|p| p.ip.to_string()).chain([ip.to_string(), west.gateway.ip().to_string()]).collect();
        edge.read_tls(&metrics_in(&netns), &endpoints, &[]);
        mc.edges.push(edge);
    }
    let pod_netns = |pod: &str| host::netns_path(&format!("{}-{pod}", west.prefix));
    // A server's inbound series carry the client's identity; the gateway counts the connections
    // it admitted by client (its forwarded traffic is outbound, to west's pods).
    let seen = |metrics: Vec<traffic::Sample>| {
        let mut ids: Vec<String> = metrics
            .iter()
            .filter(|s| {
                s.name.starts_with("gateway_connections") || s.labels.get("direction").is_some_and(|d| d == "inbound")
            })
            .filter_map(|s| s.labels.get("client_id").cloned())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    };
    mc.identities_seen.insert("gateway".into(), seen(metrics_in(&pod_netns("gateway"))));
    for pod in west.pods.iter().filter(|p| matches!(p.spec.role, Role::Server { .. }) && p.spec.meshed) {
        mc.identities_seen.insert(pod.spec.name.clone(), seen(metrics_in(&pod_netns(&pod.spec.name))));
    }
    mc
}
