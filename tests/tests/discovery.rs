//! Discovery on a real kernel: the control plane reads Services, EndpointSlices and Pods from a
//! directory of YAML (local mode's source); a client pod calls a service's ClusterIP through its
//! proxy, which resolves it, balances over the replicas with mTLS, follows scaling, and keeps
//! working on the known endpoints when the control plane goes away.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use cnimesh_e2e::apps::Apps;
use cnimesh_e2e::control::{Control, env_refs, identity};
use cnimesh_e2e::sidecar::{Sidecar, http_in};
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const SERVICE_IP: &str = "10.96.0.10";
const EMPTY_SERVICE_IP: &str = "10.96.0.20";

fn pod_yaml(name: &str, ip: Ipv4Addr, meshed: bool) -> String {
    let proxy = if meshed { "\n    - name: cnimesh-proxy\n      image: cnimesh/proxy" } else { "" };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: shop\n  labels: {{app: web}}\nspec:\n  serviceAccountName: web\n  containers:\n    - name: app\n      image: web\n      ports: [{{name: http, containerPort: 8080}}]{proxy}\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"
    )
}

/// The `web` service (port 80 → named port `http` = 8080) with `replicas` ready, and an `empty`
/// service with no endpoints.
fn cluster_yaml(replicas: &[(&str, Ipv4Addr)]) -> String {
    let mut docs = vec![
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop}}\nspec:\n  clusterIP: {SERVICE_IP}\n  ports: [{{name: http, port: 80, targetPort: http}}]\n  selector: {{app: web}}\n"
        ),
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: empty, namespace: shop}}\nspec:\n  clusterIP: {EMPTY_SERVICE_IP}\n  ports: [{{port: 80, targetPort: 8080}}]\n"
        ),
    ];
    let endpoints: Vec<String> = replicas
        .iter()
        .map(|(name, ip)| {
            format!(
                "  - addresses: [\"{ip}\"]\n    conditions: {{ready: true}}\n    targetRef: {{kind: Pod, name: {name}, namespace: shop}}\n"
            )
        })
        .collect();
    docs.push(format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n{}",
        if endpoints.is_empty() { "  []\n".to_string() } else { endpoints.concat() }
    ));
    docs.extend(replicas.iter().map(|(name, ip)| pod_yaml(name, *ip, true)));
    docs.join("---\n")
}

struct Service<'n> {
    control: Control,
    client: Pod<'n>,
    client_proxy: Sidecar,
    replicas: Vec<(Pod<'n>, Sidecar, Apps)>,
    _control_pod: Pod<'n>,
}

impl Service<'_> {
    /// One request to the service from the client app; (status, replica that answered).
    fn call(&self, ip: &str) -> (u16, String) {
        http_in(&self.client.netns.path(), &format!("{ip}:80"), "GET", "/replica", "").unwrap_or((0, String::new()))
    }

    /// One request to `addr` with a `Host` header of its own, on one connection.
    fn call_with_host(&self, addr: &str, host: &str) -> (u16, String) {
        let request = format!("GET /replica HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let addr = addr.to_string();
        let response = cnimesh_cni::netns::run_in(&self.client.netns.path(), move || {
            let mut s = std::net::TcpStream::connect(&addr)?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            std::io::Write::write_all(&mut s, request.as_bytes())?;
            let mut response = String::new();
            std::io::Read::read_to_string(&mut s, &mut response)?;
            std::io::Result::Ok(response)
        })
        .unwrap()
        .unwrap_or_default();
        let status = response.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (status, response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
    }

    fn set_replicas(&self, names: &[&str]) {
        let replicas: Vec<(&str, Ipv4Addr)> = self
            .replicas
            .iter()
            .filter(|(pod, _, _)| names.contains(&pod.name.as_str()))
            .map(|(pod, _, _)| (pod.name.as_str(), pod.ipv4()))
            .collect();
        self.control.cluster.apply_yaml("web.yaml", &cluster_yaml(&replicas)).unwrap();
    }
}

fn service<'n>(net: &'n Network, names: &[&str]) -> Service<'n> {
    let bins = bins!();
    let control_pod = Pod::unmeshed(net, "cnimesh", "control").unwrap();
    let mut replicas = Vec::new();
    let env_of = |control: &Control, sa: &str| control.proxy_env("shop", sa, &control.token("shop", sa).unwrap());
    let pods: Vec<Pod<'_>> = names.iter().map(|n| Pod::named(net, "shop", n).unwrap()).collect();
    let listed: Vec<(&str, Ipv4Addr)> = pods.iter().map(|p| (p.name.as_str(), p.ipv4())).collect();
    let objects = cluster_yaml(&listed);
    let control = Control::start_with_objects(&bins.control, &control_pod, &[], &[("web.yaml", &objects)]).unwrap();
    let web_env = env_of(&control, "web");
    for pod in pods {
        let apps = Apps::start(&pod.netns.path(), pod.ipv4().into(), &pod.name).unwrap();
        let proxy = Sidecar::start(&bins.proxy, &pod.netns, &env_refs(&web_env)).unwrap();
        replicas.push((pod, proxy, apps));
    }
    let client = Pod::named(net, "shop", "client").unwrap();
    // A route for the service range, as a node's default route provides: the connection is
    // redirected to the proxy before it leaves the pod.
    client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
    let mut env = env_of(&control, "client");
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&env)).unwrap();
    Service { control, client, client_proxy, replicas, _control_pod: control_pod }
}

fn spread(s: &Service<'_>, n: usize) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for _ in 0..n {
        let (status, replica) = s.call(SERVICE_IP);
        assert_eq!(status, 200, "{replica}");
        *counts.entry(replica).or_insert(0) += 1;
    }
    counts
}

#[test]
fn a_service_is_balanced_over_its_replicas_with_mtls_and_follows_scaling() {
    if !require_root("a_service_is_balanced_over_its_replicas_with_mtls_and_follows_scaling") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let mut s = service(&net, &["web-0", "web-1", "web-2"]);

    let counts = spread(&s, 90);
    assert_eq!(counts.len(), 3, "every replica serves: {counts:?}");
    let client_id = format!("client_id=\"{}\"", identity("shop", "client"));
    for (pod, proxy, _) in &s.replicas {
        assert!(proxy.metrics().contains(&client_id), "{} saw mTLS from the client", pod.name);
    }
    assert!(s.client_proxy.metrics().contains(&format!("server_id=\"{}\"", identity("shop", "web"))));
    // The control plane's outbound policy for the Service: every request took its default route.
    let routed = "outbound_http_route_backend_requests_total{parent_group=\"core\",parent_kind=\"Service\",parent_namespace=\"shop\",parent_name=\"web\",parent_port=\"80\",parent_section_name=\"\",route_group=\"\",route_kind=\"default\",route_namespace=\"\",route_name=\"http\",backend_group=\"core\",backend_kind=\"Service\",backend_namespace=\"shop\",backend_name=\"web\",backend_port=\"80\",backend_section_name=\"\"} 90";
    assert!(s.client_proxy.metrics().contains(routed), "{}", s.client_proxy.metrics());

    // A request naming the service in its authority is balanced too, whatever address it dialled.
    let replica0 = format!("{}:8080", s.replicas[0].0.ipv4());
    let mut named = std::collections::HashSet::new();
    for _ in 0..30 {
        let (status, replica) = s.call_with_host(&replica0, "web.shop.svc.cluster.local:80");
        assert_eq!(status, 200, "{replica}");
        named.insert(replica);
    }
    assert!(named.len() > 1, "balanced by authority: {named:?}");

    // A service without endpoints answers 503 at once.
    assert_eq!(s.call(EMPTY_SERVICE_IP).0, 503);

    // Scale down under continuous load: no request fails, and web-2 stops getting traffic.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        let (stop2, seen2, s2) = (stop.clone(), seen.clone(), &s);
        scope.spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                let answer = s2.call(SERVICE_IP);
                seen2.lock().push(answer);
            }
        });
        // Load flowing before the change: some answers in.
        while seen.lock().len() < 20 {
            std::thread::sleep(Duration::from_millis(20));
        }
        s.set_replicas(&["web-0", "web-1"]);
        // Balancing alone may starve an endpoint for a while, so traffic cannot tell whether the
        // update arrived: the proxy's own gauge does.
        let gauge = "outbound_endpoints{authority=\"web.shop.svc.cluster.local:80\"} 2";
        let deadline = Instant::now() + Duration::from_secs(30);
        while !s.client_proxy.metrics().contains(gauge) {
            assert!(Instant::now() < deadline, "the proxy never learnt of the scale-down");
            std::thread::sleep(Duration::from_millis(20));
        }
        let updated_at = seen.lock().len();
        while seen.lock().len() < updated_at + 40 {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::SeqCst);
        // One request may have been in flight to web-2 when the update landed.
        let after: Vec<_> = seen.lock()[updated_at + 1..].to_vec();
        assert!(after.iter().all(|(_, r)| r != "web-2"), "web-2 got traffic after its removal: {after:?}");
    });
    let seen = seen.lock();
    let failed: Vec<_> = seen.iter().filter(|(status, _)| *status != 200).collect();
    assert!(failed.is_empty(), "{} of {} requests failed while scaling down: {failed:?}", failed.len(), seen.len());
    assert!(s.client_proxy.metrics().contains("outbound_endpoints{authority=\"web.shop.svc.cluster.local:80\"} 2"));

    // The control plane goes away: traffic keeps flowing to the endpoints already known.
    s.control.stop();
    let counts = spread(&s, 40);
    assert!(!counts.contains_key("web-2"), "{counts:?}");
}

#[test]
fn a_slow_replica_gets_less_traffic() {
    if !require_root("a_slow_replica_gets_less_traffic") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let s = service(&net, &["slow-0", "web-1", "web-2"]);
    let counts = spread(&s, 150);
    let slow = counts.get("slow-0").copied().unwrap_or(0);
    let fast = counts.get("web-1").copied().unwrap_or(0) + counts.get("web-2").copied().unwrap_or(0);
    assert!(slow * 10 < fast, "peak-EWMA steers away from the slow replica: {counts:?}");
}

/// Raises its flag when dropped, even by a failing assertion.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Waits (bounded) until the client's proxy counts `n` endpoints of the `web` service.
fn wait_for_endpoints(s: &Service<'_>, n: usize) {
    let gauge = format!("outbound_endpoints{{authority=\"web.shop.svc.cluster.local:80\"}} {n}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !s.client_proxy.metrics().contains(&gauge) {
        assert!(Instant::now() < deadline, "the client's proxy never counted {n} endpoints");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_rolling_restart_of_every_replica_under_continuous_traffic_fails_no_request() {
    if !require_root("a_rolling_restart_of_every_replica_under_continuous_traffic_fails_no_request") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let mut s = service(&net, &["web-0", "web-1"]);
    let web_env = s.control.proxy_env("shop", "web", &s.control.token("shop", "web").unwrap());
    let old = std::mem::take(&mut s.replicas);
    let mut listed: Vec<(String, Ipv4Addr)> = old.iter().map(|(pod, _, _)| (pod.name.clone(), pod.ipv4())).collect();
    let publish = |listed: &[(String, Ipv4Addr)]| {
        let replicas: Vec<(&str, Ipv4Addr)> = listed.iter().map(|(name, ip)| (name.as_str(), *ip)).collect();
        s.control.cluster.apply_yaml("web.yaml", &cluster_yaml(&replicas)).unwrap();
    };
    let stop = AtomicBool::new(false);
    let seen = Mutex::new(Vec::new());
    let mut replaced = Vec::new();
    let mut direct = Vec::new();
    std::thread::scope(|scope| {
        // The clients stop when the roll ends, however it ends.
        let _stop = StopOnDrop(&stop);
        // Two clients, each a new connection per request, as long as the roll lasts.
        for _ in 0..2 {
            scope.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    let answer = s.call(SERVICE_IP);
                    seen.lock().push(answer);
                }
            });
        }
        for (pod, proxy, apps) in old {
            // As a Deployment rolls: the replacement first, ready and listed.
            let name = format!("{}-next", pod.name);
            let next = Pod::named(&net, "shop", &name).unwrap();
            let next_apps = Apps::start(&next.netns.path(), next.ipv4().into(), &name).unwrap();
            let next_proxy = Sidecar::start(&bins.proxy, &next.netns, &env_refs(&web_env)).unwrap();
            listed.push((name, next.ipv4()));
            publish(&listed);
            wait_for_endpoints(&s, listed.len());
            // Then the old pod terminates: its proxy has SIGTERM at once, while clients learn
            // that the endpoint is gone only a moment later (the endpoints controller, then
            // the control plane's watch).
            proxy.sigterm();
            let deadline = Instant::now() + Duration::from_secs(30);
            while matches!(proxy.admin("GET", "/ready", ""), Ok((200, _))) {
                assert!(Instant::now() < deadline, "the proxy never took SIGTERM");
                std::thread::sleep(Duration::from_millis(20));
            }
            // A new connection straight to the terminating pod is still served.
            let to = format!("{}:8080", pod.ipv4());
            let answer = http_in(&s.client.netns.path(), &to, "GET", "/replica", "").unwrap();
            direct.push((pod.name.clone(), answer));
            std::thread::sleep(Duration::from_secs(1));
            listed.retain(|(n, _)| *n != pod.name);
            publish(&listed);
            wait_for_endpoints(&s, listed.len());
            let mut proxy = proxy;
            assert!(proxy.wait(), "the terminating proxy exits cleanly once drained");
            drop(apps);
            replaced.push((next, next_proxy, next_apps));
        }
        let rolled_at = seen.lock().len();
        while seen.lock().len() < rolled_at + 40 {
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let seen = seen.into_inner();
    let failed: Vec<_> = seen.iter().filter(|(status, _)| *status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed over the rolling restart: {failed:?}",
        failed.len(),
        seen.len()
    );
    let served: std::collections::HashSet<_> = seen.iter().map(|(_, replica)| replica.as_str()).collect();
    assert!(served.contains("web-0-next") && served.contains("web-1-next"), "{served:?}");
    for (name, answer) in direct {
        assert_eq!(answer, (200, name.clone()), "{name}'s proxy still took a new connection after SIGTERM");
    }
}
