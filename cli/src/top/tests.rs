//! `cnimesh top`'s aggregation and table (golden), and its run loop over a finished stream.

use super::aggregate::{Key, Top};
use super::run;
use crate::tap::tests::{golden, sample_lines};

#[test]
fn requests_fold_by_source_destination_method_and_path() {
    let mut top = Top::default();
    sample_lines().iter().for_each(|l| top.add(l));
    let rows = top.rows();
    assert_eq!(rows.len(), 3, "{rows:?}");
    let (key, hello) = rows[0];
    assert_eq!(
        key,
        &Key { source: "10.0.0.5".into(), destination: "10.0.0.7".into(), method: "GET".into(), path: "/hello".into() }
    );
    assert_eq!((hello.count, hello.successes, hello.best_us, hello.worst_us, hello.last_us), (2, 1, 812, 2345, 2345));
    let grpc = rows.iter().find(|(k, _)| k.path == "/shop.Cart/Add").unwrap().1;
    assert_eq!(grpc.successes, 0, "grpc-status 5 is a failure despite HTTP 200");
    assert!(top.problems.contains_key("demo/web-2"));
    golden("top-table.txt", &top.render());
}

#[test]
fn events_of_requests_not_seen_starting_are_ignored() {
    let mut top = Top::default();
    sample_lines().iter().skip(1).take(2).for_each(|l| top.add(l));
    assert!(top.rows().is_empty());
    assert_eq!(top.render(), "No requests seen yet.\n");
}

#[tokio::test]
async fn run_folds_the_stream_until_it_ends() {
    let lines: super::Lines = Box::pin(futures::stream::iter(sample_lines().into_iter().map(Ok)));
    let top = run(lines, None, None::<&mut Vec<u8>>).await.unwrap();
    assert_eq!(top.rows().iter().map(|(_, r)| r.count).sum::<u64>(), 4);
}

/// The pods the relay named stand in for their addresses.
#[test]
fn named_pods_replace_addresses() {
    let mut lines = sample_lines();
    for line in &mut lines {
        if let Some(at) = line.body.stream_mut() {
            at.source_pod = Some("demo/client-7d9f".into());
            at.destination_pod = Some("demo/web-1".into());
        }
    }
    let mut top = Top::default();
    lines.iter().for_each(|l| top.add(l));
    let rows = top.rows();
    assert!(rows.iter().all(|(k, _)| k.source == "demo/client-7d9f" && k.destination == "demo/web-1"), "{rows:?}");
}

/// A policy's refusals are counted as such, never as successes: 403 denied, 429 rate-limited.
#[test]
fn denied_and_rate_limited_requests_are_not_successes() {
    use cnimesh_model::tap::Body;
    let mut top = Top::default();
    for status in [200, 403, 429] {
        for line in sample_lines().iter().take(3) {
            let mut line = line.clone();
            if let Some(at) = line.body.stream_mut() {
                at.id = format!("s-{status}");
            }
            if let Body::ResponseInit { http_status, .. } = &mut line.body {
                *http_status = status;
            }
            top.add(&line);
        }
    }
    let rows = top.rows();
    let (_, row) = rows.iter().find(|(k, _)| k.path == "/hello").unwrap();
    assert_eq!((row.count, row.successes, row.denied, row.rate_limited), (3, 1, 1, 1), "{rows:?}");
}
