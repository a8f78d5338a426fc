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
use cnimesh_e2e::sidecar::Sidecar;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const SERVICE_IP: &str = "10.96.0.30";

/// The `db` Service (ClusterIP, the banner port declared opaque) and its one meshed replica.
fn cluster_yaml(db: Ipv4Addr) -> String {
    let port = apps::BANNER_PORT;
    [
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: db\n  namespace: shop\n  annotations: {{config.cnimesh.io/opaque-ports: '{port}'}}\nspec:\n  clusterIP: {SERVICE_IP}\n  ports: [{{name: db, port: {port}, targetPort: {port}}}]\n  selector: {{app: db}}\n"
        ),
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: db-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: db}}\naddressType: IPv4\nports: [{{name: db, port: {port}, protocol: TCP}}]\nendpoints:\n  - addresses: [\"{db}\"]\n    conditions: {{ready: true}}\n    targetRef: {{kind: Pod, name: db-0, namespace: shop}}\n"
        ),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: db-0\n  namespace: shop\n  labels: {{app: db}}\nspec:\n  serviceAccountName: db\n  containers:\n    - name: app\n      image: db\n      ports: [{{name: db, containerPort: {port}}}]\n    - name: cnimesh-proxy\n      image: cnimesh/proxy\nstatus:\n  phase: Running\n  podIP: {db}\n  podIPs: [{{ip: {db}}}]\n"
        ),
    ]
    .join("---\n")
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
    let cluster = tempfile::tempdir().unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let db = Pod::named(&net, "shop", "db-0").unwrap();
    let client = Pod::named(&net, "shop", "client").unwrap();
    std::fs::write(cluster.path().join("db.yaml"), cluster_yaml(db.ipv4())).unwrap();
    let cluster_dir = cluster.path().display().to_string();
    let mut control = Control::start(&bins.control, &control_pod, &["--cluster-dir", &cluster_dir]).unwrap();

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
