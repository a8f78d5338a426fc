//! `stat` and `edges` from fixed metric text (golden tables and JSON), and through the API
//! server's pod proxy against the mocked API server `cnimesh check` is tested with.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cnimesh_common::prom_text::samples;
use k8s_openapi::api::core::v1::{Pod, Service};
use serde_json::{Value, json};

use super::compute::{self, Query, Scrapes};
use super::mesh::{Mesh, Resource};
use super::render::{self, Output};
use super::{EdgesArgs, Scope, Sources, StatArgs, edges, stat};
use crate::check::mock::MockApi;

const CLIENT_ID: &str = "client.shop.serviceaccount.identity.cnimesh.cluster.local";
const WEB_ID: &str = "web.shop.serviceaccount.identity.cnimesh.cluster.local";

fn pod(name: &str, ip: &str, app: &str, meshed: bool) -> Value {
    let mut labels = json!({"app": app});
    let mut containers = vec![json!({"name": "app", "image": "app:1"})];
    if meshed {
        labels["cnimesh.io/proxy-deployment"] = json!(app);
        labels["cnimesh.io/workload-ns"] = json!("shop");
        containers.push(json!({"name": "cnimesh-proxy", "image": "proxy:1"}));
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": labels},
        "spec": {"serviceAccountName": app, "containers": containers},
        "status": {"phase": "Running", "podIP": ip},
    })
}

fn service(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "selector": {"app": name}, "ports": [{"port": 80}]},
    })
}

/// `client` (meshed) calls `web` (two meshed replicas, mTLS) and `legacy` (not meshed).
pub(crate) fn objects() -> (Vec<Value>, Vec<Value>) {
    let pods = vec![
        pod("web-1", "10.244.0.11", "web", true),
        pod("web-2", "10.244.0.12", "web", true),
        pod("client", "10.244.0.20", "client", true),
        pod("legacy", "10.244.0.30", "legacy", false),
    ];
    (pods, vec![service("web", "10.96.0.10"), service("legacy", "10.96.0.20")])
}

pub(crate) fn mesh() -> Mesh {
    let (pods, services) = objects();
    let pods: Vec<Pod> = pods.into_iter().map(|p| serde_json::from_value(p).unwrap()).collect();
    let services: Vec<Service> = services.into_iter().map(|s| serde_json::from_value(s).unwrap()).collect();
    Mesh::new(&pods, &services)
}

/// A web replica's inbound metrics, as its proxy writes them: `ok`/`failed` responses to
/// `client` over mTLS, with cumulative latency buckets (1, 2, 5, 10 ms, +Inf).
pub(crate) fn web_metrics(ip: &str, ok: u64, failed: u64, buckets: [u64; 5], open: u64) -> String {
    let common = format!(
        "direction=\"inbound\",target_addr=\"{ip}:8080\",authority=\"web.shop.svc.cluster.local\",tls=\"true\",client_id=\"{CLIENT_ID}\""
    );
    let mut text = format!(
        "# TYPE request counter\nrequest_total{{{common}}} {}\n\
         response_total{{{common},status_code=\"200\",classification=\"success\"}} {ok}\n\
         response_total{{{common},status_code=\"500\",classification=\"failure\"}} {failed}\n",
        ok + failed
    );
    for (le, count) in ["1.0", "2.0", "5.0", "10.0", "+Inf"].iter().zip(buckets) {
        text.push_str(&format!("response_latency_ms_bucket{{{common},le=\"{le}\"}} {count}\n"));
    }
    let tcp = format!("direction=\"inbound\",target_addr=\"{ip}:8080\",tls=\"true\",client_id=\"{CLIENT_ID}\"");
    text.push_str(&format!("tcp_open_total{{{tcp}}} {open}\ntcp_open_connections{{{tcp}}} {open}\n# EOF\n"));
    text
}

/// The client's outbound metrics: `web` by ClusterIP over mTLS, `legacy` in plaintext.
pub(crate) fn client_metrics(web: u64, legacy: u64) -> String {
    let web_labels = format!(
        "direction=\"outbound\",target_addr=\"10.96.0.10:80\",authority=\"web.shop.svc.cluster.local\",tls=\"true\",server_id=\"{WEB_ID}\""
    );
    let legacy_labels = "direction=\"outbound\",target_addr=\"10.96.0.20:80\",authority=\"legacy\",tls=\"false\"";
    let mut text = String::new();
    for (labels, n, ms) in [(web_labels.as_str(), web, "2.0"), (legacy_labels, legacy, "5.0")] {
        text.push_str(&format!("request_total{{{labels}}} {n}\n"));
        text.push_str(&format!("response_total{{{labels},status_code=\"200\",classification=\"success\"}} {n}\n"));
        text.push_str(&format!("response_latency_ms_bucket{{{labels},le=\"{ms}\"}} {n}\n"));
        text.push_str(&format!("response_latency_ms_bucket{{{labels},le=\"+Inf\"}} {n}\n"));
    }
    let tcp = |target: &str, tls: &str| format!("direction=\"outbound\",target_addr=\"{target}\",tls=\"{tls}\"");
    text.push_str(&format!("tcp_open_total{{{}}} 1\n", tcp("10.96.0.10:80", "true")));
    text.push_str(&format!("tcp_open_connections{{{}}} 1\n", tcp("10.96.0.10:80", "true")));
    text.push_str(&format!("tcp_open_total{{{}}} 3\n", tcp("10.96.0.20:80", "false")));
    text
}

/// Two readings 10 s apart: web-1 answered 100 (2 failed), web-2 100, client sent 200 to web and
/// 50 to legacy.
fn scrapes() -> Scrapes {
    let pair = |before: String, after: String| Ok((samples(&before), samples(&after)));
    BTreeMap::from([
        (
            "shop/web-1".to_string(),
            pair(
                web_metrics("10.244.0.11", 500, 0, [50, 300, 450, 500, 500], 1),
                web_metrics("10.244.0.11", 598, 2, [60, 360, 540, 600, 600], 1),
            ),
        ),
        (
            "shop/web-2".to_string(),
            pair(
                web_metrics("10.244.0.12", 0, 0, [0; 5], 0),
                web_metrics("10.244.0.12", 100, 0, [0, 50, 90, 100, 100], 1),
            ),
        ),
        ("shop/client".to_string(), pair(client_metrics(1000, 100), client_metrics(1200, 150))),
    ])
}

fn query(resource: &str) -> Query {
    Query {
        resource: resource.parse().unwrap(),
        namespace: Some("shop".into()),
        from: None,
        to: None,
        window: Duration::from_secs(10),
    }
}

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(actual, expected, "{name}: UPDATE_GOLDEN=1 cargo nextest run -p cnimesh-control stat to refresh");
}

#[test]
fn stat_counts_what_each_workload_received() {
    let rows = compute::stat(&mesh(), &scrapes(), &query("deploy"));
    let web = rows.iter().find(|r| r.name == "web").unwrap();
    assert_eq!((web.meshed_pods, web.pods), (2, 2));
    assert_eq!(web.requests, 200.0);
    assert_eq!(web.success_rate, Some(0.99));
    assert_eq!(web.rps, 20.0);
    let latency = web.latency_ms.as_ref().unwrap();
    // 200 in the window: 10 under 1 ms, 110 under 2, 180 under 5: the median is in (1, 2].
    assert!((latency.p50 - (1.0 + 90.0 / 100.0)).abs() < 1e-9, "{latency:?}");
    assert_eq!(web.tcp_connections, 2.0);
    assert_eq!(web.mtls_share, Some(1.0));
    let client = rows.iter().find(|r| r.name == "client").unwrap();
    assert_eq!((client.requests, client.success_rate, client.latency_ms.clone()), (0.0, None, None));
    assert!(rows.iter().all(|r| r.name != "legacy"), "unmeshed pods carry no owner label: {rows:?}");

    golden("stat-deploy-table.txt", &render::stat(&rows, Output::Table, false));
    golden("stat-deploy-wide.txt", &render::stat(&rows, Output::Wide, true));
    golden("stat-deploy.json", &render::stat(&rows, Output::Json, false));
}

#[test]
fn stat_to_and_from_count_what_was_sent_between_them() {
    let to_web = Query { to: Some(("deploy/web".parse().unwrap(), "shop".into())), ..query("deploy/client") };
    let rows = compute::stat(&mesh(), &scrapes(), &to_web);
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].requests, rows[0].mtls_share), (200.0, Some(1.0)), "{rows:?}");
    let to_legacy = Query { to: Some(("po/legacy".parse().unwrap(), "shop".into())), ..query("deploy/client") };
    let rows = compute::stat(&mesh(), &scrapes(), &to_legacy);
    assert_eq!((rows[0].requests, rows[0].mtls_share), (50.0, Some(0.0)), "plaintext to legacy: {rows:?}");
    let from_client = Query { from: Some(("deploy/client".parse().unwrap(), "shop".into())), ..query("deploy/web") };
    let rows = compute::stat(&mesh(), &scrapes(), &from_client);
    assert_eq!((rows[0].name.as_str(), rows[0].requests), ("web", 200.0), "{rows:?}");
    golden("stat-to-web-table.txt", &render::stat(&compute::stat(&mesh(), &scrapes(), &to_web), Output::Table, false));
}

#[test]
fn edges_name_both_sides_and_their_identities() {
    let rows = compute::edges(&mesh(), &scrapes(), &query("deploy"));
    assert_eq!(rows.len(), 2, "{rows:?}");
    let web = rows.iter().find(|e| e.dst == "deployment/web").unwrap();
    assert_eq!((web.src.as_str(), web.mtls), ("deployment/client", true));
    assert_eq!(web.client_ids, ["client.shop"]);
    assert_eq!(web.server_ids, ["web.shop"]);
    let legacy = rows.iter().find(|e| e.dst == "pod/legacy").unwrap();
    assert!(!legacy.mtls && legacy.server_ids.is_empty(), "{legacy:?}");
    golden("edges-deploy-table.txt", &render::edges(&rows, Output::Table));
    golden("edges-deploy.json", &render::edges(&rows, Output::Json));
}

fn scope(output: Output) -> Scope {
    Scope {
        namespace: Some("shop".into()),
        all_namespaces: false,
        local: None,
        prometheus: None,
        prometheus_ca: None,
        output,
    }
}

/// The mocked cluster these tests (and the dashboard's) read: `client` calls `web` (mTLS) and
/// `legacy` (plaintext); web-2's proxy cannot be reached.
pub(crate) fn mock_cluster() -> MockApi {
    let (pods, services) = objects();
    let mut api = MockApi::default();
    api.get("/api/v1/pods", json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods}));
    api.get("/api/v1/services", json!({"apiVersion": "v1", "kind": "ServiceList", "metadata": {}, "items": services}));
    api.get_text("/api/v1/namespaces/shop/pods/client:4191/proxy/metrics", &client_metrics(1200, 150));
    api.get_text(
        "/api/v1/namespaces/shop/pods/web-1:4191/proxy/metrics",
        &web_metrics("10.244.0.11", 598, 2, [60, 360, 540, 600, 600], 1),
    );
    api.fail(
        "/api/v1/namespaces/shop/pods/web-2:4191/proxy/metrics",
        503,
        "error trying to reach service: dial tcp 10.244.0.12:4191: connect: connection refused",
    );
    api
}

/// The cluster path: pods and Services listed from the API server, every meshed pod's metrics
/// read through its pod proxy subresource (and an unreadable one reported, not fatal).
#[tokio::test]
async fn through_the_api_servers_pod_proxy() {
    let api = mock_cluster();
    let sources = Sources::with_client(api.client(), &scope(Output::Table)).unwrap();

    let mut out = Vec::new();
    let args = EdgesArgs { resource: "deploy".parse::<Resource>().unwrap(), scope: scope(Output::Table) };
    edges(&sources, &args, &mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("deployment/client  deployment/web  shop    shop    client.shop  web.shop   mTLS"), "{text}");

    let mut out = Vec::new();
    let args = StatArgs {
        resource: "deploy/web".parse().unwrap(),
        scope: scope(Output::Table),
        from: None,
        from_namespace: None,
        to: None,
        to_namespace: None,
        window: Duration::ZERO,
        watch: false,
    };
    stat(&sources, &args, &mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("deployment/web  2/2"), "{text}");
    assert!(text.contains("warning: metrics not read from shop/web-2: error trying to reach service"), "{text}");
}

/// `--prometheus`: an instant-vector answer becomes samples by pod (the scrape config's
/// `namespace` and `pod` labels), and a failed query is an error saying why.
#[test]
fn prometheus_answers_are_read_by_pod() {
    let body = json!({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "response_total", "namespace": "shop", "pod": "web-1", "direction": "inbound",
                    "classification": "success", "job": "cnimesh-proxy"}, "value": [1700000000.0, "42"]},
        {"metric": {"__name__": "tcp_open_connections", "namespace": "shop", "pod": "web-1", "direction": "inbound"},
         "value": [1700000000.0, "3"]},
        {"metric": {"__name__": "up", "job": "other"}, "value": [1700000000.0, "1"]},
    ]}});
    let by_pod = super::parse_prometheus(&body.to_string()).unwrap();
    assert_eq!(by_pod.len(), 1, "series without namespace and pod are not the proxies': {by_pod:?}");
    let web = &by_pod["shop/web-1"];
    assert_eq!(
        (web[0].name.as_str(), web[0].value, web[0].label("classification")),
        ("response_total", 42.0, "success")
    );
    assert_eq!(web[1].value, 3.0);
    let failed = json!({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"});
    assert_eq!(super::parse_prometheus(&failed.to_string()).unwrap_err(), "Prometheus: parse error at char 3");
    assert!(super::parse_prometheus("<html>").unwrap_err().contains("not a Prometheus answer"));
    assert_eq!(super::encode_query(r#"{a=~"b|c"}"#), "%7Ba%3D~%22b%7Cc%22%7D");
}

/// `-n` defaults to the cluster client's namespace (the kubeconfig context's), as kubectl does.
#[test]
fn the_namespace_defaults_to_the_kubeconfig_contexts() {
    let mut s = scope(Output::Table);
    assert_eq!(s.namespace("team-a").as_deref(), Some("shop"));
    s.namespace = None;
    assert_eq!(s.namespace("team-a").as_deref(), Some("team-a"));
    s.all_namespaces = true;
    assert_eq!(s.namespace("team-a"), None);
}

#[test]
fn edges_show_egress_by_hostname_with_its_egress_network_and_refusals() {
    // The client's proxy also counted egress by hostname.
    let egress = "dst_kind=\"egress\",egress_network=\"shop/world\"";
    let extra = format!(
        "outbound_egress_requests_total{{{egress},dst_hostname=\"api.example.test\"}} 7\noutbound_egress_connections_total{{{egress},dst_hostname=\"api.example.test\",protocol=\"tls\"}} 2\noutbound_egress_denied_total{{{egress},dst_hostname=\"evil.test\",protocol=\"tls\"}} 1\n"
    );
    let after = client_metrics(1200, 150) + &extra;
    let mut scrapes = scrapes();
    scrapes.insert("shop/client".into(), Ok((samples(&client_metrics(1000, 100)), samples(&after))));
    let rows = compute::edges(&mesh(), &scrapes, &query("deploy"));
    let api = rows.iter().find(|e| e.dst == "egress/api.example.test").unwrap();
    assert_eq!((api.dst_namespace.as_str(), api.requests, api.connections), ("shop", 7.0, 2.0));
    assert_eq!(api.egress.as_ref().map(|e| (e.network.as_str(), e.denied)), Some(("shop/world", 0.0)));
    let evil = rows.iter().find(|e| e.dst == "egress/evil.test").unwrap();
    assert_eq!(evil.egress.as_ref().unwrap().denied, 1.0);
    let table = render::edges(&rows, Output::Table);
    assert!(table.contains("egress/api.example.test") && table.contains("egress (shop/world, 0 denied)"), "{table}");
    assert!(rows.iter().filter(|e| e.egress.is_none()).count() == 2, "the other edges are unchanged: {rows:?}");
}

/// The client's egress through the EgressNetwork `shop/world` after `n` HTTP requests to
/// api.example.test (`denied` of them refused) and `tls` TLS connections to it, as its proxy
/// counts them: by hostname, and the same traffic by IP marked `dst_kind="egress"`.
pub(crate) fn client_egress(n: u64, denied: u64, tls: u64) -> String {
    let egress = "dst_kind=\"egress\",egress_network=\"shop/world\",dst_hostname=\"api.example.test\"";
    let by_ip = "direction=\"outbound\",target_addr=\"203.0.113.10:80\",dst_kind=\"egress\"";
    let ok = n - denied;
    format!(
        "outbound_egress_requests_total{{{egress}}} {n}\n\
         outbound_egress_connections_total{{{egress},protocol=\"http\"}} 1\n\
         outbound_egress_connections_total{{{egress},protocol=\"tls\"}} {tls}\n\
         outbound_egress_denied_total{{{egress},protocol=\"http\"}} {denied}\n\
         request_total{{{by_ip},authority=\"api.example.test\",tls=\"false\"}} {n}\n\
         response_total{{{by_ip},authority=\"api.example.test\",tls=\"false\",status_code=\"200\",classification=\"success\"}} {ok}\n\
         response_total{{{by_ip},authority=\"api.example.test\",tls=\"false\",status_code=\"403\",classification=\"success\"}} {denied}\n\
         tcp_open_total{{direction=\"outbound\",target_addr=\"203.0.113.10:80\",dst_kind=\"egress\",tls=\"false\"}} 1\n\
         tcp_open_total{{direction=\"outbound\",target_addr=\"203.0.113.10:8443\",dst_kind=\"egress\",tls=\"false\"}} {tls}\n"
    )
}

fn egress_scrapes() -> Scrapes {
    let mut scrapes = scrapes();
    let before = client_metrics(1000, 100) + &client_egress(10, 2, 1);
    let after = client_metrics(1200, 150) + &client_egress(30, 7, 4);
    scrapes.insert("shop/client".into(), Ok((samples(&before), samples(&after))));
    scrapes
}

#[test]
fn egress_seen_by_hostname_is_one_edge_not_also_one_per_ip() {
    let rows = compute::edges(&mesh(), &egress_scrapes(), &query("deploy"));
    let dsts: Vec<&str> = rows.iter().map(|e| e.dst.as_str()).collect();
    assert!(dsts.contains(&"egress/api.example.test"), "{dsts:?}");
    assert!(!dsts.iter().any(|d| d.starts_with("203.0.113.10")), "no IP row for egress seen by hostname: {dsts:?}");
    assert_eq!(rows.iter().filter(|e| e.egress.is_none()).count(), 2, "the mesh's edges are unchanged: {rows:?}");
    // Without an EgressNetwork (no `dst_kind`), the same traffic stays a row by IP.
    let plain = client_metrics(1200, 150)
        + "tcp_open_total{direction=\"outbound\",target_addr=\"203.0.113.10:80\",tls=\"false\"} 1\n";
    let mut scrapes = scrapes();
    scrapes.insert("shop/client".into(), Ok((Vec::new(), samples(&plain))));
    let rows = compute::edges(&mesh(), &scrapes, &query("deploy"));
    assert!(rows.iter().any(|e| e.dst == "203.0.113.10:80"), "{rows:?}");
}

#[test]
fn stat_egress_shows_each_hostname_with_its_rate_success_connections_and_refusals() {
    let rows = compute::egress_stat(&mesh(), &egress_scrapes(), &query("egress"));
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!((row.namespace.as_str(), row.kind, row.name.as_str()), ("shop", "egress", "api.example.test"));
    assert_eq!(row.network, "shop/world");
    assert_eq!((row.requests, row.rps, row.connections, row.denied), (20.0, 2.0, 3.0, 5.0));
    assert_eq!(row.success_rate, Some(1.0), "a refusal's 403 is not a failure, as Linkerd classifies");
    let table = render::egress_stat(&rows, Output::Table, false);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("egress/api.example.test") && table.contains("shop/world"), "{table}");
    let json: Value = serde_json::from_str(&render::egress_stat(&rows, Output::Json, false)).unwrap();
    assert_eq!(json[0]["denied"], 5.0);
    assert_eq!(json[0]["network"], "shop/world");
    // One hostname by name; another is not there.
    assert_eq!(compute::egress_stat(&mesh(), &egress_scrapes(), &query("egress/API.example.test")).len(), 1);
    assert!(compute::egress_stat(&mesh(), &egress_scrapes(), &query("egress/other.test")).is_empty());
    // A workload's row is unchanged by its egress.
    let with = compute::stat(&mesh(), &egress_scrapes(), &query("deploy/client"));
    let without = compute::stat(&mesh(), &scrapes(), &query("deploy/client"));
    assert_eq!(with, without);
    let empty = render::egress_stat(&[], Output::Table, false);
    assert!(empty.contains("No egress seen by hostname"), "{empty}");
}
