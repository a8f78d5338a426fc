//! A small W3C WebDriver client for Debian's chromium driven by chromedriver: start a headless
//! session, load pages, run scripts, find elements, press keys, take screenshots. Just the HTTP
//! API (hyper-util's client on a runtime of its own), so the browser tests need no new crate.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

/// Debian's packages (`scripts/setup.sh` installs them).
pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The W3C name of an element reference in answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Why the browser tests cannot run here, if they cannot.
pub fn missing() -> Option<String> {
    let absent: Vec<&str> = [CHROMIUM, CHROMEDRIVER].into_iter().filter(|p| !Path::new(p).exists()).collect();
    (!absent.is_empty()).then(|| {
        format!(
            "{} not installed (Debian's chromium and chromium-driver: scripts/setup.sh installs them)",
            absent.join(" and ")
        )
    })
}

/// True when the browser test can run; under CI=true a missing browser is a failure.
pub fn require_browser(test: &str) -> bool {
    match missing() {
        None => true,
        Some(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: {why}; CI=true, so this is a failure, not a skip")
        }
        Some(why) => {
            eprintln!("\n!!! SKIPPED {test}: {why}. Run scripts/setup.sh. !!!\n");
            false
        }
    }
}

/// chromedriver and one headless chromium session, both ended on drop.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    runtime: tokio::runtime::Runtime,
    client: Client<HttpConnector, Full<Bytes>>,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver on a free port and a headless session of `width`×`height`.
    pub fn start(width: u32, height: u32) -> anyhow::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {CHROMEDRIVER}"))?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let client = Client::builder(TokioExecutor::new()).build_http();
        let profile = tempfile::Builder::new().prefix("cnimesh-chromium").tempdir()?;
        let mut browser = Self {
            driver,
            base: format!("http://{}", SocketAddr::from(([127, 0, 0, 1], port))),
            session: String::new(),
            runtime,
            client,
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while browser.call("GET", "/status", None).map(|v| v["ready"] != true).unwrap_or(true) {
            anyhow::ensure!(Instant::now() < deadline, "chromedriver did not become ready in 20s");
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            // The page's console, read back by `console_errors`.
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {"binary": CHROMIUM, "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", format!("--window-size={width},{height}"),
                format!("--user-data-dir={}", browser._profile.path().display()),
            ]},
        }}});
        let answer = browser.call("POST", "/session", Some(caps))?;
        browser.session = answer["sessionId"].as_str().context("no sessionId in the answer")?.to_string();
        Ok(browser)
    }

    /// One WebDriver command: its `value`, or the driver's error.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let uri = format!("{}{path}", self.base);
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let request = http::Request::builder()
            .method(method)
            .uri(&uri)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let (status, text) = self.runtime.block_on(async {
            let answer = tokio::time::timeout(Duration::from_secs(60), async {
                let response = self.client.request(request).await?;
                let status = response.status();
                let bytes = response.into_body().collect().await?.to_bytes();
                anyhow::Ok((status, bytes))
            })
            .await
            .map_err(|_| anyhow::anyhow!("{method} {path}: no answer in 60s"))??;
            anyhow::Ok(answer)
        })?;
        let value: Value = serde_json::from_slice(&text).with_context(|| format!("{method} {path}: not JSON"))?;
        anyhow::ensure!(status.is_success(), "{method} {path}: HTTP {status}: {}", value["value"]);
        Ok(value["value"].clone())
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    pub fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.session_call("POST", "/url", Some(json!({"url": url}))).map(|_| ())
    }

    /// Runs `script` (a function body; `arguments` are `args`) and returns what it returns.
    pub fn execute(&self, script: &str, args: Value) -> anyhow::Result<Value> {
        self.session_call("POST", "/execute/sync", Some(json!({"script": script, "args": args})))
    }

    /// Waits (bounded) until `script` returns something other than null/false; returns it.
    pub fn wait_for(&self, what: &str, timeout: Duration, script: &str) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.execute(script, json!([]))?;
            if !value.is_null() && value != Value::Bool(false) {
                return Ok(value);
            }
            anyhow::ensure!(Instant::now() < deadline, "{what}: not within {}s", timeout.as_secs());
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The first element matching a CSS selector (its WebDriver reference).
    pub fn find(&self, css: &str) -> anyhow::Result<String> {
        let found = self.session_call("POST", "/element", Some(json!({"using": "css selector", "value": css})))?;
        found[ELEMENT].as_str().map(str::to_string).with_context(|| format!("{css}: no element"))
    }

    pub fn click(&self, element: &str) -> anyhow::Result<()> {
        self.session_call("POST", &format!("/element/{element}/click"), Some(json!({}))).map(|_| ())
    }

    /// Presses `key` (a character or a WebDriver key code such as `\u{E004}`, Tab).
    pub fn press(&self, key: &str) -> anyhow::Result<()> {
        let actions = json!({"actions": [{"type": "key", "id": "keyboard", "actions": [
            {"type": "keyDown", "value": key}, {"type": "keyUp", "value": key},
        ]}]});
        self.session_call("POST", "/actions", Some(actions)).map(|_| ())
    }

    /// Turns the mouse wheel by `delta_y` pixels over the element (negative: away from the user).
    pub fn wheel(&self, element: &str, delta_y: i64) -> anyhow::Result<()> {
        let actions = json!({"actions": [{"type": "wheel", "id": "wheel", "actions": [
            {"type": "scroll", "x": 0, "y": 0, "deltaX": 0, "deltaY": delta_y, "origin": {ELEMENT: element}},
        ]}]});
        self.session_call("POST", "/actions", Some(actions)).map(|_| ())
    }

    /// The console's errors since the last call (chromium's `SEVERE` entries: uncaught
    /// exceptions, failed loads, `console.error`).
    pub fn console_errors(&self) -> anyhow::Result<Vec<String>> {
        let entries = self.session_call("POST", "/se/log", Some(json!({"type": "browser"})))?;
        Ok(entries
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .collect())
    }

    /// A PNG of the viewport, written to `path` (its directory created).
    pub fn screenshot(&self, path: &Path) -> anyhow::Result<PathBuf> {
        use base64::Engine as _;
        let data = self.session_call("GET", "/screenshot", None)?;
        let png = base64::engine::general_purpose::STANDARD.decode(data.as_str().context("no screenshot data")?)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png)?;
        Ok(path.to_path_buf())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.session_call("DELETE", "", None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
