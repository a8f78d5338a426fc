//! Enforcing a port's policy on one connection. A client's address and identity are fixed for
//! the connection, so every route's verdict (and its counter handle) is computed once per
//! connection and per policy version; a request only finds its route and reads the verdict.
//! A policy update reaches open connections at their next request.
//!
//! After authorization, a request is held to the Server's rate limit (a denied request is
//! denied, never rate-limited): over it, 429 (gRPC: RESOURCE_EXHAUSTED), counted in
//! `inbound_http_local_ratelimit_total`. A request (or opaque connection) only audit mode's
//! authorization admits is a would-be denial: let through, counted under `authz_kind="audit"`
//! and logged at most once per [`AUDIT_LOG_PERIOD`] (with how many were left out), so an
//! audited flood is no log flood. Rate limits apply in audit mode too.
//!
//! Requests on the kubelet probe route are outside every rate limit, as they are outside
//! authorization: the route is open to every client, so any client could otherwise spend the
//! Server's `total` budget, and the one bucket every client without an identity shares (the
//! kubelet's too), until the pod's probes fail and it restarts. A bucket of their own would
//! still let any client starve the kubelet's probes.

use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

use http::{HeaderValue, Request, Response, StatusCode};
use prometheus_client::metrics::counter::Counter;

use super::authorize::{Client, authorized, route_for};
use super::discover::PortWatch;
use super::metrics::RateLimitLabels;
use super::metrics::{AuthzLabels, AuthzMetrics};
use super::model::{AUDIT_KIND, PortPolicy, PortProtocol, Resource, is_probe_route};
use crate::http::Body;
use crate::http::error::{ProxyError, error_response, full};
use crate::http::headers::PROXY_ERROR;
use crate::transport::labels::TlsLabel;
use cnimesh_common::log_limit::LogLimit;

/// At most one would-be-denial log line per period, per proxy.
pub const AUDIT_LOG_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);
static AUDIT_LOG: LogLimit = LogLimit::new(AUDIT_LOG_PERIOD);

/// The one route of a policy without routes (as linkerd2-proxy builds it).
static DEFAULT_ROUTE: std::sync::LazyLock<Resource> =
    std::sync::LazyLock::new(|| Resource::new("", "default", "default"));

pub struct ConnPolicy {
    port: PortWatch,
    ip: IpAddr,
    target_addr: String,
    tls: TlsLabel,
    metrics: Arc<AuthzMetrics>,
    verdicts: Mutex<Option<Arc<Verdicts>>>,
}

/// One policy version's verdicts for this connection's client.
struct Verdicts {
    policy: Arc<PortPolicy>,
    tcp: Verdict,
    /// Per route of the policy, or the one default route when it has none.
    routes: Vec<Verdict>,
}

struct Verdict {
    allowed: bool,
    /// Admitted only by audit mode: a would-be denial.
    audited: bool,
    /// The kubelet probe route: outside every rate limit.
    probe: bool,
    counter: Counter,
    route: Arc<str>,
}

impl ConnPolicy {
    /// `tls` is the connection's own: its `client_id` is the identity the client's certificate
    /// proved (mTLS terminated here), absent for plaintext.
    pub fn new(port: PortWatch, peer: IpAddr, tls: TlsLabel, target_addr: String, metrics: Arc<AuthzMetrics>) -> Self {
        Self { port, ip: peer, target_addr, tls, metrics, verdicts: Mutex::default() }
    }

    /// This connection's policy for a request a multicluster gateway forwarded for `identity`
    /// (a workload of another cluster, verified by the gateway): authorized, counted and rate
    /// limited as that workload, from the same address.
    pub fn forwarded_for(&self, identity: &str) -> Self {
        let tls = TlsLabel { client_id: Some(identity.to_string()), ..self.tls.clone() };
        Self::new(self.port.clone(), self.ip, tls, self.target_addr.clone(), self.metrics.clone())
    }

    pub fn protocol(&self) -> PortProtocol {
        self.verdicts().policy.protocol
    }

    /// Whether the connection may be forwarded as opaque TCP; counted either way.
    pub fn allow_tcp(&self) -> bool {
        let v = self.verdicts();
        v.tcp.counter.inc();
        if v.tcp.audited {
            self.log_audited(&v.policy, None);
        }
        v.tcp.allowed
    }

    fn log_audited(&self, policy: &PortPolicy, route: Option<&str>) {
        if let Some(left_out) = AUDIT_LOG.allow() {
            tracing::warn!(
                server = %policy.server.name,
                route = route.unwrap_or(""),
                client = %self.ip,
                client_id = self.tls.client_id.as_deref().unwrap_or(""),
                target = %self.target_addr,
                left_out,
                "audit: no authorization admits this client; let through (would be denied under deny)"
            );
        }
    }

    /// Whether the Server's rate limit refuses the request now (counted when it does).
    fn rate_limited<B>(&self, policy: &PortPolicy, req: &Request<B>) -> Option<Response<Body>> {
        let limited = policy.rate_limit.as_ref()?;
        let scope = limited.limiter.check(self.tls.client_id.as_deref()).err()?;
        let labels = RateLimitLabels {
            target_addr: self.target_addr.clone(),
            srv: policy.server.clone(),
            ratelimit: limited.limit.meta.clone(),
            scope: scope.as_str(),
            tls: self.tls.clone(),
        };
        self.metrics.inbound_http_local_ratelimit_total.get_or_create(&labels).inc();
        Some(refused(req, Refusal::RateLimited, &ProxyError::RateLimited.to_string()))
    }

    /// Resolves once a policy update no longer authorizes this connection as opaque TCP
    /// (counted); never while it stays authorized. Opaque connections and tunnels are not
    /// re-checked per request, so they are closed on it, as linkerd2-proxy closes them.
    pub async fn revoked(&self) {
        let mut port = self.port.clone();
        loop {
            port.changed().await;
            if !self.verdicts().tcp.allowed {
                self.metrics.inbound_tcp_authz_revoked_total.inc();
                return;
            }
        }
    }

    /// `None` when the request is authorized; otherwise the answer for it: 403, or for gRPC a
    /// trailers-only PERMISSION_DENIED; a request matching no route of the Server gets 404 (gRPC:
    /// NOT_FOUND), as linkerd2-proxy's inbound answers it, counted apart from denials.
    ///
    /// A `tunnel` (an HTTP/1 `Upgrade` or a `CONNECT`) carries unchecked bytes once switched, so
    /// it also needs the server-level authorizations: a route's own authorization (the kubelet
    /// probe route's, open to everyone) never opens one. The path is matched as given: the caller
    /// normalizes it first ([`super::path::normalize`]).
    pub fn deny_request<B>(&self, req: &Request<B>, tunnel: bool) -> Option<Response<Body>> {
        let v = self.verdicts();
        let index = if v.policy.routes.is_empty() {
            Some(0)
        } else {
            route_for(&v.policy.routes, req.method(), req.uri().path())
        };
        match index.and_then(|i| Some((i, v.routes.get(i)?))) {
            Some((i, verdict)) => {
                if tunnel && verdict.allowed && !v.tcp.allowed {
                    let route = v.policy.routes.get(i).map(|r| &r.meta);
                    self.count(&v.policy, Some(route.unwrap_or(&*DEFAULT_ROUTE)), None, false).inc();
                    let why = format!(
                        "unauthorized tunnel on route {}: Upgrade and CONNECT need the server's authorization",
                        verdict.route
                    );
                    return Some(refused(req, Refusal::Unauthorized, &why));
                }
                verdict.counter.inc();
                if verdict.allowed {
                    if verdict.audited {
                        self.log_audited(&v.policy, Some(&verdict.route));
                    }
                    if verdict.probe {
                        return None;
                    }
                    return self.rate_limited(&v.policy, req);
                }
                Some(refused(req, Refusal::Unauthorized, &format!("unauthorized request on route {}", verdict.route)))
            }
            None => {
                self.metrics
                    .inbound_http_route_not_found_total
                    .get_or_create(&self.labels(&v.policy, None, None))
                    .inc();
                Some(refused(req, Refusal::NoRoute, "no route matches the request"))
            }
        }
    }

    fn verdicts(&self) -> Arc<Verdicts> {
        let policy = self.port.current();
        let mut cached = self.verdicts.lock();
        if let Some(v) = cached.as_ref()
            && Arc::ptr_eq(&v.policy, &policy)
        {
            return v.clone();
        }
        let v = Arc::new(self.compute(policy));
        *cached = Some(v.clone());
        v
    }

    fn compute(&self, policy: Arc<PortPolicy>) -> Verdicts {
        let client = Client { ip: self.ip, identity: self.tls.client_id.as_deref() };
        let tcp = self.verdict(&policy, None, &policy.authorizations, client);
        let default_route =
            [super::model::Route { meta: DEFAULT_ROUTE.clone(), matches: Vec::new(), authorizations: Vec::new() }];
        let routes = if policy.routes.is_empty() { &default_route[..] } else { &policy.routes[..] };
        let routes = routes
            .iter()
            .map(|r| self.verdict(&policy, Some(&r.meta), r.authorizations_or(&policy.authorizations), client))
            .collect();
        Verdicts { policy, tcp, routes }
    }

    fn verdict(
        &self,
        policy: &PortPolicy,
        route: Option<&Resource>,
        authzs: &[super::model::Authz],
        client: Client<'_>,
    ) -> Verdict {
        let allowed = authorized(authzs, client);
        Verdict {
            allowed: allowed.is_some(),
            audited: allowed.is_some_and(|a| &*a.meta.kind == AUDIT_KIND),
            probe: route.is_some_and(is_probe_route),
            counter: self.count(policy, route, allowed.map(|a| &a.meta), route.is_none()),
            route: route.map_or_else(|| "".into(), |r| r.name.clone()),
        }
    }

    /// The counter for a decision: `authz` set means allowed; `tcp` selects the family.
    fn count(&self, policy: &PortPolicy, route: Option<&Resource>, authz: Option<&Resource>, tcp: bool) -> Counter {
        let m = &self.metrics;
        let family = match (tcp, authz.is_some()) {
            (true, true) => &m.inbound_tcp_authz_allow_total,
            (true, false) => &m.inbound_tcp_authz_deny_total,
            (false, true) => &m.inbound_http_authz_allow_total,
            (false, false) => &m.inbound_http_authz_deny_total,
        };
        family.get_or_create(&self.labels(policy, route, authz)).clone()
    }

    fn labels(&self, policy: &PortPolicy, route: Option<&Resource>, authz: Option<&Resource>) -> AuthzLabels {
        AuthzLabels {
            target_addr: self.target_addr.clone(),
            srv: policy.server.clone(),
            route: route.cloned(),
            authz: authz.cloned(),
            tls: self.tls.clone(),
        }
    }
}

fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// Why a request is answered by the proxy instead of the app.
#[derive(Clone, Copy)]
enum Refusal {
    /// 403; gRPC PERMISSION_DENIED (7).
    Unauthorized,
    /// 404; gRPC NOT_FOUND (5).
    NoRoute,
    /// 429; gRPC RESOURCE_EXHAUSTED (8), as linkerd2-proxy answers it.
    RateLimited,
}

/// The status naming why, or for gRPC a trailers-only response (HTTP 200 with `grpc-status`),
/// which is how a gRPC client learns of it.
fn refused<B>(req: &Request<B>, refusal: Refusal, why: &str) -> Response<Body> {
    let (status, grpc_status) = match refusal {
        Refusal::Unauthorized => (StatusCode::FORBIDDEN, "7"),
        Refusal::NoRoute => (StatusCode::NOT_FOUND, "5"),
        Refusal::RateLimited => (StatusCode::TOO_MANY_REQUESTS, "8"),
    };
    if !is_grpc(req) {
        if let Refusal::RateLimited = refusal {
            return error_response(&ProxyError::RateLimited);
        }
        return error_response(&ProxyError::Refused { status, why: why.to_string() });
    }
    let mut r = Response::new(full(bytes::Bytes::new()));
    let h = r.headers_mut();
    h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(crate::http::headers::GRPC_STATUS, HeaderValue::from_static(grpc_status));
    if let Ok(v) = HeaderValue::from_str(why) {
        h.insert(crate::http::headers::GRPC_MESSAGE, v.clone());
        h.insert(PROXY_ERROR, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbound::policy::model::DefaultPolicy;
    use crate::serve::metrics::Metrics;

    /// A plaintext client's connection from 10.0.0.1 to 10.0.0.2:80 under `policy`.
    /// With the registry its counters are in.
    fn plaintext_client_of(policy: PortPolicy) -> (ConnPolicy, Metrics) {
        let metrics = Metrics::default();
        let conn = ConnPolicy::new(
            PortWatch::fixed(Arc::new(policy)),
            "10.0.0.1".parse().unwrap(),
            TlsLabel::plaintext(),
            "10.0.0.2:80".into(),
            Arc::new(metrics.authz.clone()),
        );
        (conn, metrics)
    }

    #[test]
    fn denied_answers_for_http_and_grpc() {
        let policy = DefaultPolicy::Deny.policy(&[]);
        let (conn, metrics) = plaintext_client_of(policy);
        let plain = Request::get("/x").body(()).unwrap();
        let r = conn.deny_request(&plain, false).unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(r.headers()[PROXY_ERROR], "unauthorized request on route default");
        let grpc = Request::post("/pkg.Svc/M").header("content-type", "application/grpc").body(()).unwrap();
        let r = conn.deny_request(&grpc, false).unwrap();
        assert_eq!((r.status(), &r.headers()["grpc-status"]), (StatusCode::OK, &HeaderValue::from_static("7")));
        assert!(!conn.allow_tcp());
        let text = metrics.encode();
        assert!(text.contains("inbound_http_authz_deny_total{target_addr=\"10.0.0.2:80\",srv_group=\"\",srv_kind=\"default\",srv_name=\"deny\",route_group=\"\",route_kind=\"default\",route_name=\"default\",tls=\"false\"} 2"), "{text}");
        assert!(text.contains("inbound_tcp_authz_deny_total{target_addr=\"10.0.0.2:80\",srv_group=\"\",srv_kind=\"default\",srv_name=\"deny\",tls=\"false\"} 1"), "{text}");
    }

    #[test]
    fn a_request_matching_no_route_gets_404_and_an_unauthorized_one_403() {
        use crate::inbound::policy::model::{PathMatch, Route, RouteMatch};
        let mut policy = DefaultPolicy::AllUnauthenticated.policy(&[]);
        let route = |name: &str, path: &str, authorizations| Route {
            meta: Resource::new("policy.cnimesh.io", "HTTPRoute", name),
            matches: vec![RouteMatch { path: PathMatch::Prefix(path.into()), method: None }],
            authorizations,
        };
        let open = policy.authorizations.clone();
        policy.routes = vec![route("api", "/api", open), route("admin", "/admin", Vec::new())];
        policy.authorizations.clear();
        let (conn, metrics) = plaintext_client_of(policy);
        assert!(conn.deny_request(&Request::get("/api/x").body(()).unwrap(), false).is_none());
        let r = conn.deny_request(&Request::get("/admin").body(()).unwrap(), false).unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "a route matched, no authorization did");
        let r = conn.deny_request(&Request::get("/other").body(()).unwrap(), false).unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert_eq!(r.headers()[PROXY_ERROR], "no route matches the request");
        let grpc = Request::post("/pkg.Svc/M").header("content-type", "application/grpc").body(()).unwrap();
        let r = conn.deny_request(&grpc, false).unwrap();
        assert_eq!((r.status(), &r.headers()["grpc-status"]), (StatusCode::OK, &HeaderValue::from_static("5")));
        let text = metrics.encode();
        assert!(text.contains("inbound_http_route_not_found_total{target_addr=\"10.0.0.2:80\",srv_group=\"\",srv_kind=\"default\",srv_name=\"all-unauthenticated\",tls=\"false\"} 2"), "{text}");
        assert!(!text.contains("route_name=\"\""), "no-route requests are not counted as denials: {text}");
    }

    /// What cnimesh-control sends for a port under `deny` with a kubelet probe on `/ready`.
    fn deny_with_probe() -> PortPolicy {
        use crate::inbound::policy::model::{PathMatch, Route, RouteMatch};
        let mut policy = DefaultPolicy::Deny.policy(&[]);
        let open = DefaultPolicy::AllUnauthenticated.policy(&[]).authorizations;
        policy.routes = vec![
            Route {
                meta: Resource::new("", "default", "probe"),
                matches: vec![RouteMatch { path: PathMatch::Exact("/ready".into()), method: Some(http::Method::GET) }],
                authorizations: open,
            },
            Route {
                meta: Resource::new("", "default", "default"),
                matches: vec![RouteMatch { path: PathMatch::Any, method: None }],
                authorizations: Vec::new(),
            },
        ];
        policy
    }

    #[test]
    fn a_probe_path_matches_with_a_query_string() {
        let (conn, _) = plaintext_client_of(deny_with_probe());
        assert!(conn.deny_request(&Request::get("/ready?verbose=1").body(()).unwrap(), false).is_none());
        assert!(conn.deny_request(&Request::get("/ready").body(()).unwrap(), false).is_none());
        let r = conn.deny_request(&Request::get("/admin?ready").body(()).unwrap(), false).unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
    }

    /// Finding 4: the probe route's exemption opened tunnels (h2c, WebSocket) to
    /// everyone. A tunnel needs the server-level authorization.
    #[test]
    fn a_route_exemption_never_authorizes_a_tunnel() {
        let (conn, metrics) = plaintext_client_of(deny_with_probe());
        let upgrade = Request::get("/ready").header("upgrade", "websocket").body(()).unwrap();
        let r = conn.deny_request(&upgrade, true).unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(r.headers()[PROXY_ERROR].to_str().unwrap().contains("unauthorized tunnel on route probe"));
        let connect = Request::connect("db:5432").body(()).unwrap();
        assert_eq!(conn.deny_request(&connect, true).unwrap().status(), StatusCode::FORBIDDEN);
        let text = metrics.encode();
        assert!(text.contains("route_name=\"probe\",tls=\"false\"} 1"), "the refused tunnel is counted: {text}");

        let mut open = deny_with_probe();
        open.authorizations = DefaultPolicy::AllUnauthenticated.policy(&[]).authorizations;
        let (conn, _) = plaintext_client_of(open);
        assert!(conn.deny_request(&upgrade, true).is_none(), "the server admits this client: its tunnel too");
        assert!(conn.deny_request(&connect, true).is_none());
    }

    fn limited(policy: &mut PortPolicy, total: u32) {
        use crate::inbound::policy::model::{Limited, Limiter, RateLimit};
        let limit = RateLimit {
            meta: Resource::new("policy.cnimesh.io", "httplocalratelimitpolicy", "rl"),
            total: Some(total),
            identity: None,
            overrides: Vec::new(),
        };
        policy.rate_limit = Some(Limited { limiter: Arc::new(Limiter::new(&limit)), limit });
    }

    #[test]
    fn over_the_limit_a_request_gets_429_and_grpc_resource_exhausted_and_denials_stay_403() {
        let mut policy = DefaultPolicy::AllUnauthenticated.policy(&[]);
        limited(&mut policy, 2);
        let (conn, metrics) = plaintext_client_of(policy);
        let get = || Request::get("/x").body(()).unwrap();
        assert!(conn.deny_request(&get(), false).is_none());
        assert!(conn.deny_request(&get(), false).is_none());
        let r = conn.deny_request(&get(), false).expect("the third in the same second is over 2 rps");
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[PROXY_ERROR], "rate limited");
        let grpc = Request::post("/pkg.Svc/M").header("content-type", "application/grpc").body(()).unwrap();
        let r = conn.deny_request(&grpc, false).unwrap();
        assert_eq!((r.status(), &r.headers()["grpc-status"]), (StatusCode::OK, &HeaderValue::from_static("8")));
        let text = metrics.encode();
        assert!(text.contains("inbound_http_local_ratelimit_total{target_addr=\"10.0.0.2:80\",srv_group=\"\",srv_kind=\"default\",srv_name=\"all-unauthenticated\",ratelimit_group=\"policy.cnimesh.io\",ratelimit_kind=\"httplocalratelimitpolicy\",ratelimit_name=\"rl\",ratelimit_scope=\"total\",tls=\"false\"} 2"), "{text}");

        // Authorization comes first: a denied request is denied, and spends no token.
        let mut deny = DefaultPolicy::Deny.policy(&[]);
        limited(&mut deny, 1);
        let (conn, _) = plaintext_client_of(deny);
        for _ in 0..3 {
            assert_eq!(conn.deny_request(&get(), false).unwrap().status(), StatusCode::FORBIDDEN);
        }
    }

    /// Any client may use the probe route: its requests must leave the Server's budgets to the
    /// clients it authorizes and to the kubelet.
    #[test]
    fn probe_requests_spend_no_rate_limit() {
        let mut policy = deny_with_probe();
        policy.routes[1].authorizations = DefaultPolicy::AllUnauthenticated.policy(&[]).authorizations;
        limited(&mut policy, 2);
        let (conn, metrics) = plaintext_client_of(policy);
        for _ in 0..50 {
            assert!(conn.deny_request(&Request::get("/ready").body(()).unwrap(), false).is_none());
        }
        let get = || Request::get("/x").body(()).unwrap();
        assert!(conn.deny_request(&get(), false).is_none(), "the probes left the budget whole");
        assert!(conn.deny_request(&get(), false).is_none());
        assert_eq!(conn.deny_request(&get(), false).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(conn.deny_request(&Request::get("/ready").body(()).unwrap(), false).is_none(), "nor a spent one");
        let text = metrics.encode();
        assert!(text.contains("ratelimit_scope=\"total\",tls=\"false\"} 1\n"), "only the one request: {text}");
    }

    #[test]
    fn audit_lets_a_would_be_denial_through_and_counts_it_as_audit() {
        let (conn, metrics) = plaintext_client_of(DefaultPolicy::Audit.policy(&[]));
        assert!(conn.deny_request(&Request::get("/x").body(()).unwrap(), false).is_none());
        assert!(conn.allow_tcp());
        let text = metrics.encode();
        assert!(text.contains("inbound_http_authz_allow_total{target_addr=\"10.0.0.2:80\",srv_group=\"\",srv_kind=\"default\",srv_name=\"audit\",route_group=\"\",route_kind=\"default\",route_name=\"default\",authz_group=\"\",authz_kind=\"audit\",authz_name=\"audit\",tls=\"false\"} 1"), "{text}");
        assert!(text.contains("inbound_tcp_authz_allow_total{target_addr=\"10.0.0.2:80\",srv_group=\"\",srv_kind=\"default\",srv_name=\"audit\",authz_group=\"\",authz_kind=\"audit\""), "{text}");
    }

    #[tokio::test]
    async fn an_opaque_connection_learns_when_its_authorization_is_revoked() {
        let open = Arc::new(DefaultPolicy::AllUnauthenticated.policy(&[]));
        let (answer, answers) = tokio::sync::watch::channel(None);
        let (_fallback, fallbacks) = tokio::sync::watch::channel(open);
        let metrics = Metrics::default();
        let conn = ConnPolicy::new(
            PortWatch::following(answers, fallbacks),
            "10.0.0.1".parse().unwrap(),
            TlsLabel::plaintext(),
            "10.0.0.2:80".into(),
            Arc::new(metrics.authz.clone()),
        );
        assert!(conn.allow_tcp(), "unanswered: the default, which allows");
        let revoked = conn.revoked();
        tokio::pin!(revoked);
        let still = tokio::time::timeout(std::time::Duration::from_millis(20), revoked.as_mut()).await;
        assert!(still.is_err(), "nothing changed");
        answer.send_replace(Some(Arc::new(DefaultPolicy::Deny.policy(&[]))));
        tokio::time::timeout(std::time::Duration::from_secs(5), revoked).await.expect("revoked by the deny answer");
        assert_eq!(metrics.authz.inbound_tcp_authz_revoked_total.get(), 1);
    }
}
