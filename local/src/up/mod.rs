//! `cnimesh-local up`, in the order a cluster brings a node up: trust anchor and issuer, the API
//! server (on the bridge's gateway) with the cluster's Namespaces, Node, ServiceAccounts and policy
//! objects, the node agent (which installs and chains the plugin), the control plane's pod
//! (primary CNI only), then each workload pod through the full chain as the kubelet would,
//! proxies as the proxy UID, the apps, the ingress controller if the workloads have one, and
//! finally the demo's traffic. With `--clusters 2`, [`west`] brings the second cluster up beside
//! the first and links them.

mod egress;
mod ingress;
mod preflight;
mod summary;
mod west;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cnimesh_common::fs::write_atomic;
use cnimesh_common::names::{
    AGENT_NAME, AGENT_NAMESPACE, CONTROL_ADMIN_PORT, CONTROL_NAME, CONTROL_NAMESPACE, CONTROL_PORT, MIRROR_NAME,
    PROXY_ADMIN_PORT, PROXY_UID, TAP_SERVICE_ACCOUNT,
};
use serde_json::{Value, json};

use self::preflight::{Binaries, preflight};
use self::summary::{next_commands, send_traced_request, send_traffic};
use super::apiserver::{self, API_PORT};
use super::host::{self, REFERENCE_PLUGIN_DIR, netns_path, spawn_detached};
use super::objects::Objects;
use super::record::State;
use super::runtime::Runtime;
use super::traffic::{Summary, http_get, http_get_in};
use super::workloads::{self, APP_PORT, PodSpec, Role, SERVICE_RANGE, Workloads};
use super::{Naming, UpArgs, down};
use cnimesh_node::chain;

/// The control plane's admin server (`/ready`) inside its pod; not a §2 number, local mode's own.
const NETWORK: &str = "cnimesh-local";
/// East's (the first cluster's) trust domain: the mesh's default.
const EAST_TRUST_DOMAIN: &str = "cluster.local";
/// The mirror's admin server (`/ready`), in the control plane's pod beside the control plane's.
const MIRROR_ADMIN_PORT: u16 = 9991;
const STARTUP: Duration = Duration::from_secs(30);
/// How often local mode's single control plane renews its writer Lease (at most a third of the
/// lease's 30 s, which the control plane checks).
const LEASE_RENEW_INTERVAL: &str = "10s";
/// The ConfigMap of the trust anchors in the control plane's namespace (key `ca.crt`), as
/// `cnimesh install` names it.
const TRUST_ANCHORS_CONFIG_MAP: &str = "cnimesh-identity-trust-anchors";
/// The Node local mode's pods run on (`spec.nodeName`), which the node agent watches pods of.
pub const NODE_NAME: &str = "cnimesh-local";

/// Waits (bounded) for `ready`; on timeout the error carries the tail of `log`.
fn wait_for(root: &Path, what: &str, log: &str, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + STARTUP;
    while !ready() {
        if Instant::now() > deadline {
            bail!(
                "{what} did not become ready within {} s; {log}.log ends with:\n{}",
                STARTUP.as_secs(),
                host::log_tail(root, log)
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Ok(())
}

fn mkdir(path: &Path, mode: u32) -> anyhow::Result<()> {
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn write_secret(path: &Path, contents: &str, owner: Option<u32>) -> anyhow::Result<()> {
    write_atomic(path, contents.as_bytes(), Some(0o600))?;
    if let Some(uid) = owner {
        chown(path, Some(uid), Some(uid))?;
    }
    Ok(())
}

fn identity(ns: &str, sa: &str, trust_domain: &str) -> String {
    format!("{sa}.{ns}.serviceaccount.identity.cnimesh.{trust_domain}")
}

fn free_loopback_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A pod that `up` created.
struct Running {
    spec: PodSpec,
    ip: Ipv4Addr,
}

/// What every step of [`bring_up`] reads: the checked arguments, workloads and binaries, and the
/// names derived from them. One struct, so each step is a small function with one argument for
/// "the run" and only its own products as others.
struct Inputs<'a> {
    args: &'a UpArgs,
    workloads: &'a Workloads,
    bins: &'a Binaries,
    root: &'a Path,
    prefix: &'a str,
    started: Instant,
    /// This cluster's pod subnet (east: --subnet; west: --west-subnet).
    subnet: ipnet::Ipv4Net,
    /// This cluster's trust domain (east: cluster.local; west: west.local).
    trust_domain: &'a str,
}

impl Inputs<'_> {
    fn progress(&self, msg: &str) {
        eprintln!("[{:5.1}s] {msg}", self.started.elapsed().as_secs_f64());
    }

    fn bridge(&self) -> String {
        format!("{}0", self.prefix)
    }

    /// The netns name of `pod`.
    fn netns_name(&self, pod: &str) -> String {
        format!("{}-{pod}", self.prefix)
    }

    /// The netns path of `pod`, for work done on a thread inside it.
    fn netns(&self, pod: &str) -> PathBuf {
        netns_path(&self.netns_name(pod))
    }

    /// `program` run inside the netns of `pod`.
    fn in_netns(&self, pod: &str, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns_name(pod)]).arg(program);
        cmd
    }

    /// The administrator's kubeconfig of this cluster's API server.
    fn kubeconfig(&self) -> PathBuf {
        self.root.join("kubeconfig")
    }

    /// The CNI runtime over local mode's plugin dir, recording attachments for `down`.
    fn runtime(&self) -> Runtime {
        Runtime { cni_path: self.root.join("cni-bin"), records: self.root.join("attachments") }
    }
}

pub fn up(args: &UpArgs) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let (workloads, bins) = preflight(args)?;
    let root = args.naming.dir.clone();
    let inputs = Inputs {
        args,
        workloads: &workloads,
        bins: &bins,
        root: &root,
        prefix: &args.naming.prefix,
        started,
        subnet: args.subnet,
        trust_domain: EAST_TRUST_DOMAIN,
    };
    match bring_up(&inputs) {
        Ok(summary) => Ok(summary),
        Err(e) => {
            let cleanup = down::down(&Naming { dir: root.clone(), prefix: args.naming.prefix.clone() });
            let cleaned = match cleanup {
                Ok(_) => "everything it created was removed again".to_string(),
                Err(c) => {
                    format!("cleaning up failed too ({c:#}): run `cnimesh-local down --dir {}`", root.display())
                }
            };
            Err(e.context(format!("local up failed; {cleaned}")))
        }
    }
}

/// The steps, in the order a cluster brings a node up.
fn bring_up(i: &Inputs<'_>) -> anyhow::Result<Summary> {
    let mut state = root_layout(i)?;
    let ca = trust_anchor(i)?;
    let api = start_apiserver(i, &ca)?;
    write_policies(i, &api)?;
    let conflist = start_agent(i, &api)?;
    egress::masquerade(i, &mut state)?;
    let control_addr = start_control(i, &api, &conflist, &ca, &mut state)?;
    let collector = start_collector(i)?;
    let pods = create_pods(i, &api, &conflist)?;
    write_services(i, &api, &pods)?;
    start_apps(i, &pods)?;
    start_proxies(i, &api, &pods, &ca, control_addr, collector)?;
    wait_for_pods(i, &pods)?;
    let ingress = ingress::start(i, &pods)?;
    if let Some(bin) = &i.bins.mirror {
        start_mirror(i, &api, bin)?;
    }
    let west = if i.args.clusters == 2 { Some(west::bring_up(i, &api, &ca, &mut state)?) } else { None };
    let up_seconds = i.started.elapsed().as_secs_f64();
    let edges = send_traffic(i, &pods);
    let trace = send_traced_request(i, &pods)?;
    let multicluster = west.map(|w| west::send_traffic(i, &api, &w));
    Ok(Summary {
        root: i.root.display().to_string(),
        edges,
        commands: next_commands(i),
        up_seconds,
        trace,
        multicluster,
        ingress,
    })
}

/// The root dir and its layout, and the first record of this run (so `down` finds it even if
/// `up` stops right after).
fn root_layout(i: &Inputs<'_>) -> anyhow::Result<State> {
    let state = State {
        prefix: i.prefix.into(),
        subnet: i.subnet,
        bridge: i.bridge(),
        control: None,
        trust_domain: Some(i.trust_domain.to_string()),
        gateway: None,
        forward_table: None,
        egress_table: None,
    };
    // The proxies (UID 2102) read their token and the trust anchors under the root.
    mkdir(i.root, 0o755)?;
    state.write(i.root)?;
    for dir in ["logs", "run", "net.d", "cni-bin", "state", "attachments"] {
        mkdir(&i.root.join(dir), 0o755)?;
    }
    // Each component's kubeconfig holds its ServiceAccount's token: root's alone.
    mkdir(&i.root.join("kubeconfigs"), 0o700)?;
    Ok(state)
}

/// The bridge's gateway address: the first host of the pod subnet (host-local never hands it out).
fn gateway_of(subnet: ipnet::Ipv4Net) -> anyhow::Result<Ipv4Addr> {
    subnet.hosts().next().with_context(|| format!("the subnet {subnet} has no gateway address"))
}

/// The API server (`cnimesh-local apiserver`) on the bridge's gateway, where the host and every
/// pod reach it: the bridge and its address are made first (the bridge plugin finds both in
/// place). Then what a cluster holds before its first pod: the Namespaces, this Node and the
/// ServiceAccounts of the pods and of the mesh's own components.
fn start_apiserver(i: &Inputs<'_>, ca: &Path) -> anyhow::Result<Objects> {
    let gateway = gateway_of(i.subnet)?;
    let listen = SocketAddr::from((gateway, API_PORT));
    i.progress(&format!("starting the API server on {listen} (kubectl --kubeconfig {})", i.kubeconfig().display()));
    let bridge = i.bridge();
    if !host::link_exists(&bridge) {
        host::run("ip", &["link", "add", &bridge, "type", "bridge"])?;
    }
    host::run("ip", &["addr", "replace", &format!("{gateway}/{}", i.subnet.prefix_len()), "dev", &bridge])?;
    host::run("ip", &["link", "set", &bridge, "up"])?;
    let mut server = Command::new(&i.bins.local);
    server
        .args(["apiserver", "--listen", &listen.to_string(), "--namespace", &i.workloads.namespace, "--kubeconfig"])
        .arg(i.kubeconfig());
    spawn_detached(i.root, "apiserver", server)?;
    wait_for(i.root, "local mode's API server", "apiserver", || i.kubeconfig().exists())?;
    let api = Objects::connect(&i.kubeconfig())?;
    for ns in [i.workloads.namespace.as_str(), CONTROL_NAMESPACE, AGENT_NAMESPACE] {
        api.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))?;
    }
    api.apply(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE_NAME}}))?;
    // The trust anchors, where `cnimesh install` puts them (`multicluster check` compares them).
    let anchors = std::fs::read_to_string(ca.join("ca.crt")).context("reading the trust anchors")?;
    api.apply(&json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": TRUST_ANCHORS_CONFIG_MAP, "namespace": CONTROL_NAMESPACE},
        "data": {"ca.crt": anchors}}))?;
    let mut accounts: Vec<(&str, &str)> = vec![
        (CONTROL_NAMESPACE, CONTROL_NAME),
        (CONTROL_NAMESPACE, TAP_SERVICE_ACCOUNT),
        (AGENT_NAMESPACE, AGENT_NAME),
    ];
    let pods = i.workloads.pods();
    accounts.extend(pods.iter().map(|p| (i.workloads.namespace.as_str(), p.service_account.as_str())));
    for (ns, name) in accounts {
        service_account(&api, ns, name)?;
    }
    Ok(api)
}

pub(super) fn service_account(api: &Objects, ns: &str, name: &str) -> anyhow::Result<()> {
    api.apply(&json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}))?;
    Ok(())
}

/// A kubeconfig for ServiceAccount `ns/name` (a token of the API's own audience), root's alone;
/// returns its path.
fn component_kubeconfig(i: &Inputs<'_>, api: &Objects, ns: &str, name: &str) -> anyhow::Result<PathBuf> {
    let token = api.token(ns, name, &[])?;
    let path = i.root.join("kubeconfigs").join(format!("{name}.json"));
    write_secret(&path, &apiserver::with_token(&i.kubeconfig(), &format!("{ns}-{name}"), &token)?, None)?;
    Ok(path)
}

/// The trust anchor and issuer, made by `cnimesh ca init`; returns their dir.
fn trust_anchor(i: &Inputs<'_>) -> anyhow::Result<PathBuf> {
    i.progress("generating the trust anchor and issuer");
    let ca = i.root.join("ca");
    let out = Command::new(&i.bins.cli).args(["ca", "init", "--dir"]).arg(&ca).output()?;
    if !out.status.success() {
        bail!("cnimesh ca init: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o755))?;
    Ok(ca)
}

/// The primary conflist (bridge + host-local), then the node agent, which installs cnimesh-cni
/// and chains it; returns the chained conflist once the agent is ready.
fn start_agent(i: &Inputs<'_>, api: &Objects) -> anyhow::Result<Value> {
    i.progress("starting the node agent (installs cnimesh-cni, chains it into the primary conflist)");
    let root = i.root;
    for entry in std::fs::read_dir(REFERENCE_PLUGIN_DIR)?.flatten() {
        std::os::unix::fs::symlink(entry.path(), root.join("cni-bin").join(entry.file_name()))?;
    }
    let primary = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [{
            // A default route through the bridge, as a node's pods have (egress::masquerade
            // takes it out of the host).
            "type": "bridge", "bridge": i.bridge(), "isGateway": true, "isDefaultGateway": true,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": i.subnet.to_string()}]], "dataDir": root.join("ipam")},
        }],
    });
    write_atomic(&root.join("net.d/10-cnimesh-local.conflist"), &serde_json::to_vec_pretty(&primary)?, None)?;
    let ready_addr = SocketAddr::from(([127, 0, 0, 1], free_loopback_port()?));
    let kubeconfig = component_kubeconfig(i, api, AGENT_NAMESPACE, AGENT_NAME)?;
    let mut agent = Command::new(&i.bins.node);
    agent.env("KUBECONFIG", kubeconfig);
    agent
        .arg("--cni-bin-dir")
        .arg(root.join("cni-bin"))
        .arg("--cni-conf-dir")
        .arg(root.join("net.d"))
        .arg("--socket")
        .arg(root.join("node.sock"))
        .arg("--state-dir")
        .arg(root.join("state"))
        .args(["run", "--node-name", NODE_NAME])
        .arg("--plugin-binary")
        .arg(&i.bins.plugin)
        .args(["--ready-addr", &ready_addr.to_string()]);
    spawn_detached(root, "node-agent", agent)?;
    wait_for(root, "the node agent", "node-agent", || matches!(http_get(ready_addr, "agent", "/ready"), Ok((200, _))))?;
    let chained =
        chain::is_chained(&root.join("net.d")).context("the node agent reports ready but nothing is chained")?;
    Ok(serde_json::from_slice(&std::fs::read(&chained)?)?)
}

/// A pod's netns, set up through `conflist` (only its first plugin when `only_primary`) as the
/// kubelet would, with a route to the service range; returns the pod's IPv4 address.
fn attach(
    i: &Inputs<'_>,
    conflist: &Value,
    name: &str,
    ns: &str,
    uid: &str,
    only_primary: bool,
) -> anyhow::Result<Ipv4Addr> {
    let netns = i.netns_name(name);
    host::run("ip", &["netns", "add", &netns])?;
    let a = i.runtime().add(conflist, only_primary, ns, name, uid, &netns_path(&netns))?;
    host::run("ip", &["netns", "exec", &netns, "ip", "route", "add", SERVICE_RANGE, "dev", "eth0"])?;
    a.ipv4().with_context(|| format!("the CNI result for {name} has no IPv4 address: {:?}", a.result))
}

/// The control plane in a pod of its own (primary CNI only, never captured), with its Pod and
/// Service (the CLI's service proxy reaches its admin port through them) and a kubeconfig for its
/// ServiceAccount; its address recorded as soon as it is known. Returns that gRPC address once the
/// control plane is ready.
fn start_control(
    i: &Inputs<'_>,
    api: &Objects,
    conflist: &Value,
    ca: &Path,
    state: &mut State,
) -> anyhow::Result<SocketAddr> {
    i.progress("starting the control plane in its own pod (primary CNI only, not captured)");
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": CONTROL_NAME, "namespace": CONTROL_NAMESPACE, "labels": {"app": CONTROL_NAME}},
        "spec": {"serviceAccountName": CONTROL_NAME, "nodeName": NODE_NAME, "containers": [{"name": CONTROL_NAME,
            "ports": [{"name": "grpc", "containerPort": CONTROL_PORT}, {"name": "admin", "containerPort": CONTROL_ADMIN_PORT}]}]},
    });
    let pod = api.apply(&pod)?;
    let control_ip = attach(i, conflist, "control", CONTROL_NAMESPACE, &created_uid(&pod)?, true)?;
    api.set_status(&pod, &workloads::pod_status("Running", Some(control_ip)))?;
    api.apply(&json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": CONTROL_NAME, "namespace": CONTROL_NAMESPACE},
        "spec": {"clusterIP": "None", "selector": {"app": CONTROL_NAME}, "ports": [
            {"name": "grpc", "port": CONTROL_PORT, "targetPort": "grpc"},
            {"name": "admin", "port": CONTROL_ADMIN_PORT, "targetPort": "admin"}]},
    }))?;
    let control_addr = SocketAddr::from((control_ip, CONTROL_PORT));
    state.control = Some(control_addr);
    state.write(i.root)?;
    let kubeconfig = component_kubeconfig(i, api, CONTROL_NAMESPACE, CONTROL_NAME)?;
    let mut control = i.in_netns("control", &i.bins.control);
    control
        .env("KUBECONFIG", kubeconfig)
        .args(["serve", "--kube", "--issuer-dir"])
        .arg(ca)
        .args(["--addr", &format!("0.0.0.0:{CONTROL_PORT}"), "--admin-addr", &format!("0.0.0.0:{CONTROL_ADMIN_PORT}")])
        .args(["--trust-domain", i.trust_domain])
        // One replica: its writer Lease is renewed every 10 s rather than every 2 s (the default,
        // for a quick hand-over between replicas), so idle local mode does not wake the API
        // server and the control plane for a Lease no one else wants. The lease stays 30 s.
        .env("CNIMESH_CONTROL_LEASE_RENEW_INTERVAL", LEASE_RENEW_INTERVAL);
    spawn_detached(i.root, "control", control)?;
    let control_ns = i.netns("control");
    let control_admin = SocketAddr::from(([127, 0, 0, 1], CONTROL_ADMIN_PORT));
    wait_for(i.root, "cnimesh-control", "control", || {
        matches!(http_get_in(&control_ns, control_admin, "control", "/ready"), Ok((200, _)))
    })?;
    Ok(control_addr)
}

/// The multicluster mirror (`cnimesh-mirror serve`), as `cnimesh multicluster install` runs it:
/// a process of its own beside the control plane (in the control plane's pod here, its admin on
/// [`MIRROR_ADMIN_PORT`]), with a kubeconfig for its own ServiceAccount. It follows the Links in
/// the control plane's namespace and writes the mirrors of their clusters' exports (ClusterIPs
/// from the API server); the control plane holds no linked cluster's credentials.
fn start_mirror(i: &Inputs<'_>, api: &Objects, bin: &Path) -> anyhow::Result<()> {
    i.progress("starting the multicluster mirror (cnimesh-mirror, its own ServiceAccount)");
    service_account(api, CONTROL_NAMESPACE, MIRROR_NAME)?;
    let kubeconfig = component_kubeconfig(i, api, CONTROL_NAMESPACE, MIRROR_NAME)?;
    let mut mirror = i.in_netns("control", bin);
    mirror
        .env("KUBECONFIG", kubeconfig)
        .env("CNIMESH_MIRROR_TRUST_DOMAIN", i.trust_domain)
        .env("CNIMESH_MIRROR_ADMIN_ADDR", format!("127.0.0.1:{MIRROR_ADMIN_PORT}"))
        .arg("serve");
    spawn_detached(i.root, "mirror", mirror)?;
    let control_ns = i.netns("control");
    wait_for(i.root, "cnimesh-mirror", "mirror", || {
        matches!(http_get_in(&control_ns, loopback(MIRROR_ADMIN_PORT), "mirror", "/ready"), Ok((200, _)))
    })
}

/// The uid the API server gave an object it created (the CNI's `K8S_POD_UID`).
fn created_uid(object: &Value) -> anyhow::Result<String> {
    object["metadata"]["uid"].as_str().map(String::from).context("the API server gave the object no uid")
}

/// The collector stand-in (`cnimesh-local collector`) on the bridge's gateway, which the control
/// pod's attachment has just given an address; returns where the proxies export to.
fn start_collector(i: &Inputs<'_>) -> anyhow::Result<SocketAddr> {
    let gateway = gateway_of(i.subnet)?;
    let addr = SocketAddr::from((gateway, crate::demo_trace::COLLECTOR_PORT));
    i.progress(&format!("starting the collector stand-in on {addr} (spans to traces.jsonl)"));
    let file = crate::demo_trace::traces_file(i.root);
    crate::demo_trace::create_file(&file)?;
    let mut collector = Command::new(&i.bins.local);
    collector.args(["collector", "--listen", &addr.to_string(), "--out"]).arg(&file);
    spawn_detached(i.root, "collector", collector)?;
    wait_for(i.root, "the collector stand-in", "collector", || crate::demo_trace::listening(addr))?;
    Ok(addr)
}

/// Each workload pod through the full chain: its Pod is created Pending on local mode's Node
/// first (the agent decides capture from it), then reported Running with its IP, as a kubelet
/// would.
fn create_pods(i: &Inputs<'_>, api: &Objects, conflist: &Value) -> anyhow::Result<Vec<Running>> {
    i.progress("creating the pods through the CNI chain (the agent decides capture from each Pod)");
    let ns = i.workloads.namespace.as_str();
    let mut pods = Vec::new();
    for spec in i.workloads.pods() {
        let pod = api.apply(&workloads::pod_object(ns, &spec, NODE_NAME, i.workloads.ingress.as_ref()))?;
        api.set_status(&pod, &workloads::pod_status("Pending", None))?;
        let ip = attach(i, conflist, &spec.name, ns, &created_uid(&pod)?, false)?;
        api.set_status(&pod, &workloads::pod_status("Running", Some(ip)))?;
        pods.push(Running { spec, ip });
    }
    Ok(pods)
}

/// The replicas of service `name`.
fn replicas<'p>(pods: &'p [Running], name: &str) -> Vec<&'p Running> {
    pods.iter().filter(|p| p.spec.role == Role::Server { service: name.to_string() }).collect()
}

/// Each service's Service and its EndpointSlice (local mode has no endpoint controller).
fn write_services(i: &Inputs<'_>, api: &Objects, pods: &[Running]) -> anyhow::Result<()> {
    let ns = i.workloads.namespace.as_str();
    for s in &i.workloads.services {
        let endpoints: Vec<(String, Ipv4Addr)> =
            replicas(pods, &s.name).into_iter().map(|p| (p.spec.name.clone(), p.ip)).collect();
        for object in workloads::service_objects(ns, s, &endpoints) {
            api.apply(&object)?;
        }
    }
    Ok(())
}

/// The policy objects of services with `allow` and the routes of those with `split`, written
/// before the control plane starts so that the proxies' first answer already holds them.
fn write_policies(i: &Inputs<'_>, api: &Objects) -> anyhow::Result<()> {
    let ns = i.workloads.namespace.as_str();
    for s in &i.workloads.services {
        for object in workloads::policy_objects(ns, s).into_iter().chain(workloads::route_objects(ns, s)) {
            api.apply(&object)?;
        }
    }
    Ok(())
}

/// The demo's HTTP app in every server pod (`cnimesh-local app`, this executable).
fn start_apps(i: &Inputs<'_>, pods: &[Running]) -> anyhow::Result<()> {
    i.progress(&format!("starting the apps and the proxies (UID {PROXY_UID})"));
    for pod in pods.iter().filter(|p| matches!(p.spec.role, Role::Server { .. })) {
        let mut app = i.in_netns(&pod.spec.name, &i.bins.local);
        app.args(["app", "--listen", &format!("0.0.0.0:{APP_PORT}"), "--name", &pod.spec.name]);
        spawn_detached(i.root, &format!("app-{}", pod.spec.name), app)?;
    }
    Ok(())
}

/// A proxy in every meshed pod, as the proxy UID, with its service account's token (one per
/// service account, as a projected token would be) readable by it alone.
/// Every proxy exports its spans to the collector stand-in; their sampling stays the default 0,
/// so only requests that carry a sampled context (the demo's traced request) are traced.
fn start_proxies(
    i: &Inputs<'_>,
    api: &Objects,
    pods: &[Running],
    ca: &Path,
    control_addr: SocketAddr,
    collector: SocketAddr,
) -> anyhow::Result<()> {
    let ns = i.workloads.namespace.as_str();
    let mut tokens = std::collections::BTreeMap::new();
    for pod in pods.iter().filter(|p| p.spec.meshed) {
        let sa = &pod.spec.service_account;
        if !tokens.contains_key(sa) {
            tokens.insert(sa.clone(), api.token(ns, sa, &[cnimesh_identity::TOKEN_AUDIENCE])?);
        }
        let dir = i.root.join("proxies").join(&pod.spec.name);
        mkdir(&dir, 0o700)?;
        chown(&dir, Some(PROXY_UID), Some(PROXY_UID))?;
        write_secret(&dir.join("token"), &tokens[sa], Some(PROXY_UID))?;
        let mut proxy = Command::new("ip");
        proxy
            .args(["netns", "exec", &i.netns_name(&pod.spec.name)])
            .args(["setpriv", &format!("--reuid={PROXY_UID}"), &format!("--regid={PROXY_UID}"), "--clear-groups"])
            .arg(&i.bins.proxy)
            .env("CNIMESH_PROXY_IDENTITY_NAME", identity(ns, sa, i.trust_domain))
            .env(
                "CNIMESH_PROXY_IDENTITY_SVC_NAME",
                identity(CONTROL_NAMESPACE, cnimesh_common::names::CONTROL_NAME, i.trust_domain),
            )
            .env("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS", ca.join("ca.crt"))
            .env("CNIMESH_PROXY_IDENTITY_TOKEN_FILE", dir.join("token"))
            .env("CNIMESH_PROXY_IDENTITY_ADDR", control_addr.to_string())
            .env("CNIMESH_PROXY_DESTINATION_ADDR", control_addr.to_string())
            // Each port's authorization policy comes from the control plane.
            .env("CNIMESH_PROXY_POLICY_WORKLOAD", format!("{ns}:{}", pod.spec.name))
            // What the injector sets from the downward API: the spans' pod and namespace.
            .env("CNIMESH_POD_NAME", &pod.spec.name)
            .env("CNIMESH_POD_NAMESPACE", ns)
            .env("CNIMESH_PROXY_TRACE_COLLECTOR", format!("http://{collector}"));
        if pod.spec.role == Role::Ingress {
            // What the injector sets for `cnimesh.io/inject: ingress`.
            proxy.env("CNIMESH_PROXY_MODE", "ingress");
        }
        spawn_detached(i.root, &format!("proxy-{}", pod.spec.name), proxy)?;
    }
    Ok(())
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Waits until every app answers and every proxy reports ready, from inside its pod.
fn wait_for_pods(i: &Inputs<'_>, pods: &[Running]) -> anyhow::Result<()> {
    for pod in pods {
        let netns = i.netns(&pod.spec.name);
        if matches!(pod.spec.role, Role::Server { .. }) {
            let log = format!("app-{}", pod.spec.name);
            wait_for(i.root, &format!("the app in {}", pod.spec.name), &log, || {
                matches!(http_get_in(&netns, loopback(APP_PORT), "app", "/"), Ok((200, _)))
            })?;
        }
        if pod.spec.meshed {
            let log = format!("proxy-{}", pod.spec.name);
            wait_for(i.root, &format!("the proxy in {}", pod.spec.name), &log, || {
                matches!(http_get_in(&netns, loopback(PROXY_ADMIN_PORT), "proxy", "/ready"), Ok((200, _)))
            })?;
        }
    }
    Ok(())
}
