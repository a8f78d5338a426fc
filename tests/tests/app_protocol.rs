//! Declared protocols on a real kernel: Service ports whose `appProtocol` declares their protocol
//! (`http`, `cnimesh.io/opaque`, `linkerd.io/opaque`) are served without detection, by the
//! client's proxy (learnt from OutboundPolicies) and by the server's inbound proxy (learnt from
//! InboundServerPolicies, for the pod ports the Service targets). The proxies run with a short
//! detection timeout and the clients here are slower than it: an HTTP client that writes its
//! request late on a declared port is still served as HTTP (counted as HTTP requests), a silent
//! client of a declared-opaque port gets its server's greeting, while the same late client on an
//! undeclared port is cut off by detection as before. Declaring HTTP opens nothing: a client no
//! policy admits is still denied.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::Path;
use std::time::Duration;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, env_refs, identity};
use cnimesh_e2e::sidecar::{Sidecar, http_in, metric_with};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const DECLARED_IP: &str = "10.96.0.70";
const UNDECLARED_IP: &str = "10.96.0.71";
/// The client proxy's detection timeout, and how long the late client waits before it writes.
const DETECT_TIMEOUT_MS: u64 = 200;
const LATE: Duration = Duration::from_millis(1000);
/// Only guards against a hung step; nothing here measures time.
const PATIENCE: Duration = Duration::from_secs(30);

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
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let web = Pod::named(&net, "shop", "web-0").unwrap();
    let client = Pod::named(&net, "shop", "client").unwrap();
    let control = Control::start_with_objects(
        &bins.control,
        &control_pod,
        &[],
        &[("web.yaml", cluster_yaml(web.ipv4()).as_str())],
    )
    .unwrap();
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

/// The server side's cast: `api-0` (its HTTP port named `http`, so the Service targets it by
/// name, and its banner port) behind the Service `api`, whose ports declare `http` and
/// `cnimesh.io/opaque` when `declared`; with `server`, a Server on the HTTP port without a
/// `proxyProtocol` (the declaration decides) admitting only ServiceAccount `web`.
fn server_side_yaml(ip: Ipv4Addr, declared: bool, server: bool) -> String {
    let (http, banner) = (apps::HTTP_PORT, apps::BANNER_PORT);
    let app = |value: &str| if declared { format!(", appProtocol: {value}") } else { String::new() };
    let mut docs = vec![
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: api-0, namespace: shop, labels: {{app: api}}}}\nspec:\n  serviceAccountName: api\n  containers:\n    - name: app\n      image: api\n      ports: [{{name: http, containerPort: {http}}}, {{name: db, containerPort: {banner}}}]\n    - name: cnimesh-proxy\n      image: cnimesh/proxy\nstatus: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}]}}\n"
        ),
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: api, namespace: shop}}\nspec:\n  selector: {{app: api}}\n  ports:\n  - {{name: http, port: 80, targetPort: http{}}}\n  - {{name: db, port: {banner}, targetPort: {banner}{}}}\n",
            app("http"),
            app("cnimesh.io/opaque"),
        ),
    ];
    if server {
        docs.push(
            "apiVersion: policy.cnimesh.io/v1alpha1\nkind: Server\nmetadata: {name: api-http, namespace: shop}\nspec: {podSelector: {matchLabels: {app: api}}, port: http}\n---\napiVersion: policy.cnimesh.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {name: web-to-api, namespace: shop}\nspec:\n  targetRef: {group: policy.cnimesh.io, kind: Server, name: api-http}\n  requiredAuthenticationRefs: [{kind: ServiceAccount, name: web}]\n".to_string(),
        );
    }
    docs.join("---\n")
}

/// api's proxy, taking its inbound policy from `control`, with the short detection timeout (and
/// as short a wait for a ClientHello, so a late client of a declared port passes both).
fn api_proxy(bins: &cnimesh_e2e::cni::Bins, control: &Control, api: &Pod<'_>) -> Sidecar {
    let mut env = control.proxy_env("shop", "api", &control.token("shop", "api").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    env.push(("CNIMESH_PROXY_POLICY_WORKLOAD".into(), "shop:api-0".into()));
    env.push(("CNIMESH_PROXY_DETECT_TIMEOUT_MS".into(), DETECT_TIMEOUT_MS.to_string()));
    env.push(("CNIMESH_PROXY_OPAQUE_TLS_WAIT_MS".into(), DETECT_TIMEOUT_MS.to_string()));
    // The proxy's own default opaque ports include the banner port; only the Service declares it.
    env.push(("CNIMESH_PROXY_OPAQUE_PORTS".into(), "25".into()));
    Sidecar::start(&bins.proxy, &api.netns, &env_refs(&env)).unwrap()
}

#[test]
fn a_server_behind_a_declared_service_port_serves_a_late_client_as_http_and_greets_a_silent_one() {
    if !require_root("a_server_behind_a_declared_service_port_serves_a_late_client_as_http_and_greets_a_silent_one") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let api = Pod::named(&net, "shop", "api-0").unwrap();
    // Not meshed: its bytes reach api's inbound proxy exactly as it writes them, late.
    let client = Pod::unmeshed(&net, "shop", "client").unwrap();
    let file = "cluster.yaml";
    let control = Control::start_with_objects(
        &bins.control,
        &control_pod,
        &[],
        &[(file, server_side_yaml(api.ipv4(), false, false).as_str())],
    )
    .unwrap();
    let _apps = Apps::start(&api.netns.path(), api.ipv4().into(), "api-0").unwrap();
    let proxy = api_proxy(&bins, &control, &api);
    let netns = client.netns.path();
    let (http, banner) =
        (format!("{}:{}", api.ipv4(), apps::HTTP_PORT), format!("{}:{}", api.ipv4(), apps::BANNER_PORT));
    let metric = |name: &str, labels: &[&str]| metric_with(&proxy.metrics(), name, labels);
    let inbound_by = |protocol: &str, by: &str| {
        let (protocol, by) = (format!("protocol=\"{protocol}\""), format!("decided_by=\"{by}\""));
        metric("connection_protocol_total", &["direction=\"inbound\"", &protocol, &by])
    };
    let cut_off = || {
        metric("inbound_tcp_accept_errors_total", &["error=\"tls_detect_timeout\""])
            + metric("inbound_tcp_accept_errors_total", &["error=\"detect_timeout\""])
    };
    let responses = || metric("response_total", &["direction=\"inbound\""]);

    // Undeclared (today's behaviour): the late client and the silent one are cut off by the
    // inbound detection, never served.
    assert_eq!(http_in(&netns, &http, "GET", "/hello", "").map(|r| r.0).ok(), Some(200), "the port works");
    let before = cut_off();
    let answer = late_get(&netns, http.clone());
    assert!(!answer.contains("hello from api-0"), "{answer}");
    assert_eq!(greeting(&netns, banner.clone()), "", "a silent client is cut off by detection");
    assert_eq!(cut_off(), before + 2.0, "{}", proxy.metrics());
    assert_eq!(inbound_by("http1", "policy") + inbound_by("opaque", "policy"), 0.0);

    // Declared on the Service (targetPort by name for http): the inbound policy is pushed and
    // the same late client is HTTP, counted as an inbound request and authorized as one.
    control.cluster.apply_yaml(file, &server_side_yaml(api.ipv4(), true, false)).unwrap();
    eventually("the declaration served to api's proxy", PATIENCE, || {
        late_get(&netns, http.clone()).contains("hello from api-0")
    });
    let authorized = || metric("inbound_http_authz_allow_total", &["srv_kind=\"default\"", "tls=\"false\""]);
    let before = (responses(), authorized(), inbound_by("http1", "policy"), cut_off());
    let answer = late_get(&netns, http.clone());
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(responses(), before.0 + 1.0, "{}", proxy.metrics());
    assert_eq!(authorized(), before.1 + 1.0, "authorized as an HTTP request: {}", proxy.metrics());
    assert_eq!(inbound_by("http1", "policy"), before.2 + 1.0, "{}", proxy.metrics());

    // Declared opaque: the silent client gets its greeting, decided by policy, not detection.
    assert_eq!(greeting(&netns, banner.clone()), apps::BANNER);
    assert_eq!(inbound_by("opaque", "policy"), 1.0, "{}", proxy.metrics());
    assert_eq!(cut_off(), before.3, "nothing cut off on declared ports");

    // The Service's declaration removed: detection again, pushed live.
    control.cluster.apply_yaml(file, &server_side_yaml(api.ipv4(), false, false)).unwrap();
    eventually("detection restored", PATIENCE, || greeting(&netns, banner.clone()).is_empty());
    assert!(!late_get(&netns, http.clone()).contains("hello from api-0"));
}

#[test]
fn declaring_http_on_a_port_does_not_bypass_its_authorization() {
    if !require_root("declaring_http_on_a_port_does_not_bypass_its_authorization") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let api = Pod::named(&net, "shop", "api-0").unwrap();
    let web = Pod::named(&net, "shop", "web").unwrap();
    let intruder = Pod::unmeshed(&net, "shop", "intruder").unwrap();
    let control = Control::start_with_objects(
        &bins.control,
        &control_pod,
        &[],
        &[("cluster.yaml", server_side_yaml(api.ipv4(), true, true).as_str())],
    )
    .unwrap();
    let _apps = Apps::start(&api.netns.path(), api.ipv4().into(), "api-0").unwrap();
    let proxy = api_proxy(&bins, &control, &api);
    let mut web_env = control.proxy_env("shop", "web", &control.token("shop", "web").unwrap());
    web_env.push(("CNIMESH_PROXY_OUTBOUND_IDENTITIES".into(), format!("{}={}", api.ipv4(), identity("shop", "api"))));
    let _web_proxy = Sidecar::start(&bins.proxy, &web.netns, &env_refs(&web_env)).unwrap();
    let http = format!("{}:{}", api.ipv4(), apps::HTTP_PORT);
    let get = |pod: &Pod<'_>| http_in(&pod.netns.path(), &http, "GET", "/hello", "").map_or(0, |r| r.0);
    let metric = |name: &str, labels: &[&str]| metric_with(&proxy.metrics(), name, labels);

    // The Server names no proxyProtocol: the Service's `http` decides it, and its policy holds.
    eventually("web admitted", PATIENCE, || get(&web) == 200);
    assert_eq!(get(&intruder), 403, "declared HTTP, still denied");
    // Late, through the declared path that skips detection: denied all the same.
    let answer = late_get(&intruder.netns.path(), http.clone());
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let denied = metric("inbound_http_authz_deny_total", &["srv_name=\"api-http\"", "tls=\"false\""]);
    assert_eq!(denied, 2.0, "{}", proxy.metrics());
    let web_id = format!("client_id=\"{}\"", identity("shop", "web"));
    assert!(metric("inbound_http_authz_allow_total", &["authz_name=\"web-to-api\"", &web_id]) >= 1.0);
    let by_policy = ["direction=\"inbound\"", "protocol=\"http1\"", "decided_by=\"policy\""];
    assert!(metric("connection_protocol_total", &by_policy) >= 2.0, "{}", proxy.metrics());
}
