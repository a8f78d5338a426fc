//! The cost of the multicluster gateway hop: the same server (west's `web` and its
//! proxy) called in-cluster by a west client (client proxy → server proxy) and from east through
//! the gateway (client proxy → gateway → server proxy), both over mTLS. Rounds interleave the
//! rows; medians are printed with the added p50/p99 and CPU per 1000 requests (charged to every
//! proxy on the path, so the gateway row includes the gateway's).
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench proxy_gateway` (needs nghttp2-client).
//! `CNIMESH_BENCH_ROUNDS` (default 3) sets the rounds.

use cnimesh_e2e::bench::{Row, interleaved_rounds, print_comparison, rounds};
use cnimesh_e2e::control::env_refs;
use cnimesh_e2e::multicluster::{MIRROR_IP, Meshed};
use cnimesh_e2e::sidecar::{Sidecar, http_in};
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

/// West's own `web` Service (tests/src/multicluster.rs).
const WEB_IP: &str = "10.97.0.10";

fn main() {
    if !require_root("proxy gateway benchmark") {
        return;
    }
    let rounds = rounds();
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let c = Meshed::start(&bins, &net);
    let local = Pod::named(&net, "shop", "west-client").unwrap();
    local.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
    let mut env = c.west.proxy_env("shop", "west-client", &c.west.token("shop", "west-client").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), c.west.addr.to_string()));
    let local_proxy = Sidecar::start(&bins.proxy, &local.netns, &env_refs(&env)).unwrap();
    for (pod, ip) in [(&local, WEB_IP), (&c.client, MIRROR_IP)] {
        let (status, body) = http_in(&pod.netns.path(), &format!("{ip}:80"), "GET", "/hello", "").unwrap();
        assert_eq!(status, 200, "{ip}: {body}");
    }
    let rows = vec![
        Row {
            name: "in-cluster (client proxy → server proxy)",
            netns: &local.netns,
            url: format!("http://{WEB_IP}:80/hello"),
            pids: vec![local_proxy.pid(), c.web_proxy.pid()],
        },
        Row {
            name: "via gateway (client proxy → gateway → server proxy)",
            netns: &c.client.netns,
            url: format!("http://{MIRROR_IP}:80/hello"),
            pids: vec![c.client_proxy.pid(), c.gateway.pid(), c.web_proxy.pid()],
        },
    ];
    let samples = interleaved_rounds(&rows, rounds);
    print_comparison("The multicluster gateway hop, HTTP/1 over mTLS", &rows, &samples, "via gateway", 100.0);
}
