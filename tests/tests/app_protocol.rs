//! Declared protocols on a real kernel: Service ports whose `appProtocol` declares their protocol
//! (`http`, `cnimesh.io/opaque`, `linkerd.io/opaque`) are served by the client's proxy without
//! detection, learnt from OutboundPolicies. The client's proxy runs with a short detection
//! timeout and the clients here are slower than it: an HTTP client that writes its request late
//! on the declared port is still served as HTTP (counted as HTTP requests), a silent client of a
//! declared-opaque port gets its server's greeting, while the same late client on an undeclared
//! port is cut off by detection as before.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::Path;
use std::time::Duration;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, env_refs};
use cnimesh_e2e::sidecar::{Sidecar, metric_with};
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const DECLARED_IP: &str = "10.96.0.70";
const UNDECLARED_IP: &str = "10.96.0.71";
/// The client proxy's detection timeout, and how long the late client waits before it writes.
const DETECT_TIMEOUT_MS: u64 = 200;
const LATE: Duration = Duration::from_millis(1000);

/// `declared` (ports with `appProtocol`) and `undeclared` (the same ports without), both on the
/// one `web-0` replica.
fn cluster_yaml(ip: Ipv4Addr) -> String {
    let (http, banner) = (apps::HTTP_PORT, apps::BANNER_PORT);
    let service = |name: &str, cluster_ip: &str, declared: bool| {
        let app = |value: &str| if declared { format!(", appProtocol: {value}") } else { String::new() };
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  clusterIP: {cluster_ip}\n  selector: {{app: web}}\n  ports:\n  - {{name: http, port: 80, targetPort: {http}{}}}\n  - {{name: db, port: {banner}, targetPort: {banner}{}}}\n  - {{name: db2, port: 5433, targetPort: {banner}{}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: http, port: {http}, protocol: TCP}}, {{name: db, port: {banner}, protocol: TCP}}, {{name: db2, port: {banner}, protocol: TCP}}]\nendpoints:\n  - addresses: [\"{ip}\"]\n    conditions: {{ready: true}}\n    targetRef: {{kind: Pod, name: web-0, namespace: shop}}\n",
            app("http"),
            app("cnimesh.io/opaque"),
            app("linkerd.io/opaque"),
        )
    };
    [
        service("declared", DECLARED_IP, true),
        service("undeclared", UNDECLARED_IP, false),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-0\n  namespace: shop\n  labels: {{app: web}}\nspec:\n  serviceAccountName: web\n  containers:\n    - name: app\n      image: app\n    - name: cnimesh-proxy\n      image: cnimesh/proxy\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"
        ),
    ]
    .join("---\n")
}

/// An HTTP/1 client that connects, waits [`LATE`], then sends `GET /hello`; what came back
/// (empty when the connection was closed without an answer).
fn late_get(netns: &Path, to: String) -> String {
    cnimesh_cni::netns::run_in(netns, move || {
        let mut s = TcpStream::connect(&to)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        std::thread::sleep(LATE);
        let request = format!("GET /hello HTTP/1.1\r\nHost: {to}\r\nConnection: close\r\n\r\n");
        // A connection detection already closed may refuse the write: that is "no answer".
        if s.write_all(request.as_bytes()).is_err() {
            return std::io::Result::Ok(String::new());
        }
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        Ok(String::from_utf8_lossy(&got).into_owned())
    })
    .unwrap()
    .unwrap_or_default()
}

/// A client that connects and only listens, as a database client waits for its server's
/// greeting; what arrived (empty if nothing did before the read timed out).
fn greeting(netns: &Path, to: String) -> String {
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
fn declared_app_protocols_are_never_downgraded_by_a_client_slower_than_detection() {
    if !require_root("declared_app_protocols_are_never_downgraded_by_a_client_slower_than_detection") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let cluster = tempfile::tempdir().unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let web = Pod::named(&net, "shop", "web-0").unwrap();
    let client = Pod::named(&net, "shop", "client").unwrap();
    std::fs::write(cluster.path().join("web.yaml"), cluster_yaml(web.ipv4())).unwrap();
    let cluster_dir = cluster.path().display().to_string();
    let control = Control::start(&bins.control, &control_pod, &["--cluster-dir", &cluster_dir]).unwrap();
    let _apps = Apps::start(&web.netns.path(), web.ipv4().into(), "web-0").unwrap();
    let web_env = control.proxy_env("shop", "web", &control.token("shop", "web").unwrap());
    let _web_proxy = Sidecar::start(&bins.proxy, &web.netns, &env_refs(&web_env)).unwrap();
    client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
    let mut env = control.proxy_env("shop", "client", &control.token("shop", "client").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    // Only the control plane declares these ports; the proxy's own list names none of them.
    env.push(("CNIMESH_PROXY_OPAQUE_PORTS".into(), "25".into()));
    env.push(("CNIMESH_PROXY_DETECT_TIMEOUT_MS".into(), DETECT_TIMEOUT_MS.to_string()));
    let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&env)).unwrap();
    let netns = client.netns.path();
    let metric = |name: &str, labels: &[&str]| metric_with(&client_proxy.metrics(), name, labels);
    let outbound_by = |protocol: &str, by: &str| {
        let (protocol, by) = (format!("protocol=\"{protocol}\""), format!("decided_by=\"{by}\""));
        metric("connection_protocol_total", &["direction=\"outbound\"", &protocol, &by])
    };

    // `appProtocol: http`: served as HTTP however late the request, and counted as a request.
    let answer = late_get(&netns, format!("{DECLARED_IP}:80"));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("hello from web-0"), "{answer}");
    assert_eq!(outbound_by("http1", "policy"), 1.0, "{}", client_proxy.metrics());
    let authority = format!("authority=\"{DECLARED_IP}:80\"");
    assert_eq!(metric("request_total", &["direction=\"outbound\"", &authority]), 1.0, "{}", client_proxy.metrics());

    // Opaque, by our name and Linkerd's: a silent client gets the server's greeting at once.
    let banner = apps::BANNER_PORT;
    assert_eq!(greeting(&netns, format!("{DECLARED_IP}:{banner}")), apps::BANNER);
    assert_eq!(greeting(&netns, format!("{DECLARED_IP}:5433")), apps::BANNER);
    assert_eq!(outbound_by("opaque", "policy"), 2.0, "{}", client_proxy.metrics());

    // Undeclared: the late client is cut off by detection, as before (never served as HTTP).
    let timeouts = || metric("outbound_tcp_accept_errors_total", &["error=\"detect_timeout\""]);
    let before = timeouts();
    let answer = late_get(&netns, format!("{UNDECLARED_IP}:80"));
    assert!(!answer.contains("hello from web-0"), "{answer}");
    assert_eq!(timeouts(), before + 1.0, "{}", client_proxy.metrics());
    assert_eq!(outbound_by("http1", "policy"), 1.0, "nothing more decided by policy");
}
