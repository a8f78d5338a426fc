//! Failure accrual (circuit breaking) on a real kernel: `cnimesh-control` reads a `web` Service
//! with `balancer.cnimesh.io/failure-accrual: consecutive` (3 failures, penalties of 1–2 s, no
//! jitter) and three meshed replicas from a directory of YAML; a client pod calls the Service's
//! ClusterIP through its proxy, which takes the accrual from OutboundPolicies. A replica that
//! starts answering 500 stops getting traffic after 3 failures (plus single probes), comes back
//! once it heals, and when every replica fails requests are still sent to them (no blackout made
//! by the proxy). The same replicas behind a Service without the annotation keep their share.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cnimesh_e2e::control::{Control, env_refs};
use cnimesh_e2e::sidecar::{Reply, Sidecar, http_reply_in, metric_with};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const WEB_IP: &str = "10.96.0.60";
const PLAIN_IP: &str = "10.96.0.61";
const PORT: u16 = 8080;
const REPLICAS: [&str; 3] = ["web-0", "web-1", "web-2"];
const MAX_FAILURES: usize = 3;
const MIN_PENALTY: Duration = Duration::from_secs(1);
const WEB_AUTHORITY: &str = "authority=\"web.shop.svc.cluster.local:80\"";
const PLAIN_AUTHORITY: &str = "authority=\"plain.shop.svc.cluster.local:80\"";

/// A replica's app: answers its name, with 500 while `failing`, and counts what it answered.
#[derive(Default)]
struct Backend {
    failing: AtomicBool,
    answered: AtomicUsize,
}

/// Serves `backend` on `ip:PORT` inside `netns` for as long as the test runs.
fn serve(netns: &std::path::Path, ip: IpAddr, name: &'static str, backend: Arc<Backend>) {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    cnimesh_e2e::netns::spawn_in(netns, move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, PORT)).await.unwrap();
            ready_tx.send(()).unwrap();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let backend = backend.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |_req: http::Request<hyper::body::Incoming>| {
                        let backend = backend.clone();
                        async move {
                            backend.answered.fetch_add(1, Ordering::SeqCst);
                            let mut response = http::Response::new(Full::new(bytes::Bytes::from(name)));
                            if backend.failing.load(Ordering::SeqCst) {
                                *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                            }
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    })
    .unwrap();
    ready_rx.recv().unwrap();
}

/// `web` (with failure accrual) and `plain` (without), both selecting the three replicas.
fn cluster_yaml(ips: &[std::net::Ipv4Addr]) -> String {
    let accrual = "\n    balancer.cnimesh.io/failure-accrual: consecutive\
                   \n    balancer.cnimesh.io/failure-accrual-consecutive-max-failures: \"3\"\
                   \n    balancer.cnimesh.io/failure-accrual-consecutive-min-penalty: 1s\
                   \n    balancer.cnimesh.io/failure-accrual-consecutive-max-penalty: 2s\
                   \n    balancer.cnimesh.io/failure-accrual-consecutive-jitter-ratio: \"0\"";
    let mut docs = Vec::new();
    for (name, ip, annotations) in [("web", WEB_IP, accrual), ("plain", PLAIN_IP, "{}")] {
        let annotations = if annotations == "{}" { " {}".to_string() } else { annotations.to_string() };
        docs.push(format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: shop\n  annotations:{annotations}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: http, port: 80, targetPort: {PORT}}}]\n  selector: {{app: web}}\n"
        ));
        let endpoints: String = REPLICAS
            .iter()
            .zip(ips)
            .map(|(pod, ip)| {
                format!(
                    "  - addresses: [\"{ip}\"]\n    conditions: {{ready: true}}\n    targetRef: {{kind: Pod, name: {pod}, namespace: shop}}\n"
                )
            })
            .collect();
        docs.push(format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abc\n  namespace: shop\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: http, port: {PORT}, protocol: TCP}}]\nendpoints:\n{endpoints}"
        ));
    }
    for (pod, ip) in REPLICAS.iter().zip(ips) {
        docs.push(format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: shop\n  labels: {{app: web}}\nspec:\n  serviceAccountName: web\n  containers:\n    - name: app\n      image: app\n      ports: [{{name: http, containerPort: {PORT}}}]\n    - name: cnimesh-proxy\n      image: cnimesh/proxy\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"
        ));
    }
    docs.join("---\n")
}

struct Mesh<'n> {
    client: Pod<'n>,
    client_proxy: Sidecar,
    backends: Vec<Arc<Backend>>,
    _replicas: Vec<(Pod<'n>, Sidecar)>,
    _control: Control,
    _control_pod: Pod<'n>,
}

impl Mesh<'_> {
    fn call(&self, service_ip: &str) -> Reply {
        http_reply_in(&self.client.netns.path(), &format!("{service_ip}:80"), "GET", "/", "").unwrap_or_default()
    }

    /// What each replica has answered so far.
    fn answered(&self) -> Vec<usize> {
        self.backends.iter().map(|b| b.answered.load(Ordering::SeqCst)).collect()
    }

    fn fail(&self, replica: usize, failing: bool) {
        self.backends[replica].failing.store(failing, Ordering::SeqCst);
    }

    fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        metric_with(&self.client_proxy.metrics(), name, labels)
    }

    fn state_changes(&self, authority: &str, state: &str) -> f64 {
        let state = format!("state=\"{state}\"");
        self.metric("outbound_http_balancer_endpoint_state_changes_total", &[authority, &state])
    }
}

fn mesh(net: &Network) -> Mesh<'_> {
    let bins = bins!();
    let control_pod = Pod::unmeshed(net, "cnimesh", "control").unwrap();
    let pods: Vec<Pod<'_>> = REPLICAS.iter().map(|name| Pod::named(net, "shop", name).unwrap()).collect();
    let client = Pod::named(net, "shop", "client").unwrap();
    let ips: Vec<_> = pods.iter().map(Pod::ipv4).collect();
    let objects = cluster_yaml(&ips);
    let control =
        Control::start_with_objects(&bins.control, &control_pod, &[], &[("services.yaml", &objects)]).unwrap();
    let web_env = control.proxy_env("shop", "web", &control.token("shop", "web").unwrap());
    let mut backends = Vec::new();
    let replicas = pods
        .into_iter()
        .zip(REPLICAS)
        .map(|(pod, name)| {
            let backend = Arc::new(Backend::default());
            serve(&pod.netns.path(), pod.ipv4().into(), name, backend.clone());
            backends.push(backend);
            let proxy = Sidecar::start(&bins.proxy, &pod.netns, &env_refs(&web_env)).unwrap();
            (pod, proxy)
        })
        .collect();
    client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
    let mut env = control.proxy_env("shop", "client", &control.token("shop", "client").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&env)).unwrap();
    Mesh { client, client_proxy, backends, _replicas: replicas, _control: control, _control_pod: control_pod }
}

fn minus(after: &[usize], before: &[usize]) -> Vec<usize> {
    after.iter().zip(before).map(|(a, b)| a - b).collect()
}

#[test]
fn a_failing_endpoint_is_taken_out_probed_and_put_back_and_all_failing_are_still_tried() {
    if !require_root("a_failing_endpoint_is_taken_out_probed_and_put_back_and_all_failing_are_still_tried") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let mesh = mesh(&net);

    // Healthy: every replica answers, nothing changes state.
    eventually("web answers", Duration::from_secs(30), || mesh.call(WEB_IP).status == 200);
    for _ in 0..30 {
        assert_eq!(mesh.call(WEB_IP).status, 200);
    }
    assert!(mesh.answered().iter().all(|n| *n > 0), "all three take traffic: {:?}", mesh.answered());
    assert_eq!(mesh.state_changes(WEB_AUTHORITY, "unavailable"), 0.0);

    // web-1 fails every request: after 3 failures in a row it gets only single probes, one per
    // penalty (1 s, then 2 s), however many requests go by.
    mesh.fail(1, true);
    let (before, since) = (mesh.answered(), Instant::now());
    const CALLS: usize = 90;
    let failed = (0..CALLS).filter(|_| mesh.call(WEB_IP).status == 500).count();
    let probes_at_most = (since.elapsed().as_secs_f64() / MIN_PENALTY.as_secs_f64()).ceil() as usize + 1;
    let got = minus(&mesh.answered(), &before);
    assert_eq!(failed, got[1], "the client saw web-1's answers, no others failed: {got:?}");
    assert!(got[1] <= MAX_FAILURES + probes_at_most, "web-1 got {} requests after it began to fail: {got:?}", got[1]);
    assert!(got[1] >= MAX_FAILURES, "it was tried until it tripped: {got:?}");
    assert_eq!(got[0] + got[2], CALLS - got[1], "web-0 and web-2 took the rest: {got:?}");
    assert!(mesh.state_changes(WEB_AUTHORITY, "unavailable") >= 1.0);
    assert_eq!(mesh.metric("outbound_http_balancer_endpoints_unavailable", &[WEB_AUTHORITY]), 1.0);
    // The last requests all succeed: the client's success rate is back.
    for _ in 0..10 {
        let reply = mesh.call(WEB_IP);
        assert!(reply.status == 200 || reply.body == "web-1", "only a probe may fail: {reply:?}");
    }

    // Without the annotation (same replicas, `plain`): web-1 stays in rotation however often it
    // fails in a row. Calls go on until the balancer has picked it more than MAX_FAILURES times
    // (each pick is a 500 with its name); with accrual the MAX_FAILURES-th would have taken it
    // out, so its state must still be available and never have changed.
    let before = mesh.answered();
    let mut plain_failed = 0;
    for call in 0.. {
        assert!(
            call < 1000,
            "the balancer never picked web-1 {} times: {:?}",
            MAX_FAILURES + 2,
            minus(&mesh.answered(), &before)
        );
        let reply = mesh.call(PLAIN_IP);
        assert_eq!(reply.status == 500, reply.body == "web-1", "only web-1 fails: {reply:?}");
        plain_failed += usize::from(reply.status == 500);
        if plain_failed > MAX_FAILURES + 1 {
            break;
        }
    }
    assert_eq!(minus(&mesh.answered(), &before)[1], plain_failed);
    assert_eq!(mesh.state_changes(PLAIN_AUTHORITY, "unavailable"), 0.0, "no accrual without the annotation");
    assert_eq!(mesh.metric("outbound_http_balancer_endpoints_unavailable", &[PLAIN_AUTHORITY]), 0.0);

    // It heals: a probe finds it answering and it is back in rotation.
    mesh.fail(1, false);
    eventually("web-1 back in rotation", Duration::from_secs(30), || {
        let reply = mesh.call(WEB_IP);
        reply.status == 200 && reply.body == "web-1"
    });
    assert!(mesh.state_changes(WEB_AUTHORITY, "probation") >= 1.0);
    assert!(mesh.state_changes(WEB_AUTHORITY, "available") >= 1.0);
    assert_eq!(mesh.metric("outbound_http_balancer_endpoints_unavailable", &[WEB_AUTHORITY]), 0.0);
    let before = mesh.answered();
    for _ in 0..30 {
        assert_eq!(mesh.call(WEB_IP).status, 200);
    }
    assert!(minus(&mesh.answered(), &before)[1] > 0, "web-1 takes traffic again");

    // All fail: each request still reaches a replica (their 500s, not a 503 of the proxy's).
    for i in 0..REPLICAS.len() {
        mesh.fail(i, true);
    }
    let before = mesh.answered();
    for _ in 0..40 {
        let reply = mesh.call(WEB_IP);
        assert_eq!(reply.status, 500, "{reply:?}");
        assert!(reply.header("cnimesh-proxy-error").is_none(), "the app's answer, not the proxy's: {reply:?}");
    }
    assert_eq!(minus(&mesh.answered(), &before).iter().sum::<usize>(), 40, "every request was tried");
    assert_eq!(mesh.metric("outbound_http_balancer_endpoints_unavailable", &[WEB_AUTHORITY]), 3.0);
}
