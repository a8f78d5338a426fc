//! Outbound policy on a real kernel: the control plane reads a Service whose
//! `config.cnimesh.io/opaque-ports` annotation declares its server-speaks-first port opaque; the
//! client's proxy, with that port in none of its own settings, learns it from OutboundPolicies
//! and forwards the silent client's connection at once, so the app's greeting arrives without
//! protocol detection. Once the control plane is gone, the last answer stays in force.

use std::io::Read;
use std::net::{Ipv4Addr, TcpStream};
use std::path::Path;
use std::time::Duration;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, env_refs};
use cnimesh_e2e::sidecar::{Sidecar, http_in};
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const SERVICE_IP: &str = "10.96.0.30";

/// A ClusterIP Service `name` on `port` (to the same port of its pod, unless `target` names
/// another), its one meshed replica `<name>-0` at `ip`, with the Service's `annotations`.
fn service_yaml(name: &str, cluster_ip: &str, port: u16, target: u16, ip: Ipv4Addr, annotations: &str) -> String {
    [
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: shop\n  annotations: {{{annotations}}}\nspec:\n  clusterIP: {cluster_ip}\n  ports: [{{name: p, port: {port}, targetPort: {target}}}]\n  selector: {{app: {name}}}\n"
        ),
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: p, port: {target}, protocol: TCP}}]\nendpoints:\n  - addresses: [\"{ip}\"]\n    conditions: {{ready: true}}\n    targetRef: {{kind: Pod, name: {name}-0, namespace: shop}}\n"
        ),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}-0\n  namespace: shop\n  labels: {{app: {name}}}\nspec:\n  serviceAccountName: {name}\n  containers:\n    - name: app\n      image: {name}\n      ports: [{{name: p, containerPort: {target}}}]\n    - name: cnimesh-proxy\n      image: cnimesh/proxy\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"
        ),
    ]
    .join("---\n")
}

/// The `db` Service with its server-speaks-first port declared opaque.
fn cluster_yaml(db: Ipv4Addr) -> String {
    let port = apps::BANNER_PORT;
    service_yaml("db", SERVICE_IP, port, port, db, &format!("config.cnimesh.io/opaque-ports: '{port}'"))
}

/// A client that connects and only listens, as a database client waits for its server's
/// greeting; what arrived (empty if nothing did before the read timed out).
fn greeting(netns: &Path) -> String {
    let to = format!("{SERVICE_IP}:{}", apps::BANNER_PORT);
    cnimesh_cni::netns::run_in(netns, move || {
        let mut s = TcpStream::connect(&to)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut got = vec![0u8; apps::BANNER.len()];
        s.read_exact(&mut got)?;
        std::io::Result::Ok(String::from_utf8_lossy(&got).into_owned())
    })
    .unwrap()
    .unwrap_or_default()
}

#[test]
fn a_port_the_service_declares_opaque_greets_a_silent_client_without_detection() {
    if !require_root("a_port_the_service_declares_opaque_greets_a_silent_client_without_detection") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let db = Pod::named(&net, "shop", "db-0").unwrap();
    let client = Pod::named(&net, "shop", "client").unwrap();
    let objects = cluster_yaml(db.ipv4());
    let mut control = Control::start_with_objects(&bins.control, &control_pod, &[], &[("db.yaml", &objects)]).unwrap();

    let _apps = Apps::start(&db.netns.path(), db.ipv4().into(), "db-0").unwrap();
    let db_env = control.proxy_env("shop", "db", &control.token("shop", "db").unwrap());
    let _db_proxy = Sidecar::start(&bins.proxy, &db.netns, &env_refs(&db_env)).unwrap();
    // The service range is routed out of the pod, as a node's default route does.
    client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
    let mut env = control.proxy_env("shop", "client", &control.token("shop", "client").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    // Only the control plane knows the port is opaque; detection would wait a minute for a
    // client that never speaks.
    env.push(("CNIMESH_PROXY_OPAQUE_PORTS".into(), "25".into()));
    env.push(("CNIMESH_PROXY_DETECT_TIMEOUT_MS".into(), "60000".into()));
    let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&env)).unwrap();

    let by_policy = |n: u32| {
        format!("connection_protocol_total{{direction=\"outbound\",protocol=\"opaque\",decided_by=\"policy\"}} {n}")
    };
    assert_eq!(greeting(&client.netns.path()), apps::BANNER);
    let metrics = client_proxy.metrics();
    assert!(metrics.contains(&by_policy(1)), "{metrics}");
    assert!(!metrics.contains("direction=\"outbound\",protocol=\"opaque\",decided_by=\"detection\""), "{metrics}");

    // The control plane goes away: the last answer stays in force.
    control.stop();
    assert_eq!(greeting(&client.netns.path()), apps::BANNER);
    let metrics = client_proxy.metrics();
    assert!(metrics.contains(&by_policy(2)), "{metrics}");
}

/// `web-routes` on the `web` Service: `/hello` to the `api` Service (unless `without_api`), the
/// rest to `web`.
fn route_yaml(without_api: bool) -> String {
    let api_rule = "  - matches: [{path: {type: Exact, value: /hello}}]\n    backendRefs: [{name: api, port: 80}]\n";
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: web-routes, namespace: shop}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: web, port: 80}}]\n  rules:\n{}  - backendRefs: [{{name: web, port: 80}}]\n",
        if without_api { "" } else { api_rule }
    )
}

#[test]
fn an_httproute_of_a_service_routes_by_path_and_changes_apply_live() {
    if !require_root("an_httproute_of_a_service_routes_by_path_and_changes_apply_live") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let (web, api) = (Pod::named(&net, "shop", "web-0").unwrap(), Pod::named(&net, "shop", "api-0").unwrap());
    let client = Pod::named(&net, "shop", "client").unwrap();
    let http = apps::HTTP_PORT;
    let services = [
        service_yaml("web", "10.96.0.40", 80, http, web.ipv4(), ""),
        service_yaml("api", "10.96.0.41", 80, http, api.ipv4(), ""),
    ];
    let objects = [("services.yaml", services.join("---\n")), ("routes.yaml", route_yaml(false))];
    let objects: Vec<(&str, &str)> = objects.iter().map(|(n, y)| (*n, y.as_str())).collect();
    let control = Control::start_with_objects(&bins.control, &control_pod, &[], &objects).unwrap();
    let mut replicas = Vec::new();
    for (pod, sa) in [(&web, "web"), (&api, "api")] {
        let apps = Apps::start(&pod.netns.path(), pod.ipv4().into(), &pod.name).unwrap();
        let env = control.proxy_env("shop", sa, &control.token("shop", sa).unwrap());
        replicas.push((apps, Sidecar::start(&bins.proxy, &pod.netns, &env_refs(&env)).unwrap()));
    }
    client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
    let mut env = control.proxy_env("shop", "client", &control.token("shop", "client").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&env)).unwrap();
    let get =
        |path: &str| http_in(&client.netns.path(), "10.96.0.40:80", "GET", path, "").unwrap_or((0, String::new()));

    assert_eq!(get("/replica"), (200, "web-0".into()));
    assert_eq!(get("/hello"), (200, "hello from api-0 over HTTP/1.1".into()), "the /hello rule goes to api");
    let metrics = client_proxy.metrics();
    let to_api = "route_group=\"gateway.networking.k8s.io\",route_kind=\"HTTPRoute\",route_namespace=\"shop\",route_name=\"web-routes\",backend_group=\"core\",backend_kind=\"Service\",backend_namespace=\"shop\",backend_name=\"api\"";
    assert!(metrics.contains(to_api), "{metrics}");

    // The route loses its /hello rule: the running proxy follows.
    control.cluster.apply_yaml("routes.yaml", &route_yaml(true)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while get("/hello") != (200, "hello from web-0 over HTTP/1.1".into()) {
        assert!(std::time::Instant::now() < deadline, "the route change never applied");
        std::thread::sleep(Duration::from_millis(50));
    }
}
