//! Mesh expansion end to end: local mode's cluster (pods as network namespaces through the real
//! CNI chain, the real control plane, real proxies) and a "VM": a network namespace outside the
//! CNI chain, on local mode's bridge like another machine on the pods' network, set up by
//! `cnimesh-node host` alone, which runs the real proxy as ExternalWorkload `demo/vm` with a join
//! token made by `cnimesh external-workload join`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cnimesh_e2e::apps::{Apps, HTTP_PORT};
use cnimesh_e2e::host::{run, unique_name};
use cnimesh_e2e::host_agent::{HostAgent, get_in};
use cnimesh_e2e::local_mode::LocalMode;
use cnimesh_e2e::netns::Netns;
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{local_bins, require_root};
use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_cnimesh-node-e2e");
const CLI: &str = env!("CARGO_BIN_EXE_cnimesh-cli-e2e");
const PROXY: &str = env!("CARGO_BIN_EXE_cnimesh-proxy-e2e");
const NS: &str = "demo";
/// The VM's Service (a cluster IP of local mode's range no demo Service uses).
const VM_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 30);
/// web's cluster IP in the demo.
const WEB_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

fn identity(sa: &str) -> String {
    format!("{sa}.{NS}.serviceaccount.identity.cnimesh.cluster.local")
}

/// A "VM" on local mode's bridge: its own namespace, a veth whose other end is a port of the
/// bridge, address `ip` of the pods' subnet (above what host-local hands out), default route via
/// the bridge's gateway, as a machine on that network would have.
fn vm_on_bridge(local: &LocalMode, ip: Ipv4Addr, gateway: Ipv4Addr) -> Netns {
    let vm = Netns::new().expect("vm netns");
    let (outer, inner) = (unique_name("vmo"), unique_name("vmi"));
    run("ip", &["link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", vm.name()]).unwrap();
    run("ip", &["link", "set", &outer, "master", &format!("{}0", local.prefix)]).unwrap();
    run("ip", &["link", "set", &outer, "up"]).unwrap();
    vm.exec("ip", &["link", "set", "lo", "up"]).unwrap();
    vm.exec("ip", &["addr", "add", &format!("{ip}/24"), "dev", &inner]).unwrap();
    vm.exec("ip", &["link", "set", &inner, "up"]).unwrap();
    vm.exec("ip", &["route", "add", "default", "via", &gateway.to_string()]).unwrap();
    vm
}

/// `cnimesh external-workload join NAME -n demo --output-file PATH` as the cluster's administrator.
fn join(local: &LocalMode, name: &str, out: &Path) {
    let status = Command::new(CLI)
        .args(["external-workload", "join", name, "-n", NS, "--output-file"])
        .arg(out)
        .arg("--kubeconfig")
        .arg(local.root.join("kubeconfig"))
        .status()
        .unwrap();
    assert!(status.success(), "join {name}");
}

/// The proxy's environment file (root's, 0600) for ExternalWorkload `name`.
fn proxy_env(dir: &Path, local: &LocalMode, control: &str, name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("{name}.env"));
    let text = format!(
        "CNIMESH_EXTERNAL_WORKLOAD={NS}/{name}\nCNIMESH_PROXY_IDENTITY_NAME={}\n\
         CNIMESH_PROXY_IDENTITY_SVC_NAME=cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local\n\
         CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS={}\nCNIMESH_PROXY_IDENTITY_ADDR={control}\n\
         CNIMESH_PROXY_DESTINATION_ADDR={control}\nCNIMESH_PROXY_INBOUND_PORTS={HTTP_PORT}\n",
        identity("vm"),
        local.root.join("ca/ca.crt").display(),
    );
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// `cnimesh-node host` in `host` running the real proxy with `env` and the join token `token`, its
/// log (the proxy's included) in `log`.
fn host_agent(host: &Netns, env: &Path, token: &Path, log: &Path) -> HostAgent {
    let args =
        ["--proxy-bin", PROXY, "--proxy-env-file", env.to_str().unwrap(), "--join-token-file", token.to_str().unwrap()];
    HostAgent::start_logged(Path::new(AGENT), host, &args, log).unwrap()
}

fn get(netns: &Path, ip: Ipv4Addr, port: u16, path: &str) -> Option<(u16, String)> {
    get_in(netns, SocketAddr::from((ip, port)), path)
}

#[test]
fn a_vm_joins_the_mesh_through_host_mode_and_talks_mtls_both_ways_under_policy() {
    if !require_root("a_vm_joins_the_mesh_through_host_mode_and_talks_mtls_both_ways_under_policy") {
        return;
    }
    let pid = std::process::id();
    let local = LocalMode::new(format!("cnmx{:x}", pid & 0xffff), format!("10.248.{}.0/24", pid % 200), local_bins!());
    let _ = local.down();
    local.up();
    let state: Value = serde_json::from_slice(&std::fs::read(local.root.join("local.json")).unwrap()).unwrap();
    let control = state["control"].as_str().unwrap().to_string();
    // A /24: the gateway is its first address (local mode's bridge), the VMs sit at its top.
    let network: Ipv4Addr = state["subnet"].as_str().unwrap().split('/').next().unwrap().parse().unwrap();
    let host = |n: u32| Ipv4Addr::from(u32::from(network) + n);
    let (gateway, vm_ip, other_ip) = (host(1), host(250), host(251));

    // The VM in the cluster: its ServiceAccount, ExternalWorkload and Service; web lets it in.
    local.kubectl(
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: vm, namespace: {NS}}}
---
apiVersion: workload.cnimesh.io/v1alpha1
kind: ExternalWorkload
metadata: {{name: vm, namespace: {NS}, labels: {{app: vm}}}}
spec: {{workloadIPs: ["{vm_ip}"], ports: [{{name: http, port: {HTTP_PORT}}}], serviceAccountName: vm}}
---
apiVersion: v1
kind: Service
metadata: {{name: vm, namespace: {NS}}}
spec: {{clusterIP: "{VM_SERVICE_IP}", selector: {{app: vm}}, ports: [{{name: http, port: 80, targetPort: http}}]}}
---
apiVersion: policy.cnimesh.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {{name: web-clients, namespace: {NS}}}
spec: {{identityRefs: [{{kind: ServiceAccount, name: client}}, {{kind: ServiceAccount, name: vm}}]}}
"#
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("join-token");
    join(&local, "vm", &token);

    // The VM: its app, then the host agent with the real proxy, nothing else.
    let vm = vm_on_bridge(&local, vm_ip, gateway);
    let _app = Apps::start(&vm.path(), vm_ip.into(), "vm").unwrap();
    let env = proxy_env(dir.path(), &local, &control, "vm");
    let log = dir.path().join("vm.log");
    let agent = host_agent(&vm, &env, &token, &log);
    let proxy_ready = || get(&vm.path(), Ipv4Addr::LOCALHOST, 4191, "/ready").is_some_and(|(c, _)| c == 200);
    eventually("the VM's proxy is ready", Duration::from_secs(60), || {
        proxy_ready() && agent.get("/ready").is_some_and(|(c, _)| c == 200)
    });
    assert!(vm.nft_table().is_some(), "the agent alone captured the VM");

    // A meshed pod reaches the VM's app through its Service, over mTLS to the VM's identity.
    let client = local.netns("client");
    eventually("client → vm Service", Duration::from_secs(60), || {
        get(&client, VM_SERVICE_IP, 80, "/hello").is_some_and(|(c, body)| c == 200 && body.contains("hello from vm"))
    });
    let metrics = get(&vm.path(), Ipv4Addr::LOCALHOST, 4191, "/metrics").unwrap().1;
    assert!(
        metrics.contains(&format!("client_id=\"{}\"", identity("client"))),
        "the VM's proxy saw the client's identity:\n{metrics}"
    );

    // The VM's app calls a meshed Service in return: web admits only identities it names (now
    // client and vm), so a 200 is the VM's identity proven over mTLS.
    eventually("vm → web Service", Duration::from_secs(60), || {
        get(&vm.path(), WEB_SERVICE_IP, 80, "/hello").is_some_and(|(c, _)| c == 200)
    });
    let metrics = get(&vm.path(), Ipv4Addr::LOCALHOST, 4191, "/metrics").unwrap().1;
    assert!(
        metrics.contains(&format!("server_id=\"{}\"", identity("web"))) || metrics.contains("server_id=\"web."),
        "the VM's proxy verified web's identity:\n{metrics}"
    );

    // Policy on the VM's port: only client; intruder (meshed, its own identity) is refused.
    local.kubectl(
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: policy.cnimesh.io/v1alpha1
kind: Server
metadata: {{name: vm-http, namespace: {NS}}}
spec: {{podSelector: {{matchLabels: {{app: vm}}}}, port: http, proxyProtocol: HTTP/1}}
---
apiVersion: policy.cnimesh.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {{name: vm-clients, namespace: {NS}}}
spec: {{identityRefs: [{{kind: ServiceAccount, name: client}}]}}
---
apiVersion: policy.cnimesh.io/v1alpha1
kind: AuthorizationPolicy
metadata: {{name: vm-clients, namespace: {NS}}}
spec:
  targetRef: {{group: policy.cnimesh.io, kind: Server, name: vm-http}}
  requiredAuthenticationRefs: [{{group: policy.cnimesh.io, kind: MeshTLSAuthentication, name: vm-clients}}]
"#
        ),
    );
    let intruder = local.netns("intruder");
    eventually("intruder → vm refused", Duration::from_secs(60), || {
        get(&intruder, VM_SERVICE_IP, 80, "/hello").is_some_and(|(c, _)| c == 403)
    });
    let (code, _) = get(&client, VM_SERVICE_IP, 80, "/hello").unwrap();
    assert_eq!(code, 200, "client is still admitted");

    // The used token, on a second host: refused, and its proxy says why.
    let other = vm_on_bridge(&local, other_ip, gateway);
    let other_log = dir.path().join("other.log");
    let stolen = host_agent(&other, &env, &token, &other_log);
    eventually("the second host's proxy reports the refusal", Duration::from_secs(60), || {
        let text = std::fs::read_to_string(&other_log).unwrap_or_default();
        text.contains("certificate request failed") && text.contains("Unauthenticated")
    });
    let ready = get(&other.path(), Ipv4Addr::LOCALHOST, 4191, "/ready").map(|(c, _)| c);
    assert_ne!(ready, Some(200), "a proxy refused its certificate is not ready");
    drop(stolen);
    drop(agent);
    assert!(vm.nft_table().is_some(), "the agent leaves its rules on SIGTERM");
    vm.exec(AGENT, &["host", "uninstall"]).expect("the VM leaves the mesh");
    assert!(vm.nft_table().is_none(), "`host uninstall` removed the rules");
    let down = local.down();
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
}
