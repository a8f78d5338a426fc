//! Distributed tracing on a real kernel: meshed pods' proxies export their spans over
//! OTLP/gRPC to a real receiver (cnimesh-trace's, served by this test process on a socket inside
//! a `collector` pod), and the test apps report the trace headers they were handed. Checked: the
//! app's parent → client proxy's CLIENT span → server proxy's SERVER span → the server app, over
//! HTTP/1 upgraded between the proxies (`l5d-orig-proto`) and over gRPC; B3 in gives B3 and W3C
//! out with the same ids; untraced, unsampled and malformed requests make no spans and their
//! headers arrive as sent; a route's split and retries (each try a child span); a collector
//! that is down costs dropped spans, counted, never a failed request; and a request that crosses
//! clusters through a multicluster gateway is one trace, the gateway's span between the caller's
//! and the target's.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::control::{Control, env_refs, identity};
use cnimesh_e2e::mesh::proxies_with;
use cnimesh_e2e::multicluster::{MIRROR_IP, Meshed};
use cnimesh_e2e::objects::service_yaml;
use cnimesh_e2e::sidecar::{self, Reply, Sidecar};
use cnimesh_e2e::wait::eventually;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use cnimesh_trace::{ReceivedSpan, Receiver};
use serde_json::json;

/// The OTLP/gRPC port.
const OTLP_PORT: u16 = 4317;
/// Bounded waits for spans: the exporter sends a batch within 1 s of its first span.
const SPAN_WAIT: Duration = Duration::from_secs(30);
/// The app's own span, the parent of everything the proxies record.
const APP_SPAN: &str = "00f067aa0ba902b7";

/// A trace id of the test's own, distinct per `n`.
fn trace_id(n: u32) -> String {
    format!("4bf92f3577b34da6a3ce929d{n:08x}")
}

fn traceparent(trace: &str, span: &str, sampled: bool) -> String {
    format!("00-{trace}-{span}-{}", if sampled { "01" } else { "00" })
}

/// The receiver, on a socket made inside an unmeshed `collector` pod (a socket stays in the
/// namespace it was made in), served by a runtime of this test process.
struct Collector<'n> {
    receiver: Option<Receiver>,
    runtime: tokio::runtime::Runtime,
    /// `http://ip:4317`, for `CNIMESH_PROXY_TRACE_COLLECTOR`.
    endpoint: String,
    _pod: Pod<'n>,
}

impl<'n> Collector<'n> {
    /// A collector pod; with `serving` false nothing listens there (a collector that is down).
    fn start(net: &'n Network, serving: bool) -> Self {
        let pod = Pod::unmeshed(net, "tracing", "collector").unwrap();
        let ip = pod.ipv4();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let receiver = serving.then(|| {
            let listener =
                cnimesh_cni::netns::run_in(&pod.netns.path(), move || std::net::TcpListener::bind((ip, OTLP_PORT)))
                    .unwrap()
                    .unwrap();
            let _entered = runtime.enter();
            Receiver::from_listener(listener, None).unwrap()
        });
        Self { receiver, runtime, endpoint: format!("http://{ip}:{OTLP_PORT}"), _pod: pod }
    }

    fn receiver(&self) -> &Receiver {
        self.receiver.as_ref().expect("a serving collector")
    }

    /// Waits (bounded) until trace `trace` has at least `n` spans; returns them.
    fn trace(&self, trace: &str, n: usize) -> Vec<ReceivedSpan> {
        let spans = || self.receiver().spans().into_iter().filter(|s| s.trace_id == trace).collect::<Vec<_>>();
        eventually(&format!("{n} spans of trace {trace}: {:#?}", spans()), SPAN_WAIT, || spans().len() >= n);
        spans()
    }

    /// The trace ids of every span received so far.
    fn trace_ids(&self) -> std::collections::BTreeSet<String> {
        self.receiver().spans().into_iter().map(|s| s.trace_id).collect()
    }
}

impl Drop for Collector<'_> {
    fn drop(&mut self) {
        // The server stops inside the runtime that serves it.
        let _entered = self.runtime.enter();
        self.receiver.take();
    }
}

/// The proxy settings of a traced pod.
fn trace_env<'a>(collector: &'a str, pod: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![("CNIMESH_PROXY_TRACE_COLLECTOR", collector), ("CNIMESH_POD_NAME", pod), ("CNIMESH_POD_NAMESPACE", "shop")]
}

/// A meshed client and server, both proxies tracing to `collector`.
struct Pair<'n> {
    client: Pod<'n>,
    server: Pod<'n>,
    client_proxy: Sidecar,
    server_proxy: Sidecar,
    _apps: Apps,
    _control: Control,
    _control_pod: Pod<'n>,
}

fn pair<'n>(net: &'n Network, collector: &str) -> Pair<'n> {
    pair_with(net, collector, &[])
}

/// [`pair`] with more settings for the server's proxy.
fn pair_with<'n>(net: &'n Network, collector: &str, server_settings: &[(&str, &str)]) -> Pair<'n> {
    let bins = bins!();
    let control_pod = Pod::unmeshed(net, "cnimesh", "control").unwrap();
    let control = Control::start(&bins.control, &control_pod, &[]).unwrap();
    let client = Pod::named(net, "shop", "client").unwrap();
    let server = Pod::named(net, "shop", "server").unwrap();
    let apps = Apps::start(&server.netns.path(), server.ipv4().into(), "server").unwrap();
    let (client_proxy, server_proxy) = proxies_with(
        &control,
        &bins.proxy,
        &client,
        &server,
        &trace_env(collector, "client"),
        &[&trace_env(collector, "server")[..], server_settings].concat(),
        &Sidecar::start,
    );
    Pair { client, server, client_proxy, server_proxy, _apps: apps, _control: control, _control_pod: control_pod }
}

/// Waits until `proxy`'s span budget has refilled (`trace_span_budget_full` is 1), so the next
/// sampled request is recorded whatever came before it.
fn wait_budget_full(proxy: &Sidecar) {
    eventually("the span budget refilled", SPAN_WAIT, || proxy.metric("trace_span_budget_full") == 1.0);
}

/// One HTTP/1.1 request with extra `headers` over a fresh connection inside `netns`.
fn get(netns: &Path, addr: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    sidecar::raw_reply_in(netns, addr, request).unwrap()
}

/// One gRPC call with extra `headers`; returns the HTTP status and the trailers' `grpc-status`.
fn grpc(netns: &Path, addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let (status, _, trailers) = sidecar::grpc_with_headers_in(netns, addr, path, headers).unwrap();
    let grpc = trailers.get("grpc-status").map(|v| v.to_str().unwrap_or_default().to_string()).unwrap_or_default();
    (status, grpc)
}

/// The headers the app's `/headers` reported (names lowercase, as HTTP/2 and hyper give them).
fn seen(reply: &Reply) -> BTreeMap<String, String> {
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.body.lines().filter_map(|l| l.split_once(": ")).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn one<'a>(spans: &'a [ReceivedSpan], kind: &str) -> &'a ReceivedSpan {
    let of_kind: Vec<_> = spans.iter().filter(|s| s.kind == kind).collect();
    assert_eq!(of_kind.len(), 1, "one {kind} span: {spans:#?}");
    of_kind[0]
}

#[test]
fn a_traced_request_gets_a_client_and_a_server_span_under_the_apps_parent_over_upgraded_http1_and_grpc() {
    if !require_root(
        "a_traced_request_gets_a_client_and_a_server_span_under_the_apps_parent_over_upgraded_http1_and_grpc",
    ) {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let collector = Collector::start(&net, true);
    let p = pair(&net, &collector.endpoint);
    let server_addr = format!("{}:{}", p.server.ipv4(), apps::HTTP_PORT);

    // HTTP/1 from the app; the client's proxy carries it to the server's over HTTP/2 marked
    // `l5d-orig-proto` (on by default between meshed proxies), which downgrades it for the app.
    let trace = trace_id(1);
    let sent = traceparent(&trace, APP_SPAN, true);
    let reply =
        get(&p.client.netns.path(), &server_addr, "/headers", &[("traceparent", &sent), ("tracestate", "app=1")]);
    let app = seen(&reply);
    assert_eq!(app["version"], "HTTP/1.1", "the app got HTTP/1.1 back from the upgrade: {app:?}");
    let spans = collector.trace(&trace, 2);
    let (client, server) = (one(&spans, "client"), one(&spans, "server"));
    assert_eq!(spans.len(), 2, "{spans:#?}");
    assert_eq!(client.parent_span_id.as_deref(), Some(APP_SPAN), "the app's span is the client span's parent");
    assert_eq!(server.parent_span_id.as_deref(), Some(client.span_id.as_str()), "client span → server span");
    assert_eq!(app["traceparent"], traceparent(&trace, &server.span_id, true), "the app's parent is the server span");
    assert_eq!(app["tracestate"], "app=1", "tracestate forwarded as received");
    assert_eq!((client.trace_state.as_str(), server.trace_state.as_str()), ("app=1", "app=1"));
    assert_eq!(server.attr("network.protocol.version"), Some("2"), "the hop between the proxies was HTTP/2");
    assert_eq!(client.attr("network.protocol.version"), Some("1.1"));

    // What the spans say.
    let client_id = identity("shop", "client");
    let server_id = identity("shop", "server");
    for (span, pod) in [(client, "client"), (server, "server")] {
        assert_eq!(span.name, "GET", "{span:#?}");
        assert_eq!(span.attr("http.request.method"), Some("GET"));
        assert_eq!(span.attr("url.path"), Some("/headers"));
        assert_eq!(span.attr("http.response.status_code"), Some("200"));
        assert_eq!(span.attr("server.address"), Some(p.server.ipv4().to_string().as_str()));
        assert_eq!(span.attr("server.port"), Some(apps::HTTP_PORT.to_string().as_str()));
        assert_eq!(span.attr("cnimesh.tls"), Some("true"));
        assert_eq!(span.attr("cnimesh.client.identity"), Some(client_id.as_str()));
        assert_eq!(span.attr("cnimesh.server.identity"), Some(server_id.as_str()));
        assert_eq!(span.attr("k8s.pod.name"), Some(pod));
        assert_eq!(span.attr("k8s.namespace.name"), Some("shop"));
        assert_eq!(span.resource.get("service.name").map(String::as_str), Some("cnimesh-proxy"));
        assert_eq!(span.resource.get("k8s.pod.name").map(String::as_str), Some(pod));
        assert_eq!(span.status, "unset");
        assert!(span.end_unix_nano >= span.start_unix_nano && span.start_unix_nano > 0);
    }
    assert_eq!(client.attr("cnimesh.direction"), Some("outbound"));
    assert_eq!(client.attr("network.peer.address"), Some(p.server.ipv4().to_string().as_str()));
    assert_eq!(server.attr("cnimesh.direction"), Some("inbound"));
    assert_eq!(server.attr("network.peer.address"), Some(p.client.ipv4().to_string().as_str()));

    // gRPC: the same links over HTTP/2 end to end; a failing gRPC status (in the trailers) marks
    // both spans failed.
    for (n, path, expected, status) in [(2, "/grpc", "0", "unset"), (3, "/grpc-fail", "13", "error")] {
        let trace = trace_id(n);
        let (http, grpc_status) =
            grpc(&p.client.netns.path(), &server_addr, path, &[("traceparent", &traceparent(&trace, APP_SPAN, true))]);
        assert_eq!((http, grpc_status.as_str()), (200, expected));
        let spans = collector.trace(&trace, 2);
        let (client, server) = (one(&spans, "client"), one(&spans, "server"));
        assert_eq!(client.parent_span_id.as_deref(), Some(APP_SPAN));
        assert_eq!(server.parent_span_id.as_deref(), Some(client.span_id.as_str()));
        for span in [client, server] {
            assert_eq!(span.name, "POST");
            assert_eq!(span.attr("network.protocol.version"), Some("2"));
            assert!(span.status.starts_with(status), "{path}: {span:#?}");
        }
    }

    // The proxies count what they exported.
    for proxy in [&p.client_proxy, &p.server_proxy] {
        eventually("trace_spans_exported_total counts the spans", SPAN_WAIT, || {
            proxy.metric("trace_spans_exported_total") >= 3.0
        });
        assert_eq!(proxy.metric("trace_spans_dropped_total"), 0.0);
    }
}

#[test]
fn b3_in_gives_consistent_w3c_and_b3_out_and_untraced_unsampled_or_malformed_requests_make_no_spans() {
    if !require_root("b3_in_gives_consistent_w3c_and_b3_out_and_untraced_unsampled_or_malformed_requests_make_no_spans")
    {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let collector = Collector::start(&net, true);
    let p = pair(&net, &collector.endpoint);
    let server_addr = format!("{}:{}", p.server.ipv4(), apps::HTTP_PORT);
    let call = |headers: &[(&str, &str)]| seen(&get(&p.client.netns.path(), &server_addr, "/headers", headers));

    // B3 single: continued, and the app gets B3 single and W3C naming the same span.
    let b3_trace = trace_id(10);
    let app = call(&[("b3", &format!("{b3_trace}-{APP_SPAN}-1"))]);
    let spans = collector.trace(&b3_trace, 2);
    let server = one(&spans, "server");
    assert_eq!(one(&spans, "client").parent_span_id.as_deref(), Some(APP_SPAN));
    assert_eq!(app["traceparent"], traceparent(&b3_trace, &server.span_id, true), "{app:?}");
    assert_eq!(app["b3"], format!("{b3_trace}-{}-1", server.span_id), "{app:?}");

    // B3 multi with a 64-bit trace id: forwarded in B3 as the 16 digits it came as (as Zipkin's
    // libraries do), widened to 128 bits only in `traceparent` and the spans, which need 32.
    let short = "a3ce929d0e0e4736";
    let app = call(&[("X-B3-TraceId", short), ("X-B3-SpanId", APP_SPAN), ("X-B3-Sampled", "1")]);
    let widened = format!("0000000000000000{short}");
    let spans = collector.trace(&widened, 2);
    let server = one(&spans, "server");
    assert_eq!(app["x-b3-traceid"], short, "{app:?}");
    assert_eq!(app["x-b3-spanid"], server.span_id);
    assert_eq!(app["x-b3-sampled"], "1");
    assert_eq!(app["traceparent"], traceparent(&widened, &server.span_id, true));
    assert!(!app.contains_key("b3"), "B3 stays in the form it came in: {app:?}");

    // No context and sampling off: untraced, nothing added.
    let app = call(&[]);
    assert!(!app.contains_key("traceparent") && !app.contains_key("b3"), "{app:?}");
    // An unsampled parent: no spans, its context forwarded untouched.
    let unsampled = traceparent(&trace_id(11), APP_SPAN, false);
    assert_eq!(call(&[("traceparent", &unsampled)])["traceparent"], unsampled);
    // Malformed headers: ignored, no spans, and forwarded as received.
    let upper = traceparent(&trace_id(12).to_uppercase(), APP_SPAN, true);
    let zero = traceparent(&"0".repeat(32), APP_SPAN, true);
    for bad in [upper.as_str(), zero.as_str(), "ff-garbage", "00-xyz"] {
        assert_eq!(call(&[("traceparent", bad)])["traceparent"], bad);
    }
    assert_eq!(call(&[("b3", "not-b3")])["b3"], "not-b3");

    // A traced request after all of them: once its spans are in, everything the proxies
    // recorded before it is too (each proxy exports in order), and only the traced requests
    // made spans.
    let sentinel = trace_id(13);
    call(&[("traceparent", &traceparent(&sentinel, APP_SPAN, true))]);
    collector.trace(&sentinel, 2);
    let expected: std::collections::BTreeSet<String> = [b3_trace, widened, sentinel].into();
    assert_eq!(collector.trace_ids(), expected);
    assert_eq!(collector.receiver().spans().len(), 6);
}

/// Span export only for traffic the mesh trusts: a client without a mesh identity (plaintext)
/// that marks its request sampled (`traceparent …-01`, `b3: 1`, `X-B3-Sampled: 1`) gets the
/// proxy's own decision instead (sampling ratio 0: no span, and the app is handed the request
/// without trace headers), a meshed client still gets its spans, and a flood of sampled requests
/// from a meshed client is held to the proxy's span budget. Unfixed: the intruder's trace id was
/// exported.
#[test]
fn only_meshed_clients_decide_sampling_and_a_flood_of_sampled_requests_is_held_to_the_span_budget() {
    if !require_root("only_meshed_clients_decide_sampling_and_a_flood_of_sampled_requests_is_held_to_the_span_budget") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let collector = Collector::start(&net, true);
    let p = pair_with(&net, &collector.endpoint, &[("CNIMESH_PROXY_TRACE_SPAN_BUDGET", "1")]);
    let intruder = Pod::unmeshed(&net, "shop", "intruder").unwrap();
    let server_addr = format!("{}:{}", p.server.ipv4(), apps::HTTP_PORT);

    // The intruder, plaintext, asks for traces with ids of its choosing, in every format.
    let forced = trace_id(20);
    let sent = traceparent(&forced, APP_SPAN, true);
    for headers in [&[("traceparent", sent.as_str())][..], &[("b3", "1")]] {
        let reply = get(&intruder.netns.path(), &server_addr, "/headers", headers);
        assert_eq!(trace_headers(&reply), Vec::<String>::new(), "passed on with no trace header: {}", reply.body);
    }
    let b3_trace = trace_id(21);
    let multi = [("X-B3-TraceId", b3_trace.as_str()), ("X-B3-SpanId", APP_SPAN), ("X-B3-Sampled", "1")];
    let reply = get(&intruder.netns.path(), &server_addr, "/headers", &multi);
    assert_eq!(trace_headers(&reply), Vec::<String>::new(), "{}", reply.body);

    // A meshed client's sampled request is traced: once its spans are in, anything the server's
    // proxy recorded before is too (it exports in order).
    let meshed = trace_id(22);
    call_traced(&p, &server_addr, &meshed);
    collector.trace(&meshed, 2);
    let ids = collector.trace_ids();
    assert!(!ids.contains(&forced) && !ids.contains(&b3_trace), "no span for the intruder's traces: {ids:?}");
    assert_eq!(collector.receiver().spans().len(), 2, "{:#?}", collector.receiver().spans());

    // A flood of sampled requests from the meshed client: the server's proxy records at most
    // its budget (1 span a second, a burst of 1), whatever the client asks for.
    wait_budget_full(&p.server_proxy);
    let flood: Vec<String> = (0..40).map(|n| trace_id(100 + n)).collect();
    for trace in &flood {
        call_traced(&p, &server_addr, trace);
    }
    wait_budget_full(&p.server_proxy);
    let sentinel = trace_id(200);
    call_traced(&p, &server_addr, &sentinel);
    let server_spans = |traces: &[String]| {
        collector.receiver().spans().into_iter().filter(|s| s.kind == "server" && traces.contains(&s.trace_id)).count()
    };
    eventually("the sentinel's server span", SPAN_WAIT, || server_spans(std::slice::from_ref(&sentinel)) == 1);
    let recorded = server_spans(&flood);
    eprintln!("server spans of the flood of {}: {recorded}", flood.len());
    assert!(recorded >= 1, "the budget admits some: {recorded}");
    assert!(recorded < flood.len() / 2, "the flood was held to the budget: {recorded} of {}", flood.len());
}

/// Every trace header line the app was handed (`name: value`, each occurrence).
fn trace_headers(reply: &Reply) -> Vec<String> {
    const NAMES: [&str; 8] = [
        "traceparent",
        "tracestate",
        "b3",
        "x-b3-traceid",
        "x-b3-spanid",
        "x-b3-parentspanid",
        "x-b3-sampled",
        "x-b3-flags",
    ];
    assert_eq!(reply.status, 200, "{reply:?}");
    reply
        .body
        .lines()
        .filter(|l| l.split_once(": ").is_some_and(|(k, _)| NAMES.contains(&k)))
        .map(String::from)
        .collect()
}

/// A client without a mesh identity cannot get a sampling decision past the proxy in any
/// format: mixed formats (an unsampled `traceparent` with `X-B3-Sampled: 1` or `X-B3-Flags: 1`,
/// a sampled one with a bare `X-B3-Sampled: 1`), a repeated `traceparent`, a value the proxy does
/// not accept but other tracers do (`X-B3-Sampled: TRUE`) and B3 debug (`b3: …-d`) all reach the
/// app with no trace header at all (at ratio 0), so an app's tracer downstream cannot continue
/// the trace as sampled; and no span carries the intruder's trace ids. Unfixed: headers the proxy
/// did not parse, or of the format it did not pick, went on untouched.
#[test]
fn an_untrusted_clients_trace_headers_never_reach_the_app_whatever_their_format_or_count() {
    if !require_root("an_untrusted_clients_trace_headers_never_reach_the_app_whatever_their_format_or_count") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let collector = Collector::start(&net, true);
    let p = pair(&net, &collector.endpoint);
    let intruder = Pod::unmeshed(&net, "shop", "intruder").unwrap();
    let server_addr = format!("{}:{}", p.server.ipv4(), apps::HTTP_PORT);

    let ids: Vec<String> = (30..36).map(trace_id).collect();
    let unsampled = |n: usize| traceparent(&ids[n], APP_SPAN, false);
    let sampled = |n: usize| traceparent(&ids[n], APP_SPAN, true);
    let debug = format!("{}-{APP_SPAN}-d", ids[5]);
    let variants: Vec<Vec<(&str, String)>> = vec![
        vec![("traceparent", unsampled(0)), ("X-B3-Sampled", "1".into())],
        vec![("traceparent", unsampled(1)), ("X-B3-Flags", "1".into())],
        vec![("traceparent", sampled(2)), ("X-B3-Sampled", "1".into())],
        vec![("traceparent", sampled(3)), ("traceparent", sampled(3))],
        vec![("X-B3-TraceId", ids[4].clone()), ("X-B3-SpanId", APP_SPAN.into()), ("X-B3-Sampled", "TRUE".into())],
        vec![("b3", debug), ("tracestate", "vendor=intruder".into())],
    ];
    for headers in &variants {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let reply = get(&intruder.netns.path(), &server_addr, "/headers", &headers);
        assert_eq!(trace_headers(&reply), Vec::<String>::new(), "sent {headers:?}, the app saw: {}", reply.body);
    }

    // A meshed client's sampled request is traced; once its spans are in, anything the server's
    // proxy recorded before is too (it exports in order): none of the intruder's.
    let meshed = trace_id(40);
    call_traced(&p, &server_addr, &meshed);
    collector.trace(&meshed, 2);
    let exported = collector.trace_ids();
    assert!(ids.iter().all(|id| !exported.contains(id)), "no span for the intruder's traces: {exported:?}");
}

/// A sampled request of trace `trace` from the meshed client to the server's app.
fn call_traced(p: &Pair<'_>, server_addr: &str, trace: &str) {
    let reply =
        get(&p.client.netns.path(), server_addr, "/headers", &[("traceparent", &traceparent(trace, APP_SPAN, true))]);
    assert_eq!(reply.status, 200, "{reply:?}");
}

#[test]
fn a_collector_that_is_down_costs_dropped_spans_counted_in_the_metric_and_no_failed_request() {
    if !require_root("a_collector_that_is_down_costs_dropped_spans_counted_in_the_metric_and_no_failed_request") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let collector = Collector::start(&net, false);
    let p = pair(&net, &collector.endpoint);
    let server_addr = format!("{}:{}", p.server.ipv4(), apps::HTTP_PORT);
    for n in 0..20 {
        let sent = traceparent(&trace_id(100 + n), APP_SPAN, true);
        let app = seen(&get(&p.client.netns.path(), &server_addr, "/headers", &[("traceparent", &sent)]));
        assert!(app["traceparent"].starts_with(&format!("00-{}-", trace_id(100 + n))), "{app:?}");
    }
    for proxy in [&p.client_proxy, &p.server_proxy] {
        eventually("the undeliverable spans are counted as dropped", SPAN_WAIT, || {
            proxy.metric("trace_spans_dropped_total") >= 1.0
        });
        assert_eq!(proxy.metric("trace_spans_exported_total"), 0.0);
    }
}

/// `web`'s routes: `/replica` split 50/50 between `web` and `web-canary`, `/slow` (1.5 s) with a
/// 100 ms request timeout; `/flaky` retried once on a 5xx.
const ROUTES: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web-split, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 80}]
  rules:
  - matches: [{path: {type: Exact, value: /replica}}]
    backendRefs: [{name: web, port: 80, weight: 50}, {name: web-canary, port: 80, weight: 50}]
  - matches: [{path: {type: Exact, value: /slow}}]
    backendRefs: [{name: web, port: 80}]
    timeouts: {request: 100ms}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: web-retries
  namespace: shop
  annotations: {retry.cnimesh.io/http: 5xx, retry.cnimesh.io/limit: "1"}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 80}]
  rules:
  - matches: [{path: {type: Exact, value: /flaky}}]
    backendRefs: [{name: web, port: 80}]
"#;

const WEB_IP: &str = "10.96.0.50";
const CANARY_IP: &str = "10.96.0.51";

#[test]
fn a_route_split_names_the_backend_a_timeout_is_an_event_and_a_retried_request_has_a_child_span_per_try() {
    if !require_root(
        "a_route_split_names_the_backend_a_timeout_is_an_event_and_a_retried_request_has_a_child_span_per_try",
    ) {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let collector = Collector::start(&net, true);
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let web = Pod::named(&net, "shop", "web-0").unwrap();
    let canary = Pod::named(&net, "shop", "canary-0").unwrap();
    let client = Pod::named(&net, "shop", "client").unwrap();
    let services = [
        service_yaml("web", WEB_IP, "web-0", web.ipv4(), "web"),
        service_yaml("web-canary", CANARY_IP, "canary-0", canary.ipv4(), "web"),
    ];
    let services = services.join("---\n");
    let objects = [("services.yaml", services.as_str()), ("routes.yaml", ROUTES)];
    let control = Control::start_with_objects(&bins.control, &control_pod, &[], &objects).unwrap();
    let web_env = control.proxy_env("shop", "web", &control.token("shop", "web").unwrap());
    let _replicas: Vec<(Sidecar, Apps)> = [&web, &canary]
        .into_iter()
        .map(|pod| {
            let apps = Apps::start(&pod.netns.path(), pod.ipv4().into(), &pod.name).unwrap();
            let mut env = env_refs(&web_env);
            env.extend(trace_env(&collector.endpoint, &pod.name));
            (Sidecar::start(&bins.proxy, &pod.netns, &env).unwrap(), apps)
        })
        .collect();
    client.netns.exec("ip", &["route", "add", "10.96.0.0/12", "dev", "eth0"]).unwrap();
    let mut env = control.proxy_env("shop", "client", &control.token("shop", "client").unwrap());
    env.push(("CNIMESH_PROXY_DESTINATION_ADDR".into(), control.addr.to_string()));
    let mut env = env_refs(&env);
    env.extend(trace_env(&collector.endpoint, "client"));
    let _client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env).unwrap();
    let call = |path: &str, trace: &str| {
        get(
            &client.netns.path(),
            &format!("{WEB_IP}:80"),
            path,
            &[("traceparent", &traceparent(trace, APP_SPAN, true))],
        )
    };

    // The split: each request's client span names the route and the backend Service it went
    // to, and the server span comes from that backend's proxy.
    let mut backends = std::collections::BTreeSet::new();
    let replies: Vec<(String, Reply)> = (0..20)
        .map(|n| {
            let trace = trace_id(200 + n);
            let reply = call("/replica", &trace);
            (trace, reply)
        })
        .collect();
    for (trace, reply) in replies {
        assert_eq!(reply.status, 200, "{reply:?}");
        let spans = collector.trace(&trace, 2);
        let (client, server) = (one(&spans, "client"), one(&spans, "server"));
        assert_eq!(client.name, "GET web-split", "{client:#?}");
        assert_eq!(client.attr("http.route"), Some("web-split"));
        let service = client.attr("cnimesh.target.service").unwrap_or_default();
        let expected = if reply.body == "canary-0" { "web-canary." } else { "web." };
        assert!(service.starts_with(expected), "{service} answered by {}", reply.body);
        assert_eq!(server.parent_span_id.as_deref(), Some(client.span_id.as_str()));
        assert_eq!(server.resource.get("k8s.pod.name"), Some(&reply.body), "{server:#?}");
        backends.insert(reply.body);
    }
    assert_eq!(backends.len(), 2, "both backends answered 20 requests split 50/50: {backends:?}");

    // A route timeout: the client span ends failed with a `timeout` event; the server proxy's
    // request is abandoned when the client proxy gives up, and its span says so.
    let trace = trace_id(250);
    assert_eq!(call("/slow", &trace).status, 504);
    let spans = collector.trace(&trace, 2);
    let (client_span, server_span) = (one(&spans, "client"), one(&spans, "server"));
    assert_eq!(client_span.events, ["timeout"], "{client_span:#?}");
    assert_eq!(client_span.attr("http.response.status_code"), Some("504"));
    assert!(client_span.status.starts_with("error"), "{client_span:#?}");
    assert_eq!(server_span.parent_span_id.as_deref(), Some(client_span.span_id.as_str()));
    assert_eq!(server_span.attr("error.type"), Some("cancelled"), "{server_span:#?}");

    // A retry: `/flaky` fails its first request (see apps::flaky_fails) and the route retries it
    // once. The request's span has a child per try and a `retry` event; each try's server span
    // hangs under that try.
    assert!(apps::flaky_fails(0) && !apps::flaky_fails(1));
    let trace = trace_id(300);
    assert_eq!(call("/flaky", &trace).status, 200);
    let spans = collector.trace(&trace, 5);
    assert_eq!(spans.len(), 5, "{spans:#?}");
    let request = spans.iter().find(|s| s.parent_span_id.as_deref() == Some(APP_SPAN)).expect("the request's span");
    assert_eq!((request.kind.as_str(), request.attr("http.route")), ("client", Some("web-retries")));
    assert_eq!(request.events, ["retry"]);
    assert_eq!(request.attr("http.response.status_code"), Some("200"));
    let mut tries: Vec<_> = spans.iter().filter(|s| s.parent_span_id.as_deref() == Some(&request.span_id)).collect();
    tries.sort_by_key(|s| s.start_unix_nano);
    assert_eq!(tries.len(), 2, "{spans:#?}");
    assert_eq!((tries[0].kind.as_str(), tries[0].attr("http.response.status_code")), ("client", Some("500")));
    assert!(tries[0].status.starts_with("error"), "{:#?}", tries[0]);
    assert_eq!(tries[0].attr("http.request.resend_count"), None);
    assert_eq!(tries[1].attr("http.response.status_code"), Some("200"));
    assert_eq!(tries[1].attr("http.request.resend_count"), Some("1"));
    for attempt in &tries {
        assert_eq!(attempt.attr("network.peer.address"), Some(web.ipv4().to_string().as_str()));
        let server = spans
            .iter()
            .find(|s| s.parent_span_id.as_deref() == Some(&attempt.span_id))
            .unwrap_or_else(|| panic!("a server span under each try: {spans:#?}"));
        assert_eq!(server.kind, "server");
        assert_eq!(server.attr("http.response.status_code"), attempt.attr("http.response.status_code"));
    }
}

#[test]
fn a_request_across_clusters_is_one_trace_with_the_gateways_span_between_the_callers_and_the_targets() {
    if !require_root(
        "a_request_across_clusters_is_one_trace_with_the_gateways_span_between_the_callers_and_the_targets",
    ) {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let collector = Collector::start(&net, true);
    // Every proxy of both clusters, the gateway too, exports to the one collector, as
    // `multicluster install` gives the gateway the collector the control plane gives proxies.
    let c = Meshed::start_with(&bins, &net, &[("CNIMESH_PROXY_TRACE_COLLECTOR", &collector.endpoint)]);
    let client_id = c.east.identity("shop", "client");
    let gateway_id =
        c.west.identity(cnimesh_common::names::MULTICLUSTER_NAMESPACE, cnimesh_common::names::GATEWAY_NAME);

    let trace = trace_id(40);
    let reply = get(
        &c.client.netns.path(),
        &format!("{MIRROR_IP}:80"),
        "/headers",
        &[("traceparent", &traceparent(&trace, APP_SPAN, true))],
    );
    let app = seen(&reply);
    let spans = collector.trace(&trace, 3);
    assert_eq!(spans.len(), 3, "client, gateway and target: {spans:#?}");
    let client = one(&spans, "client");
    let servers: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.kind == "server").collect();
    let by_direction = |direction: &str| {
        *servers
            .iter()
            .find(|s| s.attr("cnimesh.direction") == Some(direction))
            .unwrap_or_else(|| panic!("a {direction} server span: {spans:#?}"))
    };
    let (gateway, target) = (by_direction("gateway"), by_direction("inbound"));
    assert_eq!(client.parent_span_id.as_deref(), Some(APP_SPAN), "the app's span is the client span's parent");
    assert_eq!(gateway.parent_span_id.as_deref(), Some(client.span_id.as_str()), "caller's client span → gateway");
    assert_eq!(target.parent_span_id.as_deref(), Some(gateway.span_id.as_str()), "gateway → target's server span");
    assert_eq!(app["traceparent"], traceparent(&trace, &target.span_id, true), "the app's parent is the target span");
    assert_eq!(gateway.attr("cnimesh.client.identity"), Some(client_id.as_str()), "{gateway:#?}");
    assert_eq!(gateway.attr("cnimesh.server.identity"), Some(gateway_id.as_str()), "{gateway:#?}");
    assert_eq!(gateway.attr("network.peer.address"), Some(c.client.ipv4().to_string().as_str()), "{gateway:#?}");
    assert_eq!(target.attr("cnimesh.client.identity"), Some(gateway_id.as_str()), "{target:#?}");
    for span in [client, gateway, target] {
        assert_eq!(span.attr("http.response.status_code"), Some("200"), "{span:#?}");
    }
}
