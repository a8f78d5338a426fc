//! `cnimesh dashboard` in a real browser: local mode's demo runs (with traffic sent from the test
//! all along), the dashboard serves it (`--local DIR --port 0 --show url`), and Debian's headless
//! chromium, driven through chromedriver's WebDriver API, loads each page: the topology shows the
//! client→web edge with the mTLS lock and the plaintext edge to the unmeshed pod; the workloads
//! table's numbers for web match `cnimesh stat -o json`; a live tap shows requests arriving; the
//! intruder's denied requests show in web's authorization panel; the sort buttons are reached by
//! keyboard. A second instance puts web's Server in audit mode and rate-limits it (files the
//! control plane watches), and web's page shows the would-be denials and the 429s while the
//! intruder's requests reach the app. A third serves a generated namespace of 50 workloads and
//! 150 edges from the mocked API server and checks the topology's layout (no overlapping labels),
//! zoom, filters and console. Screenshots of every page go to
//! `target/test-artefacts/dashboard/` (`CNIMESH_UPDATE_DOCS=1` also copies the topology, the
//! 50-workload topology and the workload ones to `docs/images/`).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cnimesh_e2e::local_mode::LocalMode;
use cnimesh_e2e::webdriver::{Browser, require_browser};
use cnimesh_e2e::{local_bins, require_root};
use serde_json::{Value, json};

const CLI: &str = env!("CARGO_BIN_EXE_cnimesh-cli-e2e");
/// How long a page may take to show what the test waits for (the sampler needs two readings).
const PAGE: Duration = Duration::from_secs(60);

/// Local mode with names of its own (`cnmd…`, not local_mode.rs's `cnml…`), down on drop.
fn local() -> LocalMode {
    let pid = std::process::id();
    LocalMode::new(format!("cnmd{:x}", pid & 0xffff), format!("10.246.{}.0/24", 100 + pid % 100), local_bins!())
}

/// The demo's traffic, sent until dropped: the client to web (mTLS) and to legacy (plaintext),
/// the intruder to web (denied by policy).
struct Traffic {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(local: &LocalMode) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flows: [(&str, &str, &str, usize); 3] = [
            ("client", "10.96.0.10:80", "web", 2),
            ("client", "10.96.0.20:80", "legacy", 1),
            ("intruder", "10.96.0.10:80", "web", 1),
        ];
        let threads = flows
            .into_iter()
            .map(|(pod, addr, host, concurrency)| {
                let (netns, stop) = (local.netns(pod), stop.clone());
                let addr: SocketAddr = addr.parse().unwrap();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        cnimesh_local::traffic::load(&netns, addr, host, concurrency, Duration::from_secs(1));
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `cnimesh dashboard` as a process, killed on drop; `url` is what it printed.
struct Dashboard {
    child: Child,
    url: String,
}

impl Dashboard {
    fn start(local: &LocalMode) -> Self {
        Self::start_with(&["--local".as_ref(), local.root.as_os_str()])
    }

    /// `cnimesh dashboard ARGS --port 0 --show url --interval 2s`.
    fn start_with(args: &[&std::ffi::OsStr]) -> Self {
        let mut child = Command::new(CLI)
            .arg("dashboard")
            .args(args)
            .args(["--port", "0", "--show", "url", "--interval", "2s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let url = line.trim().strip_prefix("cnimesh dashboard: ").unwrap_or_else(|| panic!("printed {line:?}"));
        let token = url.strip_prefix("http://127.0.0.1:").and_then(|rest| rest.split_once("/?token=")).map(|t| t.1);
        assert!(token.is_some_and(|t| t.len() == 64), "{url}: the page with this run's token");
        Self { url: url.to_string(), child }
    }
}

impl Dashboard {
    /// The status a plain client gets for `path` without the token, as another local user would.
    fn status_without_token(&self, path: &str) -> u16 {
        use std::io::{Read, Write};
        let addr = self.url.trim_start_matches("http://").split('/').next().unwrap();
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        write!(tcp, "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        tcp.read_to_string(&mut text).unwrap();
        text.split(' ').nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn artefacts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-artefacts/dashboard")
}

fn shoot(browser: &Browser, name: &str) {
    let path = browser.screenshot(&artefacts().join(format!("{name}.png"))).unwrap();
    eprintln!("screenshot: {}", path.display());
    if std::env::var_os("CNIMESH_UPDATE_DOCS").is_some() && ["topology", "workload", "topology-50"].contains(&name) {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../docs/images/dashboard-{name}.png"));
        std::fs::copy(&path, docs).unwrap();
    }
}

#[test]
fn the_dashboard_shows_the_local_demo_live_in_a_real_browser() {
    let test = "the_dashboard_shows_the_local_demo_live_in_a_real_browser";
    if !require_root(test) || !require_browser(test) {
        return;
    }
    let local = local();
    local.up();
    let traffic = Traffic::start(&local);
    let dashboard = Dashboard::start(&local);
    // Without the printed URL's token, neither the page nor a tap answers.
    assert_eq!(dashboard.status_without_token("/"), 401);
    assert_eq!(dashboard.status_without_token("/api/tap?resource=deploy/web&namespace=demo"), 401);
    let browser = Browser::start(1400, 1000).unwrap();

    // Topology: client→web over mTLS, client→legacy drawn as plaintext, rates filled in.
    browser.goto(&format!("{}#/topology", dashboard.url)).unwrap();
    let edges = browser
        .wait_for(
            "the topology's edges with rates",
            PAGE,
            r#"const cy = window.cnimeshTopology;
               if (!cy) return null;
               const edges = cy.edges().map((e) => ({ source: e.data("source"), target: e.data("target"),
                 kind: e.data("kind"), rps: e.data("traffic").rps, label: e.data("text"),
                 dash: e.style("line-style") }));
               const web = edges.find((e) => e.source === "demo/deployment/client" && e.target === "demo/deployment/web");
               const legacy = edges.find((e) => e.source === "demo/deployment/client" && e.target === "demo/pod/legacy");
               return web && legacy && web.rps > 0 ? edges : null;"#,
        )
        .unwrap();
    let edge = |dst: &str| {
        edges
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["source"] == "demo/deployment/client" && e["target"] == dst)
            .unwrap()
            .clone()
    };
    let web = edge("demo/deployment/web");
    assert_eq!(web["kind"], "mtls", "{edges:#}");
    assert!(web["label"].as_str().unwrap().starts_with("mTLS · "), "{web:#}");
    assert_eq!(web["dash"], "solid", "{web:#}");
    let legacy = edge("demo/pod/legacy");
    assert_eq!(legacy["kind"], "plaintext", "{edges:#}");
    assert!(legacy["label"].as_str().unwrap().starts_with("plaintext"), "{legacy:#}");
    assert_eq!(legacy["dash"], "dashed", "plaintext edges are dashed: {legacy:#}");
    // The edges' table links each workload to its page.
    let node_link = browser
        .execute(
            r##"return document.querySelector('table.edges a[href="#/workload/demo/deployment/web"]').getAttribute("href")"##,
            json!([]),
        )
        .unwrap();
    assert_eq!(node_link, "#/workload/demo/deployment/web");
    shoot(&browser, "topology");

    // Workloads: web's RPS and success next to `cnimesh stat -o json`'s, read meanwhile.
    browser.goto(&format!("{}#/workloads", dashboard.url)).unwrap();
    let read_row = r#"const row = document.querySelector('tr[data-workload="demo/deployment/web"]');
        if (!row || document.body.dataset.stale === "true") return null;
        const rps = parseFloat(row.querySelector('[data-col="rps"]').textContent);
        return rps > 0 ? { rps, success: row.querySelector('[data-col="success"]').textContent,
                           spark: !!row.querySelector("svg.spark") } : null;"#;
    browser.wait_for("web's row with traffic", PAGE, read_row).unwrap();
    let stat = Command::new(CLI)
        .args(["stat", "deploy", "-n", "demo", "--window", "4s", "-o", "json", "--local"])
        .arg(&local.root)
        .output()
        .unwrap();
    assert!(stat.status.success(), "{}", String::from_utf8_lossy(&stat.stderr));
    let row_now = browser.execute(read_row, json!([])).unwrap();
    let stat: Value = serde_json::from_slice(&stat.stdout).unwrap();
    let cli = stat.as_array().unwrap().iter().find(|r| r["name"] == "web").unwrap_or_else(|| panic!("{stat:#}"));
    let (page_rps, cli_rps) = (row_now["rps"].as_f64().unwrap(), cli["rps"].as_f64().unwrap());
    // The same traffic measured over neighbouring windows: close, not equal.
    assert!((page_rps - cli_rps).abs() <= (cli_rps * 0.5).max(2.0), "page {page_rps} rps, stat {cli_rps} rps");
    assert_eq!(cli["success_rate"], 1.0, "{cli:#}");
    assert_eq!(row_now["success"], "100.00%", "{row_now:#}");
    assert_eq!(row_now["spark"], true);
    // Keyboard: Tab reaches a sort button, Enter sorts by it.
    let mut reached = false;
    for _ in 0..40 {
        browser.press("\u{E004}").unwrap();
        let active =
            browser.execute("return document.activeElement.matches('th button[data-sort]')", json!([])).unwrap();
        if active == true {
            reached = true;
            break;
        }
    }
    assert!(reached, "no sort button reached by Tab");
    browser.press("\u{E007}").unwrap();
    let sorted =
        browser.execute("return document.activeElement.closest('th').getAttribute('aria-sort')", json!([])).unwrap();
    assert!(sorted == "ascending" || sorted == "descending", "{sorted}");
    shoot(&browser, "workloads");

    // Workload detail: the intruder's requests denied, by client identity and by policy.
    browser.goto(&format!("{}#/workload/demo/deployment/web", dashboard.url)).unwrap();
    let denied = browser
        .wait_for(
            "the intruder denied in web's authorization panel",
            PAGE,
            r#"const row = [...document.querySelectorAll('#authorization tr[data-client]')]
                 .find((r) => r.dataset.client.startsWith("intruder.demo."));
               const policy = [...document.querySelectorAll('#authorization tr[data-denied]:not([data-client])')]
                 .some((r) => Number(r.dataset.denied) > 0);
               return row && Number(row.dataset.denied) > 0 && policy ? row.dataset.denied : null;"#,
        )
        .unwrap();
    assert!(denied.as_str().unwrap().parse::<f64>().unwrap() > 0.0);
    // Waited for, not read once: a proxy's admin page may miss one refresh on a loaded machine.
    let pods = browser
        .wait_for(
            "web's three proxies healthy",
            PAGE,
            r#"const n = [...document.querySelectorAll("td.ok")].filter((t) => t.textContent === "healthy").length;
               return n === 3 ? n : null;"#,
        )
        .unwrap();
    assert_eq!(pods, 3, "web's three proxies are healthy");
    shoot(&browser, "workload");

    // The client's routes: web's HTTPRoute with its success and latency over the range, and the
    // split's requests per backend (web and web-canary).
    browser.goto(&format!("{}#/workload/demo/deployment/client", dashboard.url)).unwrap();
    let routes = browser
        .wait_for(
            "the client's routes with success, latency and backends",
            PAGE,
            r#"const row = document.querySelector('table[aria-label="Routes"] tr[data-route]');
               const backends = [...document.querySelectorAll('table[aria-label="Routes by backend"] tr[data-backend]')]
                 .map((r) => r.dataset.backend);
               if (!row || backends.length < 2) return null;
               const cells = [...row.cells].map((c) => c.textContent);
               return cells[4] !== "-" && cells[5] !== "-" ? { cells, backends } : null;"#,
        )
        .unwrap();
    let backends = routes["backends"].as_array().unwrap();
    assert!(backends.iter().any(|b| b == "demo/web-canary") && backends.iter().any(|b| b == "demo/web"), "{routes:#}");
    assert!(routes["cells"][4].as_str().unwrap().ends_with('%'), "success: {routes:#}");
    shoot(&browser, "routes");

    // Live tap: start it, requests arrive; stop it.
    browser.goto(&format!("{}#/tap?resource=deploy/web&namespace=demo", dashboard.url)).unwrap();
    browser.wait_for("the tap form", PAGE, "return document.querySelector('#tap-start')").unwrap();
    browser.click(&browser.find("#tap-start").unwrap()).unwrap();
    // One row per request, completed by its response (status, latency).
    let seen = browser
        .wait_for(
            "tapped requests",
            PAGE,
            r#"const done = [...document.querySelectorAll('#tap-lines tr[data-type="request"][data-done="true"]')];
               const top = [...document.querySelectorAll("table[aria-label^='Requests aggregated'] tbody tr")].length;
               return done.length >= 3 && top > 0
                 ? done.map((r) => ({ status: r.dataset.status, latency: r.querySelector('[data-cell="latency"]').textContent }))
                 : null;"#,
        )
        .unwrap();
    let rows = seen.as_array().unwrap();
    assert!(rows.len() >= 3 && rows.iter().all(|r| r["status"] != "" && r["latency"] != ""), "{seen:#}");
    let counts = browser
        .execute(
            r#"const rows = [...document.querySelectorAll('#tap-lines tr[data-type="request"]')];
               return [rows.length, new Set(rows.map((r) => r.dataset.request)).size];"#,
            json!([]),
        )
        .unwrap();
    assert_eq!(counts[0], counts[1], "one row per request: {counts}");
    shoot(&browser, "tap");
    browser.click(&browser.find("#tap-stop").unwrap()).unwrap();
    browser
        .wait_for("the tap stopped", PAGE, "return document.querySelector('#tap-status').textContent === 'Stopped.'")
        .unwrap();

    // Check: local mode's API server is checked as a cluster's (`cnimesh check`).
    browser.goto(&format!("{}#/check", dashboard.url)).unwrap();
    browser
        .wait_for("the check page's checks", PAGE, "return document.querySelectorAll('ul.checks li').length > 0")
        .unwrap();
    shoot(&browser, "check");
    drop(traffic);
}

/// Web's Server in audit mode (`accessPolicy: audit` patched in with kubectl, the rest of the
/// demo as it is) and an HTTPLocalRateLimitPolicy on it (applied with kubectl): the client is held
/// to 5 requests per second per web proxy, the intruder (named in an override, so the limit never
/// hides what audit does) no longer gets 403 from web but the app's answer.
fn audit_and_limit_web(local: &LocalMode) {
    let server: Value = serde_json::from_str(
        &local.kubectl(&["get", "servers.policy.cnimesh.io", "web", "-n", "demo", "-o", "json"], ""),
    )
    .unwrap();
    assert_eq!((server["kind"].as_str(), server["metadata"]["name"].as_str()), (Some("Server"), Some("web")));
    let patch = json!({"spec": {"accessPolicy": "audit"}}).to_string();
    local.kubectl(&["patch", "servers.policy.cnimesh.io", "web", "-n", "demo", "--type", "merge", "-p", &patch], "");
    let limit = "apiVersion: policy.cnimesh.io/v1alpha1\nkind: HTTPLocalRateLimitPolicy\nmetadata: {name: web-limit, namespace: demo}\nspec:\n  targetRef: {group: policy.cnimesh.io, kind: Server, name: web}\n  identity: {requestsPerSecond: 5}\n  overrides:\n  - requestsPerSecond: 1000000\n    clientRefs: [{kind: ServiceAccount, name: intruder}]\n";
    local.kubectl(&["apply", "-f", "-"], limit);
}

#[test]
fn the_workload_page_shows_audit_modes_would_be_denials_and_rate_limited_requests() {
    let test = "the_workload_page_shows_audit_modes_would_be_denials_and_rate_limited_requests";
    if !require_root(test) || !require_browser(test) {
        return;
    }
    // Names and a subnet of its own: `cargo test` runs this beside the other test, in one process.
    let pid = std::process::id();
    let local = LocalMode::new(format!("cnma{:x}", pid & 0xffff), format!("10.248.{}.0/24", pid % 100), local_bins!());
    local.up();
    audit_and_limit_web(&local);
    let traffic = Traffic::start(&local);

    // Not denied: with web's Server in audit, the intruder's request reaches web's app (the
    // app answers 200 with its pod's name; web's proxies would answer 403 under deny, and the
    // 10 % the canary split sends to web-canary, still under deny, do get 403).
    let intruder = local.netns("intruder");
    cnimesh_e2e::wait::eventually("the intruder's request answered by web's app", Duration::from_secs(60), || {
        matches!(
            cnimesh_e2e::sidecar::http_in(&intruder, "10.96.0.10:80", "GET", "/", ""),
            Ok((200, body)) if body.contains("web-") && !body.contains("canary")
        )
    });

    let dashboard = Dashboard::start(&local);
    let browser = Browser::start(1400, 1000).unwrap();
    browser.goto(&format!("{}#/workload/demo/deployment/web", dashboard.url)).unwrap();
    // The panel's totals, once fresh: would-be denials and 429s (by Server), denials, and what
    // the intruder got from web's proxies that was not a 403.
    let panel = r#"if (document.body.dataset.stale === "true") return null;
        const table = document.querySelector('#authorization table[aria-label="Decisions by policy"]');
        if (!table) return null;
        const col = [...table.querySelectorAll("thead th")].findIndex((th) => th.textContent === "Rate limited (429)");
        const rows = [...table.querySelectorAll("tbody tr[data-would-be-denied]")].map((r) => ({
          server: r.cells[0].textContent, wouldBe: Number(r.dataset.wouldBeDenied),
          denied: Number(r.dataset.denied), limited: Number(r.cells[col].textContent) }));
        const intruder = [...document.querySelectorAll('#authorization tr[data-client]')]
          .find((r) => r.dataset.client.startsWith("intruder.demo."));
        const sum = (f) => rows.reduce((n, r) => n + r[f], 0);
        return { rows, wouldBe: sum("wouldBe"), denied: sum("denied"),
                 limited: Math.max(0, ...rows.map((r) => r.limited)),
                 intruderAllowed: intruder ? Number(intruder.cells[1].textContent) : 0 };"#;
    let first = browser
        .wait_for(
            "would-be denials and rate-limited requests in web's authorization panel",
            PAGE,
            &format!(
                "const p = (() => {{ {panel} }})();
                 return p && p.wouldBe > 0 && p.limited > 0 && p.intruderAllowed > 0 ? p : null;"
            ),
        )
        .unwrap();
    let rows = first["rows"].as_array().unwrap();
    let of = |f: &str| -> Vec<&str> {
        rows.iter().filter(|r| r[f].as_f64() > Some(0.0)).map(|r| r["server"].as_str().unwrap()).collect()
    };
    assert!(of("wouldBe").iter().all(|s| *s == "server/web"), "the audit Server's: {first:#}");
    assert!(of("limited").iter().all(|s| *s == "server/web"), "the limited Server's: {first:#}");
    // Audit lets them through: more would-be denials arrive, and no more denials (those shown
    // are from before the audit took effect).
    let later = browser
        .wait_for(
            "more would-be denials",
            PAGE,
            &format!(
                "const p = (() => {{ {panel} }})();
                 return p && p.wouldBe > {} ? p : null;",
                first["wouldBe"]
            ),
        )
        .unwrap();
    assert_eq!(later["denied"], first["denied"], "no request denied under audit: {first:#} then {later:#}");
    shoot(&browser, "authorization-audit");
    drop(traffic);
}

/// The names of the generated namespace's workloads: realistic lengths, all different.
const NAMES: [&str; 10] = [
    "api-gateway",
    "orders",
    "payments-processor",
    "inventory",
    "shipping-rates",
    "catalog-search",
    "recommendations",
    "user-profile",
    "notifications-email",
    "ledger",
];
const WORKLOADS: usize = 50;
const BIG: &str = "big";

fn big_workload(i: usize) -> String {
    format!("{}-{i}", NAMES[i % NAMES.len()])
}

fn big_ip(i: usize) -> String {
    format!("10.251.0.{}", 10 + i)
}

/// 150 edges among 50 workloads (cycles included), five of them to addresses outside the mesh
/// (192.0.2.0/24, documentation addresses nothing is sent to) and some answered 403.
/// `(source, target address, mtls, denied)`.
fn big_edges() -> Vec<(usize, String, bool, bool)> {
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..WORKLOADS {
        for k in 1..=3 {
            if k == 3 && i % 10 == 0 {
                out.push((i, format!("192.0.2.{}:443", 10 + i), false, false));
                continue;
            }
            let mut j = (i * (k + 1) + 7 * k) % WORKLOADS;
            while j == i || seen.contains(&(i, j)) {
                j = (j + 1) % WORKLOADS;
            }
            seen.insert((i, j));
            out.push((i, format!("{}:8080", big_ip(j)), i % 9 != 4, k == 2 && i % 7 == 0));
        }
    }
    out
}

/// What workload `i`'s proxy counted after `t` seconds: per edge 5 requests a second (a denied
/// edge: 1 of them answered 403), and what it received.
fn big_metrics(i: usize, edges: &[(usize, String, bool, bool)], t: u64) -> String {
    let mut text = String::new();
    for (_, target, mtls, denied) in edges.iter().filter(|e| e.0 == i) {
        let tls = if *mtls {
            format!("tls=\"true\",server_id=\"w.{BIG}.serviceaccount.identity.cnimesh.cluster.local\"")
        } else {
            "tls=\"false\"".to_string()
        };
        let labels = format!("direction=\"outbound\",target_addr=\"{target}\",{tls}");
        let refused = if *denied { t } else { 0 };
        text.push_str(&format!("request_total{{{labels}}} {}\n", 5 * t));
        text.push_str(&format!(
            "response_total{{{labels},status_code=\"200\",classification=\"success\"}} {}\n",
            5 * t - refused
        ));
        text.push_str(&format!(
            "response_total{{{labels},status_code=\"403\",classification=\"failure\"}} {refused}\n"
        ));
    }
    let inbound = format!("direction=\"inbound\",target_addr=\"{}:8080\",tls=\"true\"", big_ip(i));
    text.push_str(&format!("response_total{{{inbound},status_code=\"200\",classification=\"success\"}} {}\n", 3 * t));
    text.push_str(&format!("tcp_open_connections{{{inbound}}} 2\n# EOF\n"));
    text
}

/// A mocked API server (over HTTPS on 127.0.0.1) holding the namespace `big`: 50 workloads of
/// one meshed pod each, whose proxies' metrics its pod proxy relays, counters growing as the
/// seconds pass until dropped.
struct BigNamespace {
    _served: cnimesh_e2e::kube_api::Served,
    stop: Arc<AtomicBool>,
    updater: Option<std::thread::JoinHandle<()>>,
    kubeconfig: tempfile::NamedTempFile,
    _runtime: tokio::runtime::Runtime,
}

impl BigNamespace {
    fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let api = cnimesh_e2e::kube_api::ClusterApi::new();
        for i in 0..WORKLOADS {
            let name = big_workload(i);
            api.put(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{name}-0"), "namespace": BIG,
                             "labels": {"app": name, "cnimesh.io/proxy-deployment": name}},
                "spec": {"serviceAccountName": name, "containers": [
                    {"name": "app", "image": "app"}, {"name": "cnimesh-proxy", "image": "proxy"}]},
                "status": {"phase": "Running", "podIP": big_ip(i)}}));
        }
        let served = runtime.block_on(api.serve());
        let mut kubeconfig = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut kubeconfig, served.kubeconfig("big", "test-token").as_bytes()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let edges = big_edges();
        let publish = move |t: u64| {
            for i in 0..WORKLOADS {
                let path = format!("/api/v1/namespaces/{BIG}/pods/{}-0:4191/proxy/metrics", big_workload(i));
                api.set_text(&path, big_metrics(i, &edges, t));
            }
        };
        publish(1);
        let updater = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(500));
                    publish(1 + start.elapsed().as_secs());
                }
            })
        };
        Self { _served: served, stop, updater: Some(updater), kubeconfig, _runtime: runtime }
    }
}

impl Drop for BigNamespace {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.updater.take() {
            let _ = t.join();
        }
    }
}

/// The topology of a namespace of 50 workloads and 150 edges, laid out by dagre in a real
/// chromium: no two nodes' labels overlap (their bounding boxes, as Cytoscape.js measures them),
/// the addresses outside the mesh are address nodes the page asks nothing about, denied edges
/// stand out, zoom works by button and wheel, the namespace filter and the time range reach the
/// API, and the console has no error (a favicon is served, nothing else is missing).
#[test]
fn a_50_workload_namespace_is_drawn_without_overlapping_labels_in_a_real_browser() {
    let test = "a_50_workload_namespace_is_drawn_without_overlapping_labels_in_a_real_browser";
    if !require_browser(test) {
        return;
    }
    let big = BigNamespace::start();
    let dashboard = Dashboard::start_with(&["--kubeconfig".as_ref(), big.kubeconfig.path().as_os_str()]);
    let browser = Browser::start(1600, 1000).unwrap();
    browser.goto(&format!("{}#/topology", dashboard.url)).unwrap();
    let drawn = browser
        .wait_for(
            "the 50 workloads, 150 edges and their rates",
            PAGE,
            r#"const cy = window.cnimeshTopology;
               if (!cy) return null;
               const workloads = cy.nodes('[kind = "workload"]').length;
               const rated = cy.edges().filter((e) => e.data("traffic").rps > 0).length;
               return workloads === 50 && cy.edges().length === 150 && rated > 0
                 ? { workloads, edges: cy.edges().length, addresses: cy.nodes('[kind = "address"]').map((n) => n.data("label")) }
                 : null;"#,
        )
        .unwrap();
    assert_eq!(drawn["addresses"].as_array().unwrap().len(), 5, "{drawn:#}");
    assert!(drawn["addresses"].as_array().unwrap().iter().all(|a| a.as_str().unwrap().starts_with("192.0.2.")));

    // No two labels' bounding boxes intersect.
    let overlaps = browser
        .execute(
            r#"const cy = window.cnimeshTopology;
               const boxes = cy.nodes().map((n) => ({ id: n.id(),
                 b: n.boundingBox({ includeNodes: false, includeEdges: false, includeLabels: true }) }));
               const hit = [];
               for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
                 const a = boxes[i].b, b = boxes[j].b;
                 if (a.w > 0 && b.w > 0 && a.x1 < b.x2 && b.x1 < a.x2 && a.y1 < b.y2 && b.y1 < a.y2) hit.push([boxes[i].id, boxes[j].id]);
               }
               return { hit, labelled: boxes.filter((x) => x.b.w > 0).length };"#,
            json!([]),
        )
        .unwrap();
    assert_eq!(overlaps["hit"], json!([]), "overlapping labels: {overlaps:#}");
    assert_eq!(overlaps["labelled"], 55, "every node has its label: {overlaps:#}");
    shoot(&browser, "topology-50");

    // Denied edges stand out, on the graph and in the edges' table.
    let denied = browser
        .wait_for(
            "denied edges",
            PAGE,
            r#"const cy = window.cnimeshTopology;
               const refused = cy.edges(".refused").length;
               const rows = [...document.querySelectorAll("table.edges tr[data-denied]")].filter((r) => Number(r.dataset.denied) > 0).length;
               return refused > 0 && rows > 0 ? { refused, rows } : null;"#,
        )
        .unwrap();
    assert_eq!(denied["refused"], denied["rows"], "{denied:#}");

    // Zoom: the buttons and the wheel.
    let zoom = || browser.execute("return window.cnimeshTopology.zoom()", json!([])).unwrap().as_f64().unwrap();
    let before = zoom();
    browser.click(&browser.find("#zoom-in").unwrap()).unwrap();
    let zoomed = zoom();
    assert!(zoomed > before, "the zoom-in button: {before} → {zoomed}");
    browser.wheel(&browser.find("#cy").unwrap(), -400).unwrap();
    let wheeled = browser
        .wait_for(
            "the wheel's zoom",
            PAGE,
            &format!("const z = window.cnimeshTopology.zoom(); return z !== {zoomed} ? z : null;"),
        )
        .unwrap();
    assert_ne!(wheeled.as_f64(), Some(zoomed));
    shoot(&browser, "topology-50-zoomed");
    browser.click(&browser.find("#zoom-fit").unwrap()).unwrap();
    shoot(&browser, "topology-50-fit");

    // The namespace filter and the time range reach the API.
    browser
        .execute(
            r#"const ns = document.getElementById("filter-namespace");
               ns.value = "big"; ns.dispatchEvent(new Event("change"));
               const range = document.getElementById("filter-range");
               range.value = "1m"; range.dispatchEvent(new Event("change"));"#,
            json!([]),
        )
        .unwrap();
    browser
        .wait_for(
            "a topology request for namespace big over 1m",
            PAGE,
            r#"return performance.getEntriesByType("resource").some((e) => e.name.includes("/api/topology?namespace=big&range=1m"));"#,
        )
        .unwrap();

    // The page asked nothing about the addresses: no per-edge stat call at all.
    let asked = browser
        .execute(
            r#"return performance.getEntriesByType("resource").map((e) => e.name)
                 .filter((n) => n.includes("/api/stat") || n.includes("192.0.2."));"#,
            json!([]),
        )
        .unwrap();
    assert_eq!(asked, json!([]), "{asked:#}");
    let errors = browser.console_errors().unwrap();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
}
