//! The cost of tracing: mTLS proxy pairs of this build in the same run, same traffic.
//! One pair runs with tracing compiled in but off (no collector: today's configuration), one
//! with tracing on at 100 % sampling (h2load's requests carry no context, so the ratio of 1
//! makes every request a trace: a CLIENT and a SERVER span each) exporting to a live OTLP/gRPC
//! receiver (cnimesh-trace's, in this process, on a socket in a `collector` pod). Rounds
//! interleave the rows; medians are printed with the added p50/p99 and the CPU ratio.
//!
//! With `CNIMESH_BENCH_BASELINE_PROXY=/path/to/cnimesh-proxy` (a build of main before tracing),
//! a third pair runs that binary, and a second table shows what tracing costs when it is off
//! (this build, off, against the baseline binary: it should be within noise).
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench proxy_trace` (needs nghttp2-client).
//! `CNIMESH_BENCH_ROUNDS` (default 3) sets the rounds.

use std::path::Path;

use cnimesh_e2e::bench::{interleaved_rounds, print_comparison, rounds};
use cnimesh_e2e::control::Control;
use cnimesh_e2e::mesh::Pair;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use cnimesh_trace::Receiver;
use serde_json::json;

const OTLP_PORT: u16 = 4317;

fn main() {
    if !require_root("proxy trace benchmark") {
        return;
    }
    let rounds = rounds();
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let control = Control::start(&bins.control, &control_pod, &[]).unwrap();

    // The receiver: spans counted, not kept (hundreds of thousands of them).
    let collector_pod = Pod::unmeshed(&net, "tracing", "collector").unwrap();
    let ip = collector_pod.ipv4();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let listener =
        cnimesh_cni::netns::run_in(&collector_pod.netns.path(), move || std::net::TcpListener::bind((ip, OTLP_PORT)))
            .unwrap()
            .unwrap();
    let receiver = {
        let _entered = rt.enter();
        Receiver::from_listener(listener, None).unwrap()
    };
    receiver.keep_spans(false);
    let endpoint = format!("http://{ip}:{OTLP_PORT}");

    let off = Pair::start(&control, &bins.proxy, &net, "off");
    let on = Pair::start_with(
        &control,
        &bins.proxy,
        &net,
        "traced",
        // A span per request, however fast the run goes: the budget out of the way.
        &[
            ("CNIMESH_PROXY_TRACE_COLLECTOR", &endpoint),
            ("CNIMESH_PROXY_TRACE_SAMPLING", "1.0"),
            ("CNIMESH_PROXY_TRACE_SPAN_BUDGET", "1000000"),
        ],
    );
    let baseline = std::env::var_os("CNIMESH_BENCH_BASELINE_PROXY")
        .map(|bin| Pair::start(&control, Path::new(&bin), &net, "base"));

    let mut rows = vec![off.row("mTLS pair, tracing off"), on.row("mTLS pair, tracing on, 100 % sampled")];
    if let Some(p) = &baseline {
        rows.push(p.row("baseline binary (before tracing)"));
    }
    let samples = interleaved_rounds(&rows, rounds);
    print_comparison("Tracing cost, every request traced", &rows[..2], &samples[..2], "tracing at 100 %", 100.0);
    let exported: f64 =
        [&on.client_proxy, &on.server_proxy].iter().map(|p| p.metric("trace_spans_exported_total")).sum();
    let dropped: f64 = [&on.client_proxy, &on.server_proxy].iter().map(|p| p.metric("trace_spans_dropped_total")).sum();
    println!(
        "\nspans exported by the traced pair: {exported}; dropped: {dropped}; received by the collector: {}",
        receiver.received()
    );
    assert!(receiver.received() > 60000, "the traced requests' spans reached the collector");
    if let Some(p) = &baseline {
        let rows = [p.row("baseline binary (before tracing)"), off.row("this build, tracing off")];
        let samples = [samples[2].clone(), samples[0].clone()];
        print_comparison("Tracing off: this build against the baseline binary", &rows, &samples, "tracing (off)", 5.0);
    }
    let _entered = rt.enter();
    drop(receiver);
}
