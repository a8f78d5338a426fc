//! The dashboard's API against the mocked API server and fixed metric text: stat and edges
//! answer exactly the JSON `cnimesh stat`/`edges -o json` print for the same readings (their
//! golden files), failures carry `cnimesh check`'s hints, and the server refuses a request
//! without this run's token, from another origin or with a foreign Host header, and anything but
//! GET.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use cnimesh_common::prom_text::samples;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;

use super::access::Access;
use super::api::{self, Shared, State};
use super::server;
use super::{DashboardArgs, Show};
use crate::ClusterArgs;
use crate::check::mock::MockApi;
use crate::stat::Readings;
use crate::stat::tests::{client_egress, client_metrics, mesh, mock_cluster as cluster, web_metrics};

fn args(local: Option<&Path>) -> DashboardArgs {
    DashboardArgs {
        local: local.map(Path::to_path_buf),
        address: "127.0.0.1".parse().unwrap(),
        allow_remote: false,
        port: 0,
        show: Show::Url,
        prometheus: None,
        prometheus_ca: None,
        namespace: None,
        interval: Duration::from_secs(5),
    }
}

fn state(api: &MockApi) -> State {
    Shared::with_client(ClusterArgs::default(), api.client(), &args(None)).unwrap()
}

/// stat's two readings 10 s apart (its tests' `scrapes()`), as the sampler records them.
fn readings() -> (Readings, Readings) {
    let before = BTreeMap::from([
        ("shop/web-1".to_string(), Ok(samples(&web_metrics("10.244.0.11", 500, 0, [50, 300, 450, 500, 500], 1)))),
        ("shop/web-2".to_string(), Ok(samples(&web_metrics("10.244.0.12", 0, 0, [0; 5], 0)))),
        ("shop/client".to_string(), Ok(samples(&client_metrics(1000, 100)))),
    ]);
    let after = BTreeMap::from([
        ("shop/web-1".to_string(), Ok(samples(&web_metrics("10.244.0.11", 598, 2, [60, 360, 540, 600, 600], 1)))),
        ("shop/web-2".to_string(), Ok(samples(&web_metrics("10.244.0.12", 100, 0, [0, 50, 90, 100, 100], 1)))),
        ("shop/client".to_string(), Ok(samples(&client_metrics(1200, 150)))),
    ]);
    (before, after)
}

async fn get(state: &State, uri: &str) -> (StatusCode, Value) {
    let (status, text) = get_text(state, uri).await;
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{uri}: {e}: {text}")))
}

/// The token of the dashboards these tests run.
const TOKEN: &str = "0123456789abcdef";

fn access() -> Access {
    Access::with_token("127.0.0.1:50750".parse().unwrap(), TOKEN)
}

/// The cookie the first load sets, as the browser sends it back.
fn cookie() -> String {
    format!("cnimesh-dashboard-50750={TOKEN}")
}

async fn get_text(state: &State, uri: &str) -> (StatusCode, String) {
    let request = Request::get(uri).header("host", "127.0.0.1:50750").header("cookie", cookie()).body(()).unwrap();
    let response = server::handle(state, &access(), request).await;
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// The envelope without the clock's fields, for golden files.
fn timeless(mut value: Value) -> Value {
    if let Value::Object(map) = &mut value {
        for key in ["observed_at", "observed_at_unix", "stale"] {
            map.remove(key);
        }
    }
    value
}

fn golden(name: &str, actual: &Value) {
    let actual = serde_json::to_string_pretty(actual).unwrap() + "\n";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/dashboard").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(actual, expected, "{name}: UPDATE_GOLDEN=1 cargo nextest run -p cnimesh-cli dashboard to refresh");
}

fn cli_golden(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[tokio::test]
async fn stat_and_edges_answer_what_the_cli_prints_with_o_json() {
    let state = state(&MockApi::default());
    let (before, after) = readings();
    let t0 = SystemTime::now() - Duration::from_secs(10);
    state.snapshot.lock().record(t0, Ok((mesh(), before)));
    let (status, body) = get(&state, "/api/stat?resource=deploy&namespace=shop").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "one reading has no window yet: {body}");
    assert!(body["hint"].as_str().unwrap().contains("two readings"), "{body}");
    state.snapshot.lock().record(t0 + Duration::from_secs(10), Ok((mesh(), after)));

    let (status, stat) = get(&state, "/api/stat?resource=deploy&namespace=shop").await;
    assert_eq!(status, StatusCode::OK, "{stat}");
    // `cnimesh stat deploy -n shop -o json` over the same two readings (stat's golden file).
    assert_eq!(stat["value"], cli_golden("stat-deploy.json"));
    assert_eq!(stat["stale"], false, "{stat}");
    assert_eq!(stat["interval_seconds"], 5.0);
    golden("stat.json", &timeless(stat));

    let (status, edges) = get(&state, "/api/edges?resource=deploy&namespace=shop").await;
    assert_eq!(status, StatusCode::OK, "{edges}");
    assert_eq!(edges["value"], cli_golden("edges-deploy.json"));
    golden("edges.json", &timeless(edges));

    let (_, to_legacy) = get(&state, "/api/stat?resource=deploy/client&namespace=shop&to=po/legacy").await;
    assert_eq!(
        (to_legacy["value"][0]["requests"].as_f64(), to_legacy["value"][0]["mtls_share"].as_f64()),
        (Some(50.0), Some(0.0))
    );

    let (_, history) = get(&state, "/api/history").await;
    let web = &history["value"]["shop/deployment/web"];
    assert_eq!(web.as_array().map(Vec::len), Some(1), "{history}");
    assert_eq!(web[0]["rps"], 20.0, "{history}");

    let (_, pods) = get(&state, "/api/pods?resource=deploy/web&namespace=shop").await;
    let names: Vec<&str> = pods["value"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["web-1", "web-2"]);
}

/// The page's egress (topology nodes, a workload's Egress table, `stat egress`) is the
/// CLI's own JSON for the same readings.
#[tokio::test]
async fn egress_answers_what_stat_egress_and_edges_print() {
    let state = state(&MockApi::default());
    let (mut before, mut after) = readings();
    before.insert("shop/client".into(), Ok(samples(&(client_metrics(1000, 100) + &client_egress(10, 2, 1)))));
    after.insert("shop/client".into(), Ok(samples(&(client_metrics(1200, 150) + &client_egress(30, 7, 4)))));
    let t0 = SystemTime::now() - Duration::from_secs(10);
    state.snapshot.lock().record(t0, Ok((mesh(), before.clone())));
    state.snapshot.lock().record(t0 + Duration::from_secs(10), Ok((mesh(), after.clone())));

    let (status, stat) = get(&state, "/api/stat?resource=egress&namespace=shop").await;
    assert_eq!(status, StatusCode::OK, "{stat}");
    let query = crate::stat::compute::Query {
        resource: "egress".parse().unwrap(),
        namespace: Some("shop".into()),
        from: None,
        to: None,
        window: Duration::from_secs(10),
    };
    let scrapes = crate::stat::join(before, &after);
    let rows = crate::stat::compute::egress_stat(&mesh(), &scrapes, &query);
    let printed = crate::stat::render::egress_stat(&rows, crate::stat::render::Output::Json, false);
    assert_eq!(stat["value"], serde_json::from_str::<Value>(&printed).unwrap());
    assert_eq!(
        (stat["value"][0]["name"].as_str(), stat["value"][0]["denied"].as_f64()),
        (Some("api.example.test"), Some(5.0))
    );

    let (_, edges) = get(&state, "/api/edges?resource=deploy&namespace=shop").await;
    let rows = edges["value"].as_array().unwrap();
    let egress = rows.iter().find(|e| e["dst"] == "egress/api.example.test").unwrap_or_else(|| panic!("{edges}"));
    assert_eq!(
        (egress["egress"]["network"].as_str(), egress["egress"]["denied"].as_f64()),
        (Some("shop/world"), Some(7.0))
    );
    assert!(!rows.iter().any(|e| e["dst"].as_str().unwrap().starts_with("203.0.113.10")), "{edges}");
}

/// The cluster path: one sampler round through the API server's pod proxy; the pod that cannot
/// be read is a problem on the page, with the hint `cnimesh check` gives for a proxy.
#[tokio::test]
async fn an_unreadable_pod_is_shown_with_checks_hint() {
    let state = state(&cluster());
    let t0 = SystemTime::now() - Duration::from_secs(5);
    for at in [t0, t0 + Duration::from_secs(5)] {
        let round = super::api::round(&state, at).await;
        state.snapshot.lock().record(at, round);
    }
    let (status, stat) = get(&state, "/api/stat?resource=deploy/web&namespace=shop").await;
    assert_eq!(status, StatusCode::OK, "{stat}");
    assert_eq!(stat["value"][0]["unreadable"][0].as_str().map(|p| p.starts_with("shop/web-2: ")), Some(true), "{stat}");
    assert_eq!(stat["problems"][0]["hint"], crate::check::proxy_hint("shop", "web-2"), "{stat}");
    assert!(stat["problems"][0]["error"].as_str().unwrap().contains("connection refused"), "{stat}");
    let (_, edges) = get(&state, "/api/edges?resource=deploy&namespace=shop").await;
    assert!(
        edges["value"].as_array().unwrap().iter().any(|e| e["dst"] == "deployment/web" && e["mtls"] == true),
        "{edges}"
    );
}

/// The cluster unreachable, RBAC refusing: each an error with check's hint, never numbers.
#[tokio::test]
async fn an_unreachable_cluster_and_rbac_refusals_carry_checks_hints() {
    let mut unreachable = cluster();
    unreachable.unreachable = true;
    let state = state(&unreachable);
    let round = super::api::round(&state, SystemTime::now()).await;
    state.snapshot.lock().record(SystemTime::now(), round);
    let (status, body) = get(&state, "/api/stat?resource=deploy").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["hint"], crate::check::UNREACHABLE_HINT, "{body}");
    assert!(body["error"].as_str().unwrap().contains("listing pods"), "{body}");
    golden("error-unreachable.json", &body);

    let mut refused = cluster();
    refused.fail(
        "/api/v1/pods",
        403,
        "pods is forbidden: User \"dev\" cannot list resource \"pods\" at the cluster scope",
    );
    let state = state_of(&refused);
    let round = super::api::round(&state, SystemTime::now()).await;
    state.snapshot.lock().record(SystemTime::now(), round);
    let (status, body) = get(&state, "/api/edges?resource=deploy").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["hint"], crate::check::RBAC_HINT, "{body}");
    golden("error-rbac.json", &body);

    // Good data followed by a failed round: still served, but stale and with the error.
    let state = state_of(&cluster());
    let (before, after) = readings();
    let t0 = SystemTime::now() - Duration::from_secs(10);
    state.snapshot.lock().record(t0, Ok((mesh(), before)));
    state.snapshot.lock().record(t0 + Duration::from_secs(10), Ok((mesh(), after)));
    let failed = super::api::round(
        &super::api::Shared::with_client(ClusterArgs::default(), unreachable.client(), &args(None)).unwrap(),
        SystemTime::now(),
    )
    .await;
    state.snapshot.lock().record(SystemTime::now(), failed);
    let (status, body) = get(&state, "/api/stat?resource=deploy&namespace=shop").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["stale"].as_bool(), body["error"]["hint"].as_str()),
        (Some(true), Some(crate::check::UNREACHABLE_HINT)),
        "{body}"
    );
}

fn state_of(api: &MockApi) -> State {
    state(api)
}

/// `/api/check` is `cnimesh check -o json`; local mode has no API server to check, and says so.
#[tokio::test]
async fn check_answers_checks_report_and_local_mode_is_a_cluster_too() {
    let mut unreachable = MockApi::default();
    unreachable.unreachable = true;
    let (status, body) = get(&state(&unreachable), "/api/check").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["value"]["success"], false);
    let first = &body["value"]["checks"][0];
    assert_eq!(
        (first["status"].as_str(), first["hint"].as_str()),
        (Some("fail"), Some(crate::check::UNREACHABLE_HINT))
    );

    let dir = tempfile::tempdir().unwrap();
    let local = Shared::with_client(ClusterArgs::default(), unreachable.client(), &args(Some(dir.path()))).unwrap();
    let (status, body) = get(&local, "/api/check").await;
    assert_eq!(status, StatusCode::OK, "local mode's API server is checked as a cluster's: {body}");
    let (_, meta) = get(&local, "/api/meta").await;
    assert_eq!(meta["mode"], "local");
}

#[tokio::test]
async fn bad_parameters_are_named() {
    let state = state(&MockApi::default());
    let (before, after) = readings();
    state.snapshot.lock().record(SystemTime::now(), Ok((mesh(), before)));
    state.snapshot.lock().record(SystemTime::now(), Ok((mesh(), after)));
    let (status, body) = get(&state, "/api/stat?resource=widgets/x").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"].as_str().unwrap().contains("\"widgets/x\""), "{body}");
    let (status, body) = get(&state, "/api/diagnostics/secrets?pod=web-1").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body["error"].as_str().unwrap().contains("\"secrets\""), "{body}");
    let (status, body) = get(&state, "/api/tap?resource=deploy/web&max_rps=lots").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"].as_str().unwrap().contains("\"lots\""), "{body}");
    assert_eq!(get(&state, "/api/nope").await.0, StatusCode::NOT_FOUND);
}

/// DNS rebinding: a page elsewhere whose name now points at 127.0.0.1 sends its own Host; and
/// the dashboard only reads.
#[tokio::test]
async fn a_foreign_host_header_and_writes_are_refused() {
    let state = state(&MockApi::default());
    let request = |method: &str, host: &str| {
        Request::builder()
            .method(method)
            .uri("/api/meta")
            .header("host", host)
            .header("cookie", cookie())
            .body(())
            .unwrap()
    };
    for host in ["127.0.0.1:50750", "localhost:50750", "LOCALHOST:50750", "[::1]:50750"] {
        assert_eq!(server::handle(&state, &access(), request("GET", host)).await.status(), StatusCode::OK, "{host}");
    }
    for host in ["evil.example:50750", "127.0.0.1:8080", "localhost", ""] {
        let response = server::handle(&state, &access(), request("GET", host)).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{host}");
    }
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        let response = server::handle(&state, &access(), request(method, "127.0.0.1:50750")).await;
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED, "{method}");
        assert_eq!(response.headers()["allow"], "GET, HEAD");
    }
}

/// Another local user, or a script that never saw the printed URL, has no token: neither the page
/// nor the API (a tap) answers it, whatever token it guesses.
#[tokio::test]
async fn a_request_without_this_runs_token_is_refused() {
    let state = state(&MockApi::default());
    let cases: [(&str, &[(&str, &str)]); 8] = [
        ("/", &[]),
        ("/api/tap?resource=deploy/web&namespace=shop", &[]),
        ("/api/topology?namespace=shop&range=15m", &[]),
        ("/api/routes?resource=deploy/client&namespace=shop", &[]),
        ("/app.js", &[]),
        ("/api/meta", &[("cookie", "cnimesh-dashboard-50750=0123456789abcdee")]),
        ("/api/meta", &[("cookie", "cnimesh-dashboard-8888=0123456789abcdef")]),
        ("/api/meta?token=guess", &[("authorization", "Bearer 0123")]),
    ];
    for (uri, headers) in cases {
        let mut request = Request::get(uri).header("host", "127.0.0.1:50750");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = server::handle(&state, &access(), request.body(()).unwrap()).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{uri} {headers:?}");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert!(body["hint"].as_str().unwrap().contains("the URL `cnimesh dashboard` printed"), "{body}");
    }
}

/// The printed URL's token is traded for a cookie scoped to this port, and the browser is sent
/// to the same page without it; the cookie, or a Bearer header, then opens the API.
#[tokio::test]
async fn the_printed_urls_token_becomes_a_strict_cookie_and_leaves_the_address_bar() {
    let state = state(&MockApi::default());
    assert_eq!(access().url("127.0.0.1:50750".parse().unwrap()), format!("http://127.0.0.1:50750/?token={TOKEN}"));
    let request = Request::get(format!("/api/meta?namespace=shop&token={TOKEN}"))
        .header("host", "localhost:50750")
        .body(())
        .unwrap();
    let response = server::handle(&state, &access(), request).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()["location"], "/api/meta?namespace=shop");
    assert_eq!(
        response.headers()["set-cookie"],
        format!("cnimesh-dashboard-50750={TOKEN}; Path=/; HttpOnly; SameSite=Strict")
    );
    // A path that starts with `//` would name another host in Location.
    let request = Request::get(format!("//evil.example/?token={TOKEN}")).header("host", "localhost:50750");
    let response = server::handle(&state, &access(), request.body(()).unwrap()).await;
    assert_eq!(response.headers()["location"], "/evil.example/");
    let bearer = Request::get("/api/meta")
        .header("host", "localhost:50750")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(())
        .unwrap();
    assert_eq!(server::handle(&state, &access(), bearer).await.status(), StatusCode::OK);
    assert_eq!(get(&state, "/api/meta").await.0, StatusCode::OK);
}

/// A page the operator visits elsewhere, even on another port of 127.0.0.1 (same site for the
/// browser, so the cookie rides along), cannot make the dashboard tap: its fetches carry its own
/// Origin, and its images and scripts a cross-site or same-site Sec-Fetch-Site. The headers are
/// those Chromium sends.
#[tokio::test]
async fn another_origins_page_cannot_use_the_operators_dashboard() {
    let state = state(&MockApi::default());
    let cases: [&[(&str, &str)]; 5] = [
        &[("origin", "http://evil.example"), ("sec-fetch-site", "cross-site")],
        &[("origin", "http://127.0.0.1:8888"), ("sec-fetch-site", "same-site")],
        &[("origin", "null")],
        &[("sec-fetch-site", "same-site"), ("sec-fetch-mode", "no-cors")],
        &[("sec-fetch-site", "cross-site"), ("sec-fetch-dest", "image")],
    ];
    let paths = [
        "/api/tap?resource=deploy/web&namespace=shop",
        "/api/topology?namespace=shop&range=1m",
        "/api/routes?resource=deploy/client&namespace=shop",
    ];
    for (headers, path) in cases.iter().flat_map(|h| paths.iter().map(move |p| (h, p))) {
        let mut request = Request::get(*path).header("host", "127.0.0.1:50750").header("cookie", cookie());
        for (name, value) in headers.iter() {
            request = request.header(*name, *value);
        }
        let response = server::handle(&state, &access(), request.body(()).unwrap()).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{path} {headers:?}");
    }
    // The dashboard's own page: same-origin fetches, with or without an Origin header.
    for headers in [&[("sec-fetch-site", "same-origin")][..], &[("origin", "http://127.0.0.1:50750")]] {
        let mut request = Request::get("/api/meta").header("host", "127.0.0.1:50750").header("cookie", cookie());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        assert_eq!(server::handle(&state, &access(), request.body(()).unwrap()).await.status(), StatusCode::OK);
    }
}

/// Over a real socket: the page and its files, kept to themselves by their headers, small.
#[tokio::test]
async fn the_page_is_served_from_the_binary_with_a_strict_policy() {
    let state = state(&MockApi::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bound = listener.local_addr().unwrap();
    let tasks = tokio::task::LocalSet::new();
    tasks
        .run_until(async move {
            tokio::task::spawn_local(server::serve(listener, Access::with_token(bound, TOKEN), state));
            let files = [
                ("/", "text/html"),
                ("/app.js", "text/javascript"),
                ("/style.css", "text/css"),
                ("/favicon.svg", "image/svg+xml"),
                ("/favicon.ico", "image/svg+xml"),
            ];
            for (path, kind) in files {
                let (status, headers, body) = raw_get(bound, path, &bound.to_string()).await;
                assert_eq!(status, 200, "{path}");
                assert!(headers.contains(&format!("content-type: {kind}")), "{path}: {headers}");
                assert!(headers.contains("content-security-policy: default-src 'self'"), "{headers}");
                // Nothing is loaded from elsewhere: no script, style or module source off this
                // origin (the bundled libraries' licence comments may name their home pages).
                let compact: String = body.split_whitespace().collect();
                for load in [
                    "src=\"http",
                    "href=\"http",
                    "src='http",
                    "from\"http",
                    "from'http",
                    "import(\"http",
                    "url(http",
                    "@import\"http",
                ] {
                    assert!(!compact.contains(load), "{path} loads from elsewhere ({load})");
                }
            }
            let (status, _, body) = raw_get(bound, "/api/meta", "rebound.example").await;
            assert_eq!(status, 403, "{body}");
        })
        .await;
    // The page's script with the graph layout libraries, minified.
    let size: usize = ["/app.js", "/style.css"].iter().map(|p| super::assets::get(p).unwrap().1.len()).sum();
    assert!(size < 800 * 1024, "JS + CSS are {size} bytes");
}

/// A GET over a plain socket: status, lower-cased headers, body.
async fn raw_get(addr: std::net::SocketAddr, path: &str, host: &str) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let cookie = format!("cnimesh-dashboard-{}={TOKEN}", addr.port());
    let head = format!("GET {path} HTTP/1.1\r\nhost: {host}\r\ncookie: {cookie}\r\nconnection: close\r\n\r\n");
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut text = String::new();
    tcp.read_to_string(&mut text).await.unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_lowercase(), body.to_string())
}

#[test]
fn query_strings_are_decoded() {
    let p = api::params(Some("resource=deploy%2Fweb&path=%2Fa+b&empty&method=GET"));
    assert_eq!(p["resource"], "deploy/web");
    assert_eq!(p["path"], "/a b");
    assert_eq!(p["empty"], "");
}

/// The desktop's opener is handed a page only this user can read, never the URL with the token
/// (a command line is readable by every user of the host).
#[test]
fn the_page_handed_to_the_opener_is_private_and_leads_to_the_url() {
    use std::os::unix::fs::PermissionsExt;
    let url = format!("http://127.0.0.1:50750/?token={TOKEN}");
    let page = super::redirect_page(&url).unwrap();
    let mode = std::fs::metadata(&page).unwrap().permissions().mode() & 0o777;
    let text = std::fs::read_to_string(&page).unwrap();
    std::fs::remove_file(&page).unwrap();
    assert_eq!(mode, 0o600);
    assert!(!page.to_string_lossy().contains(TOKEN), "{}", page.display());
    assert!(text.contains(&format!("content=\"0;url={url}\"")), "{text}");
}

#[tokio::test]
async fn a_non_loopback_address_needs_allow_remote() {
    let mut a = args(None);
    a.address = "0.0.0.0".parse().unwrap();
    let e = super::main(&ClusterArgs::default(), a, &mut Vec::new()).await.unwrap_err();
    assert!(e.to_string().contains("--address 0.0.0.0: not a loopback address"), "{e}");
}

/// The live tap goes the way `cnimesh tap` does: a token for `cnimesh/cnimesh-tap` from a
/// TokenRequest, then the relay through the API server; when that is refused, the page says what
/// `cnimesh tap` needs (it never taps by another way).
#[tokio::test]
async fn the_tap_asks_for_the_same_token_as_cnimesh_tap() {
    let state = state(&MockApi::default());
    let (status, body) = get(&state, "/api/tap?resource=deploy/web&namespace=shop").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body["error"].as_str().unwrap().contains("a token for the ServiceAccount cnimesh/cnimesh-tap"), "{body}");
    assert_eq!(body["hint"], api::TAP_HINT, "{body}");
}

/// The client's other outbound traffic, cumulative after `n` rounds: 403s and 429s from web,
/// calls to an address outside the mesh, and a route splitting web's traffic 90/10 with a canary.
fn client_extra(n: u64) -> String {
    let web =
        "direction=\"outbound\",target_addr=\"10.96.0.10:80\",authority=\"web.shop.svc.cluster.local\",tls=\"true\"";
    let outside = "direction=\"outbound\",target_addr=\"10.1.2.3:443\",tls=\"false\"";
    let route = "parent_namespace=\"shop\",parent_name=\"web\",route_name=\"split\"";
    format!(
        "response_total{{{web},status_code=\"403\",classification=\"failure\"}} {}\n\
         response_total{{{web},status_code=\"429\",classification=\"failure\"}} {}\n\
         request_total{{{outside}}} {}\n\
         response_total{{{outside},status_code=\"200\",classification=\"success\"}} {}\n\
         outbound_http_route_backend_requests_total{{{route},backend_namespace=\"shop\",backend_name=\"web\"}} {}\n\
         outbound_http_route_backend_requests_total{{{route},backend_namespace=\"shop\",backend_name=\"web-canary\"}} {}\n\
         outbound_http_route_request_duration_seconds_bucket{{{route},le=\"0.005\"}} {}\n\
         outbound_http_route_request_duration_seconds_bucket{{{route},le=\"0.01\"}} {}\n\
         outbound_http_route_request_duration_seconds_bucket{{{route},le=\"+Inf\"}} {}\n\
         outbound_http_route_request_duration_seconds_count{{{route}}} {}\n\
         outbound_http_route_request_statuses_total{{{route},http_status=\"200\",error=\"\"}} {}\n\
         outbound_http_route_request_statuses_total{{{route},http_status=\"503\",error=\"\"}} {}\n",
        3 * n,
        5 * n,
        7 * n,
        7 * n,
        90 * n,
        10 * n,
        50 * n,
        100 * n,
        100 * n,
        100 * n,
        95 * n,
        5 * n
    )
}

/// A state whose sampler recorded `rounds` readings 15 s apart (the last one now): the client's
/// counters grow by `client_extra(1)` and 200 requests to web each round.
fn recorded(rounds: u64) -> State {
    let state = state(&MockApi::default());
    let start = SystemTime::now() - Duration::from_secs(15 * (rounds - 1));
    for i in 0..rounds {
        let client = client_metrics(1000 + 200 * i, 100 + 50 * i) + &client_extra(i);
        let readings = BTreeMap::from([
            ("shop/web-1".to_string(), Ok(samples(&web_metrics("10.244.0.11", 500 + 100 * i, 0, [0; 5], 1)))),
            ("shop/web-2".to_string(), Ok(samples(&web_metrics("10.244.0.12", 500 + 100 * i, 0, [0; 5], 1)))),
            ("shop/client".to_string(), Ok(samples(&client))),
        ]);
        state.snapshot.lock().record(start + Duration::from_secs(15 * i), Ok((mesh(), readings)));
    }
    state
}

/// The topology in one answer: an address outside the mesh is an address node (the page asks
/// nothing about it), denials (403) and rate-limited requests (429) are counted on the edge that
/// got them, and a route's canary backend is drawn with its share.
#[tokio::test]
async fn the_topology_shows_addresses_denials_rate_limits_and_split_backends() {
    let state = recorded(3);
    let (status, body) = get(&state, "/api/topology?namespace=shop").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let graph = &body["value"];
    let node = |id: &str| graph["nodes"].as_array().unwrap().iter().find(|n| n["id"] == id).cloned();
    let edge = |id: &str| graph["edges"].as_array().unwrap().iter().find(|e| e["id"] == id).cloned();
    assert_eq!(graph["namespaces"], serde_json::json!(["shop"]));

    let address = node("address:10.1.2.3:443").unwrap_or_else(|| panic!("{graph:#}"));
    assert_eq!((address["kind"].as_str(), address["label"].as_str()), (Some("address"), Some("10.1.2.3:443")));
    let to_address = edge("shop/deployment/client>address:10.1.2.3:443").unwrap_or_else(|| panic!("{graph:#}"));
    assert_eq!(to_address["kind"], "plaintext");

    // The last window (15 s): 3 denied and 5 rate-limited of web's 208 responses.
    let web = edge("shop/deployment/client>shop/deployment/web").unwrap_or_else(|| panic!("{graph:#}"));
    assert_eq!((web["kind"].as_str(), web["mtls"].as_bool()), (Some("mtls"), Some(true)), "{web:#}");
    assert_eq!((web["traffic"]["denied"].as_f64(), web["traffic"]["rate_limited"].as_f64()), (Some(3.0), Some(5.0)));
    assert_eq!(web["traffic"]["responses"], 208.0, "{web:#}");
    assert_eq!(web["traffic"]["success_rate"], 200.0 / 208.0, "403s and 429s are not successes: {web:#}");

    let canary = node("service:shop/web-canary").unwrap_or_else(|| panic!("{graph:#}"));
    assert_eq!(canary["kind"], "service");
    let split = edge("shop/deployment/client>service:shop/web-canary|split").unwrap_or_else(|| panic!("{graph:#}"));
    assert_eq!((split["kind"].as_str(), split["split"]["share"].as_f64()), (Some("split"), Some(0.1)), "{split:#}");

    // Every workload is a node with its inbound golden metrics, called or not.
    let web_node = node("shop/deployment/web").unwrap();
    assert_eq!((web_node["kind"].as_str(), web_node["meshed"].as_bool()), (Some("workload"), Some(true)));
    assert!(web_node["rps"].as_f64().unwrap() > 0.0, "{web_node:#}");
    assert!(node("shop/pod/legacy").is_some(), "{graph:#}");

    // Another namespace has none of these.
    let (_, other) = get(&state, "/api/topology?namespace=elsewhere").await;
    assert_eq!(other["value"]["edges"], serde_json::json!([]), "{other}");
}

/// A time range's rates come from the kept reading that starts it: over 1m (five readings 15 s
/// apart) the window is 60 s; a range longer than the dashboard has run is what there is.
#[tokio::test]
async fn a_time_range_spans_the_readings_kept_for_it() {
    let state = recorded(5);
    let (status, last) = get(&state, "/api/stat?resource=deploy/client&namespace=shop&to=deploy/web").await;
    assert_eq!(status, StatusCode::OK, "{last}");
    assert_eq!(last["value"][0]["requests"], 208.0, "the last window: {last}");
    let (_, minute) = get(&state, "/api/stat?resource=deploy/client&namespace=shop&to=deploy/web&range=1m").await;
    assert_eq!(minute["value"][0]["requests"], 4.0 * 208.0, "{minute}");
    assert_eq!(minute["value"][0]["rps"], 4.0 * 208.0 / 60.0, "{minute}");
    let (_, topology) = get(&state, "/api/topology?namespace=shop&range=15m").await;
    assert_eq!(topology["window_seconds"], 60.0, "only a minute was kept: {topology}");
    let web = topology["value"]["edges"].as_array().unwrap().iter().find(|e| e["target"] == "shop/deployment/web");
    assert_eq!(web.map(|e| e["traffic"]["denied"].clone()), Some(12.0.into()), "{topology}");
}

/// Bad filter values are refused with a 400 that names the parameter, never passed on: a
/// namespace that is no namespace name never reaches a filter, a tap query or an API server's
/// path (here a path that would step out of the namespace asked for).
#[tokio::test]
async fn a_namespace_or_range_that_is_not_one_is_refused_before_any_api_server_call() {
    let mut mock = MockApi::default();
    mock.rbac = Some(Vec::new());
    let state = state(&mock);
    let (before, after) = readings();
    let t0 = SystemTime::now() - Duration::from_secs(10);
    state.snapshot.lock().record(t0, Ok((mesh(), before)));
    state.snapshot.lock().record(t0 + Duration::from_secs(10), Ok((mesh(), after)));
    let injected = "kube-system%2Fsecrets%2Fx%2F..";
    for uri in [
        format!("/api/diagnostics/metrics?pod=web-1&namespace={injected}"),
        format!("/api/authz?resource=deploy/web&namespace={injected}"),
        format!("/api/tap?resource=deploy/web&namespace={injected}"),
        format!("/api/tap?resource=deploy/web&namespace=shop&to=deploy/web&to_namespace={injected}"),
        format!("/api/stat?resource=deploy&namespace={injected}"),
        format!("/api/topology?namespace={injected}"),
        "/api/topology?namespace=Shop".to_string(),
        "/api/pods?resource=deploy/web&namespace=a,b".to_string(),
    ] {
        let (status, body) = get(&state, &uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
        assert!(body["error"].as_str().unwrap().contains("not a namespace name"), "{uri}: {body}");
    }
    assert_eq!(*mock.forbidden.lock(), Vec::<String>::new(), "no request reached the API server");
    for uri in ["/api/topology?range=2h", "/api/stat?resource=deploy&range=-1m", "/api/topology?range=1m%0A"] {
        let (status, body) = get(&state, uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
        assert!(body["error"].as_str().unwrap().contains("expected 1m, 5m or 15m"), "{uri}: {body}");
    }
}

/// A workload's routes over the range: requests, success and latency from the route families,
/// and each backend's requests (the split's shares).
#[tokio::test]
async fn a_workloads_routes_have_success_latency_and_backends() {
    let state = recorded(2);
    let (status, body) = get(&state, "/api/routes?resource=deploy/client&namespace=shop").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let route = &body["value"]["routes"][0];
    assert_eq!((route["parent"].as_str(), route["route"].as_str()), (Some("shop/web"), Some("split")), "{body}");
    assert_eq!((route["requests"].as_f64(), route["success_rate"].as_f64()), (Some(100.0), Some(0.95)), "{body}");
    assert_eq!(route["latency_ms"]["p50"], 5.0, "{body}");
    assert!((route["latency_ms"]["p99"].as_f64().unwrap() - 9.9).abs() < 1e-9, "{body}");
    let backends: Vec<(&str, f64)> = body["value"]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["backend"].as_str().unwrap(), b["requests"].as_f64().unwrap()))
        .collect();
    assert_eq!(backends, [("shop/web", 90.0), ("shop/web-canary", 10.0)]);
}
