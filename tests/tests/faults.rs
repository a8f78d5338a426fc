//! Faults on a real kernel: the node agent, a proxy and the control plane killed with
//! SIGKILL at the worst moment, the state directory full, the primary CNI's configuration deleted
//! while pods are being created. Each test says what the user sees, that nothing is lost, and
//! that nothing is left behind (nft tables, attachment records, IPAM allocations, bridge ports).
//!
//! The opt-in load run of the plugin with a node agent restart (`load_adds_and_dels_with_an_agent_restart`,
//! `#[ignore]`d) shares the burst code; see docs/development.md, "Reliability".

use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cnimesh_e2e::agent::{Agent, kube_pod};
use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::cni::libcni_config;
use cnimesh_e2e::control::identity;
use cnimesh_e2e::host::Mounted;
use cnimesh_e2e::mesh::{Meshed, meshed};
use cnimesh_e2e::sidecar::{Sidecar, http_in, metric_sum};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{CniFailure, Network, Pod, bins, require_root};
use serde_json::{Value, json};

const NODE_BIN: &str = env!("CARGO_BIN_EXE_cnimesh-node-e2e");

fn has_record(net: &Network, container_id: &str) -> bool {
    net.leftovers().iter().any(|l| l.starts_with("record") && l.contains(container_id))
}

/// A node agent (not yet started) with `repair`, and a network whose plugin asks it.
fn agent_network(repair: &'static str) -> (Network, Agent) {
    let bins = bins!();
    let agent = Agent::new(NODE_BIN.as_ref(), &bins.plugin, repair).unwrap();
    let net = agent.network(&bins).unwrap();
    (net, agent)
}

/// What one burst of ADDs did.
struct Burst {
    /// Per pod: the ADD's outcome.
    outcomes: Vec<Result<Value, CniFailure>>,
    elapsed: Duration,
}

/// ADDs every pod through `net`, `concurrency` at a time; `during` runs alongside with the
/// count of finished ADDs (to kill the agent in the middle of the burst).
fn add_burst(net: &Network, pods: &[Pod<'_>], concurrency: usize, during: impl FnOnce(&AtomicUsize) + Send) -> Burst {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let outcomes: Mutex<Vec<Option<Result<Value, CniFailure>>>> = Mutex::new(vec![None; pods.len()]);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..concurrency {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(pod) = pods.get(i) else { break };
                    let outcome = net.add(&pod.call());
                    outcomes.lock()[i] = Some(outcome);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        s.spawn(|| during(&done));
    });
    let outcomes = outcomes.into_inner().into_iter().map(|o| o.expect("every ADD ran")).collect();
    Burst { outcomes, elapsed: start.elapsed() }
}

/// Waits until `n` ADDs finished (or all of them, if fewer).
fn wait_for(done: &AtomicUsize, n: usize) {
    while done.load(Ordering::Relaxed) < n {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Every ADD either captured its pod (rules and record) or failed with code 11 and left neither;
/// the runtime's DEL after a failure releases the pod's address. Returns the failed pods' indexes.
fn check_fail_closed(net: &Network, pods: &[Pod<'_>], burst: &Burst) -> Vec<usize> {
    let mut failed = Vec::new();
    for (i, (pod, outcome)) in pods.iter().zip(&burst.outcomes).enumerate() {
        match outcome {
            Ok(_) => {
                assert!(pod.nft_table().is_some(), "{}: ADD succeeded without rules", pod.name);
                assert!(has_record(net, &pod.container_id), "{}: ADD succeeded without a record", pod.name);
            }
            Err(e) => {
                assert_eq!(e.code, Some(11), "{}: {e}", pod.name);
                assert!(pod.nft_table().is_none(), "{}: a failed ADD left rules", pod.name);
                assert!(!has_record(net, &pod.container_id), "{}: a failed ADD left a record", pod.name);
                // The runtime tears the sandbox down after a failed ADD.
                pod.del().unwrap_or_else(|e| panic!("{}: DEL after a failed ADD: {e}", pod.name));
                assert!(!net.allocated_to(&pod.container_id), "{}: address kept after DEL", pod.name);
                failed.push(i);
            }
        }
    }
    failed
}

/// Pods known to the agent as meshed, not yet set up.
fn meshed_pods<'n>(net: &'n Network, agent: &Agent, n: usize) -> Vec<Pod<'n>> {
    (0..n)
        .map(|i| {
            let name = format!("web-{i}");
            agent.add_pod(&kube_pod("shop", &name, true)).unwrap();
            Pod::unattached(net, "shop", &name).unwrap()
        })
        .collect()
}

/// DEL of every pod, then nothing may be left.
fn del_all_and_check_nothing_left(net: &Network, pods: Vec<Pod<'_>>) {
    std::thread::scope(|s| {
        for chunk in pods.chunks(pods.len().div_ceil(8).max(1)) {
            s.spawn(move || {
                for pod in chunk {
                    pod.del().unwrap_or_else(|e| panic!("{}: DEL: {e}", pod.name));
                    assert!(pod.nft_table().is_none(), "{}: table left after DEL", pod.name);
                }
            });
        }
    });
    drop(pods);
    assert_eq!(net.leftovers(), Vec::<String>::new(), "left behind");
}

#[test]
fn node_agent_killed_during_an_add_burst_fails_closed_and_retries_succeed() {
    if !require_root("node_agent_killed_during_an_add_burst_fails_closed_and_retries_succeed") {
        return;
    }
    let (net, mut agent) = agent_network("off");
    agent.start().unwrap();
    let pods = meshed_pods(&net, &agent, 24);
    let agent = Mutex::new(agent);
    let burst = add_burst(&net, &pods, 6, |done| {
        wait_for(done, 6);
        agent.lock().kill();
    });
    let failed = check_fail_closed(&net, &pods, &burst);
    assert!(failed.len() >= 24 - 6 - 6, "the ADDs after the kill fail: {} failed", failed.len());

    // The agent is back (its socket file was left behind by SIGKILL): the runtime's retries succeed.
    agent.lock().start().unwrap();
    for i in failed {
        let pod = &pods[i];
        net.add(&pod.call()).unwrap_or_else(|e| panic!("{}: retried ADD: {e}", pod.name));
        assert!(pod.nft_table().is_some(), "{}: retried ADD without rules", pod.name);
    }
    del_all_and_check_nothing_left(&net, pods);
}

/// The load run: `CNIMESH_LOAD_PODS` (default 500) concurrent ADDs with the node
/// agent killed and restarted in the middle, then as many concurrent DELs. Prints the figures.
#[test]
#[ignore = "load run (minutes, hundreds of namespaces): cargo nextest run -p cnimesh-e2e --test faults --run-ignored only --no-capture"]
fn load_adds_and_dels_with_an_agent_restart() {
    assert!(require_root("load_adds_and_dels_with_an_agent_restart"), "needs root");
    let n: usize = std::env::var("CNIMESH_LOAD_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(500);
    let (mut net, mut agent) = agent_network("off");
    // Room for more pods than a /24 holds.
    net.conflist["plugins"][0]["ipam"]["ranges"][0][0]["subnet"] = json!("10.240.0.0/20");
    agent.write_primary(&net.primary_conflist()).unwrap();
    agent.start().unwrap();
    let pods = meshed_pods(&net, &agent, n);
    let agent = Mutex::new(agent);
    let restart = Mutex::new(Duration::ZERO);
    let burst = add_burst(&net, &pods, n, |done| {
        wait_for(done, n / 2);
        let t = Instant::now();
        let mut agent = agent.lock();
        agent.kill();
        agent.start().unwrap();
        *restart.lock() = t.elapsed();
    });
    let failed = check_fail_closed(&net, &pods, &burst);
    let retry_start = Instant::now();
    for &i in &failed {
        net.add(&pods[i].call()).unwrap_or_else(|e| panic!("{}: retried ADD: {e}", pods[i].name));
    }
    let retry = retry_start.elapsed();
    let del_start = Instant::now();
    del_all_and_check_nothing_left(&net, pods);
    let del = del_start.elapsed();
    println!("| pods | ADD ok | ADD code 11 | other | burst s | agent down+up s | retries s | DEL s | left behind |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {n} | {} | {} | 0 | {:.2} | {:.2} | {:.2} | {:.2} | 0 |",
        n - failed.len(),
        failed.len(),
        burst.elapsed.as_secs_f64(),
        restart.lock().as_secs_f64(),
        retry.as_secs_f64(),
        del.as_secs_f64()
    );
}

/// What the client saw for one request to a pod whose proxy was killed.
#[derive(Debug, PartialEq)]
enum Seen {
    Ok,
    Refused,
    /// Reset or closed mid-request (the one in flight when the proxy died).
    Broken,
    Other(String),
}

/// Sets a phase counter to its final value when dropped.
struct StopOnDrop<'a>(&'a AtomicUsize, usize);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(self.1, Ordering::SeqCst);
    }
}

fn request(client: &Pod<'_>, to: &str) -> Seen {
    match http_in(&client.netns.path(), to, "POST", "/echo", "fault") {
        Ok((200, body)) if body.contains("fault") => Seen::Ok,
        Ok((0, _)) => Seen::Broken,
        Ok(other) => Seen::Other(format!("{other:?}")),
        Err(e) => match e.downcast_ref::<std::io::Error>().map(std::io::Error::kind) {
            Some(std::io::ErrorKind::ConnectionRefused) => Seen::Refused,
            Some(std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof) => Seen::Broken,
            _ => Seen::Other(format!("{e:#}")),
        },
    }
}

#[test]
fn proxy_killed_during_traffic_refuses_connections_then_serves_again() {
    if !require_root("proxy_killed_during_traffic_refuses_connections_then_serves_again") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let server = Pod::named(&net, "shop", "server").unwrap();
    let client = Pod::unmeshed(&net, "shop", "client").unwrap();
    let app = Apps::start(&server.netns.path(), server.ipv4().into(), "server").unwrap();
    let mut proxy = Sidecar::start(&bins.proxy, &server.netns, &[]).unwrap();
    let to = format!("{}:{}", server.ipv4(), apps::HTTP_PORT);

    // 0: proxy up, 1: being killed, 2: dead, 3: restarting, 4: up again, 5: stop.
    let seen = Mutex::new(Vec::new());
    let phase = AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while phase.load(Ordering::SeqCst) < 5 {
                let before = phase.load(Ordering::SeqCst);
                let outcome = request(&client, &to);
                seen.lock().push((before, outcome, phase.load(Ordering::SeqCst)));
            }
        });
        // Ends the traffic even when an assertion below fails (the scope joins it).
        let _stop = StopOnDrop(&phase, 5);
        let count =
            |p: usize, what: Seen| seen.lock().iter().filter(|(b, o, a)| *b == p && *a == p && *o == what).count();
        eventually("traffic through the proxy", Duration::from_secs(10), || count(0, Seen::Ok) >= 20);
        phase.store(1, Ordering::SeqCst);
        proxy.kill();
        phase.store(2, Ordering::SeqCst);
        let accepted = app.accepted.load(Ordering::SeqCst);
        eventually("refused connections", Duration::from_secs(10), || count(2, Seen::Refused) >= 20);
        assert_eq!(app.accepted.load(Ordering::SeqCst), accepted, "a connection reached the app without its proxy");
        // cnimesh-cni's CHECK alone: the reference bridge plugin's CHECK trips over its own MAC.
        net.exec_cnimesh("CHECK", &server.call()).expect("rules intact while the proxy is down");
        phase.store(3, Ordering::SeqCst);
        proxy = Sidecar::start(&bins.proxy, &server.netns, &[]).unwrap();
        phase.store(4, Ordering::SeqCst);
        eventually("full service after the restart", Duration::from_secs(10), || count(4, Seen::Ok) >= 20);
        phase.store(5, Ordering::SeqCst);
    });
    let seen = seen.into_inner();
    for (before, outcome, after) in &seen {
        let allowed = match (before, after) {
            (0, 0) | (4, 4) | (4, 5) => *outcome == Seen::Ok,
            (2, 2) => *outcome == Seen::Refused,
            // Requests that straddle the kill or the restart.
            _ => matches!(outcome, Seen::Ok | Seen::Refused | Seen::Broken),
        };
        assert!(allowed, "phase {before}->{after}: {outcome:?} (all: {seen:?})");
    }
    drop(proxy);
}

#[test]
fn control_plane_killed_during_renewal_the_proxy_keeps_its_certificate_and_renews_later() {
    if !require_root("control_plane_killed_during_renewal_the_proxy_keeps_its_certificate_and_renews_later") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    // Renewal at 70 % of 15 s: about 10 s after issuance.
    let mut m = meshed(&bins!(), &net, &["--cert-lifetime", "15s"]);
    let server_http = format!("{}:{}", m.server.ipv4(), apps::HTTP_PORT);
    let renewed = |p: &Sidecar| p.metric("identity_cert_refresh_total{result=\"success\"}");
    let failed = |p: &Sidecar| p.metric("identity_cert_refresh_total{result=\"failure\"}");
    let expiry = |p: &Sidecar| p.metric("identity_cert_expiration_timestamp_seconds");
    // Answers the server's proxy gave to requests that came over mTLS from the client.
    let client_id = identity("shop", "client");
    let mtls_answers = |p: &Sidecar| {
        let needle = format!("tls=\"true\",client_id=\"{client_id}\",status_code=\"200\"");
        let metrics = p.metrics();
        let lines: Vec<&str> = metrics.lines().filter(|l| l.contains(&needle)).collect();
        metric_sum(&lines.join("\n"), "response_total{")
    };
    let mtls_request_ok = |m: &Meshed<'_>| {
        let before = mtls_answers(&m.server_proxy);
        let answer = http_in(&m.client.netns.path(), &server_http, "POST", "/echo", "renew");
        matches!(answer, Ok((200, b)) if b.contains("renew")) && mtls_answers(&m.server_proxy) > before
    };
    assert!(mtls_request_ok(&m), "mTLS before the fault");
    let (first_server, first_client) = (expiry(&m.server_proxy), expiry(&m.client_proxy));
    assert!(first_server > 0.0 && first_client > 0.0);

    m.control.stop();
    eventually("both proxies to fail a renewal", Duration::from_secs(20), || {
        failed(&m.server_proxy) >= 1.0 && failed(&m.client_proxy) >= 1.0
    });
    // The current certificates are still valid: mTLS keeps working, nobody went unready.
    for _ in 0..5 {
        assert!(mtls_request_ok(&m), "mTLS while the control plane is down");
    }
    for p in [&m.server_proxy, &m.client_proxy] {
        assert_eq!(p.admin("GET", "/ready", "").unwrap().0, 200, "ready on its current certificate");
        assert_eq!(renewed(p), 1.0, "no renewal without the control plane");
    }
    assert_eq!(expiry(&m.server_proxy), first_server, "the certificate in use is kept");

    m.control.restart().unwrap();
    eventually("both proxies to renew", Duration::from_secs(10), || {
        renewed(&m.server_proxy) >= 2.0 && renewed(&m.client_proxy) >= 2.0
    });
    assert!(expiry(&m.server_proxy) > first_server && expiry(&m.client_proxy) > first_client, "new certificates");
    assert!(mtls_request_ok(&m), "mTLS on the renewed certificates");
}

/// Fills the filesystem at `dir` until writes fail with ENOSPC.
fn fill(dir: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let chunk = [0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    while f.write_all(&chunk[..1]).is_ok() {}
    assert_eq!(std::fs::write(dir.join("probe"), b"x").map_err(|e| e.raw_os_error()), Err(Some(libc::ENOSPC)));
}

#[test]
fn a_full_state_directory_fails_add_closed_with_code_5_and_del_still_works() {
    if !require_root("a_full_state_directory_fails_add_closed_with_code_5_and_del_still_works") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _mounted = Mounted::tmpfs(&state, "256k").unwrap();
    let net = Network::bridge(&bins!(), json!({"stateDir": state.join("cnimesh")})).unwrap();
    let before = Pod::new(&net, "default").unwrap();
    assert!(has_record(&net, &before.container_id));

    fill(&state);
    let late = Pod::unattached(&net, "default", "late").unwrap();
    let e = net.add(&late.call()).expect_err("no room for the record");
    assert_eq!(e.code, Some(5), "{e}");
    assert!(
        e.msg.contains("cannot write the attachment record")
            && e.details.as_deref().unwrap_or_default().contains("No space left"),
        "{e}"
    );
    assert!(late.nft_table().is_none(), "fail closed: no rules without a record");
    let records: Vec<String> = std::fs::read_dir(state.join("cnimesh/attachments"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(records.len(), 1, "only the earlier pod's record, no half-written one: {records:?}");
    late.del().expect("the runtime's DEL after the failed ADD");
    assert!(!net.allocated_to(&late.container_id));

    before.del().expect("DEL on a full disk");
    assert!(before.nft_table().is_none() && !has_record(&net, &before.container_id));

    std::fs::remove_file(state.join("filler")).unwrap();
    net.add(&late.call()).expect("ADD once there is room again");
    assert!(late.nft_table().is_some() && has_record(&net, &late.container_id));
    late.del().unwrap();
    drop((before, late));
    assert_eq!(net.leftovers(), Vec::<String>::new());
}

/// How one pod set up through the conf dir came out.
#[derive(Debug)]
enum Start {
    /// The runtime found no configuration (the primary CNI's file was gone): not started.
    NoConfig,
    /// Started through a list that chains cnimesh-cni (or not).
    Started {
        chained: bool,
    },
    Failed(String),
}

#[test]
fn primary_cni_config_deleted_while_pods_start_no_meshed_pod_keeps_running_unmeshed() {
    if !require_root("primary_cni_config_deleted_while_pods_start_no_meshed_pod_keeps_running_unmeshed") {
        return;
    }
    // Repair deletes meshed pods found running without capture (their controller recreates them).
    let (net, mut agent) = agent_network("delete");
    agent.start().unwrap();
    let primary = net.primary_conflist();
    let conf_dir = agent.conf_dir();

    let starts = Mutex::new(Vec::new());
    let pods: Vec<Pod<'_>> = (0..40).map(|i| Pod::unattached(&net, "shop", &format!("web-{i}")).unwrap()).collect();
    let stop = AtomicUsize::new(0);
    std::thread::scope(|s| {
        // The primary CNI restarts twice: deletes its file, then writes it back (without us).
        // The second time the agent is frozen for a while (a busy node), so the window before
        // it re-patches surely lets pods through unmeshed.
        s.spawn(|| {
            for slow_agent in [false, true] {
                std::thread::sleep(Duration::from_millis(400));
                std::fs::remove_file(agent.primary_file()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                agent.freeze(slow_agent);
                agent.write_primary(&primary).unwrap();
                if slow_agent {
                    std::thread::sleep(Duration::from_millis(800));
                    agent.freeze(false);
                }
            }
            std::thread::sleep(Duration::from_millis(400));
            stop.store(1, Ordering::SeqCst);
        });
        // The runtime: pods created one after another, each through what libcni reads now.
        for pod in &pods {
            if stop.load(Ordering::SeqCst) == 1 {
                break;
            }
            let mut object = kube_pod("shop", &pod.name, true);
            object["status"]["phase"] = json!("Pending");
            agent.add_pod(&object).unwrap();
            let start = match libcni_config(&conf_dir) {
                None => Start::NoConfig,
                Some(list) => {
                    let chained = list["plugins"].as_array().unwrap().iter().any(|p| p["type"] == "cnimesh-cni");
                    match net.add_list(&list, &pod.call()) {
                        Ok(_) => {
                            object["status"]["phase"] = json!("Running");
                            agent.add_pod(&object).unwrap();
                            Start::Started { chained }
                        }
                        Err(e) => Start::Failed(e.to_string()),
                    }
                }
            };
            starts.lock().push((pod.name.clone(), start));
            std::thread::sleep(Duration::from_millis(30));
        }
    });
    let starts = starts.into_inner();
    eventually("the agent to chain itself again", Duration::from_secs(10), || {
        cnimesh_node::chain::is_chained(&conf_dir).is_some()
    });
    let unmeshed: Vec<&str> = starts
        .iter()
        .filter(|(_, s)| matches!(s, Start::Started { chained: false }))
        .map(|(n, _)| n.as_str())
        .collect();
    let no_config = starts.iter().filter(|(_, s)| matches!(s, Start::NoConfig)).count();
    assert!(no_config > 0, "pods were created while the file was gone: {starts:?}");
    assert!(!unmeshed.is_empty(), "pods were created before the agent re-patched: {starts:?}");
    for (name, start) in &starts {
        let pod = pods.iter().find(|p| &p.name == name).unwrap();
        match start {
            Start::Started { chained: true } => {
                assert!(pod.nft_table().is_some(), "{name} started through the chain without rules");
            }
            Start::Failed(e) => panic!("{name}: {e}"),
            _ => {}
        }
    }
    // Pods that slipped through the window before the re-patch run without capture: the agent
    // finds and deletes them promptly (their controller recreates them through the plugin).
    eventually("every pod started unmeshed to be repaired", Duration::from_secs(20), || {
        unmeshed.iter().all(|name| !agent.has_pod("shop", name))
    });
    for (name, start) in &starts {
        if matches!(start, Start::Started { chained: true }) {
            assert!(agent.has_pod("shop", name), "{name} was captured and must not be repaired");
        }
    }
    del_all_and_check_nothing_left(&net, pods);
}
