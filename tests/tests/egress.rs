//! Egress visibility and control (issue 30) on a real kernel: a meshed client in namespace `shop`
//! talks to a server outside the mesh's networks (203.0.113.10, another netns on the bridge),
//! over HTTP and over its own TLS, through its proxy. The control plane reads EgressNetworks and
//! routes from its files directory and answers the client's proxy through OutboundPolicies.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use cnimesh_e2e::apps;
use cnimesh_e2e::control::{Control, env_refs, write_atomically};
use cnimesh_e2e::outside::{OUTSIDE_IP, Outside, TLS_GREETING, TLS_PORT, tls_in};
use cnimesh_e2e::sidecar::{Reply, Sidecar, metric_with, raw_reply_in};
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const HOST: &str = "api.example.test";

/// An HTTP/1.1 GET of `path` to the outside server with `Host: <host>`.
fn get(netns: &Path, host: &str, path: &str) -> Reply {
    let addr = format!("{OUTSIDE_IP}:{}", apps::HTTP_PORT);
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    raw_reply_in(netns, &addr, request).unwrap_or_default()
}

fn tls(netns: &Path, sni: &str, outside: &Outside) -> anyhow::Result<String> {
    tls_in(netns, SocketAddr::from((OUTSIDE_IP, TLS_PORT)), sni, &outside.ca_pem)
}

fn egress_network(policy: &str) -> String {
    format!(
        "apiVersion: policy.cnimesh.io/v1alpha1\nkind: EgressNetwork\nmetadata: {{name: world, namespace: shop}}\nspec:\n  trafficPolicy: {policy}\n  networks: [{{cidr: 203.0.113.0/24}}]\n"
    )
}

/// Deny, except `/hello` on [`HOST`] over HTTP and the SNI [`HOST`] over TLS.
fn allow_list() -> String {
    let http = apps::HTTP_PORT;
    [
        egress_network("Deny"),
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: api-hello, namespace: shop}}\nspec:\n  parentRefs: [{{group: policy.cnimesh.io, kind: EgressNetwork, name: world, port: {http}}}]\n  hostnames: [{HOST}]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: /hello}}}}]}}]\n"
        ),
        format!(
            "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TLSRoute\nmetadata: {{name: api-tls, namespace: shop}}\nspec:\n  parentRefs: [{{group: policy.cnimesh.io, kind: EgressNetwork, name: world, port: {TLS_PORT}}}]\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{{group: policy.cnimesh.io, kind: EgressNetwork, name: world}}]}}]\n"
        ),
    ]
    .join("---\n")
}

/// Waits (bounded) until `check` holds.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The control plane, the client pod with its proxy, and the outside server.
struct World<'n> {
    _control: Control,
    client: Pod<'n>,
    proxy: Sidecar,
    outside: Outside,
    cluster: tempfile::TempDir,
    _pods: Vec<Pod<'n>>,
}

fn world<'n>(bins: &cnimesh_e2e::Bins, net: &'n Network, egress: Option<&str>) -> World<'n> {
    let cluster = tempfile::tempdir().unwrap();
    if let Some(egress) = egress {
        std::fs::write(cluster.path().join("egress.yaml"), egress).unwrap();
    }
    let control_pod = Pod::unmeshed(net, "cnimesh", "control").unwrap();
    let client = Pod::named(net, "shop", "client").unwrap();
    let outside_pod = Pod::unmeshed(net, "outside", "world").unwrap();
    let outside = Outside::start(&outside_pod, &[HOST, "other.example.test"], &[&client]).unwrap();
    let cluster_dir = cluster.path().display().to_string();
    let control = Control::start(&bins.control, &control_pod, &["--cluster-dir", &cluster_dir]).unwrap();
    let mut env = control.proxy_env("shop", "client", &control.token("shop", "client").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), "shop:client".into()));
    let proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&env)).unwrap();
    World { _control: control, client, proxy, outside, cluster, _pods: vec![control_pod, outside_pod] }
}

#[test]
fn egress_is_forwarded_as_before_without_an_egress_network_and_seen_by_hostname_with_one() {
    if !require_root("egress_is_forwarded_as_before_without_an_egress_network_and_seen_by_hostname_with_one") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let w = world(&bins, &net, None);
    let netns = w.client.netns.path();

    // No EgressNetwork: forwarded as today, and nothing counted as egress.
    assert_eq!(get(&netns, HOST, "/replica").status, 200);
    assert_eq!(tls(&netns, HOST, &w.outside).unwrap(), TLS_GREETING);
    let m = w.proxy.metrics();
    for family in
        ["outbound_egress_requests_total", "outbound_egress_connections_total", "outbound_egress_denied_total"]
    {
        assert_eq!(metric_with(&m, family, &[]), 0.0, "{m}");
    }

    // An Allow EgressNetwork: still forwarded, now seen by hostname (Host, SNI).
    write_atomically(&w.cluster.path().join("egress.yaml"), &egress_network("Allow"));
    let network = "egress_network=\"shop/world\"";
    eventually("an HTTP request counted as egress by its Host", || {
        let reply = get(&netns, HOST, "/replica");
        assert_eq!(reply.status, 200, "{reply:?}");
        let m = w.proxy.metrics();
        metric_with(
            &m,
            "outbound_egress_requests_total",
            &[network, "dst_kind=\"egress\"", "dst_hostname=\"api.example.test\""],
        ) >= 1.0
    });
    let by_sni = ["protocol=\"tls\"", network, "dst_hostname=\"api.example.test\""];
    eventually("a TLS connection counted as egress by its SNI", || {
        assert_eq!(tls(&netns, HOST, &w.outside).unwrap(), TLS_GREETING, "the app's own TLS passes through");
        metric_with(&w.proxy.metrics(), "outbound_egress_connections_total", &by_sni) >= 1.0
    });
    let m = w.proxy.metrics();
    assert_eq!(metric_with(&m, "outbound_egress_denied_total", &[]), 0.0, "{m}");
}

#[test]
fn a_deny_egress_network_allows_only_the_hosts_paths_and_snis_its_routes_describe() {
    if !require_root("a_deny_egress_network_allows_only_the_hosts_paths_and_snis_its_routes_describe") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let w = world(&bins, &net, Some(&allow_list()));
    let netns = w.client.netns.path();

    eventually("the allow-list applied", || get(&netns, HOST, "/replica").status == 403);
    let hello = get(&netns, HOST, "/hello");
    assert_eq!(hello.status, 200, "{hello:?}");
    let denied = get(&netns, HOST, "/replica");
    assert_eq!(denied.status, 403);
    assert_eq!(denied.header("cnimesh-proxy-error"), Some("egress denied by EgressNetwork shop/world"));
    let other_host = get(&netns, "other.example.test", "/hello");
    assert_eq!(other_host.status, 403, "the route names one host: {other_host:?}");

    assert_eq!(tls(&netns, HOST, &w.outside).unwrap(), TLS_GREETING, "the TLSRoute allows its SNI");
    let refused = tls(&netns, "other.example.test", &w.outside);
    assert!(refused.is_err(), "another SNI is refused after its ClientHello: {refused:?}");

    let m = w.proxy.metrics();
    let network = "egress_network=\"shop/world\"";
    let http = ["protocol=\"http\"", network, "dst_hostname=\"api.example.test\""];
    assert!(metric_with(&m, "outbound_egress_denied_total", &http) >= 2.0, "{m}");
    let http_other = ["protocol=\"http\"", network, "dst_hostname=\"other.example.test\""];
    assert_eq!(metric_with(&m, "outbound_egress_denied_total", &http_other), 1.0, "{m}");
    let sni = ["protocol=\"tls\"", network, "dst_hostname=\"other.example.test\""];
    assert_eq!(metric_with(&m, "outbound_egress_denied_total", &sni), 1.0, "{m}");
    let allowed = ["protocol=\"tls\"", network, "dst_hostname=\"api.example.test\""];
    assert_eq!(metric_with(&m, "outbound_egress_connections_total", &allowed), 1.0, "{m}");
}

#[test]
fn a_bad_egress_network_is_refused_and_the_previous_one_stays_in_force() {
    if !require_root("a_bad_egress_network_is_refused_and_the_previous_one_stays_in_force") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let w = world(&bins, &net, Some(&egress_network("Deny")));
    let netns = w.client.netns.path();
    eventually("the Deny network applied", || get(&netns, HOST, "/replica").status == 403);

    // A CIDR that does not parse: refused (logged with kind and name), the Deny stays.
    let bad = egress_network("Allow").replace("203.0.113.0/24", "203.0.113.0/33");
    write_atomically(&w.cluster.path().join("egress.yaml"), &bad);
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..3 {
        let reply = get(&netns, HOST, "/replica");
        assert_eq!(reply.status, 403, "the last good EgressNetwork stays in force: {reply:?}");
    }
    // Without trafficPolicy the document does not parse: the same.
    write_atomically(
        &w.cluster.path().join("egress.yaml"),
        &egress_network("Allow").replace("  trafficPolicy: Allow\n", ""),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(get(&netns, HOST, "/replica").status, 403);
    // A good change applies.
    write_atomically(&w.cluster.path().join("egress.yaml"), &egress_network("Allow"));
    eventually("the Allow network applied", || get(&netns, HOST, "/replica").status == 200);
}
