//! Ingress mode on a real kernel: Debian's nginx as an ingress controller in a meshed pod of its
//! own (`edge/nginx`, its proxy in ingress mode as `cnimesh.io/inject: ingress` sets it),
//! proxying to the `web` Service by name (the `Host` it sets, or Linkerd's `l5d-dst-override`)
//! while it connects to another Service's ClusterIP or straight to another Service's pod. `web`'s HTTPRoute splits 90/10 between
//! `web` and `web-canary`: the split holds for the ingress's requests, they travel over mTLS,
//! and the targets' Servers, which admit only the ingress's identity, see that identity (a
//! meshed client of another identity is refused). The override header never reaches the app,
//! and a name no Service has keeps the connection's original destination.

use std::collections::HashMap;
use std::net::SocketAddr;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, env_refs};
use cnimesh_e2e::nginx::{Nginx, location};
use cnimesh_e2e::objects::service_yaml;
use cnimesh_e2e::sidecar::{Sidecar, http_in, metric_with};
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const WEB_IP: &str = "10.96.0.60";
const CANARY_IP: &str = "10.96.0.61";
/// Where nginx listens in its pod (loopback: the test calls it from inside the pod).
const NGINX_ADDR: &str = "127.0.0.1:8088";
/// Requests per split measurement.
const N: usize = 400;

/// `web`'s canary split, the Servers of both Services' pods, and their one authorization: the
/// ingress's identity.
const OBJECTS: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web-split, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 80}]
  rules:
  - backendRefs: [{name: web, port: 80, weight: 90}, {name: web-canary, port: 80, weight: 10}]
---
apiVersion: policy.cnimesh.io/v1alpha1
kind: Server
metadata: {name: web-http, namespace: shop}
spec:
  podSelector: {matchExpressions: [{key: app, operator: In, values: [web, web-canary]}]}
  port: http
  proxyProtocol: HTTP/1
---
apiVersion: policy.cnimesh.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: ingress, namespace: shop}
spec:
  identityRefs: [{kind: ServiceAccount, name: nginx, namespace: edge}]
---
apiVersion: policy.cnimesh.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: ingress-to-web, namespace: shop}
spec:
  targetRef: {group: policy.cnimesh.io, kind: Server, name: web-http}
  requiredAuthenticationRefs: [{group: policy.cnimesh.io, kind: MeshTLSAuthentication, name: ingress}]
"#;

/// nginx's locations. Each connects to `web-canary` (so the Service it names, not the address,
/// must decide): its ClusterIP by `Host`, by Linkerd's override (with an unrelated `Host`), and
/// naming no Service at all; and its pod's target port directly, as ingress-nginx does, with the
/// override naming the Service without a port.
fn nginx_server(canary_pod: std::net::Ipv4Addr) -> String {
    let clusterip = format!("{CANARY_IP}:80");
    let pod = format!("{canary_pod}:{}", apps::HTTP_PORT);
    [
        location("host", &clusterip, "Host web.shop.svc.cluster.local"),
        location("override", &clusterip, "l5d-dst-override web.shop.svc.cluster.local:80"),
        location("unknown", &clusterip, "Host shop.example.com"),
        location("pod", &pod, "l5d-dst-override web.shop"),
    ]
    .concat()
}

/// Requests per replica (the body of `/replica`) for `n` GETs of `path` through nginx.
fn replicas(nginx: &Pod<'_>, path: &str, n: usize) -> HashMap<String, usize> {
    let mut answered = HashMap::new();
    for _ in 0..n {
        let (status, body) = http_in(&nginx.netns.path(), NGINX_ADDR, "GET", path, "").unwrap_or_default();
        assert_eq!(status, 200, "{path}: {body}");
        *answered.entry(body).or_default() += 1;
    }
    answered
}

/// The canary's share of `n` requests split 90/10 lies within five standard deviations of 10 %
/// (binomial: for 400 requests, 40 ± 30); a proxy that ignored the name would send all of them
/// to the canary, whose ClusterIP nginx connects to.
fn assert_split(answered: &HashMap<String, usize>, n: usize, case: &str) {
    let canary = answered.get("canary-0").copied().unwrap_or(0);
    let web = answered.get("web-0").copied().unwrap_or(0);
    assert_eq!(web + canary, n, "{case}: {answered:?}");
    let (mean, sd) = (n as f64 * 0.1, (n as f64 * 0.1 * 0.9).sqrt());
    assert!((canary as f64 - mean).abs() <= 5.0 * sd, "{case}: canary {canary} of {n}, expected {mean} ± {}", 5.0 * sd);
}

#[test]
fn an_ingress_controller_in_ingress_mode_gets_the_services_split_over_mtls_under_its_own_identity() {
    if !require_root("an_ingress_controller_in_ingress_mode_gets_the_services_split_over_mtls_under_its_own_identity") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let web = Pod::named(&net, "shop", "web-0").unwrap();
    let canary = Pod::named(&net, "shop", "canary-0").unwrap();
    let nginx = Pod::named(&net, "edge", "nginx").unwrap();
    let intruder = Pod::named(&net, "shop", "intruder").unwrap();
    let services = [
        service_yaml("web", WEB_IP, "web-0", web.ipv4(), "web"),
        service_yaml("web-canary", CANARY_IP, "canary-0", canary.ipv4(), "web"),
    ]
    .join("---\n");
    let objects = [("services.yaml", services.as_str()), ("ingress.yaml", OBJECTS)];
    let control = Control::start_with_objects(&bins.control, &control_pod, &[], &objects).unwrap();

    // The targets: inbound policy from the control plane (their pods are `shop:<pod>`).
    let token = control.token("shop", "web").unwrap();
    let targets: Vec<(Sidecar, Apps)> = [(&web, "web-0"), (&canary, "canary-0")]
        .into_iter()
        .map(|(pod, name)| {
            let mut env = control.proxy_env("shop", "web", &token);
            env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
            env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), format!("shop:{name}")));
            let apps = Apps::start(&pod.netns.path(), pod.ipv4().into(), &pod.name).unwrap();
            (Sidecar::start(&bins.proxy, &pod.netns, &env_refs(&env)).unwrap(), apps)
        })
        .collect();
    // The service range is routed out of the pods, as a node's default route does.
    for pod in [&nginx, &intruder] {
        pod.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
    }
    // The ingress: its proxy in ingress mode, as the injector sets it for `cnimesh.io/inject: ingress`.
    let mut env = control.proxy_env("edge", "nginx", &control.token("edge", "nginx").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    env.push(("CNIMESH_PROXY_MODE".into(), "ingress".into()));
    let ingress_proxy = Sidecar::start(&bins.proxy, &nginx.netns, &env_refs(&env)).unwrap();
    let listen: SocketAddr = NGINX_ADDR.parse().unwrap();
    let _nginx = Nginx::start(&nginx.netns, listen, &nginx_server(canary.ipv4())).unwrap();

    // By Host, then by Linkerd's override: web's split, not the canary nginx connected to.
    assert_split(&replicas(&nginx, "/host/replica", N), N, "by Host");
    assert_split(&replicas(&nginx, "/override/replica", N), N, "by l5d-dst-override");
    assert_split(&replicas(&nginx, "/pod/replica", N), N, "to a pod, by l5d-dst-override without a port");
    // Counted on web's route, its parent the Service the requests named.
    let routed = metric_with(
        &ingress_proxy.metrics(),
        "outbound_http_route_backend_requests_total",
        &["parent_name=\"web\"", "route_name=\"web-split\""],
    );
    assert_eq!(routed, (3 * N) as f64, "{}", ingress_proxy.metrics());

    // A name no Service has: the original destination (the canary's ClusterIP), as without
    // ingress mode.
    let unknown = replicas(&nginx, "/unknown/replica", 20);
    assert_eq!(unknown.get("canary-0"), Some(&20), "{unknown:?}");

    // mTLS end to end: the app behind web's proxy is told the ingress's verified identity, and
    // never sees the override.
    let ingress_id = control.identity("edge", "nginx");
    for _ in 0..20 {
        let (status, headers) = http_in(&nginx.netns.path(), NGINX_ADDR, "GET", "/override/headers", "").unwrap();
        assert_eq!(status, 200, "{headers}");
        assert!(headers.contains(&format!("l5d-client-id: {ingress_id}")), "{headers}");
        assert!(!headers.contains("dst-override"), "the override reached the app: {headers}");
    }

    // web's proxy counted them as mTLS requests of the ingress's identity.
    let web_metrics = targets[0].0.metrics();
    let seen = metric_with(
        &web_metrics,
        "request_total",
        &["direction=\"inbound\"", "tls=\"true\"", &format!("client_id=\"{ingress_id}\"")],
    );
    assert!(seen >= 20.0, "{web_metrics}");

    // The Servers admit only the ingress: another meshed client of web is refused.
    let mut env = control.proxy_env("shop", "intruder", &control.token("shop", "intruder").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    let _intruder_proxy = Sidecar::start(&bins.proxy, &intruder.netns, &env_refs(&env)).unwrap();
    for _ in 0..10 {
        let (status, body) = http_in(&intruder.netns.path(), &format!("{WEB_IP}:80"), "GET", "/replica", "").unwrap();
        assert_eq!(status, 403, "{body}");
    }
}
