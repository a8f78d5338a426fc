//! The node agent with the plugin: decisions over the agent's socket for pods served by the
//! in-process Kubernetes API server, in real network namespaces through the real CNI chain; the agent's run loop
//! (install, re-chaining, uninstall); repair and taint removal against the API; the debug CLI.

use std::sync::Arc;
use std::time::Duration;

use cnimesh_cni::spec::RedirectSpec;
use cnimesh_e2e::host::Mounted;
use cnimesh_e2e::kube_api::{Call, ClusterApi};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use cnimesh_node::cluster::{Cluster, SharedCluster};
use cnimesh_node::kube_cluster::KubeCluster;
use cnimesh_node::metrics::AgentMetrics;
use cnimesh_node::server::{self, Decider};
use http::Method;
use k8s_openapi::api::core::v1::{Node, Pod as KubePod};
use serde_json::{Value, json};

const NODE: &str = "node-1";

fn kube_pod(ns: &str, name: &str, meshed: bool, annotations: Value) -> KubePod {
    let mut containers = vec![json!({"name": "app"})];
    if meshed {
        containers.push(json!({"name": "cnimesh-proxy", "securityContext": {"runAsUser": 2103}}));
    }
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}"), "annotations": annotations},
        "spec": {"nodeName": NODE, "containers": containers},
        "status": {"phase": "Running"}
    }))
    .unwrap()
}

/// An API server holding `pods` and `node`.
fn cluster_api(pods: &[&KubePod], node: Option<&Node>) -> Arc<ClusterApi> {
    let api = ClusterApi::new();
    for pod in pods {
        api.put(serde_json::to_value(pod).unwrap());
    }
    if let Some(node) = node {
        api.put(serde_json::to_value(node).unwrap());
    }
    api
}

/// The requests `api` saw of `method` to paths starting with `path`.
fn requests(api: &ClusterApi, method: Method, path: &str) -> Vec<Call> {
    api.calls().into_iter().filter(|c| c.method == method && c.path.starts_with(path)).collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The agent's view of `api`'s cluster on the Kubernetes code path (a reflector on this node's
/// pods), its watch driven on `rt`.
fn kube_cluster(rt: &tokio::runtime::Runtime, api: &Arc<ClusterApi>) -> SharedCluster {
    let _entered = rt.enter();
    let (cluster, driver) = KubeCluster::start(api.client(), NODE);
    rt.spawn(driver);
    cluster
}

#[test]
fn plugin_asks_the_agent_which_pods_to_capture() {
    if !require_root("plugin_asks_the_agent_which_pods_to_capture") {
        return;
    }
    let mock = cluster_api(
        &[
            &kube_pod("shop", "web", true, json!({"config.cnimesh.io/skip-inbound-ports": "8081"})),
            &kube_pod("shop", "plain", false, json!({})),
            &kube_pod("shop", "optout", true, json!({"cnimesh.io/inject": "disabled"})),
            &kube_pod("shop", "broken", true, json!({"config.cnimesh.io/skip-outbound-ports": "80,http"})),
        ],
        None,
    );
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("node.sock");
    let metrics = Arc::new(AgentMetrics::default());
    let cluster = rt.block_on(async {
        let (cluster, driver) = KubeCluster::start(mock.client(), NODE);
        tokio::spawn(driver);
        let listener = server::bind(&socket).unwrap();
        tokio::spawn(server::serve(
            listener,
            Arc::new(Decider { cluster: cluster.clone(), defaults: RedirectSpec::default() }),
            metrics.clone(),
        ));
        cluster
    });
    eventually("the pod cache to sync", Duration::from_secs(10), || cluster.ready());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600, "socket is 0600");

    let net = Network::bridge(&bins!(), json!({"nodeAgent": {"socket": socket, "timeoutMs": 2000}})).unwrap();

    // Meshed: captured, with the annotation and the proxy's runAsUser applied.
    let web = Pod::named(&net, "shop", "web").expect("meshed pod ADD");
    let rules = web.nft_table().expect("captured");
    assert!(rules.contains("tcp dport 8081 counter"), "{rules}");
    assert!(rules.contains("meta skuid 2103 counter"), "{rules}");
    net.check(&web.call()).expect("CHECK against the agent's spec");

    // Not meshed, or opted out: set up, never captured, no record.
    for name in ["plain", "optout"] {
        let pod = Pod::named(&net, "shop", name).expect("ADD succeeds");
        assert!(pod.nft_table().is_none(), "{name} is not captured");
    }

    // Invalid annotation: refused with a message naming it; nothing installed.
    let broken = Pod::unattached(&net, "shop", "broken").unwrap();
    let e = net.add(&broken.call()).expect_err("bad annotation");
    assert_eq!(e.code, Some(7), "{e}");
    assert!(e.msg.contains("skip-outbound-ports") && e.msg.contains("http"), "{e}");
    assert!(broken.nft_table().is_none());

    // Unknown to the cache: the agent asks the API once, then says try again later.
    let ghost = Pod::unattached(&net, "shop", "ghost").unwrap();
    let e = net.add(&ghost.call()).expect_err("unknown pod");
    assert_eq!(e.code, Some(11), "{e}");
    assert!(e.msg.contains("pod shop/ghost (namespace shop") && e.msg.contains("exclude namespace"), "{e}");
    assert!(ghost.nft_table().is_none());
    assert_eq!(requests(&mock, Method::GET, "/api/v1/namespaces/shop/pods/ghost").len(), 1, "one GET for a cache miss");
    assert!(
        requests(&mock, Method::GET, "/api/v1/namespaces/shop/pods/web").is_empty(),
        "cached pods cost no API call"
    );

    // Every answer is counted by result, with its latency (the agent's /metrics).
    let text = metrics.encode();
    let count = |line: &str| -> f64 {
        let value = text.lines().find_map(|l| l.strip_prefix(line)).unwrap_or_else(|| panic!("{line} in\n{text}"));
        value.trim().parse().unwrap()
    };
    assert!(count("cnimesh_node_decisions_total{result=\"capture\"}") >= 1.0, "{text}");
    assert_eq!(count("cnimesh_node_decisions_total{result=\"skip\"}"), 2.0, "{text}");
    assert_eq!(count("cnimesh_node_decisions_total{result=\"error\"}"), 1.0, "{text}");
    assert_eq!(count("cnimesh_node_decisions_total{result=\"retry\"}"), 1.0, "{text}");
    let decided: f64 = ["capture", "skip", "error", "retry"]
        .iter()
        .map(|r| count(&format!("cnimesh_node_decisions_total{{result=\"{r}\"}}")))
        .sum();
    assert_eq!(count("cnimesh_node_decision_duration_seconds_count"), decided, "{text}");

    // Excluded namespaces never wait on the agent, even when it is down.
    drop(rt);
    let system = Pod::named(&net, "kube-system", "coredns").expect("excluded pods need no agent");
    assert!(system.nft_table().is_none());

    // Agent down: fail closed with code 11, nothing installed.
    let late = Pod::unattached(&net, "shop", "web").unwrap();
    let e = net.add(&late.call()).expect_err("agent down");
    assert_eq!(e.code, Some(11), "{e}");
    assert!(e.details.as_deref().unwrap_or_default().contains("node.sock"), "{e}");
    assert!(late.nft_table().is_none(), "fail closed: no rules, and the pod does not start");
}

/// docs/architecture.md, lesson 15: while the agent is down, the mesh's own pods (the agent's among them) and
/// the cluster's still start; every other pod fails closed with an error naming it and saying
/// what to do.
#[test]
fn own_namespaces_never_wait_on_the_agent() {
    if !require_root("own_namespaces_never_wait_on_the_agent") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // No agent listens here, and the configuration does not list excluded namespaces: defaults.
    let socket = dir.path().join("node.sock");
    let net = Network::bridge(&bins!(), json!({"nodeAgent": {"socket": socket, "timeoutMs": 500}})).unwrap();
    for ns in ["cnimesh-system", "cnimesh", "kube-system"] {
        let pod = Pod::named(&net, ns, "own").unwrap_or_else(|e| panic!("a pod in {ns} needs no agent: {e}"));
        assert!(pod.nft_table().is_none(), "{ns} is not captured");
    }

    let app = Pod::unattached(&net, "default", "web-1").unwrap();
    let e = net.add(&app.call()).expect_err("fail closed outside the excluded namespaces");
    assert_eq!(e.code, Some(11), "{e}");
    assert!(app.nft_table().is_none(), "fail closed: no rules");
    for needle in ["pod default/web-1", "namespace default", "node agent must be running", "exclude", "cnimesh-system"]
    {
        assert!(e.msg.contains(needle), "{needle:?} missing from {e}");
    }
    assert!(e.details.as_deref().unwrap_or_default().contains("node.sock"), "{e}");

    // Without the pod's name, the container id says which sandbox could not be decided.
    let anonymous = Pod::unattached(&net, "default", "anon").unwrap();
    let call = cnimesh_e2e::Call { args: "IgnoreUnknown=1", ..anonymous.call() };
    let e = net.add(&call).expect_err("no pod name, no decision");
    assert!(e.msg.contains(&anonymous.container_id), "{e}");
    assert!(anonymous.nft_table().is_none());
}

#[test]
fn repair_and_taint_go_through_the_api() {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE, "resourceVersion": "7"},
        "spec": {"taints": [
            {"key": "cnimesh.io/agent-not-ready", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "mesh", "effect": "NoSchedule"}
        ]}
    }))
    .unwrap();
    let raced = kube_pod("shop", "raced", true, json!({}));
    let mock = cluster_api(&[&raced], Some(&node));
    let version = mock.get("v1", "Node", "", NODE).unwrap()["metadata"]["resourceVersion"].clone();
    let rt = runtime();
    rt.block_on(async {
        let (cluster, driver) = KubeCluster::start(mock.client(), NODE);
        tokio::spawn(driver);
        assert!(cluster.remove_node_taint("cnimesh.io/agent-not-ready").await.unwrap());
        assert!(!cluster.remove_node_taint("cnimesh.io/agent-not-ready").await.unwrap(), "already gone");
        let done =
            cnimesh_node::repair::repair(cluster.as_ref(), cnimesh_node::repair::RepairMode::Delete, &[&raced]).await;
        assert!(done[0].1.is_ok(), "{:?}", done[0].1);
    });
    let patches = requests(&mock, Method::PATCH, "/api/v1/nodes/node-1");
    assert_eq!(patches.len(), 1);
    assert_eq!(
        patches[0].body["spec"]["taints"],
        json!([{"key": "dedicated", "value": "mesh", "effect": "NoSchedule"}])
    );
    assert_eq!(patches[0].body["metadata"]["resourceVersion"], version, "compare-and-swap on the node");
    let stored = mock.get("v1", "Node", "", NODE).unwrap();
    assert_eq!(stored["spec"]["taints"], json!([{"key": "dedicated", "value": "mesh", "effect": "NoSchedule"}]));
    let events = requests(&mock, Method::POST, "/api/v1/namespaces/shop/events");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].body["involvedObject"]["name"], "raced");
    assert!(events[0].body["message"].as_str().unwrap().contains("without cnimesh capture"));
    assert_eq!(requests(&mock, Method::DELETE, "/api/v1/namespaces/shop/pods/raced").len(), 1);
    assert_eq!(mock.get("v1", "Pod", "shop", "raced"), None, "the raced pod is deleted");
}

/// The whole HTTP response to `GET path` on the agent's health port, or "" while nothing listens.
fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return String::new() };
    let _ = stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n").as_bytes());
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

/// An agent configuration on temp dirs under `dir` (bin, net.d, state, node.sock).
fn agent_config(
    dir: &std::path::Path,
    ready_port: u16,
    plugin: std::path::PathBuf,
    uninstall_on_exit: bool,
) -> cnimesh_node::run::RunConfig {
    cnimesh_node::run::RunConfig {
        node_name: Some(NODE.into()),
        cni_bin_dir: dir.join("bin"),
        cni_conf_dir: dir.join("net.d"),
        plugin_binary: plugin,
        socket: dir.join("node.sock"),
        state_dir: dir.join("state"),
        netns_dir: cnimesh_node::run::DEFAULT_NETNS_DIR.into(),
        ready_addr: ([127, 0, 0, 1], ready_port).into(),
        repair: cnimesh_node::repair::RepairMode::Off,
        repair_interval: Duration::from_secs(60),
        uninstall_on_exit,
        excluded_namespaces: cnimesh_cni::config::DEFAULT_EXCLUDED_NAMESPACES.iter().map(|s| s.to_string()).collect(),
        defaults: RedirectSpec::default(),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The agent's main loop on temp dirs: installs, chains, re-chains after the primary CNI rewrites
/// its file, reports readiness, and on shutdown removes itself — or, in upgrade mode, stays.
fn agent_lifecycle(keep_on_exit: bool, fight: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (bin_dir, conf_dir) = (dir.path().join("bin"), dir.path().join("net.d"));
    std::fs::create_dir_all(&conf_dir).unwrap();
    let plugin = dir.path().join("cnimesh-cni-src");
    std::fs::write(&plugin, b"#!/bin/sh\n").unwrap();
    let ready_port = free_port();
    let cfg = agent_config(dir.path(), ready_port, plugin, !keep_on_exit);
    let ready_response = || http_get(ready_port, "/ready");
    let ready = || ready_response().split_whitespace().nth(1).unwrap_or_default().to_string();
    let rt = runtime();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cluster = kube_cluster(&rt, &cluster_api(&[], None));
    let agent = rt.spawn(cnimesh_node::run::run(cfg.clone(), cluster, async {
        let _ = stopped.await;
    }));

    eventually("the plugin binary", Duration::from_secs(10), || bin_dir.join("cnimesh-cni").is_file());
    eventually("readiness to report the missing primary CNI", Duration::from_secs(10), || {
        let r = ready_response();
        r.contains(" 503 ") && r.contains("waiting for the primary CNI")
    });
    let flannel = r#"{"name":"cbr0","cniVersion":"0.3.1","plugins":[{"type":"flannel"},{"type":"portmap"}]}"#;
    let file = conf_dir.join("10-flannel.conflist");
    std::fs::write(&file, flannel).unwrap();
    eventually("chaining after the primary CNI appears", Duration::from_secs(10), || {
        cnimesh_node::chain::is_chained(&conf_dir).is_some()
    });
    eventually("readiness", Duration::from_secs(10), || ready() == "200");
    let entry: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(entry["plugins"][2]["nodeAgent"]["socket"], json!(cfg.socket), "the plugin is pointed at the agent");
    assert_eq!(entry["plugins"][2]["excludeNamespaces"], json!(cnimesh_cni::config::DEFAULT_EXCLUDED_NAMESPACES));

    // The primary CNI rewrites its file: re-chained.
    std::fs::write(&file, flannel).unwrap();
    eventually("re-chaining after a rewrite", Duration::from_secs(10), || {
        cnimesh_node::chain::is_chained(&conf_dir).is_some()
    });
    // Both writes (the first chaining and the re-patch) are on the agent's /metrics.
    eventually("two CNI configuration writes on /metrics", Duration::from_secs(10), || {
        let metrics = http_get(ready_port, "/metrics");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("cnimesh_node_cni_config_writes_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            >= Some(2.0)
    });

    if fight {
        // Another agent keeps restoring its own version: we stop fighting and say so.
        eventually("the rewrite loop to be reported", Duration::from_secs(10), || {
            std::fs::write(&file, flannel).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            ready_response().contains("rewrite loop on")
        });
        assert_eq!(ready(), "503", "not ready while another writer removes our entry");
    }

    stop.send(()).unwrap();
    rt.block_on(agent).unwrap().expect("clean shutdown");
    assert!(!cfg.socket.exists(), "socket removed");
    if keep_on_exit {
        // New pods fail closed (agent unreachable → code 11) until the next agent is up,
        // instead of starting uncaptured or hitting "failed to find plugin".
        assert!(cnimesh_node::chain::is_chained(&conf_dir).is_some(), "still chained after a restart-style exit");
        assert!(bin_dir.join("cnimesh-cni").is_file(), "binary kept after a restart-style exit");
        return;
    }
    let restored: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(restored, serde_json::from_str::<Value>(flannel).unwrap(), "original configuration restored");
    assert!(!bin_dir.join("cnimesh-cni").exists(), "binary removed");
}

#[test]
fn agent_run_installs_rechains_and_uninstalls() {
    agent_lifecycle(false, false);
}

#[test]
fn agent_restart_leaves_the_plugin_in_place() {
    agent_lifecycle(true, false);
}

#[test]
fn agent_reports_a_rewrite_fight_instead_of_looping() {
    agent_lifecycle(false, true);
}

/// `GET /status` on the health port: the JSON `cnimesh check` reads, with the live rules of each
/// captured pod verified against the desired ones.
#[test]
fn status_endpoint_reports_installation_and_drift() {
    if !require_root("status_endpoint_reports_installation_and_drift") {
        return;
    }
    let bins = bins!();
    let dir = tempfile::tempdir().unwrap();
    let ready_port = free_port();
    let cfg = agent_config(dir.path(), ready_port, bins.plugin.clone(), true);
    let api = cluster_api(&[&kube_pod("shop", "web", true, json!({}))], None);
    std::fs::create_dir_all(&cfg.cni_conf_dir).unwrap();
    std::fs::write(
        cfg.cni_conf_dir.join("10-bridge.conflist"),
        r#"{"name":"cbr0","cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}"#,
    )
    .unwrap();

    let rt = runtime();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cluster = kube_cluster(&rt, &api);
    let agent = rt.spawn(cnimesh_node::run::run(cfg.clone(), cluster, async {
        let _ = stopped.await;
    }));
    eventually("readiness", Duration::from_secs(10), || {
        http_get(ready_port, "/ready").split_whitespace().nth(1) == Some("200")
    });

    // A pod captured through the agent, into the agent's state dir.
    let net = Network::bridge(&bins, json!({"stateDir": cfg.state_dir, "nodeAgent": {"socket": cfg.socket}})).unwrap();
    let web = Pod::named(&net, "shop", "web").expect("meshed pod ADD");
    assert!(web.nft_table().is_some());

    let status = || {
        let response = http_get(ready_port, "/status");
        let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{head}");
        serde_json::from_str::<Value>(body).unwrap_or_else(|e| panic!("{e}: {body}"))
    };
    let s = status();
    let keys = |v: &Value| {
        let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    // The contract's field names, exactly.
    assert_eq!(keys(&s), ["healthy", "mount_propagation", "node", "pending", "ready", "status", "verify"], "{s}");
    assert_eq!(
        keys(&s["status"]),
        [
            "agent_socket",
            "agent_socket_present",
            "captured_pods",
            "chained_in",
            "kube",
            "plugin_binary",
            "plugin_installed",
            "plugin_versions",
            "primary_config"
        ],
        "{s}"
    );
    assert_eq!(s["node"], NODE);
    assert_eq!((&s["ready"], &s["pending"], &s["healthy"]), (&json!(true), &json!([]), &json!(true)), "{s}");
    assert_eq!(s["status"]["chained_in"], json!(cfg.cni_conf_dir.join("10-bridge.conflist")), "{s}");
    assert_eq!(s["status"]["plugin_installed"], true, "{s}");
    assert!(s["status"]["plugin_versions"].as_array().is_some_and(|v| v.contains(&json!("1.0.0"))), "{s}");
    assert_eq!(s["status"]["agent_socket_present"], true, "{s}");
    assert_eq!(s["status"]["captured_pods"], 1, "{s}");
    assert_eq!(s["status"]["kube"], "pod cache synced", "{s}");
    // iproute2 makes its netns directory a shared mount of its own.
    assert_eq!(s["mount_propagation"], "shared", "{s}");
    assert_eq!(
        s["verify"],
        json!([{"pod": "shop/web", "container_id": web.container_id, "ok": true, "drift": []}]),
        "{s}"
    );

    // Someone deletes the capture table: the pod is reported as drifted.
    web.netns.exec("nft", &["delete", "table", "inet", "cnimesh"]).unwrap();
    let s = status();
    let verdict = &s["verify"][0];
    assert_eq!((&verdict["pod"], &verdict["ok"]), (&json!("shop/web"), &json!(false)), "{s}");
    assert!(verdict["drift"].as_array().is_some_and(|d| !d.is_empty()), "{s}");

    drop(web);
    stop.send(()).unwrap();
    rt.block_on(agent).unwrap().expect("clean shutdown");
}

/// docs/architecture.md, lesson 17: a private mount under the netns dir (as on a host whose root mount is
/// private) is reported at start, on /ready and /status, and in "netns not found" drift.
#[test]
fn agent_reports_a_private_netns_mount() {
    if !require_root("agent_reports_a_private_netns_mount") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let netns_dir = dir.path().join("netns");
    std::fs::create_dir_all(&netns_dir).unwrap();
    let _mounted = Mounted::tmpfs(&netns_dir, "64k").unwrap();
    cnimesh_e2e::host::run("mount", &["--make-private", netns_dir.to_str().unwrap()]).unwrap();

    let plugin = dir.path().join("cnimesh-cni-src");
    std::fs::write(&plugin, b"#!/bin/sh\n").unwrap();
    let ready_port = free_port();
    let mut cfg = agent_config(dir.path(), ready_port, plugin, true);
    cfg.netns_dir = netns_dir.clone();
    std::fs::create_dir_all(&cfg.cni_conf_dir).unwrap();
    std::fs::write(
        cfg.cni_conf_dir.join("10-bridge.conflist"),
        r#"{"name":"cbr0","cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}"#,
    )
    .unwrap();
    // A pod whose netns the runtime made after the agent started: invisible here.
    let record = cnimesh_cni::state::AttachmentRecord {
        version: cnimesh_cni::state::RECORD_VERSION,
        network: "cbr0".into(),
        container_id: "c0ffee".into(),
        ifname: "eth0".into(),
        netns: netns_dir.join("cni-late").display().to_string(),
        netns_id: None,
        pod_namespace: Some("shop".into()),
        pod_name: Some("late".into()),
        pod_uid: None,
        backend: cnimesh_cni::backend::Backend::Nftables,
        spec: RedirectSpec::default(),
        created_at: 0,
    };
    cnimesh_cni::state::StateStore::new(&cfg.state_dir).write(&record).unwrap();

    let rt = runtime();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cluster = kube_cluster(&rt, &cluster_api(&[], None));
    let agent = rt.spawn(cnimesh_node::run::run(cfg.clone(), cluster, async {
        let _ = stopped.await;
    }));
    let ready = || http_get(ready_port, "/ready");
    eventually("readiness", Duration::from_secs(10), || ready().split_whitespace().nth(1) == Some("200"));
    let body = ready();
    let shown = netns_dir.display().to_string();
    assert!(body.contains("warning: the host mount holding") && body.contains(&shown), "{body}");
    assert!(body.contains("mount --make-rshared /"), "{body}");

    let response = http_get(ready_port, "/status");
    let s: Value = serde_json::from_str(response.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(s["mount_propagation"], "private", "{s}");
    assert_eq!(s["verify"][0]["ok"], false, "{s}");
    let drift = s["verify"][0]["drift"][0].as_str().unwrap_or_default();
    assert!(drift.contains(&format!("{shown} is private")) && drift.contains("mount --make-rshared /"), "{s}");

    stop.send(()).unwrap();
    rt.block_on(agent).unwrap().expect("clean shutdown");
}
