//! `cnimesh-node local up`, in the order a cluster brings a node up: trust anchor and issuer, the
//! node agent (which installs and chains the plugin), the control plane's pod (primary CNI only),
//! then each workload pod through the full chain as the kubelet would, proxies as the proxy UID,
//! the apps, and finally the demo's traffic.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ipnet::Ipv4Net;
use serde_json::{Value, json};

use super::host::{self, REFERENCE_PLUGIN_DIR, check_prerequisites, link_exists, netns_path, spawn_detached};
use super::record::{self, State};
use super::runtime::{Runtime, random_id};
use super::traffic::{self, Edge, Summary, http_get, http_get_in, samples};
use super::workloads::{self, APP_PORT, PodSpec, Role, SERVICE_RANGE, Workloads};
use super::{DEMO, Naming, UpArgs, down};
use crate::chain;

const PROXY_UID: u32 = 2102;
const CONTROL_PORT: u16 = 4190;
const CONTROL_ADMIN_PORT: u16 = 9990;
const PROXY_ADMIN_PORT: u16 = 4191;
const CONTROL_NAMESPACE: &str = "cnimesh";
const NETWORK: &str = "cnimesh-local";
const STARTUP: Duration = Duration::from_secs(30);

struct Binaries {
    node: PathBuf,
    plugin: PathBuf,
    proxy: PathBuf,
    control: PathBuf,
}

fn resolve_binary(flag: &Option<PathBuf>, name: &str, option: &str) -> anyhow::Result<PathBuf> {
    let path = match flag {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name(name),
    };
    if !path.is_file() {
        bail!(
            "{name} not found at {} (build it with `cargo build --release -p {name}`, or pass {option})",
            path.display()
        );
    }
    Ok(std::fs::canonicalize(&path)?)
}

/// Everything checked before anything is created.
fn preflight(args: &UpArgs) -> anyhow::Result<(Workloads, Binaries)> {
    let workloads = match &args.workloads {
        Some(path) => Workloads::load(path)?,
        None => Workloads::parse(DEMO, "built-in demo.yaml")?,
    };
    let prefix = &args.naming.prefix;
    if prefix.is_empty()
        || prefix.len() > 12
        || !prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        || (prefix.starts_with("cnm") && prefix[3..].starts_with(|c: char| c.is_ascii_digit()))
    {
        bail!("--prefix {prefix:?}: 1 to 12 of a-z0-9, and not `cnm<digit>…` (the tests' names)");
    }
    if args.subnet.prefix_len() > 26 {
        bail!("--subnet {}: too small; use a /26 or larger", args.subnet);
    }
    let hosts = args.subnet.hosts().count().saturating_sub(1);
    let pods = workloads.pods().len() + 1;
    if pods > hosts {
        bail!("--subnet {} has room for {hosts} pods; the workloads need {pods}", args.subnet);
    }
    if !(args.traffic_seconds > 0.0 && args.traffic_seconds <= 600.0) || args.concurrency == 0 {
        bail!("--traffic-seconds must be in (0, 600] and --concurrency at least 1");
    }
    check_prerequisites()?;
    let bins = Binaries {
        node: std::fs::canonicalize(std::env::current_exe()?)?,
        plugin: resolve_binary(&args.cni_plugin, "cnimesh-cni", "--cni-plugin")?,
        proxy: resolve_binary(&args.proxy, "cnimesh-proxy", "--proxy")?,
        control: resolve_binary(&args.control, "cnimesh-control", "--control")?,
    };
    let root = &args.naming.dir;
    host::check_root(root)?;
    let down_hint = format!("cnimesh-node local down --dir {} --prefix {prefix}", root.display());
    if root.join(record::FILE).exists() {
        bail!("local mode is already up in {}: run `{down_hint}` first", root.display());
    }
    if std::fs::read_dir(root).is_ok_and(|mut d| d.next().is_some()) {
        bail!("{} is not empty (left over from a crashed `up`?): run `{down_hint}` first", root.display());
    }
    let leftovers = host::netns_with_prefix(prefix);
    if !leftovers.is_empty() || link_exists(&format!("{prefix}0")) {
        bail!("namespaces {leftovers:?} or bridge {prefix}0 already exist: run `{down_hint}` first");
    }
    let routes = host::run("ip", &["-4", "route", "show"])?;
    if let Some(clash) = routes.lines().find(|l| {
        l.split_whitespace().next().and_then(|n| n.parse::<Ipv4Net>().ok()).is_some_and(|n| {
            n.prefix_len() > 0 && (n.contains(&args.subnet.network()) || args.subnet.contains(&n.network()))
        })
    }) {
        bail!("--subnet {} overlaps a route of this host ({clash}); pick another", args.subnet);
    }
    Ok((workloads, bins))
}

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
    chain::write_atomic_mode(path, contents.as_bytes(), Some(0o600))?;
    if let Some(uid) = owner {
        chown(path, Some(uid), Some(uid))?;
    }
    Ok(())
}

fn identity(ns: &str, sa: &str) -> String {
    format!("{sa}.{ns}.serviceaccount.identity.cnimesh.cluster.local")
}

fn free_loopback_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn in_netns(prefix: &str, pod: &str, program: &Path) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &format!("{prefix}-{pod}")]).arg(program);
    cmd
}

/// A pod that `up` created.
struct Running {
    spec: PodSpec,
    ip: Ipv4Addr,
}

pub fn up(args: &UpArgs) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let (workloads, bins) = preflight(args)?;
    let root = args.naming.dir.clone();
    match bring_up(args, &workloads, &bins, &root, started) {
        Ok(summary) => Ok(summary),
        Err(e) => {
            let cleanup = down::down(&Naming { dir: root.clone(), prefix: args.naming.prefix.clone() });
            let cleaned = match cleanup {
                Ok(_) => "everything it created was removed again".to_string(),
                Err(c) => {
                    format!("cleaning up failed too ({c:#}): run `cnimesh-node local down --dir {}`", root.display())
                }
            };
            Err(e.context(format!("local up failed; {cleaned}")))
        }
    }
}

fn bring_up(args: &UpArgs, w: &Workloads, bins: &Binaries, root: &Path, started: Instant) -> anyhow::Result<Summary> {
    let prefix = args.naming.prefix.as_str();
    let bridge = format!("{prefix}0");
    let mut state = State { prefix: prefix.into(), subnet: args.subnet, bridge: bridge.clone(), control: None };
    // The proxies (UID 2102) read their token and the trust anchors under the root.
    mkdir(root, 0o755)?;
    state.write(root)?;
    for dir in ["logs", "run", "pods", "cluster", "net.d", "cni-bin", "state", "attachments", "tokens"] {
        mkdir(&root.join(dir), 0o755)?;
    }
    let progress = |msg: &str| eprintln!("[{:5.1}s] {msg}", started.elapsed().as_secs_f64());

    progress("generating the trust anchor and issuer");
    let ca = root.join("ca");
    let out = Command::new(&bins.control).args(["ca", "init", "--dir"]).arg(&ca).output()?;
    if !out.status.success() {
        bail!("cnimesh-control ca init: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o755))?;

    progress("starting the node agent (installs cnimesh-cni, chains it into the primary conflist)");
    for entry in std::fs::read_dir(REFERENCE_PLUGIN_DIR)?.flatten() {
        std::os::unix::fs::symlink(entry.path(), root.join("cni-bin").join(entry.file_name()))?;
    }
    let primary = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [{
            "type": "bridge", "bridge": bridge, "isGateway": true,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": args.subnet.to_string()}]], "dataDir": root.join("ipam")},
        }],
    });
    chain::write_atomic(&root.join("net.d/10-cnimesh-local.conflist"), &serde_json::to_vec_pretty(&primary)?)?;
    let ready_addr = SocketAddr::from(([127, 0, 0, 1], free_loopback_port()?));
    let mut agent = Command::new(&bins.node);
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
        .arg(&bins.plugin)
        .args(["--ready-addr", &ready_addr.to_string()]);
    spawn_detached(root, "node-agent", agent)?;
    wait_for(root, "the node agent", "node-agent", || matches!(http_get(ready_addr, "agent", "/ready"), Ok((200, _))))?;
    let chained =
        chain::is_chained(&root.join("net.d")).context("the node agent reports ready but nothing is chained")?;
    let conflist: Value = serde_json::from_slice(&std::fs::read(&chained)?)?;

    let runtime = Runtime { cni_path: root.join("cni-bin"), records: root.join("attachments") };
    let attach = |name: &str, ns: &str, uid: &str, only_primary: bool| -> anyhow::Result<Ipv4Addr> {
        let netns = format!("{prefix}-{name}");
        host::run("ip", &["netns", "add", &netns])?;
        let a = runtime.add(&conflist, only_primary, ns, name, uid, &netns_path(&netns))?;
        host::run("ip", &["netns", "exec", &netns, "ip", "route", "add", SERVICE_RANGE, "dev", "eth0"])?;
        a.ipv4().with_context(|| format!("the CNI result for {name} has no IPv4 address: {:?}", a.result))
    };

    progress("starting the control plane in its own pod (primary CNI only, not captured)");
    let control_ip = attach("control", CONTROL_NAMESPACE, &random_id()?[..32], true)?;
    let control_addr = SocketAddr::from((control_ip, CONTROL_PORT));
    state.control = Some(control_addr);
    state.write(root)?;
    let mut control = in_netns(prefix, "control", &bins.control);
    control
        .args(["serve", "--issuer-dir"])
        .arg(&ca)
        .arg("--tokens-dir")
        .arg(root.join("tokens"))
        .arg("--cluster-dir")
        .arg(root.join("cluster"))
        .args(["--addr", &format!("0.0.0.0:{CONTROL_PORT}"), "--admin-addr", &format!("0.0.0.0:{CONTROL_ADMIN_PORT}")]);
    spawn_detached(root, "control", control)?;
    let control_ns = netns_path(&format!("{prefix}-control"));
    let control_admin = SocketAddr::from(([127, 0, 0, 1], CONTROL_ADMIN_PORT));
    wait_for(root, "cnimesh-control", "control", || {
        matches!(http_get_in(&control_ns, control_admin, "control", "/ready"), Ok((200, _)))
    })?;

    progress("creating the pods through the CNI chain (the agent decides capture from each Pod)");
    let ns = w.namespace.as_str();
    let mut pods = Vec::new();
    for spec in w.pods() {
        let uid = random_id()?[..32].to_string();
        let pod_file = root.join("pods").join(format!("{}.json", spec.name));
        // Pending while the sandbox is set up, as the API server would have it.
        chain::write_atomic(
            &pod_file,
            &serde_json::to_vec_pretty(&workloads::pod_object(ns, &spec, &uid, "Pending", None))?,
        )?;
        let ip = attach(&spec.name, ns, &uid, false)?;
        let running = workloads::pod_object(ns, &spec, &uid, "Running", Some(ip));
        chain::write_atomic(&pod_file, &serde_json::to_vec_pretty(&running)?)?;
        chain::write_atomic(
            &root.join("cluster").join(format!("pod-{}.yaml", spec.name)),
            &serde_json::to_vec_pretty(&running)?,
        )?;
        pods.push(Running { spec, ip });
    }
    for s in &w.services {
        let endpoints: Vec<(String, Ipv4Addr)> = pods
            .iter()
            .filter(|p| p.spec.role == Role::Server { service: s.name.clone() })
            .map(|p| (p.spec.name.clone(), p.ip))
            .collect();
        for object in workloads::service_objects(ns, s, &endpoints) {
            let file = format!("{}-{}.yaml", object["kind"].as_str().unwrap_or("object").to_lowercase(), s.name);
            chain::write_atomic(&root.join("cluster").join(file), &serde_json::to_vec_pretty(&object)?)?;
        }
    }

    progress("starting the apps and the proxies (UID 2102)");
    for pod in pods.iter().filter(|p| matches!(p.spec.role, Role::Server { .. })) {
        let mut app = in_netns(prefix, &pod.spec.name, &bins.node);
        app.args(["local", "app", "--listen", &format!("0.0.0.0:{APP_PORT}"), "--name", &pod.spec.name]);
        spawn_detached(root, &format!("app-{}", pod.spec.name), app)?;
    }
    for pod in pods.iter().filter(|p| p.spec.meshed) {
        let sa = &pod.spec.service_account;
        let token_file = root.join("tokens").join(ns).join(sa);
        if !token_file.exists() {
            mkdir(&root.join("tokens").join(ns), 0o700)?;
            write_secret(&token_file, &random_id()?, None)?;
        }
        let dir = root.join("proxies").join(&pod.spec.name);
        mkdir(&dir, 0o700)?;
        chown(&dir, Some(PROXY_UID), Some(PROXY_UID))?;
        write_secret(&dir.join("token"), &std::fs::read_to_string(&token_file)?, Some(PROXY_UID))?;
        let mut proxy = Command::new("ip");
        proxy
            .args(["netns", "exec", &format!("{prefix}-{}", pod.spec.name)])
            .args(["setpriv", "--reuid=2102", "--regid=2102", "--clear-groups"])
            .arg(&bins.proxy)
            .env("CNIMESH_PROXY_IDENTITY_NAME", identity(ns, sa))
            .env("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS", ca.join("ca.crt"))
            .env("CNIMESH_PROXY_IDENTITY_TOKEN_FILE", dir.join("token"))
            .env("CNIMESH_PROXY_IDENTITY_ADDR", control_addr.to_string())
            .env("CNIMESH_PROXY_DESTINATION_ADDR", control_addr.to_string());
        spawn_detached(root, &format!("proxy-{}", pod.spec.name), proxy)?;
    }
    let local = |port| SocketAddr::from(([127, 0, 0, 1], port));
    for pod in &pods {
        let netns = netns_path(&format!("{prefix}-{}", pod.spec.name));
        if matches!(pod.spec.role, Role::Server { .. }) {
            let log = format!("app-{}", pod.spec.name);
            wait_for(root, &format!("the app in {}", pod.spec.name), &log, || {
                matches!(http_get_in(&netns, local(APP_PORT), "app", "/"), Ok((200, _)))
            })?;
        }
        if pod.spec.meshed {
            let log = format!("proxy-{}", pod.spec.name);
            wait_for(root, &format!("the proxy in {}", pod.spec.name), &log, || {
                matches!(http_get_in(&netns, local(PROXY_ADMIN_PORT), "proxy", "/ready"), Ok((200, _)))
            })?;
        }
    }
    let up_seconds = started.elapsed().as_secs_f64();

    progress("sending traffic");
    let metrics_of = |pod: &str| -> Vec<traffic::Sample> {
        let netns = netns_path(&format!("{prefix}-{pod}"));
        http_get_in(&netns, local(PROXY_ADMIN_PORT), "proxy", "/metrics")
            .map(|(_, body)| samples(&body))
            .unwrap_or_default()
    };
    let mut edges = Vec::new();
    for client in &w.clients {
        let netns = netns_path(&format!("{prefix}-{}", client.name));
        for target in &client.calls {
            let s = w.service(target).expect("validated: calls name services");
            let replicas: Vec<&Running> =
                pods.iter().filter(|p| p.spec.role == Role::Server { service: s.name.clone() }).collect();
            let host = format!("{}.{ns}.svc.cluster.local", s.name);
            let duration = Duration::from_secs_f64(args.traffic_seconds);
            let load =
                traffic::load(&netns, SocketAddr::from((s.cluster_ip, s.port)), &host, args.concurrency, duration);
            let names: Vec<String> = replicas.iter().map(|p| p.spec.name.clone()).collect();
            let mut edge = Edge::new(&client.name, &s.name, s.meshed, &load, &names);
            if client.meshed {
                // The proxy labels by the address the app dialled (the ClusterIP) or the endpoint's.
                let ips: Vec<String> =
                    replicas.iter().map(|p| p.ip.to_string()).chain([s.cluster_ip.to_string()]).collect();
                let replica_metrics: Vec<(String, Vec<traffic::Sample>)> = replicas
                    .iter()
                    .filter(|p| p.spec.meshed)
                    .map(|p| (p.spec.name.clone(), metrics_of(&p.spec.name)))
                    .collect();
                edge.read_tls(&metrics_of(&client.name), &ips, &replica_metrics);
            }
            edges.push(edge);
        }
    }

    let me = &bins.node;
    let state_dir = root.join("state");
    let mut commands = BTreeMap::new();
    if let Some(client) = w.clients.iter().find(|c| c.meshed) {
        commands.insert(
            "a proxy's metrics".into(),
            format!("ip netns exec {prefix}-{} curl -s localhost:{PROXY_ADMIN_PORT}/metrics", client.name),
        );
        commands.insert(
            "the capture rules of a pod".into(),
            format!("{} --state-dir {} rules {ns}/{}", me.display(), state_dir.display(), client.name),
        );
    }
    commands.insert(
        "meshed pods on this node".into(),
        format!("{} --state-dir {} pods", me.display(), state_dir.display()),
    );
    commands.insert("logs".into(), format!("ls {}", root.join("logs").display()));
    commands.insert(
        "tear it down".into(),
        format!("{} local down --dir {} --prefix {prefix}", me.display(), root.display()),
    );
    Ok(Summary { root: root.display().to_string(), edges, commands, up_seconds })
}
