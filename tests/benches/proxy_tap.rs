//! The cost of tap: two mTLS proxy pairs in the same run, same traffic. One pair has a tap
//! session open on its client's and its server's proxy (matching every request, its events read
//! and counted by a client holding the control plane's identity, as the tap relay does), the
//! other none. Rounds interleave the rows; medians are printed with the added p50/p99 and the
//! CPU ratio.
//!
//! With `CNIMESH_BENCH_BASELINE_PROXY=/path/to/cnimesh-proxy` (e.g. main's build), a third pair
//! runs that binary, and a second table shows what the tap hook costs with no session open
//! (this build, no tap, against the baseline binary).
//!
//! Run as root: `cargo bench -p cnimesh-e2e --bench proxy_tap` (needs nghttp2-client).
//! `CNIMESH_BENCH_ROUNDS` (default 3) sets the rounds; `CNIMESH_BENCH_PROXY` runs another proxy
//! binary in the first two pairs.

use std::path::Path;
use std::sync::atomic::Ordering;

use cnimesh_e2e::bench::{interleaved_rounds, print_comparison, rounds};
use cnimesh_e2e::control::{Control, identity};
use cnimesh_e2e::mesh::Pair;
use cnimesh_e2e::tap_client::{self, client_tls, everything};
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

const CONTROL_IDENTITY: &str = "cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.cluster.local";

fn main() {
    if !require_root("proxy tap benchmark") {
        return;
    }
    let rounds = rounds();
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let control_pod = Pod::unmeshed(&net, "cnimesh", "control").unwrap();
    let control = Control::start(&bins.control, &control_pod, &[]).unwrap();
    let proxy = std::env::var_os("CNIMESH_BENCH_PROXY").map_or(bins.proxy.clone(), Into::into);
    let without = Pair::start(&control, &proxy, &net, "plain");
    let with = Pair::start(&control, &proxy, &net, "tapped");
    let baseline = std::env::var_os("CNIMESH_BENCH_BASELINE_PROXY")
        .map(|bin| Pair::start(&control, Path::new(&bin), &net, "base"));

    // A session on each of the tapped pair's proxies, read to the end in the background.
    let tls = client_tls(&control, CONTROL_IDENTITY).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let counted = rt.block_on(async {
        let mut counted = Vec::new();
        for (pod, proxy) in [(&with.client, &with.client_proxy), (&with.server, &with.server_proxy)] {
            let name = identity("shop", &pod.name);
            let mut tap = tap_client::connect(&pod.netns.path(), tls.clone(), &name).await.unwrap();
            let stream = tap.observe(everything(u32::MAX)).await.unwrap().into_inner();
            assert_eq!(proxy.metric("tap_sessions_open"), 1.0);
            counted.push((tap, tap_client::count(stream)));
        }
        counted
    });

    let mut rows = vec![without.row("mTLS pair, no tap session"), with.row("mTLS pair, tap session on both")];
    if let Some(p) = &baseline {
        rows.push(p.row("baseline binary, no tap"));
    }
    let samples = interleaved_rounds(&rows, rounds);
    let events: u64 = counted.iter().map(|(_, n)| n.load(Ordering::Relaxed)).sum();
    let dropped: f64 =
        [&with.client_proxy, &with.server_proxy].iter().map(|p| p.metric("tap_events_dropped_total")).sum();
    assert!(events > 60000, "the tap clients read the measured requests' events: {events}");

    print_comparison(
        "Tap cost, one session on each proxy of the pair",
        &rows[..2],
        &samples[..2],
        "tap sessions",
        100.0,
    );
    println!("\ntap events read by the clients: {events}; dropped by the proxies (slow reader): {dropped}");
    if let Some(p) = &baseline {
        let rows = [p.row("baseline binary, no tap"), without.row("this build, no tap session")];
        let samples = [samples[2].clone(), samples[0].clone()];
        print_comparison(
            "No session open: this build against the baseline binary",
            &rows,
            &samples,
            "the tap hook",
            5.0,
        );
    }
    drop(counted);
}
