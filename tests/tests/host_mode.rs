//! `cnimesh-node host` on a real kernel: a namespace stands in for a VM (no CNI chain, no
//! kubelet), the agent runs inside it as its own process with `cnimesh-probe serve` as a stand-in
//! proxy (listeners on the proxy's ports that report which one took a connection and its original
//! destination), and a second namespace is another machine on the VM's network.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use cnimesh_common::names::PROXY_UID;
use cnimesh_e2e::host::unique_name;
use cnimesh_e2e::host_agent::{HOST_IP, HostAgent, HostNet, REMOTE_IP, processes_of};
use cnimesh_e2e::probe::connect;
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Listener, Report, require_root};

const AGENT: &str = env!("CARGO_BIN_EXE_cnimesh-node-e2e");
const PROBE: &str = env!("CARGO_BIN_EXE_cnimesh-probe");

fn at(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::from((ip, port))
}

/// The stand-in proxy's arguments: `serve NAME` on the proxy's inbound and outbound ports. NAME
/// is unique per test, so its processes can be found among other tests'.
fn stand_in(name: &str) -> Vec<String> {
    ["serve", name, "0.0.0.0:4143", "127.0.0.1:4140"].map(String::from).to_vec()
}

/// Starts the agent in `net.host` with the stand-in proxy named `name` and waits until ready.
fn start_agent(net: &HostNet, name: &str, extra: &[&str]) -> HostAgent {
    let mut args = vec!["--proxy-bin", PROBE];
    args.extend_from_slice(extra);
    args.push("--");
    let proxy = stand_in(name);
    args.extend(proxy.iter().map(String::as_str));
    let agent = HostAgent::start(Path::new(AGENT), &net.host, &args).expect("agent starts");
    agent.wait_ready();
    agent
}

fn stand_in_pids(name: &str) -> Vec<u32> {
    let marker = format!("serve {name} ");
    processes_of(PROXY_UID).into_iter().filter(|(_, cmd)| cmd.contains(&marker)).map(|(pid, _)| pid).collect()
}

#[track_caller]
fn reached(net_path: &Path, to: SocketAddr, uid: Option<u32>) -> Report {
    connect(Path::new(PROBE), net_path, to, uid).unwrap_or_else(|e| panic!("connect to {to} as {uid:?}: {e}"))
}

fn no_table(net: &HostNet) -> bool {
    net.host.nft_table().is_none()
}

#[test]
fn host_mode_captures_the_hosts_traffic_except_the_proxys_uid_loopback_and_ssh() {
    if !require_root("host_mode_captures_the_hosts_traffic_except_the_proxys_uid_loopback_and_ssh") {
        return;
    }
    let net = HostNet::new().expect("host and remote namespaces");
    let proxy = unique_name("proxy");
    let _remote = Listener::start(Path::new(PROBE), "remote", &net.remote.path(), &[at(REMOTE_IP, 9090)]).unwrap();
    let _apps = Listener::start(
        Path::new(PROBE),
        "host-app",
        &net.host.path(),
        &[at(Ipv4Addr::UNSPECIFIED, 22), at(Ipv4Addr::UNSPECIFIED, 8080), at(Ipv4Addr::LOCALHOST, 8081)],
    )
    .unwrap();
    let _agent = start_agent(&net, &proxy, &[]);

    let table = net.host.nft_table().expect("table inet cnimesh in the host namespace");
    for rule in ["tcp dport 22 ", "meta skuid 2102 ", "redirect to :4143", "redirect to :4140"] {
        assert!(table.contains(rule), "{rule:?} missing from\n{table}");
    }
    // An app on the host dialling another machine: sent to the proxy's outbound port.
    let out = reached(&net.host.path(), at(REMOTE_IP, 9090), None);
    assert_eq!((out.name.as_str(), out.listener.as_str()), (proxy.as_str(), "127.0.0.1:4140"), "{out:?}");
    assert_eq!(out.orig_dst.as_deref(), Some("10.79.0.1:9090"));
    // The proxy's own connections leave as they are.
    let own = reached(&net.host.path(), at(REMOTE_IP, 9090), Some(PROXY_UID));
    assert_eq!(own.name, "remote", "{own:?}");
    // Loopback stays the host's own.
    assert_eq!(reached(&net.host.path(), at(Ipv4Addr::LOCALHOST, 8081), None).name, "host-app");
    // Another machine dialling the host's app: sent to the proxy's inbound port...
    let inbound = reached(&net.remote.path(), at(HOST_IP, 8080), None);
    assert_eq!((inbound.name.as_str(), inbound.listener.as_str()), (proxy.as_str(), "0.0.0.0:4143"), "{inbound:?}");
    assert_eq!(inbound.orig_dst.as_deref(), Some("10.79.0.2:8080"));
    // ...but SSH reaches sshd directly, whatever the proxy does.
    let ssh = reached(&net.remote.path(), at(HOST_IP, 22), None);
    assert_eq!((ssh.name.as_str(), ssh.listener.as_str()), ("host-app", "0.0.0.0:22"), "{ssh:?}");
}

/// Attack: a local user other than the proxy's (any UID, and one next to it) dials out directly
/// hoping to skip the proxy; only the proxy's UID is let out.
#[test]
fn another_local_user_cannot_bypass_host_capture() {
    if !require_root("another_local_user_cannot_bypass_host_capture") {
        return;
    }
    let net = HostNet::new().expect("namespaces");
    let proxy = unique_name("proxy");
    let _remote = Listener::start(Path::new(PROBE), "remote", &net.remote.path(), &[at(REMOTE_IP, 9090)]).unwrap();
    let _agent = start_agent(&net, &proxy, &[]);
    for uid in [0, 1000, 65534, PROXY_UID - 1, PROXY_UID + 1] {
        let got = reached(&net.host.path(), at(REMOTE_IP, 9090), Some(uid));
        assert_eq!(got.name, proxy, "uid {uid} bypassed capture: {got:?}");
    }
}

#[test]
fn host_mode_puts_flushed_changed_or_deleted_rules_back() {
    if !require_root("host_mode_puts_flushed_changed_or_deleted_rules_back") {
        return;
    }
    let net = HostNet::new().expect("namespaces");
    let proxy = unique_name("proxy");
    let agent = start_agent(&net, &proxy, &[]);
    let installed = net.host.nft_table().expect("installed");
    let intact =
        || net.host.nft_table().is_some_and(|t| t.contains("redirect to :4140") && t.contains("meta skuid 2102"));
    let tampering: [&[&str]; 3] = [
        &["flush", "table", "inet", "cnimesh"],
        &["delete", "table", "inet", "cnimesh"],
        &["flush", "chain", "inet", "cnimesh", "outbound"],
    ];
    for (i, nft) in tampering.iter().enumerate() {
        net.host.exec("nft", nft).expect("tamper");
        eventually(&format!("rules back after `nft {}`", nft.join(" ")), Duration::from_secs(10), intact);
        eventually("the repair counted", Duration::from_secs(5), || {
            agent.status()["rules"]["repairs"].as_u64() == Some(i as u64 + 1)
        });
    }
    // The rules without their counters.
    let strip = |t: &str| -> Vec<String> {
        t.lines()
            .map(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                let mut kept = Vec::new();
                let mut i = 0;
                while i < words.len() {
                    if words[i] == "packets" || words[i] == "bytes" {
                        i += 2;
                    } else {
                        kept.push(words[i]);
                        i += 1;
                    }
                }
                kept.join(" ")
            })
            .collect()
    };
    assert_eq!(strip(&net.host.nft_table().unwrap()), strip(&installed), "the same rules as before");
    let metrics = agent.get("/metrics").expect("metrics").1;
    assert!(metrics.contains("cnimesh_node_host_rule_repairs_total{result=\"repaired\"} 3"), "{metrics}");
}

#[test]
fn host_mode_restarts_a_proxy_that_exits_and_fails_captured_traffic_meanwhile() {
    if !require_root("host_mode_restarts_a_proxy_that_exits_and_fails_captured_traffic_meanwhile") {
        return;
    }
    let net = HostNet::new().expect("namespaces");
    let proxy = unique_name("proxy");
    let _remote = Listener::start(Path::new(PROBE), "remote", &net.remote.path(), &[at(REMOTE_IP, 9090)]).unwrap();
    let agent = start_agent(&net, &proxy, &[]);
    let first = stand_in_pids(&proxy);
    assert_eq!(first.len(), 1, "one stand-in proxy running: {first:?}");
    assert_eq!(agent.status()["proxy"]["pid"].as_u64(), Some(u64::from(first[0])));
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(first[0] as i32), nix::sys::signal::Signal::SIGKILL);
    eventually("the proxy restarted", Duration::from_secs(30), || {
        let pids = stand_in_pids(&proxy);
        pids.len() == 1 && pids != first && agent.status()["proxy"]["restarts"] == 1
    });
    assert!(agent.status()["proxy"]["last_exit"].as_str().unwrap().contains("SIGKILL"));
    agent.wait_ready();

    // Fail closed: a proxy that cannot run leaves the rules in, so the host's outbound traffic
    // fails instead of reaching the remote machine uncaptured.
    let net2 = HostNet::new().expect("namespaces");
    let _remote2 = Listener::start(Path::new(PROBE), "remote", &net2.remote.path(), &[at(REMOTE_IP, 9090)]).unwrap();
    let broken = HostAgent::start(Path::new(AGENT), &net2.host, &["--proxy-bin", "/bin/false"]).expect("agent starts");
    eventually("the failing proxy was restarted", Duration::from_secs(30), || {
        broken.get("/status").is_some_and(|_| broken.status()["proxy"]["restarts"].as_u64() >= Some(2))
    });
    let (code, body) = broken.get("/ready").unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("proxy not running"), "{body}");
    assert!(net2.host.nft_table().is_some(), "rules stay while the proxy is down");
    // The connection waits on the agent's listener for a proxy (no local user can hold the
    // port meanwhile): it never reaches the remote machine.
    let got = connect(Path::new(PROBE), &net2.host.path(), at(REMOTE_IP, 9090), None);
    assert!(got.is_err(), "captured traffic with no proxy went around it: {got:?}");
}

#[test]
fn sigterm_stops_the_proxy_and_leaves_the_rules_unless_told_to_remove_them() {
    if !require_root("sigterm_stops_the_proxy_and_leaves_the_rules_unless_told_to_remove_them") {
        return;
    }
    let net = HostNet::new().expect("namespaces");
    // By default the rules stay: traffic fails until the agent is back, never bypasses the proxy.
    let proxy = unique_name("proxy");
    let mut agent = start_agent(&net, &proxy, &[]);
    assert_eq!(stand_in_pids(&proxy).len(), 1);
    assert!(agent.terminate().success());
    assert!(net.host.nft_table().is_some(), "rules kept on SIGTERM");
    eventually("the proxy stopped", Duration::from_secs(5), || stand_in_pids(&proxy).is_empty());

    // Leaving the mesh: `host uninstall` removes them (idempotently).
    for _ in 0..2 {
        net.host.exec(AGENT, &["host", "uninstall"]).expect("host uninstall succeeds");
        assert!(no_table(&net), "rules removed: {:?}", net.host.nft_table());
    }

    // …or `--remove-rules-on-exit`, for the operator taking the host out of the mesh.
    let proxy = unique_name("proxy");
    let mut agent = start_agent(&net, &proxy, &["--remove-rules-on-exit"]);
    assert!(agent.terminate().success());
    assert!(no_table(&net), "rules removed: {:?}", net.host.nft_table());
    eventually("the proxy stopped", Duration::from_secs(5), || stand_in_pids(&proxy).is_empty());

    // A crash (SIGKILL) leaves the rules too; the next agent takes them over.
    let proxy = unique_name("proxy");
    let mut agent = start_agent(&net, &proxy, &["--remove-rules-on-exit"]);
    agent.kill();
    assert!(net.host.nft_table().is_some(), "rules stay when the agent dies");
    for pid in stand_in_pids(&proxy) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
    }
}

/// Attack: during `systemctl restart` (an upgrade), between the old agent's exit and the new
/// one's start, a host app dials out and another machine dials the host's app, hoping to pass
/// while no proxy runs. Both are refused; once the agent is back they go through the proxy.
#[test]
fn restarting_the_host_agent_lets_no_connection_around_the_proxy() {
    if !require_root("restarting_the_host_agent_lets_no_connection_around_the_proxy") {
        return;
    }
    let net = HostNet::new().expect("namespaces");
    let _remote = Listener::start(Path::new(PROBE), "remote", &net.remote.path(), &[at(REMOTE_IP, 9090)]).unwrap();
    let _app =
        Listener::start(Path::new(PROBE), "host-app", &net.host.path(), &[at(Ipv4Addr::UNSPECIFIED, 8080)]).unwrap();
    let proxy = unique_name("proxy");
    let mut agent = start_agent(&net, &proxy, &[]);
    assert!(agent.terminate().success());
    eventually("the proxy stopped", Duration::from_secs(5), || stand_in_pids(&proxy).is_empty());
    match connect(Path::new(PROBE), &net.host.path(), at(REMOTE_IP, 9090), None) {
        Ok(got) => panic!("outbound went around the proxy while the agent was down: {got:?}"),
        Err(e) => assert!(e.to_string().contains("refused"), "{e}"),
    }
    match connect(Path::new(PROBE), &net.remote.path(), at(HOST_IP, 8080), None) {
        Ok(got) => panic!("inbound reached the host's app around the proxy while the agent was down: {got:?}"),
        Err(e) => assert!(e.to_string().contains("refused"), "{e}"),
    }
    let proxy = unique_name("proxy");
    let _agent = start_agent(&net, &proxy, &[]);
    assert_eq!(reached(&net.host.path(), at(REMOTE_IP, 9090), None).name, proxy);
    assert_eq!(reached(&net.remote.path(), at(HOST_IP, 8080), None).name, proxy);
}

/// Attack: settings or files that would weaken capture or leak the proxy's secrets are refused
/// before anything changes: the agent exits with an error naming the problem, leaving no rules
/// and no proxy behind.
#[test]
fn a_bad_host_configuration_is_refused_by_name_and_leaves_no_rules_or_proxy() {
    if !require_root("a_bad_host_configuration_is_refused_by_name_and_leaves_no_rules_or_proxy") {
        return;
    }
    let net = HostNet::new().expect("namespaces");
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("proxy.env");
    std::fs::write(&env_file, "CNIMESH_PROXY_LOG=info\n").unwrap();
    std::fs::set_permissions(&env_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let bad_env = dir.path().join("bad.env");
    std::fs::write(&bad_env, "CNIMESH_PROXY_LOG=info\nthis is not a pair\n").unwrap();
    std::fs::set_permissions(&bad_env, std::fs::Permissions::from_mode(0o600)).unwrap();
    // A proxy binary another user may replace (a copy in a world-writable directory).
    let open_dir = dir.path().join("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let writable_bin = open_dir.join("cnimesh-proxy");
    std::fs::copy(PROBE, &writable_bin).unwrap();
    let writable_bin = writable_bin.to_str().unwrap().to_string();
    let open_token = dir.path().join("join-token");
    std::fs::write(&open_token, "cnimesh-join.v1.shop.db.secret").unwrap();
    std::fs::set_permissions(&open_token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open_token = open_token.to_str().unwrap().to_string();
    let (env_file, bad_env) = (env_file.to_str().unwrap().to_string(), bad_env.to_str().unwrap().to_string());

    let cases: [(&[&str], &str); 7] = [
        (&["--join-token-file", &open_token], "join token file"),
        (&["--skip-inbound-ports", "4000-5000"], "contains the inbound proxy port"),
        (&["--skip-outbound-ports", "80,70000"], "70000"),
        (&["--proxy-uid", "0"], "--proxy-uid 0"),
        (&["--proxy-env-file", &env_file], "mode 0644"),
        (&["--proxy-env-file", &bad_env], "line 2"),
        (&["--proxy-bin", &writable_bin], "writable by other users"),
    ];
    for (args, why) in cases {
        let name = unique_name("proxy");
        let mut full: Vec<&str> = if args.contains(&"--proxy-bin") { vec![] } else { vec!["--proxy-bin", PROBE] };
        full.extend_from_slice(args);
        full.push("--");
        let proxy = stand_in(&name);
        full.extend(proxy.iter().map(String::as_str));
        let state = tempfile::tempdir().unwrap();
        let out = HostAgent::run_to_exit(Path::new(AGENT), &net.host, state.path(), &full)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(stderr.contains(why), "{args:?}: {why:?} not in {stderr}");
        assert!(no_table(&net), "{args:?} left rules: {:?}", net.host.nft_table());
        assert!(stand_in_pids(&name).is_empty(), "{args:?} started a proxy");
    }
}

/// Attack: a proxy state directory left open (another user could plant or read the proxy's key
/// and join token) is taken back at start: the proxy's UID's, 0700, in a parent others may pass
/// through but not list; the operator's join token reaches the proxy as its own 0600 copy there.
#[test]
fn the_proxy_state_directory_and_join_token_are_private_to_the_proxy_uid() {
    if !require_root("the_proxy_state_directory_and_join_token_are_private_to_the_proxy_uid") {
        return;
    }
    let net = HostNet::new().expect("namespaces");
    let proxy = unique_name("proxy");
    let state = tempfile::tempdir().unwrap();
    let open = state.path().join("proxy");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let etc = tempfile::tempdir().unwrap();
    let token = etc.path().join("join-token");
    std::fs::write(&token, "cnimesh-join.v1.shop.db.secret\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut args = vec!["--proxy-bin", PROBE, "--join-token-file", token.to_str().unwrap(), "--"];
    let stand_in = stand_in(&proxy);
    args.extend(stand_in.iter().map(String::as_str));
    let agent = HostAgent::start_in(Path::new(AGENT), &net.host, state, &args).unwrap();
    agent.wait_ready();
    let meta = std::fs::metadata(&open).unwrap();
    assert_eq!((meta.uid(), meta.gid(), meta.permissions().mode() & 0o777), (PROXY_UID, PROXY_UID, 0o700));
    let parent = std::fs::metadata(agent.state_dir.path()).unwrap();
    assert_eq!((parent.uid(), parent.permissions().mode() & 0o777), (0, 0o711));
    let copy = std::fs::metadata(open.join("join-token")).unwrap();
    assert_eq!((copy.uid(), copy.permissions().mode() & 0o777), (PROXY_UID, 0o600));
    assert_eq!(std::fs::read_to_string(open.join("join-token")).unwrap(), "cnimesh-join.v1.shop.db.secret\n");
    // The proxy is told where its state and token are.
    let pid = stand_in_pids(&proxy)[0];
    let environ = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/environ")).unwrap()).replace('\0', "\n");
    let dir = open.to_str().unwrap();
    assert!(environ.contains(&format!("CNIMESH_PROXY_IDENTITY_STATE_DIR={dir}\n")), "{environ}");
    assert!(environ.contains(&format!("CNIMESH_PROXY_IDENTITY_JOIN_TOKEN_FILE={dir}/join-token\n")), "{environ}");
}

/// A squatter: `cnimesh-probe serve squatter ADDR` as `uid` (no capability, no group) inside
/// `net`. `Some(child)` when it bound ADDR (it serves until killed), `None` when the bind failed.
fn squat(net: &HostNet, uid: u32, addr: &str) -> Option<std::process::Child> {
    use std::io::BufRead;
    let uid = uid.to_string();
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", net.host.name(), "setpriv", "--reuid", &uid, "--regid", &uid, "--clear-groups"])
        .args([PROBE, "serve", "squatter", addr])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the squatter");
    let mut line = String::new();
    let _ = std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    if line.trim() == "ready" {
        return Some(child);
    }
    let out = child.wait_with_output().expect("squatter exits");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("EADDRINUSE") || stderr.contains("in use"), "squatter on {addr}: {stderr}");
    None
}

/// Attack: an unprivileged local user loops on bind() of the proxy's ports (127.0.0.1:4140 and
/// 0.0.0.0:4143, both above 1024) while the proxy is down, to receive other users' redirected
/// connections in plaintext with their original destinations. The agent holds both listeners for
/// its whole life and hands them to every proxy it starts: the bind is refused (EADDRINUSE),
/// before the first start, between restarts and while a proxy keeps failing, and captured
/// traffic never reaches the squatter.
#[test]
fn an_unprivileged_user_cannot_take_the_proxy_ports_while_the_proxy_restarts() {
    if !require_root("an_unprivileged_user_cannot_take_the_proxy_ports_while_the_proxy_restarts") {
        return;
    }
    let addrs = ["127.0.0.1:4140", "0.0.0.0:4143"];
    // A proxy that keeps failing: it is down nearly all the time.
    let net = HostNet::new().expect("namespaces");
    let _remote = Listener::start(Path::new(PROBE), "remote", &net.remote.path(), &[at(REMOTE_IP, 9090)]).unwrap();
    let broken = HostAgent::start(Path::new(AGENT), &net.host, &["--proxy-bin", "/bin/false"]).expect("agent starts");
    eventually("the failing proxy was restarted", Duration::from_secs(30), || {
        broken.get("/status").is_some_and(|_| broken.status()["proxy"]["restarts"].as_u64() >= Some(1))
    });
    for addr in addrs {
        if let Some(mut squatter) = squat(&net, 65534, addr) {
            let got = connect(Path::new(PROBE), &net.host.path(), at(REMOTE_IP, 9090), None);
            let _ = squatter.kill();
            let _ = squatter.wait();
            panic!("uid 65534 bound {addr} while the proxy was down; a captured connection got: {got:?}");
        }
    }
    let got = connect(Path::new(PROBE), &net.host.path(), at(REMOTE_IP, 9090), None);
    assert!(got.is_err(), "captured traffic with no proxy went somewhere: {got:?}");

    // A working proxy killed: while it restarts, the ports are still taken.
    let net = HostNet::new().expect("namespaces");
    let proxy = unique_name("proxy");
    let agent = start_agent(&net, &proxy, &[]);
    for round in 1..=3u64 {
        let pids = stand_in_pids(&proxy);
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pids[0] as i32), nix::sys::signal::Signal::SIGKILL);
        for addr in addrs {
            if let Some(mut squatter) = squat(&net, PROXY_UID + 1, addr) {
                let _ = squatter.kill();
                panic!("uid {} bound {addr} while the proxy restarted", PROXY_UID + 1);
            }
        }
        eventually("the proxy restarted", Duration::from_secs(30), || {
            agent.status()["proxy"]["restarts"].as_u64() == Some(round) && stand_in_pids(&proxy).len() == 1
        });
    }
    // The restarted proxy serves both ports (the listeners it was handed).
    agent.wait_ready();
    assert_eq!(reached(&net.host.path(), at(REMOTE_IP, 9090), None).name, proxy);
    assert_eq!(reached(&net.remote.path(), at(HOST_IP, 8080), None).name, proxy);
}

/// Attack: the proxy's UID is a human's (a login user): that user's traffic would bypass capture
/// and they would own the mesh key. Refused by name before anything changes.
#[test]
fn a_proxy_uid_that_belongs_to_a_login_user_is_refused_by_name() {
    if !require_root("a_proxy_uid_that_belongs_to_a_login_user_is_refused_by_name") {
        return;
    }
    let (user, uid) = ("cnimesh-hostfix-human", "2190");
    let _ = std::process::Command::new("userdel").arg(user).output();
    let added = std::process::Command::new("useradd")
        .args(["--uid", uid, "--no-create-home", "--shell", "/bin/bash", user])
        .output()
        .expect("useradd");
    assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stderr));
    let net = HostNet::new().expect("namespaces");
    let name = unique_name("proxy");
    let mut args = vec!["--proxy-bin", PROBE, "--proxy-uid", uid, "--"];
    let proxy = stand_in(&name);
    args.extend(proxy.iter().map(String::as_str));
    let state = tempfile::tempdir().unwrap();
    let out = HostAgent::run_to_exit(Path::new(AGENT), &net.host, state.path(), &args);
    let _ = std::process::Command::new("userdel").arg(user).output();
    let out = out.unwrap_or_else(|e| panic!("{e:#}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a login user's UID accepted");
    for why in ["--proxy-uid 2190", user, "login shell /bin/bash"] {
        assert!(stderr.contains(why), "{why:?} not in {stderr}");
    }
    assert!(no_table(&net), "left rules: {:?}", net.host.nft_table());
}
