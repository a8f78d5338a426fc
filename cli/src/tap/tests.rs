//! `cnimesh tap`'s lines (golden text, wide and JSON), its flags, and the cluster path: a
//! TokenRequest for `cnimesh/cnimesh-tap` and the relay through the API server's service proxy,
//! against a mocked API server.

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use super::render::{self, TapOutput, duration};
use super::{Filter, lines, open_cluster};
use cnimesh_model::tap::{Body, Stream, TapLine};

fn stream(id: &str, direction: &str, src: &str, dst: &str, tls: &str) -> Stream {
    let mut at = Stream {
        id: id.into(),
        direction: direction.into(),
        source: Some(src.parse().unwrap()),
        destination: Some(dst.parse().unwrap()),
        ..Default::default()
    };
    let peer = if direction == "inbound" { &mut at.source_meta } else { &mut at.destination_meta };
    peer.insert("tls".into(), tls.into());
    if tls == "true" {
        at.source_meta.insert("client_id".into(), "client.demo.serviceaccount.identity.cnimesh.cluster.local".into());
        at.destination_meta.insert("server_id".into(), "web.demo.serviceaccount.identity.cnimesh.cluster.local".into());
    }
    at
}

fn request(at: Stream, method: &str, path: &str) -> Body {
    Body::RequestInit {
        at,
        method: method.into(),
        scheme: "http".into(),
        authority: "web:8080".into(),
        path: path.into(),
        headers: vec![],
    }
}

fn end(at: Stream, latency_us: u64, bytes: u64, grpc_status: Option<u32>) -> Body {
    Body::ResponseEnd {
        at,
        since_request_init_us: latency_us + 25,
        since_response_init_us: 25,
        response_bytes: bytes,
        grpc_status,
        reset_code: None,
    }
}

/// Two requests to web (one 200, one 500) seen inbound by web-1, one call from web-1 to db
/// seen outbound, a gRPC request, and a pod that could not be tapped.
pub(crate) fn sample_lines() -> Vec<TapLine> {
    let line = |pod: &str, body: Body| TapLine { namespace: "demo".into(), pod: pod.into(), body };
    let a = stream("3:1", "inbound", "10.0.0.5:51234", "10.0.0.7:8080", "true");
    let b = stream("3:2", "inbound", "10.0.0.5:51236", "10.0.0.7:8080", "true");
    let c = stream("4:1", "outbound", "10.0.0.7:40000", "10.0.0.9:5432", "no_identity");
    let g = stream("3:3", "inbound", "10.0.0.6:51000", "10.0.0.7:8080", "true");
    vec![
        line("web-1", request(a.clone(), "GET", "/hello")),
        line("web-1", Body::ResponseInit { at: a.clone(), since_request_init_us: 812, http_status: 200 }),
        line("web-1", end(a, 812, 13, None)),
        line("web-1", request(b.clone(), "GET", "/hello")),
        line("web-1", Body::ResponseInit { at: b.clone(), since_request_init_us: 2_345, http_status: 500 }),
        line("web-1", end(b, 2_345, 0, None)),
        line("web-1", request(c.clone(), "POST", "/query")),
        line("web-1", Body::ResponseInit { at: c.clone(), since_request_init_us: 1_500_000, http_status: 201 }),
        line("web-1", end(c, 1_500_000, 2048, None)),
        line("web-1", request(g.clone(), "POST", "/shop.Cart/Add")),
        line("web-1", Body::ResponseInit { at: g.clone(), since_request_init_us: 90, http_status: 200 }),
        line("web-1", end(g, 90, 5, Some(5))),
        TapLine::error("demo", "web-2", "10.0.0.8:4191: connecting to 10.0.0.8:4191: Connection refused"),
    ]
}

pub(crate) fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(actual, expected, "{name}: UPDATE_GOLDEN=1 cargo nextest run -p cnimesh-control tap to refresh");
}

fn rendered(output: TapOutput) -> String {
    sample_lines().iter().map(|l| render::line(l, output)).collect()
}

#[test]
fn lines_render_like_linkerd_tap() {
    let text = rendered(TapOutput::Text);
    assert!(text.starts_with(
        "req id=3:1 proxy=in  src=10.0.0.5:51234 dst=10.0.0.7:8080 tls=true :method=GET :authority=web:8080 :path=/hello\n\
         rsp id=3:1 proxy=in  src=10.0.0.5:51234 dst=10.0.0.7:8080 tls=true :status=200 latency=812µs\n\
         end id=3:1 proxy=in  src=10.0.0.5:51234 dst=10.0.0.7:8080 tls=true duration=25µs response-length=13B\n"
    ));
    assert!(text.contains("proxy=out src=10.0.0.7:40000 dst=10.0.0.9:5432 tls=no_identity :status=201 latency=1.5s"));
    assert!(text.contains("grpc-status=NotFound"));
    golden("tap-text.txt", &text);
    let wide = rendered(TapOutput::Wide);
    assert!(wide.contains("client-id=client.demo.serviceaccount.identity.cnimesh.cluster.local"));
    golden("tap-wide.txt", &wide);
    let json = rendered(TapOutput::Json);
    let parsed: Vec<TapLine> = json.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(parsed, sample_lines(), "-o json is the relay's lines");
}

#[test]
fn durations_print_as_go_does() {
    assert_eq!(duration(0), "0µs");
    assert_eq!(duration(812), "812µs");
    assert_eq!(duration(1_000), "1ms");
    assert_eq!(duration(1_234), "1.234ms");
    assert_eq!(duration(25_500), "25.5ms");
    assert_eq!(duration(2_500_000), "2.5s");
}

fn filter(args: &[&str]) -> Filter {
    use clap::Parser;
    #[derive(Parser)]
    struct Test {
        #[command(flatten)]
        filter: Filter,
    }
    Test::try_parse_from(std::iter::once("test").chain(args.iter().copied())).unwrap().filter
}

#[test]
fn flags_make_the_relays_query() {
    let q = filter(&["deploy/web", "-n", "demo", "--to", "sts/db", "--method", "post", "--path", "/api"])
        .query(10, "elsewhere")
        .unwrap();
    assert_eq!(
        q.to_query_string(),
        "resource=deployment%2Fweb&namespace=demo&to=statefulset%2Fdb&to-namespace=demo&method=POST&path=%2Fapi&limit=10&max-rps=100"
    );
    let q = filter(&["deploy/web"]).query(0, "shop").unwrap();
    assert_eq!(q.namespace, "shop", "the default namespace is the caller's");
    let error = filter(&["deploy/web", "--path", "api"]).query(0, "shop").unwrap_err().to_string();
    assert!(error.contains("a path starts with '/'"), "{error}");
}

#[test]
fn egress_is_shown_and_filtered_by_hostname() {
    // The proxy labels a request to an EgressNetwork's destination with its hostname.
    let mut at = stream("0:7", "outbound", "10.244.0.20:40000", "203.0.113.10:80", "not_provided_by_service_discovery");
    for (k, v) in [("dst_kind", "egress"), ("egress_network", "shop/world"), ("dst_hostname", "api.example.test")] {
        at.destination_meta.insert(k.into(), v.into());
    }
    let line = TapLine { namespace: "shop".into(), pod: "client".into(), body: request(at, "GET", "/hello") };
    let text = render::line(&line, TapOutput::Text);
    assert!(text.contains(" dst=egress/api.example.test "), "{text}");
    assert!(!text.contains("203.0.113.10"), "the hostname stands for the address: {text}");
    let wide = render::line(&line, TapOutput::Wide);
    assert!(wide.contains("egress-network=shop/world dst-addr=203.0.113.10:80"), "{wide}");

    let q = filter(&["deploy/client", "-n", "shop", "--to", "egress/api.example.test"]).query(0, "x").unwrap();
    assert!(q.to_query_string().contains("to=egress%2Fapi.example.test"), "{}", q.to_query_string());
    let error = filter(&["egress/api.example.test"]).query(0, "shop").unwrap_err().to_string();
    assert!(error.contains("egress has no proxies to tap"), "{error}");
}

/// Requests the mocked API server saw: method, URI, JSON body.
type Seen = Arc<Mutex<Vec<(String, String, Value)>>>;

/// A mocked API server: the TokenRequest and the service proxy (answering `proxy`), recording
/// what was asked.
fn api(proxy: (u16, String)) -> (kube::Client, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = seen.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (seen, proxy) = (recorded.clone(), proxy.clone());
        async move {
            let (method, uri, path) = (req.method().to_string(), req.uri().to_string(), req.uri().path().to_string());
            let token = req.headers().get("cnimesh-tap-token").map(|v| v.to_str().unwrap().to_string());
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            seen.lock().push((method.clone(), uri.clone(), body.clone()));
            let (status, text) = if method == "POST" {
                assert_eq!(path, "/api/v1/namespaces/cnimesh/serviceaccounts/cnimesh-tap/token");
                let mut answer = body;
                answer["status"] = json!({"token": "minted", "expirationTimestamp": "2030-01-01T00:00:00Z"});
                (200, answer.to_string())
            } else {
                assert_eq!(token.as_deref(), Some("minted"), "the relay gets the minted token");
                proxy
            };
            let response = http::Response::builder().status(status).body(Full::new(Bytes::from(text))).unwrap();
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    (kube::Client::new(service, "default"), seen)
}

#[tokio::test]
async fn the_cluster_path_mints_a_token_and_reads_the_relay_through_the_service_proxy() {
    let json: String = sample_lines().iter().map(|l| render::line(l, TapOutput::Json)).collect();
    let (client, seen) = api((200, json));
    let reader = open_cluster(&client, "resource=deployment%2Fweb&namespace=demo").await.unwrap();
    let got: Vec<TapLine> = lines(Box::pin(reader)).map(|l| l.unwrap()).collect().await;
    assert_eq!(got, sample_lines());
    let seen = seen.lock();
    let token_request = &seen[0].2;
    assert_eq!(token_request["spec"]["audiences"], json!([cnimesh_common::names::TAP_TOKEN_AUDIENCE]));
    assert_eq!(token_request["spec"]["expirationSeconds"], json!(600));
    assert_eq!(
        seen[1].1,
        "/api/v1/namespaces/cnimesh/services/cnimesh-control:admin/proxy/tap?resource=deployment%2Fweb&namespace=demo"
    );
}

#[tokio::test]
async fn a_refusal_by_the_relay_is_reported_with_its_reason() {
    let (client, _) = api((403, "the token is the ServiceAccount demo/web's; tap needs cnimesh/cnimesh-tap\n".into()));
    let error = open_cluster(&client, "resource=deployment%2Fweb").await.err().unwrap().to_string();
    assert!(error.contains("tap needs cnimesh/cnimesh-tap") && error.contains("403"), "{error}");
}

#[tokio::test]
async fn a_line_that_is_not_an_event_is_an_error_naming_it() {
    let reader = futures::io::Cursor::new(b"{\"namespace\":\"a\"}\n\n".to_vec());
    let got: Vec<anyhow::Result<TapLine>> = lines(Box::pin(reader)).collect().await;
    assert_eq!(got.len(), 1);
    assert!(format!("{:#}", got[0].as_ref().unwrap_err()).contains("not a tap event: {\"namespace\":\"a\"}"));
}
