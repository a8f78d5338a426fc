//! The cost of outbound routes: two mTLS proxy pairs in the same run, both clients discovering
//! their Service and its OutboundPolicies from the control plane. One Service has an HTTPRoute
//! of 20 rules (19 that never match, each with a path, a method and a header to check, then the
//! one taken), the other none (the control plane's default route). Rounds interleave the two
//! rows; medians are printed with the added p50/p99 and the CPU ratio (the target: under
//! 5 % more CPU), then the CPU each round's routed row added to the same round's plain row.
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench proxy_routes` (needs nghttp2-client).
//! `CNIMESH_BENCH_ROUNDS` (default 3) sets the rounds.

use std::path::Path;
use std::time::{Duration, Instant};

use cnimesh_e2e::apps::Apps;
use cnimesh_e2e::bench::{PairSample, Row, interleaved_rounds, median, print_comparison, rounds};
use cnimesh_e2e::control::{Control, env_refs};
use cnimesh_e2e::objects::service_yaml;
use cnimesh_e2e::sidecar::{Sidecar, http_in, metric_with};
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const RULES: usize = 20;
const PLAIN_IP: &str = "10.96.0.60";
const ROUTED_IP: &str = "10.96.0.61";

/// The `routed` Service's HTTPRoute: [`RULES`] - 1 rules that do not match `/hello`, then one
/// that does, all to `routed` itself.
fn route_yaml() -> String {
    let mut rules: Vec<String> = (0..RULES - 1)
        .map(|i| {
            format!(
                "  - matches: [{{path: {{type: PathPrefix, value: /api/v{i}}}, method: GET, headers: [{{name: x-tenant, value: t{i}}}]}}]\n    backendRefs: [{{name: routed, port: 80}}]\n"
            )
        })
        .collect();
    rules.push(
        "  - matches: [{path: {type: PathPrefix, value: /hello}}]\n    backendRefs: [{name: routed, port: 80}]\n"
            .into(),
    );
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: bench-routes, namespace: shop}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: routed, port: 80}}]\n  rules:\n{}",
        rules.concat()
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

impl Pair<'_> {
    fn pids(&self) -> [u32; 2] {
        [self.client_proxy.pid(), self.server_proxy.pid()]
    }
}

/// A meshed client calling Service `service` at `cluster_ip` (its replica is `server`).
fn pair<'n>(control: &Control, proxy: &Path, client: Pod<'n>, server: Pod<'n>, cluster_ip: &str) -> Pair<'n> {
    let apps = Apps::start(&server.netns.path(), server.ipv4().into(), &server.name).unwrap();
    let server_env = control.proxy_env("shop", &server.name, &control.token("shop", &server.name).unwrap());
    let mut client_env = control.proxy_env("shop", &client.name, &control.token("shop", &client.name).unwrap());
    client_env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    // The service range is routed out of the pod, as a node's default route does.
    client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
    let server_proxy = Sidecar::start(proxy, &server.netns, &env_refs(&server_env)).unwrap();
    let client_proxy = Sidecar::start(proxy, &client.netns, &env_refs(&client_env)).unwrap();
    Pair { client, _server: server, _apps: apps, client_proxy, server_proxy, url: format!("http://{cluster_ip}/hello") }
}

fn main() {
    if !require_root("proxy routes benchmark") {
        return;
    }
    let rounds = rounds();
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let plain = (Pod::named(&net, "shop", "plain-client").unwrap(), Pod::named(&net, "shop", "plain-server").unwrap());
    let routed =
        (Pod::named(&net, "shop", "routed-client").unwrap(), Pod::named(&net, "shop", "routed-server").unwrap());
    let objects = [
        service_yaml("plain", PLAIN_IP, &plain.1.name, plain.1.ipv4(), &plain.1.name),
        service_yaml("routed", ROUTED_IP, &routed.1.name, routed.1.ipv4(), &routed.1.name),
        route_yaml(),
    ];
    let objects = objects.join("---\n");
    let control = Control::start_with_objects(&bins.control, &control_pod, &[], &[("cluster.yaml", &objects)]).unwrap();
    let without = pair(&control, &bins.proxy, plain.0, plain.1, PLAIN_IP);
    let with = pair(&control, &bins.proxy, routed.0, routed.1, ROUTED_IP);

    // The routes are in force before measuring: the client's requests are counted on the route.
    let on_route = || {
        metric_with(
            &with.client_proxy.metrics(),
            "outbound_http_route_backend_requests_total",
            &["route_name=\"bench-routes\""],
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while on_route() == 0.0 {
        assert!(Instant::now() < deadline, "the routes never applied:\n{}", with.client_proxy.metrics());
        let _ = http_in(&with.client.netns.path(), &format!("{ROUTED_IP}:80"), "GET", "/hello", "");
        std::thread::sleep(Duration::from_millis(100));
    }

    let rows: Vec<Row<'_>> = [("mTLS pair, no HTTPRoute", &without), ("mTLS pair, HTTPRoute with 20 rules", &with)]
        .into_iter()
        .map(|(name, p)| Row { name, netns: &p.client.netns, url: p.url.clone(), pids: p.pids().to_vec() })
        .collect();
    let samples = interleaved_rounds(&rows, rounds);
    let routed_requests = on_route();
    assert!(routed_requests > 60000.0, "the measured requests took the route: {routed_requests}");

    print_comparison("Outbound routes cost, to a ClusterIP", &rows, &samples, "20 route rules", 5.0);
    print_paired(&samples);
}

/// What the routes add within each round (the two rows of a round ran back to back, so they
/// share the machine's load at the time), and the median of those: steadier than the ratio
/// of the medians when other work on the machine comes and goes.
fn print_paired(samples: &[Vec<PairSample>]) {
    let added = |f: fn(&PairSample) -> f64| -> Vec<f64> {
        samples[0].iter().zip(&samples[1]).map(|(plain, routed)| (f(routed) / f(plain) - 1.0) * 100.0).collect()
    };
    let (at_rate, at_max) = (added(|s| s.cpu_per_1000), added(|s| s.h1_cpu_per_1000));
    let list = |v: &[f64]| v.iter().map(|p| format!("{p:+.1}")).collect::<Vec<_>>().join(", ");
    println!(
        "CPU added per round (%): at 1000 rps {}; at max {}\nmedian of the rounds: {:+.1} % at 1000 rps, {:+.1} % at max",
        list(&at_rate),
        list(&at_max),
        median(at_rate.clone()),
        median(at_max.clone())
    );
}
