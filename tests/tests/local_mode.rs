//! Local mode end to end: `cnimesh-local up` builds the demo mesh on this host (pods as
//! network namespaces through the real CNI chain, the node agent, the control plane, proxies) and
//! sends traffic; its JSON summary must show mTLS where both sides are meshed, plaintext to the
//! pod outside the mesh, every replica serving, the canary split 90/10 and no failure, and one
//! trace across both proxies in the collector stand-in's spans. `down` must leave nothing behind,
//! also after `up` was killed halfway.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cnimesh_e2e::local_mode::LocalMode;
use cnimesh_e2e::{local_bins, require_root};
use serde_json::{Value, json};

const NODE: &str = env!("CARGO_BIN_EXE_cnimesh-node-e2e");
const CLI: &str = env!("CARGO_BIN_EXE_cnimesh-cli-e2e");

/// A local mode instance with names of its own (not `cnm<digit>`, which other tests use);
/// `slot` keeps the tests of this file apart (distinct prefix and subnet).
fn local(slot: u32) -> LocalMode {
    let pid = std::process::id();
    let prefix = format!("cnml{:x}{slot}", pid & 0xffff);
    // Slots 0–2 in 10.247.100–249, 3 and 4 (the two-cluster tests) in 10.245.
    let subnet = match slot {
        0..=2 => format!("10.247.{}.0/24", 100 + slot * 50 + pid % 50),
        _ => format!("10.245.{}.0/24", (slot - 3) * 100 + pid % 100),
    };
    LocalMode::new(prefix, subnet, local_bins!())
}

fn edge<'a>(summary: &'a Value, from: &str, to: &str) -> &'a Value {
    summary["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["from"] == from && e["to"] == to)
        .unwrap_or_else(|| panic!("no edge {from} -> {to}"))
}

/// Local mode's cluster is a Kubernetes API: `kubectl get pods -A` lists the demo's pods, and an
/// object applied with kubectl (the allowed clients of `web`, now the intruder too) reaches web's
/// proxies through the control plane (their `/policy.json`, read with `cnimesh diagnostics`).
fn kubectl_reads_local_mode_and_an_applied_object_reaches_the_proxies(local: &LocalMode) {
    let pods: Value = serde_json::from_str(&local.kubectl(&["get", "pods", "-A", "-o", "json"], "")).unwrap();
    let mut names: Vec<String> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!("{}/{}", p["metadata"]["namespace"].as_str().unwrap(), p["metadata"]["name"].as_str().unwrap())
        })
        .collect();
    names.sort();
    for pod in
        ["demo/client", "demo/intruder", "demo/legacy", "demo/web-0", "demo/web-canary", "cnimesh/cnimesh-control"]
    {
        assert!(names.contains(&pod.to_string()), "{pod} in {names:?}");
    }
    let web_0 = pods["items"].as_array().unwrap().iter().find(|p| p["metadata"]["name"] == "web-0").unwrap();
    assert_eq!(web_0["status"]["phase"], "Running", "{web_0:#}");
    let intruder = "intruder.demo.serviceaccount.identity.cnimesh.cluster.local";
    let allowed = |local: &LocalMode| -> Vec<String> {
        let out = Command::new(CLI)
            .args(["diagnostics", "policy", "web-0", "-o", "json", "--local"])
            .arg(&local.root)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let policy: Value = serde_json::from_slice(&out.stdout).unwrap();
        let http = policy["ports"].as_array().unwrap().iter().find(|p| p["port"] == 8080).cloned().unwrap();
        let ids = &http["authorizations"][0]["authentication"]["mesh_tls"]["identities"];
        ids.as_array().unwrap().iter().map(|i| i.as_str().unwrap().to_string()).collect()
    };
    assert!(!allowed(local).contains(&intruder.to_string()));
    let applied = local.kubectl(&["apply", "-f", "-"],
        "apiVersion: policy.cnimesh.io/v1alpha1\nkind: MeshTLSAuthentication\nmetadata: {name: web-clients, namespace: demo}\nspec:\n  identityRefs: [{kind: ServiceAccount, name: client}, {kind: ServiceAccount, name: intruder}]\n",
    );
    assert!(applied.contains("web-clients"), "{applied}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !allowed(local).contains(&intruder.to_string()) {
        assert!(Instant::now() < deadline, "web-0's proxy never got the applied policy: {:?}", allowed(local));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every pod reaches local mode's API server (the bridge's gateway): from the intruder's pod, a
/// request without the administrator's token, or with a made-up one, is refused (401) and reads
/// nothing; the same pod with the kubeconfig's token is answered, so only the token is missing.
fn a_request_to_local_modes_api_server_without_its_token_is_refused(local: &LocalMode) {
    let kubeconfig: Value = serde_json::from_slice(&std::fs::read(local.root.join("kubeconfig")).unwrap()).unwrap();
    let server = kubeconfig["clusters"][0]["cluster"]["server"].as_str().unwrap().to_string();
    let netns = format!("{}-intruder", local.prefix);
    // A kubeconfig with no credentials, so kubectl adds none of the host's.
    let empty = local.root.with_extension("empty-kubeconfig");
    std::fs::write(&empty, "apiVersion: v1\nkind: Config\n").unwrap();
    let in_pod = |extra: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", &netns, "kubectl", "--kubeconfig"])
            .arg(&empty)
            .args(["--server", &server, "--insecure-skip-tls-verify"])
            .args(extra)
            .args(["get", "secrets", "-A", "-o", "name"])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    // No bearer token (a user name and password instead, so kubectl does not prompt for them),
    // then a made-up one: 401, which kubectl reports as "You must be logged in".
    for extra in [&["--username", "admin", "--password", "admin"][..], &["--token", "not-the-token"][..]] {
        let out = in_pod(extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("must be logged in"), "{extra:?}: {stderr}");
        assert!(out.stdout.is_empty(), "nothing is read without the token");
    }
    let token = kubeconfig["users"][0]["user"]["token"].as_str().unwrap();
    let out = in_pod(&["--token", token]);
    std::fs::remove_file(&empty).unwrap();
    assert!(out.status.success(), "the pod reaches the server: {}", String::from_utf8_lossy(&out.stderr));
}

/// A pod's default route is its bridge's gateway, and what it sends out of the host's uplink is
/// masqueraded (the table's counter moves for a connection to a TEST-NET-3 address, which goes
/// out and is never answered); nothing is installed on a host without a default route.
fn egress_goes_out_through_the_bridge_and_is_masqueraded_out_of_the_uplink(local: &LocalMode) {
    let run = |args: &[&str]| {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The control plane's pod: the primary CNI only, so its connections are its own (a meshed
    // pod's go through its proxy, which connects only once the client has spoken).
    let netns = format!("{}-control", local.prefix);
    let network: std::net::Ipv4Addr = local.subnet.split('/').next().unwrap().parse().unwrap();
    let gateway = std::net::Ipv4Addr::from(u32::from(network) + 1);
    let routes = run(&["ip", "netns", "exec", &netns, "ip", "-4", "route", "show", "default"]);
    assert!(routes.starts_with(&format!("default via {gateway} dev eth0")), "{routes}");
    let host_routes = run(&["ip", "-4", "route", "show", "default"]);
    let table = format!("cnimesh-local-{}-egress", local.prefix);
    let Some(uplink) = host_routes.split_whitespace().skip_while(|w| *w != "dev").nth(1) else {
        assert!(run(&["nft", "list", "tables"]).lines().all(|l| !l.contains(&table)), "no uplink, no table");
        return;
    };
    let packets = || {
        let rules = run(&["nft", "list", "table", "ip", &table]);
        let rule = rules.lines().find(|l| l.contains("masquerade")).unwrap_or_else(|| panic!("{rules}")).to_string();
        assert!(
            rule.contains(&format!("ip saddr {}", local.subnet)) && rule.contains(&format!("oifname \"{uplink}\"")),
            "{rule}"
        );
        let n = rule.split_whitespace().skip_while(|w| *w != "packets").nth(1).unwrap_or_else(|| panic!("{rule}"));
        n.parse::<u64>().unwrap()
    };
    let before = packets();
    let _ = cnimesh_cni::netns::run_in(&local.netns("control"), || {
        std::net::TcpStream::connect_timeout(&"203.0.113.7:9".parse().unwrap(), Duration::from_millis(500))
    });
    assert!(packets() > before, "the pod's egress was masqueraded out of {uplink}");
}

#[test]
fn up_runs_the_demo_mesh_and_down_removes_everything() {
    if !require_root("up_runs_the_demo_mesh_and_down_removes_everything") {
        return;
    }
    let local = local(0);
    let out = local.up_command().output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "up failed: {stderr}");
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));

    let web = edge(&summary, "client", "web");
    assert_eq!(web["success_rate"], 1.0, "{web:#}");
    assert!(web["requests"].as_u64().unwrap() > 0);
    assert_eq!(web["tls"], true, "client -> web is mTLS: {web:#}");
    // Requests the route sent to the canary carry the canary's server identity.
    assert_eq!(
        web["server_ids"],
        json!([
            "web-canary.demo.serviceaccount.identity.cnimesh.cluster.local",
            "web.demo.serviceaccount.identity.cnimesh.cluster.local"
        ]),
        "{web:#}"
    );
    let replicas = web["replicas"].as_object().unwrap();
    assert_eq!(replicas.len(), 4, "web's three replicas and the canary's: {web:#}");
    assert!(replicas.values().all(|n| n.as_u64().unwrap() > 0), "every replica serves: {web:#}");
    // The canary split: web's HTTPRoute sends about 10 % to web-canary.
    let backends = web["backends"].as_object().unwrap();
    let (stable, canary) = (backends["web"].as_u64().unwrap(), backends["web-canary"].as_u64().unwrap());
    assert_eq!(stable + canary, web["successes"].as_u64().unwrap(), "{web:#}");
    let share = canary as f64 / (stable + canary) as f64;
    assert!((0.03..=0.2).contains(&share), "canary share {share}: {web:#}");
    for (replica, ids) in web["client_ids"].as_object().unwrap() {
        assert_eq!(
            ids[0], "client.demo.serviceaccount.identity.cnimesh.cluster.local",
            "{replica} saw the client's identity"
        );
    }
    // No policy authorizes the intruder: web's proxies answer every one of its requests 403.
    let intruder = edge(&summary, "intruder", "web");
    assert!(intruder["requests"].as_u64().unwrap() > 0, "{intruder:#}");
    assert_eq!(intruder["success_rate"], 0.0, "{intruder:#}");
    assert_eq!(intruder["statuses"].as_object().unwrap().keys().collect::<Vec<_>>(), ["403"], "{intruder:#}");
    assert!(intruder["errors"][0].as_str().unwrap().contains("unauthorized request"), "{intruder:#}");
    assert_eq!(web["statuses"].as_object().unwrap().keys().collect::<Vec<_>>(), ["200"], "{web:#}");
    let legacy = edge(&summary, "client", "legacy");
    assert_eq!(legacy["success_rate"], 1.0, "{legacy:#}");
    assert_eq!(legacy["tls"], false, "the pod outside the mesh is reached in plaintext: {legacy:#}");

    // The demo's traced request: the client sent a sampled W3C traceparent; the
    // collector stand-in received the client proxy's CLIENT span under the client's span and the
    // SERVER span of a web (or canary) replica's proxy under it (or under one of its tries).
    let trace = &summary["trace"];
    assert_eq!(trace["linked"], true, "{trace:#}");
    let trace_id = trace["trace_id"].as_str().unwrap();
    let spans = trace["spans"].as_array().unwrap();
    let client_id = "client.demo.serviceaccount.identity.cnimesh.cluster.local";
    let outbound = spans
        .iter()
        .find(|s| s["kind"] == "client" && s["pod"] == "client" && s["parent_span_id"] == trace["app_span_id"])
        .unwrap_or_else(|| panic!("no CLIENT span under the app's: {trace:#}"));
    assert_eq!((outbound["service"].as_str(), outbound["identity"].as_str()), (Some("cnimesh-proxy"), Some(client_id)));
    let client_spans: Vec<&Value> = spans.iter().filter(|s| s["pod"] == "client").map(|s| &s["span_id"]).collect();
    let inbound = spans.iter().find(|s| s["kind"] == "server").unwrap_or_else(|| panic!("no SERVER span: {trace:#}"));
    assert!(client_spans.contains(&&inbound["parent_span_id"]), "the SERVER span's parent is the client's: {trace:#}");
    assert!(inbound["pod"].as_str().unwrap().starts_with("web"), "{trace:#}");
    let server_id = inbound["identity"].as_str().unwrap();
    assert!(server_id.starts_with("web.demo.") || server_id.starts_with("web-canary.demo."), "{trace:#}");
    assert_eq!(
        inbound["attributes"]["cnimesh.client.identity"], client_id,
        "mTLS told web's proxy who called: {trace:#}"
    );
    // The same spans are in the stand-in's file, one JSON object per line.
    let file = std::fs::read_to_string(local.root.join("traces.jsonl")).unwrap();
    let lines: Vec<Value> = file.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let in_file = lines.iter().filter(|l| l["trace_id"] == trace_id).count();
    assert_eq!(in_file, spans.len(), "{file}");
    assert!(lines.iter().all(|l| l["trace_id"] == trace_id), "the load's requests carry no context and are not traced");

    // The node CLI sees the meshed pods (and only those) with the state dir up printed.
    let state_dir = local.root.join("state");
    let pods = Command::new(NODE).arg("--state-dir").arg(&state_dir).args(["-o", "json", "pods"]).output().unwrap();
    assert!(pods.status.success(), "{}", String::from_utf8_lossy(&pods.stderr));
    let pods: Value = serde_json::from_slice(&pods.stdout).unwrap();
    let mut names: Vec<&str> = pods.as_array().unwrap().iter().map(|p| p["pod"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["demo/client", "demo/intruder", "demo/web-0", "demo/web-1", "demo/web-2", "demo/web-canary"]);
    assert!(summary["commands"].to_string().contains(&format!("--state-dir {}", state_dir.display())));

    // The operator's `cnimesh stat` and `edges` read the same proxies, while the client calls web.
    let cli = |args: &[&str]| -> Value {
        let out = Command::new(CLI).args(args).arg("--local").arg(&local.root).args(["-o", "json"]).output().unwrap();
        assert!(out.status.success(), "cnimesh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let client_netns = Path::new("/run/netns").join(format!("{}-client", local.prefix));
    let web_ip: std::net::SocketAddr = "10.96.0.10:80".parse().unwrap();
    let load = std::thread::spawn(move || {
        cnimesh_local::traffic::load(&client_netns, web_ip, "web", 2, Duration::from_secs(3))
    });
    let stat = cli(&["stat", "deploy", "-n", "demo", "--window", "2s"]);
    assert!(load.join().unwrap().failures.is_empty());
    let row = |name: &str| stat.as_array().unwrap().iter().find(|r| r["name"] == name).cloned().unwrap();
    let web_row = row("web");
    assert_eq!((web_row["meshed_pods"].as_u64(), web_row["pods"].as_u64()), (Some(3), Some(3)), "{stat:#}");
    assert!(web_row["requests"].as_f64().unwrap() > 0.0 && web_row["rps"].as_f64().unwrap() > 0.0, "{stat:#}");
    assert_eq!(web_row["success_rate"], 1.0, "{stat:#}");
    assert_eq!(web_row["mtls_share"], 1.0, "{stat:#}");
    assert!(web_row["latency_ms"]["p99"].as_f64().unwrap() >= web_row["latency_ms"]["p50"].as_f64().unwrap());
    let edges = cli(&["edges", "deploy", "-n", "demo"]);
    let edge_to = |dst: &str| {
        edges.as_array().unwrap().iter().find(|e| e["src"] == "deployment/client" && e["dst"] == dst).cloned()
    };
    let to_web = edge_to("deployment/web").unwrap_or_else(|| panic!("{edges:#}"));
    assert_eq!(to_web["mtls"].as_bool(), Some(true), "{to_web:#}");
    assert!(to_web["server_ids"].as_array().unwrap().contains(&json!("web.demo")), "{to_web:#}");
    assert_eq!(to_web["client_ids"][0], "client.demo");
    assert_eq!(edge_to("pod/legacy").unwrap_or_else(|| panic!("{edges:#}"))["mtls"], false);

    // `cnimesh tap` and `top`: web's proxies, through the local control plane's tap
    // relay over mTLS, show the client's live requests with both identities.
    let client_netns = Path::new("/run/netns").join(format!("{}-client", local.prefix));
    let load = std::thread::spawn(move || {
        cnimesh_local::traffic::load(&client_netns, web_ip, "web", 2, Duration::from_secs(4))
    });
    let tap = Command::new(CLI)
        .args(["tap", "deploy/web", "--local"])
        .arg(&local.root)
        .args(["--to", "deploy/web", "--path", "/", "--method", "GET", "--limit", "6", "-o", "json"])
        .output()
        .unwrap();
    assert!(tap.status.success(), "cnimesh tap: {}", String::from_utf8_lossy(&tap.stderr));
    let events: Vec<Value> = String::from_utf8_lossy(&tap.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let of_type = |t: &str| events.iter().filter(|e| e["type"] == t).collect::<Vec<_>>();
    let (requests, responses, ends) = (of_type("requestInit"), of_type("responseInit"), of_type("responseEnd"));
    assert_eq!((requests.len(), ends.len()), (6, 6), "every tapped request ends within the limit: {events:#?}");
    for request in &requests {
        assert_eq!((request["method"].as_str(), request["path"].as_str()), (Some("GET"), Some("/")));
        assert_eq!(request["direction"], "inbound", "{request:#}");
        assert!(request["pod"].as_str().unwrap().starts_with("web-"), "{request:#}");
        assert_eq!(request["sourceMeta"]["tls"], "true", "{request:#}");
    }
    // The client's requests are allowed (an intruder's, denied by policy, would be tapped too).
    let client_id = "client.demo.serviceaccount.identity.cnimesh.cluster.local";
    let from_client: Vec<&Value> =
        requests.iter().copied().filter(|r| r["sourceMeta"]["client_id"] == client_id).collect();
    assert!(!from_client.is_empty(), "{requests:#?}");
    for request in from_client {
        let response = responses.iter().find(|r| r["id"] == request["id"] && r["pod"] == request["pod"]);
        assert_eq!(response.map(|r| r["httpStatus"].clone()), Some(json!(200)), "{events:#?}");
    }
    let top = Command::new(CLI)
        .args(["top", "deploy/web", "--local"])
        .arg(&local.root)
        .args(["--duration", "2s"])
        .output()
        .unwrap();
    assert!(load.join().unwrap().failures.is_empty());
    assert!(top.status.success(), "cnimesh top: {}", String::from_utf8_lossy(&top.stderr));
    let top = String::from_utf8_lossy(&top.stdout);
    let row = top.lines().find(|l| l.contains(" GET ")).unwrap_or_else(|| panic!("{top}"));
    assert!(row.contains("100.00%"), "{top}");

    // `cnimesh diagnostics`: one proxy's pages and what Destination serves, read through local
    // mode's API server's pod and service proxies, as in a cluster.
    let diagnostics = |args: &[&str]| -> String {
        let out = Command::new(CLI).arg("diagnostics").args(args).arg("--local").arg(&local.root).output().unwrap();
        assert!(out.status.success(), "cnimesh diagnostics {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let policy: Value = serde_json::from_str(&diagnostics(&["policy", "web-0", "-o", "json"])).unwrap();
    let http =
        policy["ports"].as_array().unwrap().iter().find(|p| p["port"] == 8080).unwrap_or_else(|| panic!("{policy:#}"));
    assert_eq!(
        (http["source"].as_str(), http["server"]["name"].as_str()),
        (Some("discovered"), Some("web")),
        "{policy:#}"
    );
    assert_eq!(http["authorizations"][0]["authorization"]["name"], "web-clients", "{policy:#}");
    assert_eq!(http["authorizations"][0]["authentication"]["mesh_tls"]["identities"][0], client_id, "{policy:#}");
    let text = diagnostics(&["policy", "web-0"]);
    assert!(text.lines().any(|l| l.starts_with("port 8080 (") && l.contains("): from the control plane")), "{text}");
    let identity = diagnostics(&["identity", "pod/web-0"]);
    assert!(identity.contains("name:          web.demo.serviceaccount.identity.cnimesh.cluster.local"), "{identity}");
    assert!(identity.contains("sha256 (public key) "), "{identity}");
    let endpoints: Value = serde_json::from_str(&diagnostics(&["endpoints", "client", "-o", "json"])).unwrap();
    let web_lookup = endpoints["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["authority"].as_str().unwrap().starts_with("web.demo.svc"));
    assert_eq!(
        web_lookup.map(|s| s["endpoints"].as_array().unwrap().len()),
        Some(3),
        "the client's proxy knows web's replicas: {endpoints:#}"
    );
    let served = diagnostics(&["endpoints", "svc/web"]);
    assert!(served.starts_with("web.demo.svc.cluster.local:80\n"), "{served}");
    assert_eq!(
        served.lines().filter(|l| l.contains("web.demo.serviceaccount") && l.contains(" h2 ")).count(),
        3,
        "{served}"
    );
    let metrics = diagnostics(&["proxy-metrics", "web-0"]);
    assert!(metrics.lines().any(|l| l.starts_with("inbound_http_authz_allow_total")), "{metrics}");

    kubectl_reads_local_mode_and_an_applied_object_reaches_the_proxies(&local);
    a_request_to_local_modes_api_server_without_its_token_is_refused(&local);
    egress_goes_out_through_the_bridge_and_is_masqueraded_out_of_the_uplink(&local);

    // Up twice: a clear error, nothing disturbed.
    let again = local.up_command().output().unwrap();
    assert!(!again.status.success());
    let again_stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again_stderr.contains("already up"), "{again_stderr}");

    let down = local.down();
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
    assert_eq!(local.leftovers(), Vec::<String>::new());
    let again = local.down();
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to do"));
}

#[test]
fn down_cleans_up_after_up_was_killed_halfway() {
    if !require_root("down_cleans_up_after_up_was_killed_halfway") {
        return;
    }
    let local = local(1);
    let mut up = local.up_command().stdout(Stdio::null()).stderr(Stdio::null()).process_group(0).spawn().unwrap();
    // Kill -9 once some pods and processes exist (or when up finished anyway).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !local.root.join("run/app-web-0.pid").exists() && up.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "up never got to the apps");
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = up.kill();
    let _ = up.wait();
    // A namespace of ours without any record, as if created just before the crash.
    let stray = format!("{}-stray", local.prefix);
    assert!(Command::new("ip").args(["netns", "add", &stray]).status().unwrap().success());
    assert!(!local.leftovers().is_empty());

    let down = local.down();
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
    assert_eq!(local.leftovers(), Vec::<String>::new());
}

#[test]
fn a_bad_workloads_file_is_refused_before_anything_is_created() {
    if !require_root("a_bad_workloads_file_is_refused_before_anything_is_created") {
        return;
    }
    let local = local(2);
    let cases = [
        (
            "namespace: demo\nclients: [{name: client, meshed: true, calls: [nope]}]\n",
            "\"nope\", which is not a service",
        ),
        (
            "namespace: demo\nservices: [{name: web, clusterIP: 10.96.0.10, meshed: true}]\n\
             ingress: {routes: [{host: web.demo, service: nope}]}\n",
            "ingress.routes: host \"web.demo\" goes to \"nope\", which is not a service",
        ),
    ];
    for (workloads, expected) in cases {
        let out = local.up_with_workloads(workloads);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{stderr}");
        assert_eq!(local.leftovers(), Vec::<String>::new());
    }
}

// Two clusters in local mode

/// Part C alone: west comes up beside east, routed, linked, with its gateway running; `check`
/// sees the Link, its credentials and the shared anchor; `down` removes both clusters and the
/// forwarding table.
#[test]
fn up_with_two_clusters_links_west_to_east_and_down_removes_both() {
    if !require_root("up_with_two_clusters_links_west_to_east_and_down_removes_both") {
        return;
    }
    let lm = local(3);
    let west_subnet = format!("10.251.{}.0/24", std::process::id() % 200);
    let out = lm.up_command().args(["--clusters", "2", "--west-subnet", &west_subnet]).output().unwrap();
    assert!(out.status.success(), "up failed: {}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mc = &summary["multicluster"];
    let west = lm.root.join("west");
    assert_eq!(mc["west_root"], west.display().to_string());
    // West's records: its trust domain and gateway.
    let record: Value = serde_json::from_slice(&std::fs::read(west.join("local.json")).unwrap()).unwrap();
    assert_eq!(record["trust_domain"], "west.local");
    assert_eq!(record["gateway"], mc["gateway"]);
    // What `link --local <west>` printed (root-only: west's credentials), applied to east's API
    // server: the Link, whose kubeconfig reaches west's own API server.
    let link_file = lm.root.join("kubeconfigs/link-west.yaml");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&link_file).unwrap().permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&link_file).unwrap();
    assert!(text.contains("targetTrustDomain: west.local"), "{text}");
    let link = lm.kubectl(&["get", "links.multicluster.cnimesh.io", "-n", "cnimesh", "west", "-o", "json"], "");
    let link: Value = serde_json::from_str(&link).unwrap();
    assert_eq!(link["spec"]["targetTrustDomain"], "west.local", "{link:#}");
    // West's issuer chains to east's anchor: one anchor.
    assert_eq!(std::fs::read(west.join("ca/ca.crt")).unwrap(), std::fs::read(lm.root.join("ca/ca.crt")).unwrap());
    // Routing: east's unmeshed `legacy` pod reaches west's gateway's admin port directly.
    let gateway: std::net::SocketAddr = mc["gateway"].as_str().unwrap().parse().unwrap();
    let legacy = Path::new("/run/netns").join(format!("{}-legacy", lm.prefix));
    let probe = std::net::SocketAddr::new(gateway.ip(), 4191);
    let ready = cnimesh_local::traffic::http_get_in(&legacy, probe, "gateway", "/ready");
    assert!(matches!(ready, Ok((200, _))), "east's pods reach west's pod network: {ready:?}");
    let check =
        Command::new(CLI).args(["multicluster", "check", "-o", "json", "--local"]).arg(&lm.root).output().unwrap();
    let report: Value = serde_json::from_slice(&check.stdout).unwrap();
    let status = |name: &str| {
        report["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).map(|c| c["status"].clone()).unwrap()
    };
    for name in ["link is valid", "credentials", "remote API", "gateway reachable", "trust anchors match"] {
        assert_eq!(status(name), "ok", "{name}: {report:#}");
    }
    let table = format!("inet cnimesh-local-{}", lm.prefix);
    let down = lm.down();
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
    assert!(lm.leftovers().is_empty(), "{:?}", lm.leftovers());
    assert!(!Path::new("/sys/class/net").join(format!("{}w0", lm.prefix)).exists(), "west's bridge is gone");
    let tables = Command::new("nft").args(["list", "tables"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&tables.stdout).contains(&table), "the forwarding table is gone");
}

/// Needs parts A and B merged: east's `client` reaches `web-west` through west's gateway and
/// `web-flat-west` directly, both mTLS; west's servers behind the gateway see the gateway's
/// identity, `web-flat`'s see east's client; `multicluster check` passes every check.
#[test]
fn two_local_clusters_carry_traffic_through_the_gateway_and_flat_with_the_documented_identities() {
    if !require_root("two_local_clusters_carry_traffic_through_the_gateway_and_flat_with_the_documented_identities") {
        return;
    }
    let lm = local(4);
    let west_subnet = format!("10.252.{}.0/24", std::process::id() % 200);
    let out = lm.up_command().args(["--clusters", "2", "--west-subnet", &west_subnet]).output().unwrap();
    assert!(out.status.success(), "up failed: {}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mc = &summary["multicluster"];
    assert!(mc["notes"].as_array().unwrap().is_empty(), "{mc:#}");
    for mirror in ["web-west", "web-flat-west"] {
        let edge = mc["edges"].as_array().unwrap().iter().find(|e| e["to"] == mirror).unwrap();
        assert_eq!(edge["success_rate"], 1.0, "{edge:#}");
        assert_eq!(edge["tls"], true, "{edge:#}");
    }
    let gateway_id = "cnimesh-gateway.cnimesh-multicluster.serviceaccount.identity.cnimesh.west.local";
    let client_id = "client.demo.serviceaccount.identity.cnimesh.cluster.local";
    let seen = &mc["identities_seen"];
    assert_eq!(seen["gateway"], serde_json::json!([client_id]), "the gateway sees east's client");
    for pod in ["web-0", "web-1"] {
        assert!(seen[pod].as_array().unwrap().iter().any(|id| id == gateway_id), "{pod} sees the gateway: {seen:#}");
    }
    assert!(seen["web-flat"].as_array().unwrap().iter().any(|id| id == client_id), "flat: east's client: {seen:#}");
    let check = Command::new(CLI).args(["multicluster", "check", "--local"]).arg(&lm.root).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
}
