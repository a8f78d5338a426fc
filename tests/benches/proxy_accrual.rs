//! The cost of failure accrual when it is configured but idle: two mTLS proxy pairs
//! of this build in the same run, each client calling a Service's ClusterIP through its
//! balancer (discovery and outbound policy from the control plane). One Service has
//! `balancer.cnimesh.io/failure-accrual: consecutive`, the other none; every endpoint is
//! healthy, so what is measured is the per-request bookkeeping (eligibility at the pick, the
//! outcome recorded at the end). Rounds interleave the rows; medians are printed with the added
//! p50/p99 and the CPU ratio.
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench proxy_accrual` (needs nghttp2-client).
//! `CNIMESH_BENCH_ROUNDS` (default 3) sets the rounds.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::bench::{Row, interleaved_rounds, print_comparison, rounds};
use cnimesh_e2e::control::{Control, env_refs};
use cnimesh_e2e::sidecar::Sidecar;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const ACCRUAL_IP: &str = "10.96.0.80";
const PLAIN_IP: &str = "10.96.0.81";

/// Service `name` at `cluster_ip` with its one replica `<name>-server` at `ip`.
fn service_yaml(name: &str, cluster_ip: &str, ip: Ipv4Addr, annotations: &str) -> String {
    let port = apps::HTTP_PORT;
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: shop\n  annotations: {{{annotations}}}\nspec:\n  clusterIP: {cluster_ip}\n  ports: [{{name: http, port: 80, targetPort: {port}}}]\n  selector: {{app: {name}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: http, port: {port}, protocol: TCP}}]\nendpoints:\n  - addresses: [\"{ip}\"]\n    conditions: {{ready: true}}\n    targetRef: {{kind: Pod, name: {name}-server, namespace: shop}}\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}-server\n  namespace: shop\n  labels: {{app: {name}}}\nspec:\n  serviceAccountName: {name}-server\n  containers:\n    - name: app\n      image: app\n    - name: cnimesh-proxy\n      image: cnimesh/proxy\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"
    )
}

struct Pair<'n> {
    client: Pod<'n>,
    _server: Pod<'n>,
    _apps: Apps,
    client_proxy: Sidecar,
    server_proxy: Sidecar,
    url: String,
}

impl<'n> Pair<'n> {
    fn start(control: &Control, proxy: &Path, client: Pod<'n>, server: Pod<'n>, cluster_ip: &str) -> Self {
        let apps = Apps::start(&server.netns.path(), server.ipv4().into(), &server.name).unwrap();
        let server_env = control.proxy_env("shop", &server.name, &control.token("shop", &server.name).unwrap());
        let mut client_env = control.proxy_env("shop", &client.name, &control.token("shop", &client.name).unwrap());
        client_env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
        client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
        let server_proxy = Sidecar::start(proxy, &server.netns, &env_refs(&server_env)).unwrap();
        let client_proxy = Sidecar::start(proxy, &client.netns, &env_refs(&client_env)).unwrap();
        let url = format!("http://{cluster_ip}:80/hello");
        Self { client, _server: server, _apps: apps, client_proxy, server_proxy, url }
    }

    fn row<'a>(&'a self, name: &'a str) -> Row<'a> {
        Row {
            name,
            netns: &self.client.netns,
            url: self.url.clone(),
            pids: vec![self.client_proxy.pid(), self.server_proxy.pid()],
        }
    }

    /// Waits until the client's requests reach the Service's replica through its balancer.
    fn ready(&self, cluster_ip: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = cnimesh_e2e::sidecar::http_in(
                &self.client.netns.path(),
                &format!("{cluster_ip}:80"),
                "GET",
                "/hello",
                "",
            );
            if got.is_ok_and(|(status, _)| status == 200) {
                return;
            }
            assert!(Instant::now() < deadline, "the Service at {cluster_ip} never answered");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn main() {
    if !require_root("proxy failure accrual benchmark") {
        return;
    }
    let rounds = rounds();
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let acc = (Pod::named(&net, "shop", "acc-client").unwrap(), Pod::named(&net, "shop", "acc-server").unwrap());
    let plain = (Pod::named(&net, "shop", "plain-client").unwrap(), Pod::named(&net, "shop", "plain-server").unwrap());
    let services = [
        service_yaml("acc", ACCRUAL_IP, acc.1.ipv4(), "balancer.cnimesh.io/failure-accrual: consecutive"),
        service_yaml("plain", PLAIN_IP, plain.1.ipv4(), ""),
    ];
    let objects = services.join("---\n");
    let control = Control::start_with_objects(&bins.control, &control_pod, &[], &[("cluster.yaml", &objects)]).unwrap();
    let with = Pair::start(&control, &bins.proxy, acc.0, acc.1, ACCRUAL_IP);
    let without = Pair::start(&control, &bins.proxy, plain.0, plain.1, PLAIN_IP);
    with.ready(ACCRUAL_IP);
    without.ready(PLAIN_IP);

    let rows = [
        without.row("mTLS pair via a Service, no failure accrual"),
        with.row("mTLS pair via a Service, failure accrual idle"),
    ];
    let samples = interleaved_rounds(&rows, rounds);
    let tripped = with.client_proxy.metric("outbound_http_balancer_endpoint_state_changes_total");
    assert_eq!(tripped, 0.0, "every endpoint stayed available: the feature was idle");
    print_comparison("Failure accrual cost, configured but idle", &rows, &samples, "failure accrual", 3.0);
}
