//! The relay's HTTP endpoint: who may tap, which proxies, and the merged stream.
//!
//! Authentication is a header, `cnimesh-tap-token: <token>`, which must prove the ServiceAccount
//! `cnimesh/cnimesh-tap` (TokenReview in a cluster, for the audience `tap.cnimesh.io` rather than
//! Identity's; local mode's token files). Why a token of an
//! account rather than the caller's own credentials: callers come through the API server's
//! service proxy, which authorizes them but strips `Authorization` and says nothing about who
//! they are, and the admin port must not trust a header anyone on the pod network could set.
//! The permission to mint a token for `cnimesh-tap` (`serviceaccounts/token` create, with
//! `services/proxy` to reach the relay: the Role `cnimesh-tap` in the manifests) is therefore
//! what an operator is given to tap, and an operator without it gets nothing, even from inside
//! the cluster. Missing or invalid tokens are 401, a token of another account 403.
//!
//! Layer: runtime (admin HTTP).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use cnimesh_common::names::{CONTROL_NAMESPACE, PROXY_ADMIN_PORT, TAP_SERVICE_ACCOUNT};
use cnimesh_identity::Name;
use cnimesh_identity::tls::CurrentCert;
use futures::StreamExt;
use http::{HeaderMap, Response, StatusCode, header};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use linkerd2_proxy_api::tap::ObserveRequest;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::admission::Admission;
use super::{client, matcher};
use cnimesh_model::destination::{Index, PodRecord};
use cnimesh_model::identity::tokens::MAX_TOKEN_LEN;
use cnimesh_model::identity::{Authenticator, IssuerRx, ServiceAccount, TokenError};
use cnimesh_model::meta::NsName;
use cnimesh_model::metrics::{Metrics, TapSession};
use cnimesh_model::resource::{Kind, Resource};
use cnimesh_model::tap::TOKEN_HEADER;
use cnimesh_model::tap::event::TapLine;
use cnimesh_model::tap::query::{TapQuery, resource_text};

/// Lines buffered towards a slow caller before the proxies' streams are paused (they then drop
/// events on their side rather than slow requests).
const BUFFERED_LINES: usize = 256;
/// While no event comes, an empty line is sent this often: a caller that has gone away is then
/// noticed (and the proxies' streams dropped) within this time, and proxies in between (the API
/// server's) see a live stream. Readers skip empty lines.
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(5);

/// The body of every admin answer: whole for the small pages, streamed for tap.
pub type AdminBody = UnsyncBoxBody<Bytes, Infallible>;

/// What the relay needs from the rest of the control plane.
#[derive(Clone)]
pub struct Relay {
    authenticator: Arc<dyn Authenticator>,
    metrics: Arc<Metrics>,
    /// Destination's pods: where the proxies are (`None` when Destination is not served).
    index: Option<Index>,
    /// The mesh's trust anchors, to verify the proxies.
    issuer: IssuerRx,
    /// The control plane's own certificate: the identity the proxies let tap.
    own_cert: Arc<CurrentCert>,
    trust_domain: String,
    /// The proxies' admin port; tests point it at their fake proxies.
    proxy_port: u16,
}

/// A proxy to tap.
struct Target {
    pod: NsName,
    ip: IpAddr,
    identity: Name,
}

impl Relay {
    pub fn new(
        authenticator: Arc<dyn Authenticator>,
        metrics: Arc<Metrics>,
        index: Option<Index>,
        issuer: IssuerRx,
        own_cert: Arc<CurrentCert>,
        trust_domain: impl Into<String>,
    ) -> Self {
        let trust_domain = trust_domain.into();
        Self { authenticator, metrics, index, issuer, own_cert, trust_domain, proxy_port: PROXY_ADMIN_PORT }
    }

    pub fn with_proxy_port(mut self, port: u16) -> Self {
        self.proxy_port = port;
        self
    }

    /// Answers `GET /tap?<query>` (see [`super::query`]).
    pub async fn handle(&self, headers: &HeaderMap, query: Option<&str>) -> Response<AdminBody> {
        let response = match self.start(headers, query.unwrap_or_default()).await {
            Ok(response) => response,
            Err((status, message)) => {
                tracing::info!(%status, message, "tap refused");
                text(status, format!("{message}\n"))
            }
        };
        self.metrics.tap_answered(response.status().as_u16());
        response
    }

    async fn start(&self, headers: &HeaderMap, query: &str) -> Result<Response<AdminBody>, (StatusCode, String)> {
        self.authorize(headers).await?;
        let query = TapQuery::parse(query).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
        let index = self.index.as_ref().ok_or_else(|| {
            let why = "tap needs the cluster's pods: this control plane serves no Destination";
            (StatusCode::SERVICE_UNAVAILABLE, why.to_string())
        })?;
        if !index.is_ready() {
            return Err((StatusCode::SERVICE_UNAVAILABLE, "the cluster's pods are not loaded yet".into()));
        }
        let targets = self.targets(index, &query)?;
        let to = match &query.to {
            // Egress is matched by hostname, not by pods' addresses.
            None | Some((Resource { kind: Kind::Egress, .. }, _)) => Vec::new(),
            Some((resource, ns)) => {
                let ips: Vec<IpAddr> = index
                    .pods(Some(ns), |key, pod| selects(resource, key, pod))
                    .into_iter()
                    .flat_map(|(_, pod)| pod.ips.clone())
                    .collect();
                if ips.is_empty() {
                    let to = resource_text(resource);
                    return Err((StatusCode::NOT_FOUND, format!("no pod with an address for {to} in namespace {ns}")));
                }
                // Outbound requests are addressed to a Service's ClusterIP, inbound ones to the pod.
                let mut to = index.cluster_ips_serving(&ips);
                to.extend(ips);
                to
            }
        };
        let issuer = self.issuer.borrow().clone();
        let (Some(issuer), Some(_)) = (issuer, self.own_cert.get()) else {
            return Err((StatusCode::SERVICE_UNAVAILABLE, "no certificate yet to tap the proxies with".into()));
        };
        let tls = client::tls(issuer.roots.clone(), self.own_cert.clone())
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("TLS for tap: {e}")))?;
        let request = matcher::observe_request(&query, &to);
        let admission = Admission::new(query.limit, query.max_rps, Instant::now());
        tracing::info!(
            resource = %resource_text(&query.resource), namespace = query.namespace, pods = targets.len(), "tap started"
        );
        let (tx, rx) = mpsc::channel::<Bytes>(BUFFERED_LINES);
        let session =
            Session { metrics: self.metrics.clone(), open: self.metrics.tap_session(), names: pod_names(index) };
        tokio::spawn(relay(targets, request, tls, self.proxy_port, admission, tx, session));
        let body = http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx)
                .map(|line| Ok::<_, Infallible>(hyper::body::Frame::data(line))),
        );
        Ok(Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/x-ndjson")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(BodyExt::boxed_unsync(body))
            .expect("a valid response"))
    }

    /// The caller proves `cnimesh/cnimesh-tap`.
    async fn authorize(&self, headers: &HeaderMap) -> Result<(), (StatusCode, String)> {
        let unauthorized = |why: String| (StatusCode::UNAUTHORIZED, why);
        let token = headers.get(TOKEN_HEADER).ok_or_else(|| {
            unauthorized(format!(
                "tap needs a token of the ServiceAccount {CONTROL_NAMESPACE}/{TAP_SERVICE_ACCOUNT} in the header {TOKEN_HEADER}"
            ))
        })?;
        if token.len() > MAX_TOKEN_LEN {
            return Err(unauthorized(format!("the {TOKEN_HEADER} header is longer than any token")));
        }
        let wanted = ServiceAccount { namespace: CONTROL_NAMESPACE.into(), name: TAP_SERVICE_ACCOUNT.into() };
        match self.authenticator.authenticate(token.as_bytes()).await {
            Ok(account) if account == wanted => Ok(()),
            Ok(account) => Err((
                StatusCode::FORBIDDEN,
                format!(
                    "the token is the ServiceAccount {}/{}'s; tap needs {CONTROL_NAMESPACE}/{TAP_SERVICE_ACCOUNT}",
                    account.namespace, account.name
                ),
            )),
            Err(TokenError::Unauthenticated(why)) => Err(unauthorized(format!("the tap token is not valid: {why}"))),
            Err(TokenError::Denied(why)) => Err((StatusCode::FORBIDDEN, format!("the tap token is refused: {why}"))),
            Err(TokenError::Unavailable(why)) => {
                Err((StatusCode::SERVICE_UNAVAILABLE, format!("the tap token could not be checked: {why}")))
            }
        }
    }

    /// The meshed pods of the query's resource that have an address.
    fn targets(&self, index: &Index, query: &TapQuery) -> Result<Vec<Target>, (StatusCode, String)> {
        let pods = index.pods(Some(&query.namespace), |key, pod| {
            pod.meshed && !pod.ips.is_empty() && selects(&query.resource, key, pod)
        });
        if pods.is_empty() {
            return Err((
                StatusCode::NOT_FOUND,
                format!("no meshed pod of {} in namespace {}", resource_text(&query.resource), query.namespace),
            ));
        }
        pods.into_iter()
            .map(|(pod, record)| {
                let identity = Name::for_service_account(&record.service_account, &pod.namespace, &self.trust_domain)
                    .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("{pod}: {e}")))?;
                Ok(Target { ip: record.ips[0], pod, identity })
            })
            .collect()
    }
}

/// Whether `resource` names the pod `key`.
fn selects(resource: &Resource, key: &NsName, pod: &PodRecord) -> bool {
    match (resource.kind, &resource.name) {
        (Kind::Namespace, _) => true,
        (Kind::Pod, name) => name.as_ref().is_none_or(|n| *n == key.name),
        (kind, name) => pod.workloads.get(kind.name()).is_some_and(|w| name.as_ref().is_none_or(|n| n == w)),
    }
}

fn text(status: StatusCode, body: String) -> Response<AdminBody> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(BodyExt::boxed_unsync(http_body_util::Full::new(Bytes::from(body))))
        .expect("a valid response")
}

/// One streaming tap: counted open while it lives, and the pod names its lines are given.
struct Session {
    metrics: Arc<Metrics>,
    open: TapSession,
    names: HashMap<IpAddr, String>,
}

/// Every known pod's addresses → `ns/name`, taken when a tap starts (a pod that comes later
/// stays an address in this session's lines).
fn pod_names(index: &Index) -> HashMap<IpAddr, String> {
    index
        .pods(None, |_, _| true)
        .into_iter()
        .flat_map(|(key, pod)| {
            pod.ips.iter().map(move |ip| (*ip, format!("{}/{}", key.namespace, key.name))).collect::<Vec<_>>()
        })
        .collect()
}

/// Names the pods at either end of `line`'s request, where their addresses are known.
fn name_pods(line: &mut TapLine, names: &HashMap<IpAddr, String>) {
    if let Some(at) = line.body.stream_mut() {
        at.source_pod = at.source.and_then(|a| names.get(&a.ip()).cloned());
        at.destination_pod = at.destination.and_then(|a| names.get(&a.ip()).cloned());
    }
}

/// What a pod's stream task reports.
enum FromPod {
    Line(Box<TapLine>),
    Ended(NsName),
}

/// Streams every target's events through `admission` to `out` until the limit is done, every
/// stream has ended, or the caller has gone (`out` closed); the proxies' streams are dropped then.
async fn relay(
    targets: Vec<Target>,
    request: ObserveRequest,
    tls: tokio_rustls::TlsConnector,
    port: u16,
    mut admission: Admission,
    out: mpsc::Sender<Bytes>,
    session: Session,
) {
    let (events, mut from_pods) = mpsc::channel::<FromPod>(BUFFERED_LINES);
    let mut tasks = JoinSet::new();
    for target in targets {
        tasks.spawn(pod_stream(target, request.clone(), tls.clone(), port, events.clone()));
    }
    drop(events);
    let mut keepalive = tokio::time::interval(KEEPALIVE);
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    keepalive.reset();
    loop {
        let next = tokio::select! {
            _ = out.closed() => break,
            _ = keepalive.tick() => {
                if out.send(Bytes::from_static(b"\n")).await.is_err() {
                    break;
                }
                continue;
            }
            next = from_pods.recv() => next,
        };
        keepalive.reset();
        match next {
            None => break,
            Some(FromPod::Ended(pod)) => admission.pod_ended(&pod.namespace, &pod.name),
            Some(FromPod::Line(mut line)) => {
                name_pods(&mut line, &session.names);
                if matches!(line.body, cnimesh_model::tap::Body::Error { .. }) {
                    session.metrics.tap_proxy_unreachable();
                }
                if admission.admit(&line, Instant::now()) {
                    let mut json = serde_json::to_vec(&line).expect("serialisable");
                    json.push(b'\n');
                    if out.send(Bytes::from(json)).await.is_err() {
                        break;
                    }
                }
            }
        }
        if admission.done() {
            break;
        }
    }
    tracing::info!("tap ended");
    tasks.abort_all();
    drop(session.open);
}

/// One proxy's stream as lines; an error line when it cannot be tapped or its stream breaks.
async fn pod_stream(
    target: Target,
    request: ObserveRequest,
    tls: tokio_rustls::TlsConnector,
    port: u16,
    events: mpsc::Sender<FromPod>,
) {
    let (ns, name) = (target.pod.namespace.as_str(), target.pod.name.as_str());
    let addr = std::net::SocketAddr::new(target.ip, port);
    match client::observe(tls, addr, &target.identity, request).await {
        Err(e) => {
            let _ = events.send(FromPod::Line(Box::new(TapLine::error(ns, name, e)))).await;
        }
        Ok(mut stream) => loop {
            match stream.message().await {
                Ok(Some(event)) => {
                    if let Some(line) = TapLine::from_event(ns, name, event)
                        && events.send(FromPod::Line(Box::new(line))).await.is_err()
                    {
                        return;
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    let message = format!("{addr}: the tap stream broke: {:?}: {}", status.code(), status.message());
                    let _ = events.send(FromPod::Line(Box::new(TapLine::error(ns, name, message)))).await;
                    break;
                }
            }
        },
    }
    let _ = events.send(FromPod::Ended(target.pod)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(workloads: &[(&str, &str)]) -> PodRecord {
        PodRecord {
            ips: vec!["10.0.0.1".parse().unwrap()],
            meshed: true,
            service_account: "web".into(),
            opaque_ports: Default::default(),
            named_ports: Default::default(),
            workloads: workloads.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    #[test]
    fn a_resource_selects_pods_by_kind_and_name() {
        let key = NsName::new("demo", "web-abc-1");
        let web = pod(&[("deployment", "web"), ("replicaset", "web-abc")]);
        let yes = ["deploy/web", "deploy", "rs/web-abc", "ns/demo", "po/web-abc-1", "po"];
        for r in yes {
            assert!(selects(&r.parse().unwrap(), &key, &web), "{r}");
        }
        for r in ["deploy/api", "sts", "sts/web", "po/web-abc-2", "job/web"] {
            assert!(!selects(&r.parse().unwrap(), &key, &web), "{r}");
        }
    }
}
