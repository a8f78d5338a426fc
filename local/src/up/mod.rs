//! `cnimesh-local up`, in the order a cluster brings a node up: trust anchor and issuer, the
//! node agent (which installs and chains the plugin), the control plane's pod (primary CNI only),
//! then each workload pod through the full chain as the kubelet would, proxies as the proxy UID,
//! the apps, and finally the demo's traffic. With `--clusters 2`, [`west`] brings the second
//! cluster up beside the first and links them.

mod egress;
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
    CONTROL_ADMIN_PORT, CONTROL_NAMESPACE, CONTROL_PORT, PROXY_ADMIN_PORT, PROXY_UID, TAP_SERVICE_ACCOUNT,
};
use serde_json::{Value, json};

use self::preflight::{Binaries, preflight};
use self::summary::{next_commands, send_traced_request, send_traffic};
use super::host::{self, REFERENCE_PLUGIN_DIR, netns_path, spawn_detached};
use super::record::State;
use super::runtime::{Runtime, random_id};
use super::traffic::{Summary, http_get, http_get_in};
use super::workloads::{self, APP_PORT, PodSpec, Role, SERVICE_RANGE, Workloads};
use super::{Naming, UpArgs, down};
use cnimesh_node::chain;

/// The control plane's admin server (`/ready`) inside its pod; not a §2 number, local mode's own.
const NETWORK: &str = "cnimesh-local";
/// East's (the first cluster's) trust domain: the mesh's default.
const EAST_TRUST_DOMAIN: &str = "cluster.local";
const STARTUP: Duration = Duration::from_secs(30);

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
    /// The control plane's `--mirror-service-cidr` (east of `--clusters 2`).
    mirror_service_cidr: Option<&'a str>,
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

    /// The CNI runtime over local mode's plugin dir, recording attachments for `down`.
    fn runtime(&self) -> Runtime {
        Runtime { cni_path: self.root.join("cni-bin"), records: self.root.join("attachments") }
    }
}

pub fn up(args: &UpArgs) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let (workloads, bins) = preflight(args)?;
    let root = args.naming.dir.clone();
    let mirror_service_cidr = (args.clusters == 2).then_some(SERVICE_RANGE);
    let inputs = Inputs {
        args,
        workloads: &workloads,
        bins: &bins,
        root: &root,
        prefix: &args.naming.prefix,
        started,
        subnet: args.subnet,
        trust_domain: EAST_TRUST_DOMAIN,
        mirror_service_cidr,
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
    write_policies(i)?;
    let conflist = start_agent(i)?;
    egress::masquerade(i, &mut state)?;
    let control_addr = start_control(i, &conflist, &ca, &mut state)?;
    let collector = start_collector(i)?;
    let pods = create_pods(i, &conflist)?;
    write_services(i, &pods)?;
    start_apps(i, &pods)?;
    start_proxies(i, &pods, &ca, control_addr, collector)?;
    wait_for_pods(i, &pods)?;
    let west = if i.args.clusters == 2 { Some(west::bring_up(i, &ca, &mut state)?) } else { None };
    let up_seconds = i.started.elapsed().as_secs_f64();
    let edges = send_traffic(i, &pods);
    let trace = send_traced_request(i, &pods)?;
    let multicluster = west.map(|w| west::send_traffic(i, &w));
    Ok(Summary {
        root: i.root.display().to_string(),
        edges,
        commands: next_commands(i),
        up_seconds,
        trace,
        multicluster,
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
    for dir in ["logs", "run", "pods", "cluster", "net.d", "cni-bin", "state", "attachments", "tokens"] {
        mkdir(&i.root.join(dir), 0o755)?;
    }
    Ok(state)
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
fn start_agent(i: &Inputs<'_>) -> anyhow::Result<Value> {
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
    let mut agent = Command::new(&i.bins.node);
    agent
        .arg("--cni-bin-dir")
        .arg(root.join("cni-bin"))
        .arg("--cni-conf-dir")
        .arg(root.join("net.d"))
        .arg("--socket")
        .arg(root.join("node.sock"))
        .arg("--state-dir")
        .arg(root.join("state"))
        .args(["run", "--pods-dir"])
        .arg(root.join("pods"))
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

/// The control plane in a pod of its own (primary CNI only, never captured), its address recorded
/// as soon as it is known; returns that gRPC address once the control plane is ready.
fn start_control(i: &Inputs<'_>, conflist: &Value, ca: &Path, state: &mut State) -> anyhow::Result<SocketAddr> {
    i.progress("starting the control plane in its own pod (primary CNI only, not captured)");
    let control_ip = attach(i, conflist, "control", CONTROL_NAMESPACE, &random_id()?[..32], true)?;
    let control_addr = SocketAddr::from((control_ip, CONTROL_PORT));
    state.control = Some(control_addr);
    state.write(i.root)?;
    // The token `cnimesh tap --local` proves the tap ServiceAccount with (root's alone).
    mkdir(&i.root.join("tokens").join(CONTROL_NAMESPACE), 0o700)?;
    write_secret(&i.root.join("tokens").join(CONTROL_NAMESPACE).join(TAP_SERVICE_ACCOUNT), &random_id()?, None)?;
    let mut control = i.in_netns("control", &i.bins.control);
    control
        .args(["serve", "--issuer-dir"])
        .arg(ca)
        .arg("--tokens-dir")
        .arg(i.root.join("tokens"))
        .arg("--cluster-dir")
        .arg(i.root.join("cluster"))
        .args(["--addr", &format!("0.0.0.0:{CONTROL_PORT}"), "--admin-addr", &format!("0.0.0.0:{CONTROL_ADMIN_PORT}")])
        .args(["--trust-domain", i.trust_domain]);
    if let Some(cidr) = i.mirror_service_cidr {
        control.args(["--mirror-service-cidr", cidr]);
    }
    spawn_detached(i.root, "control", control)?;
    let control_ns = i.netns("control");
    let control_admin = SocketAddr::from(([127, 0, 0, 1], CONTROL_ADMIN_PORT));
    wait_for(i.root, "cnimesh-control", "control", || {
        matches!(http_get_in(&control_ns, control_admin, "control", "/ready"), Ok((200, _)))
    })?;
    Ok(control_addr)
}

/// The collector stand-in (`cnimesh-local collector`) on the bridge's gateway, which the control
/// pod's attachment has just given an address; returns where the proxies export to.
fn start_collector(i: &Inputs<'_>) -> anyhow::Result<SocketAddr> {
    let gateway = i.subnet.hosts().next().context("the pod subnet has no gateway address")?;
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

/// Each workload pod through the full chain: its Pod object is written Pending first (the agent
/// decides capture from it), then Running with its IP for the agent and the control plane.
fn create_pods(i: &Inputs<'_>, conflist: &Value) -> anyhow::Result<Vec<Running>> {
    i.progress("creating the pods through the CNI chain (the agent decides capture from each Pod)");
    let ns = i.workloads.namespace.as_str();
    let mut pods = Vec::new();
    for spec in i.workloads.pods() {
        let uid = random_id()?[..32].to_string();
        let pod_file = i.root.join("pods").join(format!("{}.json", spec.name));
        // Pending while the sandbox is set up, as the API server would have it.
        write_atomic(
            &pod_file,
            &serde_json::to_vec_pretty(&workloads::pod_object(ns, &spec, &uid, "Pending", None))?,
            None,
        )?;
        let ip = attach(i, conflist, &spec.name, ns, &uid, false)?;
        let running = workloads::pod_object(ns, &spec, &uid, "Running", Some(ip));
        write_atomic(&pod_file, &serde_json::to_vec_pretty(&running)?, None)?;
        write_atomic(
            &i.root.join("cluster").join(format!("pod-{}.yaml", spec.name)),
            &serde_json::to_vec_pretty(&running)?,
            None,
        )?;
        pods.push(Running { spec, ip });
    }
    Ok(pods)
}

/// The replicas of service `name`.
fn replicas<'p>(pods: &'p [Running], name: &str) -> Vec<&'p Running> {
    pods.iter().filter(|p| p.spec.role == Role::Server { service: name.to_string() }).collect()
}

/// Each service's Service and endpoints objects, for the control plane's files backend.
fn write_services(i: &Inputs<'_>, pods: &[Running]) -> anyhow::Result<()> {
    let ns = i.workloads.namespace.as_str();
    for s in &i.workloads.services {
        let endpoints: Vec<(String, Ipv4Addr)> =
            replicas(pods, &s.name).into_iter().map(|p| (p.spec.name.clone(), p.ip)).collect();
        for object in workloads::service_objects(ns, s, &endpoints) {
            let file = format!("{}-{}.yaml", object["kind"].as_str().unwrap_or("object").to_lowercase(), s.name);
            write_atomic(&i.root.join("cluster").join(file), &serde_json::to_vec_pretty(&object)?, None)?;
        }
    }
    Ok(())
}

/// The policy objects of services with `allow` and the routes of those with `split`, written
/// before the control plane starts so that the proxies' first answer already holds them.
fn write_policies(i: &Inputs<'_>) -> anyhow::Result<()> {
    let ns = i.workloads.namespace.as_str();
    for s in &i.workloads.services {
        for object in workloads::policy_objects(ns, s).into_iter().chain(workloads::route_objects(ns, s)) {
            let kind = object["kind"].as_str().unwrap_or("object").to_lowercase();
            let file = format!("policy-{kind}-{}.yaml", s.name);
            write_atomic(&i.root.join("cluster").join(file), &serde_json::to_vec_pretty(&object)?, None)?;
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
    pods: &[Running],
    ca: &Path,
    control_addr: SocketAddr,
    collector: SocketAddr,
) -> anyhow::Result<()> {
    let ns = i.workloads.namespace.as_str();
    for pod in pods.iter().filter(|p| p.spec.meshed) {
        let sa = &pod.spec.service_account;
        let token_file = i.root.join("tokens").join(ns).join(sa);
        if !token_file.exists() {
            mkdir(&i.root.join("tokens").join(ns), 0o700)?;
            write_secret(&token_file, &random_id()?, None)?;
        }
        let dir = i.root.join("proxies").join(&pod.spec.name);
        mkdir(&dir, 0o700)?;
        chown(&dir, Some(PROXY_UID), Some(PROXY_UID))?;
        write_secret(&dir.join("token"), &std::fs::read_to_string(&token_file)?, Some(PROXY_UID))?;
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
