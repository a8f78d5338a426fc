//! The dashboard's JSON API (GET only), each answer the value the matching CLI command prints
//! with `-o json`, computed by the same functions, wrapped with when it was observed:
//! `{observed_at, observed_at_unix, interval_seconds, stale, problems, value}`. Failures are
//! `{error, hint}` with the hint `cnimesh check` gives for the same cause.
//!
//! | path | value |
//! |---|---|
//! | `/api/meta` | mode (local or cluster), namespace, interval, version |
//! | `/api/stat?resource=deploy[&namespace=NS][&to=R&to_namespace=NS][&range=1m\|5m\|15m]` | `cnimesh stat RESOURCE [--to R] -o json` over the sampler's last window, or over the last 1, 5 or 15 minutes of the proxies' counters (`resource=egress`: `cnimesh stat egress -o json`) |
//! | `/api/topology[?namespace=NS][&range=1m\|5m\|15m]` | the topology's graph ([`super::topology`]): nodes, edges with what they carried over the range |
//! | `/api/routes?resource=deploy/NAME&namespace=NS[&range=…]` | the resource's routes (requests, success, latency) and each route's requests per backend, over the range |
//! | `/api/edges?resource=deploy[&namespace=NS]` | `cnimesh edges RESOURCE -o json` from the last reading |
//! | `/api/history` | ten minutes of golden metrics per workload (sparklines) |
//! | `/api/pods?resource=deploy/NAME[&namespace=NS]` | the resource's pods (name, IP, meshed) |
//! | `/api/diagnostics/{metrics,identity,policy,endpoints}?pod=P&namespace=NS` | `cnimesh diagnostics … -o json` |
//! | `/api/authz?resource=deploy/NAME&namespace=NS` | `cnimesh authz … -o json` (a cluster's policy objects) |
//! | `/api/check` | `cnimesh check -o json` (a cluster) |
//! | `/api/tap?resource=…&namespace=…&to=…&path=…&method=…&authority=…&scheme=…&max_rps=…` | NDJSON: `{"tap": line}` as `cnimesh tap -o json` prints it, `{"top": …}` (`cnimesh top`'s rows) every second |

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::StreamExt;
use http::{Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use parking_lot::Mutex;
use serde_json::{Value, json};

use super::DashboardArgs;
pub use super::problem::ApiError;
use super::sampler::{LONGEST_RANGE, Snapshot, unix};
use super::topology;
use crate::ClusterArgs;
use crate::check::{RBAC_HINT, UNREACHABLE_HINT, proxy_hint};
use crate::diagnostics::fetch::{Reach, Target};
use crate::query_error::QueryError;
use crate::stat::compute::{self, Query};
use crate::stat::mesh::Mesh;
use crate::stat::mesh::{Kind, Resource};
use crate::stat::render::Output;
use crate::stat::{Readings, Scope, Sources, join, meshed};
use crate::tap::render::TapOutput;
use crate::top::aggregate::Top;

/// Every answer's body.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What the handlers share: how to reach the mesh and what the sampler read.
pub struct Shared {
    pub cluster: ClusterArgs,
    /// Local mode's directory (`--local`), whose API server the client reaches.
    pub local: Option<PathBuf>,
    /// The cluster's client.
    pub client: kube::Client,
    pub sources: Sources,
    /// `--namespace` (`None`: every namespace).
    pub namespace: Option<String>,
    pub interval: Duration,
    pub snapshot: Mutex<Snapshot>,
}

pub type State = Arc<Shared>;

impl Shared {
    pub async fn new(cluster: &ClusterArgs, args: &DashboardArgs) -> anyhow::Result<State> {
        let cluster = cluster.or_local(args.local.as_deref());
        let client = cluster.client().await?;
        Self::with_client(cluster, client, args)
    }

    /// `client` for the cluster (the tests' mocked API server).
    pub fn with_client(cluster: ClusterArgs, client: kube::Client, args: &DashboardArgs) -> anyhow::Result<State> {
        let scope = Scope {
            namespace: args.namespace.clone(),
            all_namespaces: args.namespace.is_none(),
            local: args.local.clone(),
            prometheus: args.prometheus.clone(),
            prometheus_ca: args.prometheus_ca.clone(),
            output: Output::Json,
        };
        let sources = Sources::with_client(client.clone(), &scope)?;
        Ok(Arc::new(Self {
            cluster,
            local: args.local.clone(),
            client,
            sources,
            namespace: args.namespace.clone(),
            interval: args.interval,
            snapshot: Mutex::new(Snapshot::default()),
        }))
    }

    /// An error reading the cluster (or local mode) with `cnimesh check`'s hint for its cause,
    /// chosen by the error's type ([`QueryError`]), never its text.
    pub fn upstream_error(&self, error: &anyhow::Error) -> ApiError {
        let text = format!("{error:#}");
        let hint = match (&self.local, QueryError::is_forbidden(error)) {
            (_, true) => RBAC_HINT.to_string(),
            (None, false) => UNREACHABLE_HINT.to_string(),
            (Some(dir), false) => format!("is local mode up there? cnimesh-local up --dir {}", dir.display()),
        };
        ApiError::new(StatusCode::BAD_GATEWAY, text).hint(hint)
    }

    fn reach(&self) -> Reach {
        Reach::Cluster(self.client.clone())
    }

    /// The envelope around a value observed at `at`.
    fn envelope(&self, at: SystemTime, value: Value, problems: Vec<ApiError>, error: Option<&ApiError>) -> Value {
        let age = SystemTime::now().duration_since(at).unwrap_or_default();
        json!({
            "observed_at": humantime::format_rfc3339_millis(at).to_string(),
            "observed_at_unix": unix(at),
            "interval_seconds": self.interval.as_secs_f64(),
            "stale": age > 2 * self.interval || error.is_some(),
            "error": error,
            "problems": problems,
            "value": value,
        })
    }
}

/// The query string's parameters, percent-decoded (`+` is a space, as forms send it).
pub fn params(query: Option<&str>) -> BTreeMap<String, String> {
    let decode = |s: &str| percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
    query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

fn resource(params: &BTreeMap<String, String>, default: &str) -> Result<Resource, ApiError> {
    let text = params.get("resource").filter(|r| !r.is_empty()).map_or(default, String::as_str);
    text.parse::<Resource>().map_err(|e| ApiError::bad_request(format!("resource {text:?}: {e}")))
}

/// A `namespace` parameter: empty is none; anything but a Kubernetes namespace name (a DNS-1123
/// label) is refused before it reaches a filter, a tap query or an API server's path.
pub fn namespace_param(params: &BTreeMap<String, String>, name: &str) -> Result<Option<String>, ApiError> {
    let Some(text) = params.get(name).filter(|n| !n.is_empty()) else { return Ok(None) };
    let label = text.len() <= 63
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-');
    if !label {
        return Err(ApiError::bad_request(format!(
            "{name} {text:?}: not a namespace name (lower-case letters, digits and '-', at most 63)"
        )));
    }
    Ok(Some(text.clone()))
}

/// The time ranges the page offers.
pub const RANGES: [(&str, Duration); 3] =
    [("1m", Duration::from_secs(60)), ("5m", Duration::from_secs(300)), ("15m", LONGEST_RANGE)];

/// A `range` parameter: `None` for the sampler's last window, else one of [`RANGES`].
pub fn range_param(params: &BTreeMap<String, String>) -> Result<Option<Duration>, ApiError> {
    let Some(text) = params.get("range").filter(|r| !r.is_empty()) else { return Ok(None) };
    RANGES.iter().find(|(name, _)| name == text).map(|(_, d)| Some(*d)).ok_or_else(|| {
        ApiError::bad_request(format!("range {text:?}: expected 1m, 5m or 15m (or none: the last window)"))
    })
}

/// The scrapes a request asks for: the last window, or the `range` of kept readings.
fn scrapes_for(
    state: &State,
    snapshot: &Snapshot,
    range: Option<Duration>,
) -> Result<(SystemTime, Duration, compute::Scrapes), ApiError> {
    let scrapes = match range {
        None => snapshot.window.clone(),
        Some(range) => snapshot.over(range),
    };
    scrapes.ok_or_else(|| {
        snapshot.error.clone().unwrap_or_else(|| {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the first window is not over yet").hint(format!(
                "rates need two readings; the proxies are read every {}",
                humantime::format_duration(state.interval)
            ))
        })
    })
}

pub fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut text = serde_json::to_string(value).expect("JSON values serialise");
    text.push('\n');
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CACHE_CONTROL, "no-store")
        .body(Full::new(Bytes::from(text)).boxed_unsync())
        .expect("a response")
}

pub fn error_response(error: &ApiError) -> Response<Body> {
    json_response(error.status, &serde_json::to_value(error).expect("serialisable"))
}

fn answer(result: Result<Value, ApiError>) -> Response<Body> {
    match result {
        Ok(value) => json_response(StatusCode::OK, &value),
        Err(e) => error_response(&e),
    }
}

/// Routes one API request (`path` under `/api/`).
pub async fn handle(state: &State, path: &str, query: Option<&str>) -> Response<Body> {
    let params = params(query);
    match path {
        "meta" => answer(Ok(meta(state))),
        "stat" => answer(stat(state, &params)),
        "edges" => answer(edges(state, &params)),
        "topology" => answer(topology(state, &params)),
        "routes" => answer(routes(state, &params)),
        "history" => answer(Ok(history(state))),
        "pods" => answer(pods(state, &params)),
        "authz" => answer(authz(state, &params).await),
        "check" => answer(check(state).await),
        "tap" => match tap(state, &params).await {
            Ok(response) => response,
            Err(e) => error_response(&e),
        },
        _ => match path.strip_prefix("diagnostics/") {
            Some(page) => answer(diagnostics(state, page, &params).await),
            None => error_response(&ApiError::new(StatusCode::NOT_FOUND, format!("/api/{path}: no such API"))),
        },
    }
}

fn meta(state: &State) -> Value {
    json!({
        "mode": if state.local.is_some() { "local" } else { "cluster" },
        "local": state.local.as_ref().map(|d| d.display().to_string()),
        "namespace": state.namespace,
        "interval_seconds": state.interval.as_secs_f64(),
        "prometheus": state.sources.is_prometheus(),
        "version": env!("CARGO_PKG_VERSION"),
    })
}

/// The query a page asks for: its resource, in its namespace or the dashboard's.
/// With `to=RESOURCE` (`&to_namespace=NS`, default the query's), what the resource sent there, as
/// `cnimesh stat RESOURCE --to …` counts it.
fn query(state: &State, params: &BTreeMap<String, String>, window: Duration) -> Result<Query, ApiError> {
    let namespace = namespace_param(params, "namespace")?.or_else(|| state.namespace.clone());
    let to = match params.get("to").filter(|t| !t.is_empty()) {
        Some(text) => {
            let to = text.parse::<Resource>().map_err(|e| ApiError::bad_request(format!("to {text:?}: {e}")))?;
            let ns = namespace_param(params, "to_namespace")?.or_else(|| namespace.clone());
            Some((to, ns.unwrap_or_else(|| "default".into())))
        }
        None => None,
    };
    Ok(Query { resource: resource(params, "deploy")?, namespace, from: None, to, window })
}

/// A pod that could not be read, with what to look at.
fn unreadable(problem: &str) -> ApiError {
    let pod = problem.split(':').next().unwrap_or_default();
    let (ns, name) = pod.split_once('/').unwrap_or(("default", pod));
    ApiError::new(StatusCode::BAD_GATEWAY, format!("metrics not read from {problem}")).hint(proxy_hint(ns, name))
}

fn stat(state: &State, params: &BTreeMap<String, String>) -> Result<Value, ApiError> {
    let range = range_param(params)?;
    let snapshot = state.snapshot.lock();
    let (at, window, scrapes) = &scrapes_for(state, &snapshot, range)?;
    let query = query(state, params, *window)?;
    let (value, problems): (Value, Vec<ApiError>) = match query.resource.kind {
        // `cnimesh stat egress -o json`'s rows.
        Kind::Egress => {
            let rows = compute::egress_stat(&snapshot.mesh, scrapes, &query);
            let mut problems: Vec<&String> = rows.iter().flat_map(|r| &r.unreadable).collect();
            problems.dedup();
            let problems = problems.into_iter().map(|p| unreadable(p)).collect();
            (serde_json::to_value(&rows).expect("serialisable"), problems)
        }
        _ => {
            let rows = compute::stat(&snapshot.mesh, scrapes, &query);
            let problems = rows.iter().flat_map(|r| &r.unreadable).map(|p| unreadable(p)).collect();
            (serde_json::to_value(&rows).expect("serialisable"), problems)
        }
    };
    Ok(state.envelope(*at, value, problems, snapshot.error.as_ref()))
}

fn edges(state: &State, params: &BTreeMap<String, String>) -> Result<Value, ApiError> {
    let snapshot = state.snapshot.lock();
    let Some((at, readings)) = &snapshot.latest else {
        return Err(snapshot.error.clone().unwrap_or_else(|| {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the proxies have not been read yet")
                .hint("the first reading is under way; try again in a moment")
        }));
    };
    let query = query(state, params, Duration::ZERO)?;
    let scrapes = join(BTreeMap::new(), readings);
    let rows = compute::edges(&snapshot.mesh, &scrapes, &query);
    let problems =
        readings.iter().filter_map(|(pod, r)| r.as_ref().err().map(|e| unreadable(&format!("{pod}: {e}")))).collect();
    let value = serde_json::to_value(&rows).expect("serialisable");
    Ok(state.envelope(*at, value, problems, snapshot.error.as_ref()))
}

/// The topology's graph over the range, for the page's namespace filter (or the dashboard's).
fn topology(state: &State, params: &BTreeMap<String, String>) -> Result<Value, ApiError> {
    let range = range_param(params)?;
    let namespace = namespace_param(params, "namespace")?.or_else(|| state.namespace.clone());
    let snapshot = state.snapshot.lock();
    let (at, window, scrapes) = scrapes_for(state, &snapshot, range)?;
    let latest = snapshot.latest.as_ref().map(|(_, r)| join(BTreeMap::new(), r)).unwrap_or_default();
    let graph = topology::build(&snapshot.mesh, &latest, &scrapes, window, namespace.as_deref());
    let problems =
        scrapes.iter().filter_map(|(pod, s)| s.as_ref().err().map(|e| unreadable(&format!("{pod}: {e}")))).collect();
    let mut value =
        state.envelope(at, serde_json::to_value(&graph).expect("serialisable"), problems, snapshot.error.as_ref());
    value["window_seconds"] = json!(window.as_secs_f64());
    Ok(value)
}

/// A resource's routes over the range: requests, success and latency per (parent, route), and
/// the requests per backend (a split's shares).
fn routes(state: &State, params: &BTreeMap<String, String>) -> Result<Value, ApiError> {
    let range = range_param(params)?;
    let snapshot = state.snapshot.lock();
    let (at, window, scrapes) = scrapes_for(state, &snapshot, range)?;
    let query = query(state, params, window)?;
    let value = json!({
        "routes": compute::routes(&snapshot.mesh, &scrapes, &query),
        "backends": compute::route_backends(&snapshot.mesh, &scrapes, &query),
    });
    Ok(state.envelope(at, value, Vec::new(), snapshot.error.as_ref()))
}

fn history(state: &State) -> Value {
    let snapshot = state.snapshot.lock();
    let at = snapshot.latest.as_ref().map_or(SystemTime::UNIX_EPOCH, |(at, _)| *at);
    let value = serde_json::to_value(&snapshot.history).expect("serialisable");
    state.envelope(at, value, Vec::new(), snapshot.error.as_ref())
}

fn pods(state: &State, params: &BTreeMap<String, String>) -> Result<Value, ApiError> {
    let snapshot = state.snapshot.lock();
    let Some((at, _)) = &snapshot.latest else {
        return Err(snapshot.error.clone().unwrap_or_else(|| {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the pods have not been listed yet")
                .hint("the first reading is under way; try again in a moment")
        }));
    };
    let query = query(state, params, Duration::ZERO)?;
    let pods: Vec<Value> = snapshot
        .mesh
        .pods
        .iter()
        .filter(|p| query.namespace.as_ref().is_none_or(|ns| *ns == p.namespace))
        .filter(|p| match (p.resource_name(query.resource.kind), &query.resource.name) {
            (Some(have), Some(want)) => have == *want,
            (Some(_), None) => true,
            (None, _) => false,
        })
        .map(|p| {
            json!({"namespace": p.namespace, "name": p.name, "ip": p.ip, "meshed": p.meshed,
                   "service_account": p.service_account})
        })
        .collect();
    Ok(state.envelope(*at, Value::Array(pods), Vec::new(), snapshot.error.as_ref()))
}

async fn diagnostics(state: &State, page: &str, params: &BTreeMap<String, String>) -> Result<Value, ApiError> {
    use crate::diagnostics::Page;
    let page = match page {
        "metrics" => Page::Metrics,
        "identity" => Page::Identity,
        "policy" => Page::Policy,
        "endpoints" => Page::Endpoints,
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("diagnostics page {other:?}: expected metrics, identity, policy or endpoints"),
            ));
        }
    };
    let pod = params.get("pod").filter(|p| !p.is_empty()).ok_or_else(|| ApiError::bad_request("no pod= given"))?;
    let target = Target::parse(pod).map_err(|e| ApiError::bad_request(format!("{e:#}")))?;
    let namespace = match namespace_param(params, "namespace")? {
        Some(ns) => ns,
        None => state.client.default_namespace().to_string(),
    };
    let at = SystemTime::now();
    let value = crate::diagnostics::query(&state.reach(), page, &target, &namespace, None).await.map_err(|e| {
        let forbidden = matches!(e, QueryError::Forbidden { .. });
        let mut error = state.upstream_error(&e.into());
        if let Target::Pod(name) = &target
            && !forbidden
        {
            error.hint = Some(proxy_hint(&namespace, name));
        }
        error
    })?;
    Ok(state.envelope(at, value, Vec::new(), None))
}

async fn authz(state: &State, params: &BTreeMap<String, String>) -> Result<Value, ApiError> {
    let client = state.client.clone();
    let resource =
        params.get("resource").filter(|r| !r.is_empty()).ok_or_else(|| ApiError::bad_request("no resource= given"))?;
    let args = crate::authz::AuthzArgs {
        resource: resource.clone(),
        namespace: namespace_param(params, "namespace")?.unwrap_or_else(|| client.default_namespace().to_string()),
        identity: params.get("identity").filter(|i| !i.is_empty()).cloned(),
        from: None,
        from_namespace: None,
        trust_domain: cnimesh_identity::DEFAULT_TRUST_DOMAIN.to_string(),
        output: crate::authz::Output::Json,
        local: None,
    };
    let at = SystemTime::now();
    let report = crate::authz::query(&client, &args).await.map_err(|e| state.upstream_error(&e.into()))?;
    let value = serde_json::to_value(&report).expect("the report serialises");
    Ok(state.envelope(at, value, Vec::new(), None))
}

async fn check(state: &State) -> Result<Value, ApiError> {
    let client = state.client.clone();
    let at = SystemTime::now();
    let checks = crate::check::run_checks(client, false, at).await;
    let value = serde_json::to_value(crate::check::Report::of(&checks)).expect("the report serialises");
    Ok(state.envelope(at, value, Vec::new(), None))
}

/// `cnimesh top`'s rows (busiest first) and the pods that could not be tapped.
pub fn top_value(top: &Top) -> Value {
    let rows: Vec<Value> = top
        .rows()
        .into_iter()
        .map(|(key, row)| {
            let mut value = serde_json::to_value(key).expect("serialisable");
            if let (Value::Object(map), Value::Object(row)) =
                (&mut value, serde_json::to_value(row).expect("serialisable"))
            {
                map.extend(row);
            }
            value
        })
        .collect();
    json!({"rows": rows, "problems": top.problems})
}

/// What a failed tap on a cluster needs looked at: the grants `cnimesh tap` needs.
pub const TAP_HINT: &str = "tapping needs what `cnimesh tap` needs: the Role cnimesh-tap in namespace cnimesh \
     (create serviceaccounts/token for cnimesh-tap, get services/proxy) and a running control plane";

/// How often the tap stream carries `top`'s table.
const TOP_EVERY: Duration = Duration::from_secs(1);

/// A live tap through the relay `cnimesh tap` uses (its authorization unchanged), as NDJSON; it
/// ends when the browser goes away (the next write fails) or the relay ends it.
async fn tap(state: &State, params: &BTreeMap<String, String>) -> Result<Response<Body>, ApiError> {
    let optional = |k: &str| params.get(k).filter(|v| !v.is_empty()).cloned();
    let to = match optional("to") {
        Some(to) => Some(to.parse::<Resource>().map_err(|e| ApiError::bad_request(format!("to {to:?}: {e}")))?),
        None => None,
    };
    let max_rps = match optional("max_rps") {
        Some(v) => v.parse::<f64>().map_err(|_| ApiError::bad_request(format!("max_rps {v:?}: not a number")))?,
        None => cnimesh_model::tap::query::DEFAULT_MAX_RPS,
    };
    let filter = crate::tap::Filter {
        resource: resource(params, "deploy")?,
        namespace: namespace_param(params, "namespace")?.or_else(|| state.namespace.clone()),
        to,
        to_namespace: namespace_param(params, "to_namespace")?,
        path: optional("path"),
        method: optional("method"),
        authority: optional("authority"),
        scheme: optional("scheme"),
        max_rps,
        local: None,
    };
    let opened = match filter.query(0, state.client.default_namespace()) {
        Ok(query) => crate::tap::open_cluster(&state.client, &query.to_query_string())
            .await
            .map(|reader| crate::tap::lines(Box::pin(reader))),
        Err(e) => return Err(ApiError::bad_request(format!("{e:#}"))),
    };
    let mut lines = opened.map_err(|e| match QueryError::find(&e) {
        Some(QueryError::BadQuery(text)) => ApiError::bad_request(text.clone()),
        Some(QueryError::Forbidden { .. }) => state.upstream_error(&e),
        // What `cnimesh tap` itself needs: the page taps with the same grants, no more.
        _ => ApiError::new(StatusCode::BAD_GATEWAY, format!("{e:#}")).hint(TAP_HINT),
    })?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut top = Top::default();
        let mut ticks = tokio::time::interval(TOP_EVERY);
        let top_line = |top: &Top| Bytes::from(json!({"top": top_value(top)}).to_string() + "\n");
        loop {
            let next = tokio::select! {
                line = lines.next() => line,
                _ = ticks.tick() => {
                    if tx.send(top_line(&top)).await.is_err() { break }
                    continue;
                }
                () = tx.closed() => break,
            };
            let sent = match next {
                Some(Ok(line)) => {
                    top.add(&line);
                    let text = crate::tap::render::line(&line, TapOutput::Json);
                    tx.send(Bytes::from(format!("{{\"tap\":{}}}\n", text.trim_end()))).await
                }
                Some(Err(e)) => {
                    let _ = tx.send(Bytes::from(json!({"error": format!("{e:#}")}).to_string() + "\n")).await;
                    break;
                }
                None => {
                    let _ = tx.send(top_line(&top)).await;
                    let _ = tx.send(Bytes::from_static(b"{\"end\":true}\n")).await;
                    break;
                }
            };
            if sent.is_err() {
                break;
            }
        }
    });
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|bytes| (Ok::<_, Infallible>(Frame::data(bytes)), rx))
    });
    Ok(Response::builder()
        .header(http::header::CONTENT_TYPE, "application/x-ndjson")
        .header(http::header::CACHE_CONTROL, "no-store")
        .body(BodyExt::boxed_unsync(StreamBody::new(frames)))
        .expect("a response"))
}

/// One sampler round: the pods and Services, then every meshed proxy's metrics.
pub async fn round(state: &State, at: SystemTime) -> Result<(Mesh, Readings), ApiError> {
    let namespaces = state.namespace.clone().map(|ns| vec![ns]);
    let mesh = state.sources.mesh(namespaces.as_deref()).await.map_err(|e| state.upstream_error(&e.into()))?;
    let readings = state.sources.read(&meshed(&mesh), at).await;
    Ok((mesh, readings))
}

/// The sampler: one round per interval, forever, each recorded in the snapshot.
pub async fn run_sampler(state: State) {
    let mut ticks = tokio::time::interval(state.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let at = SystemTime::now();
        let result = round(&state, at).await;
        if let Err(e) = &result {
            tracing::warn!("dashboard sampler: {}", e.error);
        }
        state.snapshot.lock().record(at, result);
    }
}
