//! Destination at scale: 1,000 services with 10 endpoints each (10,000 meshed pods) listed from
//! the in-process API server, 1,000 `Get` streams over real gRPC on localhost, and the time an
//! EndpointSlice change takes to reach the client, (a) applied to the index directly and (b)
//! written to the API server (watch event → read → index → stream). Each is measured first with one open stream (the
//! baseline) and then with all 1,000 open, in the same run. Then 1,000 streams on one service and
//! the time until a change has reached all of them. Also the process RSS.
//!
//! Run: `cargo bench -p cnimesh-control --bench destination`.

use std::time::{Duration, Instant};

use cnimesh_apiserver::ClusterApi;
use cnimesh_control::grpc::destination::DestinationService;
use cnimesh_control::sources::{KubeSource, Source};
use cnimesh_model::destination::{Change, Config, Index, Object};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use linkerd2_proxy_api::destination::destination_client::DestinationClient;
use linkerd2_proxy_api::destination::{GetDestination, Update};
use tonic::Streaming;
use tonic::transport::Channel;

mod common;
use common::rss_mib;

const SERVICES: usize = 1_000;
const ENDPOINTS_PER_SERVICE: usize = 10;
const CHANGES: usize = 200;
const FAN_OUT_CHANGES: usize = 50;
/// Streams share connections as proxies on one node would not; 20 streams per connection keeps
/// the file-descriptor count modest while still exercising many HTTP/2 connections.
const CONNECTIONS: usize = 50;

fn endpoint_ip(service: usize, endpoint: usize) -> String {
    let k = service * ENDPOINTS_PER_SERVICE + endpoint;
    format!("10.1.{}.{}", k / 256, k % 256)
}

/// The slice of `service`; `generation` toggles whether its last endpoint is listed, so that every
/// change yields exactly one message (a remove, then an add).
fn slice_yaml(service: usize, generation: usize) -> String {
    let count = if generation % 2 == 1 { ENDPOINTS_PER_SERVICE - 1 } else { ENDPOINTS_PER_SERVICE };
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{service}-a\n  namespace: bench\n  labels: {{kubernetes.io/service-name: svc-{service}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n"
    );
    for e in 0..count {
        s += &format!(
            "- addresses: ['{}']\n  conditions: {{ready: true}}\n  targetRef: {{kind: Pod, name: pod-{service}-{e}, namespace: bench}}\n",
            endpoint_ip(service, e)
        );
    }
    s
}

/// The Service, its slice and its pods.
fn objects_yaml(service: usize, generation: usize) -> String {
    let mut docs = vec![
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{service}, namespace: bench}}\nspec:\n  clusterIP: 10.96.{}.{}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n",
            service / 256,
            service % 256
        ),
        slice_yaml(service, generation),
    ];
    for e in 0..ENDPOINTS_PER_SERVICE {
        docs.push(format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: pod-{service}-{e}, namespace: bench}}\nspec:\n  serviceAccountName: sa-{service}\n  containers: [{{name: app}}, {{name: cnimesh-proxy}}]\nstatus: {{podIP: '{ip}', podIPs: [{{ip: '{ip}'}}]}}\n",
            ip = endpoint_ip(service, e)
        ));
    }
    docs.join("---\n")
}

fn apply(api: &ClusterApi, service: usize, generation: usize) {
    api.apply_yaml(&format!("svc-{service}.yaml"), &objects_yaml(service, generation)).expect("apply");
}

struct Stats {
    p50: Duration,
    p99: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    Stats { p50: samples[samples.len() / 2], p99: samples[samples.len() * 99 / 100] }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The per-service generation, so each change flips the current state of its service.
struct Bench {
    api: std::sync::Arc<ClusterApi>,
    index: Index,
    generation: Vec<usize>,
}

#[derive(Clone, Copy)]
enum Via {
    Index,
    Api,
}

impl Bench {
    /// Applies one change to `service` and waits for its stream to see it.
    async fn change(&mut self, service: usize, stream: &mut Streaming<Update>, via: Via) -> Duration {
        self.generation[service] += 1;
        let generation = self.generation[service];
        let start = Instant::now();
        match via {
            Via::Index => {
                let slice: EndpointSlice = serde_saphyr::from_str(&slice_yaml(service, generation)).expect("slice");
                self.index.apply([Change::Upsert(Object::from(slice))]);
            }
            Via::Api => {
                let slice: serde_json::Value = serde_saphyr::from_str(&slice_yaml(service, generation)).expect("slice");
                self.api.put(slice);
            }
        }
        stream.message().await.expect("stream ok").expect("stream open");
        start.elapsed()
    }

    /// `CHANGES` changes spread over the services whose streams are open.
    async fn measure(&mut self, streams: &mut [Streaming<Update>], via: Via) -> Stats {
        let mut samples = Vec::with_capacity(CHANGES);
        for i in 0..CHANGES + 10 {
            let service = (i * 7) % streams.len();
            let took = self.change(service, &mut streams[service], via).await;
            if i >= 10 {
                samples.push(took); // The first ten warm caches and connections.
            }
        }
        stats(samples)
    }
}

async fn open(client: &mut DestinationClient<Channel>, service: usize) -> Streaming<Update> {
    let path = format!("svc-{service}.bench.svc.cluster.local:80");
    let mut stream = client.get(GetDestination { path, ..Default::default() }).await.expect("get").into_inner();
    stream.message().await.expect("first").expect("open"); // The initial add.
    stream
}

#[tokio::main]
async fn main() {
    // `RUST_LOG=cnimesh_control=debug` shows what the Kubernetes source does with each event.
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let api = ClusterApi::new();
    for service in 0..SERVICES {
        apply(&api, service, 0);
    }
    let rss_start = rss_mib(std::process::id());
    let index = Index::new();
    let loading = Instant::now();
    let source = KubeSource::new(api.client()).run(index.clone());
    tokio::spawn(async move { source.await.expect("kube source") });
    while index.stats().pods < SERVICES * ENDPOINTS_PER_SERVICE {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let load_time = loading.elapsed();
    let rss_loaded = rss_mib(std::process::id());

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    DestinationService::new(index.clone(), Config::default()).spawn_plaintext(listener);
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(DestinationClient::connect(format!("http://{addr}")).await.expect("connect"));
    }

    let mut bench = Bench { api: api.clone(), index: index.clone(), generation: vec![0; SERVICES] };
    let mut streams = vec![open(&mut clients[0], 0).await];
    let index_one = bench.measure(&mut streams, Via::Index).await;
    let api_one = bench.measure(&mut streams, Via::Api).await;

    let opening = Instant::now();
    for service in 1..SERVICES {
        streams.push(open(&mut clients[service % CONNECTIONS], service).await);
    }
    let open_time = opening.elapsed();
    let rss_streams = rss_mib(std::process::id());
    let index_all = bench.measure(&mut streams, Via::Index).await;
    let api_all = bench.measure(&mut streams, Via::Api).await;
    let rss_end = rss_mib(std::process::id());

    // Fan-out: the same number of streams all on one service; one change must reach every one.
    let mut same = Vec::with_capacity(SERVICES);
    for i in 0..SERVICES {
        same.push(open(&mut clients[i % CONNECTIONS], 0).await);
    }
    let mut fan_out = Vec::new();
    for i in 0..FAN_OUT_CHANGES + 5 {
        bench.generation[0] += 1;
        let slice: EndpointSlice = serde_saphyr::from_str(&slice_yaml(0, bench.generation[0])).expect("slice");
        let start = Instant::now();
        index.apply([Change::Upsert(Object::from(slice))]);
        futures::future::join_all(same.iter_mut().map(|s| s.message())).await;
        streams[0].message().await.expect("stream ok"); // Keep the first phase's stream drained.
        if i >= 5 {
            fan_out.push(start.elapsed());
        }
    }
    let fan_out = stats(fan_out);
    let rss_fan_out = rss_mib(std::process::id());

    println!(
        "destination bench: {SERVICES} services x {ENDPOINTS_PER_SERVICE} endpoints (meshed pods), Kubernetes source on the in-process API server"
    );
    println!(
        "  list {} services' objects: {:.0} ms; opening {} more Get streams: {:.0} ms",
        SERVICES,
        ms(load_time),
        SERVICES - 1,
        ms(open_time)
    );
    println!("  propagation over {CHANGES} changes            p50 ms    p99 ms");
    let row = |name: &str, s: &Stats| println!("  {name:<40} {:>7.2}   {:>7.2}", ms(s.p50), ms(s.p99));
    row("index -> stream, 1 stream open", &index_one);
    row(&format!("index -> stream, {SERVICES} streams open"), &index_all);
    row("API write -> stream, 1 stream open", &api_one);
    row(&format!("API write -> stream, {SERVICES} streams open"), &api_all);
    row(&format!("index -> all {SERVICES} streams of one service"), &fan_out);
    println!(
        "  ratio {SERVICES} streams / 1 stream (p50): index {:.2}x, API {:.2}x",
        ms(index_all.p50) / ms(index_one.p50),
        ms(api_all.p50) / ms(api_one.p50),
    );
    println!(
        "  VmRSS (whole process: index, server, {CONNECTIONS} client connections and {SERVICES} client streams, runtime): start {rss_start:.1} MiB, loaded {rss_loaded:.1} MiB, {SERVICES} streams {rss_streams:.1} MiB, after the changes {rss_end:.1} MiB, with {SERVICES} more on one service {rss_fan_out:.1} MiB"
    );
    println!("  index: {:?}", index.stats());
}
