//! High availability on a real kernel: two control plane replicas share one address
//! (`serve --reuse-port`, the kernel spreads connections), a client proxy calls a meshed service
//! with mTLS without pause, and the replicas are restarted one at a time: no request may fail,
//! and afterwards the proxy still learns of changes (its Destination stream found a live
//! replica again).

use parking_lot::Mutex;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cnimesh_e2e::apps::Apps;
use cnimesh_e2e::control::{CONTROL_PORT, Control, env_refs};
use cnimesh_e2e::sidecar::{Sidecar, http_in};
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const SERVICE_IP: &str = "10.96.0.30";
const AUTHORITY_GAUGE: &str = "outbound_endpoints{authority=\"api.ha.svc.cluster.local:80\"}";
/// Short Leases, so that the writer's Lease moves to a live replica soon after its holder is
/// killed (no release): 3 s without renewal.
/// Only guards against a hung test.
const ELECTION: [&str; 4] = ["--lease-duration", "3s", "--lease-renew-interval", "1s"];

/// Service `api` (port 80 → 8080) in namespace `ha`, its endpoints being `pods`.
fn cluster(pods: &[(&str, Ipv4Addr)]) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: api, namespace: ha}}\nspec:\n  clusterIP: {SERVICE_IP}\n  ports: [{{port: 80, targetPort: 8080}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: api-1\n  namespace: ha\n  labels: {{kubernetes.io/service-name: api}}\naddressType: IPv4\nports: [{{port: 8080, protocol: TCP}}]\nendpoints:\n"
    );
    for (name, ip) in pods {
        out += &format!("  - addresses: [\"{ip}\"]\n    targetRef: {{kind: Pod, name: {name}, namespace: ha}}\n");
    }
    for (name, ip) in pods {
        out += &format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: ha}}\nspec:\n  serviceAccountName: api\n  containers: [{{name: app}}, {{name: cnimesh-proxy}}]\nstatus: {{phase: Running, podIP: \"{ip}\"}}\n"
        );
    }
    out
}

/// One request to the service from the client pod; status 0 when it could not be made.
fn call(client: &Path) -> (u16, String) {
    http_in(client, &format!("{SERVICE_IP}:80"), "GET", "/replica", "").unwrap_or((0, String::new()))
}

/// One more replica beside `first`: the same issuer and API server (and so the same tokens and
/// cluster state), the same gRPC address (SO_REUSEPORT), an admin port of its own so the test
/// can tell it is ready.
struct Replica {
    child: Child,
    admin: u16,
}

impl Replica {
    fn start(bin: &Path, pod: &Pod<'_>, first: &Control, name: &str, admin: u16) -> Self {
        let child = Command::new("ip")
            .args(["netns", "exec", pod.netns.name()])
            .arg(bin)
            .args(["serve", "--reuse-port", "--addr", &format!("0.0.0.0:{CONTROL_PORT}")])
            .args(["--admin-addr", &format!("0.0.0.0:{admin}")])
            .args(["--pod-name", name])
            .args(ELECTION)
            .arg("--issuer-dir")
            .arg(first.issuer_dir())
            .arg("--kube")
            .env("KUBECONFIG", first.kubeconfig())
            .env("CNIMESH_CONTROL_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let replica = Self { child, admin };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(http_in(&pod.netns.path(), &format!("127.0.0.1:{admin}"), "GET", "/ready", ""), Ok((200, _))) {
            assert!(Instant::now() < deadline, "replica on admin port {} did not become ready", replica.admin);
            std::thread::sleep(Duration::from_millis(20));
        }
        replica
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The mesh of both tests: the control plane's first replica, two `api` pods with proxies
/// (only api-0 listed at first), a client pod whose proxy resolves through the shared address.
struct Mesh<'n> {
    control_pod: Pod<'n>,
    first: Control,
    api: [Pod<'n>; 2],
    _servers: Vec<(Apps, Sidecar)>,
    client: Pod<'n>,
    client_proxy: Sidecar,
}

impl<'n> Mesh<'n> {
    fn start(net: &'n Network, bins: &cnimesh_e2e::cni::Bins) -> Self {
        let api = [Pod::named(net, "ha", "api-0").unwrap(), Pod::named(net, "ha", "api-1").unwrap()];
        let control_pod = Pod::unmeshed(net, "cnimesh", "control").unwrap();
        let objects = cluster(&[("api-0", api[0].ipv4())]);
        let args = [&["--reuse-port", "--pod-name", "replica-0"][..], &ELECTION].concat();
        let first = Control::start_with_objects(&bins.control, &control_pod, &args, &[("api.yaml", &objects)]).unwrap();
        let api_env = first.proxy_env("ha", "api", &first.token("ha", "api").unwrap());
        let mut servers = Vec::new();
        for pod in &api {
            let apps = Apps::start(&pod.netns.path(), pod.ipv4().into(), &pod.name).unwrap();
            servers.push((apps, Sidecar::start(&bins.proxy, &pod.netns, &env_refs(&api_env)).unwrap()));
        }
        let client = Pod::named(net, "ha", "client").unwrap();
        client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
        let mut env = first.proxy_env("ha", "client", &first.token("ha", "client").unwrap());
        env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), first.addr.to_string()));
        let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&env)).unwrap();
        let mesh = Self { control_pod, first, api, _servers: servers, client, client_proxy };
        let (status, body) = mesh.call();
        assert_eq!(status, 200, "{body}");
        mesh
    }

    fn call(&self) -> (u16, String) {
        http_in(&self.client.netns.path(), &format!("{SERVICE_IP}:80"), "GET", "/replica", "")
            .unwrap_or((0, String::new()))
    }

    /// Replica `replica-<n>`, its admin on port 9990 + n.
    fn replica(&self, bin: &Path, n: u16) -> Replica {
        Replica::start(bin, &self.control_pod, &self.first, &format!("replica-{n}"), 9990 + n)
    }
}

#[test]
fn a_rolling_restart_of_the_control_plane_fails_no_request() {
    if !require_root("a_rolling_restart_of_the_control_plane_fails_no_request") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let mut mesh = Mesh::start(&net, &bins);
    let mut second = Some(mesh.replica(&bins.control, 1));

    let client = mesh.client.netns.path();
    let stop = AtomicBool::new(false);
    let seen = Mutex::new(Vec::new());
    let progress = |seen: &Mutex<Vec<(u16, String)>>| {
        // At least 20 more answers before the next restart: traffic flows across each step.
        let start = seen.lock().len();
        let deadline = Instant::now() + Duration::from_secs(30);
        while seen.lock().len() < start + 20 {
            assert!(Instant::now() < deadline, "traffic stalled");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let answer = call(&client);
                seen.lock().push(answer);
            }
        });
        progress(&seen);
        // Restart each replica in turn, the other serving meanwhile (a rollout with maxSurge 1).
        mesh.first.stop();
        progress(&seen);
        let mut third = mesh.replica(&bins.control, 2);
        progress(&seen);
        drop(second.take());
        progress(&seen);
        let fourth = mesh.replica(&bins.control, 3);
        progress(&seen);
        let _ = third.child.kill();
        let _ = third.child.wait();
        progress(&seen);
        stop.store(true, Ordering::SeqCst);
        drop(fourth);
    });
    let seen = seen.into_inner();
    let failed: Vec<_> = seen.iter().filter(|(status, _)| *status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the rolling restart: {failed:?}",
        failed.len(),
        seen.len()
    );
    println!("{} requests, none failed, through two control plane restarts", seen.len());
}

/// After replicas come and go, the proxy's Destination stream reaches a live one again: a
/// scale-up made after the restarts reaches the proxy. (The mirror's writer Lease is the mirror's
/// own: multicluster_mirror_process.)
#[test]
fn after_a_restart_the_proxy_follows_changes_from_another_replica() {
    if !require_root("after_a_restart_the_proxy_follows_changes_from_another_replica") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let mut mesh = Mesh::start(&net, &bins);
    assert!(mesh.client_proxy.metrics().contains(&format!("{AUTHORITY_GAUGE} 1")));

    let _second = mesh.replica(&bins.control, 1);
    mesh.first.stop();
    let listed = [("api-0", mesh.api[0].ipv4()), ("api-1", mesh.api[1].ipv4())];
    mesh.first.cluster.apply_yaml("api.yaml", &cluster(&listed)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !mesh.client_proxy.metrics().contains(&format!("{AUTHORITY_GAUGE} 2")) {
        assert!(Instant::now() < deadline, "the proxy never heard of the scale-up from the remaining replica");
        std::thread::sleep(Duration::from_millis(50));
    }
}

const NODE_PODS: &str = "/api/v1/pods";

/// A running meshed pod on `node-1`, incarnation `uid`.
fn node_pod(name: &str, uid: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "shop", "name": name, "uid": uid},
        "spec": {"nodeName": "node-1", "containers": [{"name": "app"}, {"name": "cnimesh-proxy"}]},
        "status": {"phase": "Running"}})
}

/// The plugin's record of capturing `name` (incarnation `uid`).
fn captured(name: &str, uid: &str) -> cnimesh_cni::state::AttachmentRecord {
    cnimesh_cni::state::AttachmentRecord {
        version: 1,
        network: "k8s".into(),
        container_id: format!("c-{uid}"),
        ifname: "eth0".into(),
        netns: format!("/var/run/netns/{uid}"),
        netns_id: None,
        pod_namespace: Some("shop".into()),
        pod_name: Some(name.into()),
        pod_uid: Some(uid.into()),
        backend: cnimesh_cni::backend::Backend::Nftables,
        spec: cnimesh_cni::spec::RedirectSpec::default(),
        created_at: 0,
    }
}

/// The node agent's pod cache across two API server restarts: a clean end of the watch resumes
/// from the last resourceVersion (no list), a restart that lost the watch cache (410 Gone)
/// re-lists once; the cache never empties meanwhile, and what repair would act on stays empty,
/// also for a pod recreated while the API server was away (no repair storm).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_agent_resumes_its_watch_after_an_api_server_restart_without_a_repair_storm() {
    use cnimesh_e2e::kube_api::ClusterApi;
    use cnimesh_node::cluster::Cluster;

    let api = ClusterApi::new();
    let names: Vec<String> = (0..20).map(|i| format!("web-{i}")).collect();
    for name in &names {
        api.put(node_pod(name, &format!("{name}-a")));
    }
    let listed = api.resource_version();
    let (cluster, driver) = cnimesh_node::kube_cluster::KubeCluster::start(api.client(), "node-1");
    tokio::spawn(driver);
    let first = api.nth_watch(NODE_PODS, 1).await;
    assert_eq!(first.param("resourceVersion"), Some(listed.as_str()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster.ready() || cluster.node_pods().await.unwrap().len() < 20 {
        assert!(Instant::now() < deadline, "the pod cache never synced");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // What repair would act on, sampled every millisecond throughout.
    let records =
        std::sync::Arc::new(Mutex::new(names.iter().map(|n| captured(n, &format!("{n}-a"))).collect::<Vec<_>>()));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let sampler = {
        let (cluster, records, stop) = (cluster.clone(), records.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut smallest, mut targets) = (usize::MAX, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                let pods = cluster.node_pods().await.unwrap();
                smallest = smallest.min(pods.len());
                let records = records.lock().clone();
                for pod in cnimesh_node::repair::uncaptured(&pods, &records, &[]) {
                    targets.push(format!(
                        "{}/{}",
                        pod.metadata.name.clone().unwrap(),
                        pod.metadata.uid.clone().unwrap()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (smallest, targets)
        })
    };

    // Restart 1: the API server closes the watch; the agent resumes it where it was.
    api.end_watches("pods");
    let resumed = api.nth_watch(NODE_PODS, 2).await;
    assert_eq!(resumed.param("resourceVersion"), Some(listed.as_str()));
    assert_eq!(api.lists_of(NODE_PODS), 1, "a clean restart must not re-list");

    // Restart 2: the watch cache is gone; meanwhile web-3 was recreated (and captured again by
    // the plugin: a record for the new incarnation). One re-list, no pod ever looks uncaptured.
    records.lock().push(captured("web-3", "web-3-b"));
    api.restart_losing_history("pods", |api| {
        api.remove("v1", "Pod", "shop", "web-3");
        api.put(node_pod("web-3", "web-3-b"));
    });
    let relisted = api.resource_version();
    api.watch_from(NODE_PODS, &relisted).await;
    assert_eq!(api.lists_of(NODE_PODS), 2, "exactly one re-list");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster.node_pods().await.unwrap().iter().any(|p| p.metadata.uid.as_deref() == Some("web-3-b")) {
        assert!(Instant::now() < deadline, "the re-list never reached the cache");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let (smallest, targets) = sampler.await.unwrap();
    assert_eq!(smallest, 20, "the pod cache emptied during a restart");
    assert!(targets.is_empty(), "repair would have acted on captured pods: {targets:?}");
    assert!(cluster.ready());
}
