//! Routes on a real kernel: `cnimesh-control` reads Services, EndpointSlices, Pods and Gateway API
//! HTTPRoutes (a Service as parent, the GAMMA profile) from a directory of YAML (local mode's
//! source); a client pod calls the `web` Service's ClusterIP through its proxy, which takes the
//! routes from OutboundPolicies and sends each request by path to `web` or `web-canary` over
//! mTLS, splits by weight, answers a request timeout with 504, follows a route change while
//! running, retries a flaky backend within Linkerd's retry budget, and counts per route.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, env_refs};
use cnimesh_e2e::objects::service_yaml;
use cnimesh_e2e::sidecar::{Reply, Sidecar, grpc_in, http_reply_in, metric_with};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const WEB_IP: &str = "10.96.0.50";
const CANARY_IP: &str = "10.96.0.51";
/// Concurrent callers of [`Mesh::calls`].
const CALLERS: usize = 10;

/// `web`'s path routes: `/hello` to `hello_backend`, `/replica` split 90/10 between `web` and
/// `web-canary`, `/slow` with a 100 ms request timeout. Nothing else matches.
fn paths_route(hello_backend: &str) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: web-paths, namespace: shop}}
spec:
  parentRefs: [{{group: "", kind: Service, name: web, port: 80}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /hello}}}}]
    backendRefs: [{{name: {hello_backend}, port: 80}}]
  - matches: [{{path: {{type: Exact, value: /replica}}}}]
    backendRefs: [{{name: web, port: 80, weight: 90}}, {{name: web-canary, port: 80, weight: 10}}]
  - matches: [{{path: {{type: Exact, value: /slow}}}}]
    backendRefs: [{{name: web, port: 80}}]
    timeouts: {{request: 100ms}}
"#
    )
}

/// `web`'s retried paths, with Linkerd-style annotations: 5xx retried once.
const RETRY_ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: web-retries
  namespace: shop
  annotations: {retry.cnimesh.io/http: 5xx, retry.cnimesh.io/limit: "1"}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 80}]
  rules:
  - matches: [{path: {type: Exact, value: /flaky}}, {path: {type: Exact, value: /status/503}}]
    backendRefs: [{name: web, port: 80}]
"#;

/// `web`'s gRPC routes: `test.Echo/Canary` to `web-canary`, the other methods of `test.Echo` to
/// `web`.
const GRPC_ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: web-grpc, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 80}]
  rules:
  - matches: [{method: {service: test.Echo, method: Canary}}]
    backendRefs: [{name: web-canary, port: 80}]
  - matches: [{method: {service: test.Echo}}]
    backendRefs: [{name: web, port: 80}]
"#;

/// The control plane, the `web-0` and `canary-0` replicas behind their proxies, and a client
/// whose proxy discovers services and their routes.
struct Mesh<'n> {
    client: Pod<'n>,
    client_proxy: Sidecar,
    _replicas: Vec<(Pod<'n>, Sidecar, Apps)>,
    control: Control,
    _control_pod: Pod<'n>,
}

impl Mesh<'_> {
    /// One request from the client app to `web`, on a fresh connection.
    fn call(&self, method: &str, path: &str, body: &str) -> Reply {
        http_reply_in(&self.client.netns.path(), &format!("{WEB_IP}:80"), method, path, body).unwrap_or_default()
    }

    /// `n` requests from [`CALLERS`] concurrent callers, each on a fresh connection.
    fn calls(&self, n: usize, method: &str, path: &str) -> Vec<Reply> {
        std::thread::scope(|scope| {
            let callers: Vec<_> = (0..CALLERS)
                .map(|i| {
                    let share = n / CALLERS + usize::from(i < n % CALLERS);
                    scope.spawn(move || (0..share).map(|_| self.call(method, path, "")).collect::<Vec<_>>())
                })
                .collect();
            callers.into_iter().flat_map(|c| c.join().unwrap()).collect()
        })
    }

    fn routes(&self, routes: &str) {
        self.control.cluster.apply_yaml("routes.yaml", routes).unwrap();
    }

    /// A route metric of the client's proxy, summed over the samples with all `labels`.
    fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        metric_with(&self.client_proxy.metrics(), name, labels)
    }
}

fn mesh<'n>(net: &'n Network, routes: &str) -> Mesh<'n> {
    let bins = bins!();
    let control_pod = Pod::unmeshed(net, "cnimesh", "control").unwrap();
    let web = Pod::named(net, "shop", "web-0").unwrap();
    let canary = Pod::named(net, "shop", "canary-0").unwrap();
    let client = Pod::named(net, "shop", "client").unwrap();
    let services = [
        service_yaml("web", WEB_IP, "web-0", web.ipv4(), "web"),
        service_yaml("web-canary", CANARY_IP, "canary-0", canary.ipv4(), "web"),
    ];
    let services = services.join("---\n");
    let objects = [("services.yaml", services.as_str()), ("routes.yaml", routes)];
    let control = Control::start_with_objects(&bins.control, &control_pod, &[], &objects).unwrap();

    let web_env = control.proxy_env("shop", "web", &control.token("shop", "web").unwrap());
    let replicas = [web, canary]
        .into_iter()
        .map(|pod| {
            let apps = Apps::start(&pod.netns.path(), pod.ipv4().into(), &pod.name).unwrap();
            let proxy = Sidecar::start(&bins.proxy, &pod.netns, &env_refs(&web_env)).unwrap();
            (pod, proxy, apps)
        })
        .collect();
    // The service range is routed out of the pod, as a node's default route does.
    client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
    let mut env = control.proxy_env("shop", "client", &control.token("shop", "client").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&env)).unwrap();
    Mesh { client, client_proxy, _replicas: replicas, control, _control_pod: control_pod }
}

#[test]
fn http_routes_send_by_path_split_by_weight_time_out_and_change_on_a_live_proxy() {
    if !require_root("http_routes_send_by_path_split_by_weight_time_out_and_change_on_a_live_proxy") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let mesh = mesh(&net, &paths_route("web-canary"));

    // By path: `/hello` goes to the other Service; a path no rule matches is the proxy's 404.
    let hello = mesh.call("GET", "/hello", "");
    assert_eq!(hello.status, 200, "{hello:?}");
    assert!(hello.body.contains("canary-0"), "{hello:?}");
    let unrouted = mesh.call("GET", "/echo", "");
    assert_eq!(unrouted.status, 404, "{unrouted:?}");
    assert!(unrouted.header("cnimesh-proxy-error").is_some(), "the proxy's own 404: {unrouted:?}");

    // The rule's 100 ms request timeout on a backend answering in 1.5 s: 504, named by the proxy.
    let slow = mesh.call("GET", "/slow", "");
    assert_eq!(slow.status, 504, "{slow:?}");
    let why = slow.header("cnimesh-proxy-error").unwrap_or_default();
    assert!(why.contains("timed out") && why.contains("web-paths"), "{slow:?}");

    // 90/10 over 2000 requests, within 3 points; every request counted on its route and backend.
    let backend = |name: &str| {
        mesh.metric(
            "outbound_http_route_backend_requests_total",
            &["parent_name=\"web\"", "route_name=\"web-paths\"", &format!("backend_name=\"{name}\"")],
        )
    };
    let duration_count =
        || mesh.metric("outbound_http_route_request_duration_seconds_count", &["route_name=\"web-paths\""]);
    let (web_before, canary_before, count_before) = (backend("web"), backend("web-canary"), duration_count());
    let mut answered: HashMap<String, usize> = HashMap::new();
    for reply in mesh.calls(2000, "GET", "/replica") {
        assert_eq!(reply.status, 200, "{reply:?}");
        *answered.entry(reply.body).or_default() += 1;
    }
    let canary = answered.get("canary-0").copied().unwrap_or(0);
    assert_eq!(answered.get("web-0").copied().unwrap_or(0) + canary, 2000, "{answered:?}");
    let share = canary as f64 / 2000.0;
    assert!((0.07..=0.13).contains(&share), "canary share {share} not within 10 ± 3 %: {answered:?}");
    assert_eq!(backend("web") - web_before, (2000 - canary) as f64);
    assert_eq!(backend("web-canary") - canary_before, canary as f64);
    assert_eq!(duration_count() - count_before, 2000.0);

    // A route change reaches the running proxy: `/hello` now goes to `web`.
    mesh.routes(&paths_route("web"));
    eventually("/hello moved to web", Duration::from_secs(30), || {
        mesh.call("GET", "/hello", "").body.contains("web-0")
    });
    assert_eq!(mesh.call("GET", "/replica", "").status, 200, "the other rules stay");
}

#[test]
fn retries_recover_a_flaky_backend_within_the_budget_and_leave_large_bodies_alone() {
    if !require_root("retries_recover_a_flaky_backend_within_the_budget_and_leave_large_bodies_alone") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let mesh = mesh(&net, RETRY_ROUTE);
    let route = ["route_name=\"web-retries\""];
    let retries = || mesh.metric("outbound_http_route_retry_requests_total", &route);
    let overflow = || mesh.metric("outbound_http_route_retry_overflow_total", &route);

    // 30 % of the backend's answers fail; one at a time, each failure's retry succeeds.
    const GETS: usize = 200;
    let retrying_since = Instant::now();
    let ok = (0..GETS).filter(|_| mesh.call("GET", "/flaky", "").status == 200).count();
    assert!(ok * 100 >= GETS * 99, "{ok} of {GETS} succeeded");
    // The backend's own count: which of its answers failed, and so how many retries were sent.
    let (mut hits, mut expected_retries) = (0, 0);
    for _ in 0..GETS {
        if apps::flaky_fails(hits) {
            hits += 1;
            expected_retries += 1;
        }
        hits += 1;
    }
    assert_eq!(retries(), expected_retries as f64);
    assert_eq!(overflow(), 0.0);

    // A POST whose body is over 64 KiB is never held for a retry: its failures reach the client.
    let large = "x".repeat(100 * 1024);
    let failed = (0..20).filter(|_| mesh.call("POST", "/flaky", &large).status == 500).count();
    let expected_failures = (hits..hits + 20).filter(|n| apps::flaky_fails(*n)).count();
    assert_eq!(failed, expected_failures);
    assert_eq!(retries(), expected_retries as f64, "no retry of a large body");

    // A backend failing every request: retries stop at the budget, not one per request. The
    // budget is 20 % of the requests plus 10 per second (a reserve of 10 s worth that refills as
    // retries older than 10 s expire), so what it allows is computed from the time the retried
    // requests took; this bounds a count, it does not time anything.
    // Sent by concurrent callers, so that the requests outpace the 10/s floor even on a slow
    // machine and the 20 % share is what binds.
    const FAILING: usize = 500;
    let before = retries();
    assert!(mesh.calls(FAILING, "GET", "/status/503").iter().all(|r| r.status == 503));
    let spent = retries() - before;
    let allowed = (GETS + FAILING) as f64 * 0.2 + 10.0 * (retrying_since.elapsed().as_secs_f64() + 10.0);
    assert!(spent + expected_retries as f64 <= allowed.ceil(), "{spent} retries for {FAILING} requests, {allowed}");
    assert!(spent < FAILING as f64, "{spent} retries for {FAILING} requests");
    assert_eq!(overflow(), FAILING as f64 - spent, "every request the budget refused is counted");
}

#[test]
fn grpc_routes_send_by_method() {
    if !require_root("grpc_routes_send_by_method") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let mesh = mesh(&net, GRPC_ROUTE);
    let call = |path: &str| grpc_in(&mesh.client.netns.path(), &format!("{WEB_IP}:80"), path).unwrap();
    for (method, replica) in [("Canary", "canary-0"), ("Stable", "web-0"), ("Canary", "canary-0")] {
        let (status, headers, trailers) = call(&format!("/test.Echo/{method}"));
        assert_eq!(status, 200, "{method}: {headers:?}");
        assert_eq!(headers.get("x-replica").map(|v| v.to_str().unwrap()), Some(replica), "{method}: {headers:?}");
        assert_eq!(trailers.get("grpc-status").map(|v| v.to_str().unwrap()), Some("0"), "{method}: {trailers:?}");
    }
    let backend = |name: &str| {
        mesh.metric(
            "outbound_http_route_backend_requests_total",
            &["route_name=\"web-grpc\"", &format!("backend_name=\"{name}\"")],
        )
    };
    assert_eq!((backend("web"), backend("web-canary")), (1.0, 2.0), "{}", mesh.client_proxy.metrics());
}
