//! The inbound authorization metrics, as Linkerd names them: the policy resources in labels and
//! the allow/deny families, handles into the app's registry.

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::transport::labels::TlsLabel;

/// A policy resource (server, route, authorization) in labels: `<prefix>_group`,
/// `<prefix>_kind`, `<prefix>_name`.
pub use cnimesh_policy_rules::Resource;

/// `inbound_{http,tcp}_authz_{allow,deny}_total`: Linkerd's labels (`srv_*`, `route_*` for
/// HTTP, `authz_*` when allowed, `tls`, `client_id`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AuthzLabels {
    pub target_addr: String,
    pub srv: Resource,
    pub route: Option<Resource>,
    pub authz: Option<Resource>,
    pub tls: TlsLabel,
}

impl EncodeLabelSet for AuthzLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut labels: Vec<(&str, &str)> = vec![("target_addr", &self.target_addr)];
        let resources = [("srv", Some(&self.srv)), ("route", self.route.as_ref()), ("authz", self.authz.as_ref())];
        for (prefix, r) in resources {
            if let Some(r) = r {
                let names = match prefix {
                    "srv" => ["srv_group", "srv_kind", "srv_name"],
                    "route" => ["route_group", "route_kind", "route_name"],
                    _ => ["authz_group", "authz_kind", "authz_name"],
                };
                labels.extend([(names[0], &*r.group), (names[1], &*r.kind), (names[2], &*r.name)]);
            }
        }
        labels.encode(encoder)?;
        self.tls.encode(encoder)
    }
}

/// `inbound_http_local_ratelimit_total` (linkerd2-proxy's name and labels): the server, the
/// HTTPLocalRateLimitPolicy (`ratelimit_group`/`_kind`/`_name`), which limit refused
/// (`ratelimit_scope`: `total`, `identity`, `override`), `tls` and `client_id`. Only refused
/// requests are counted; admitted ones are in the authz families.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateLimitLabels {
    pub target_addr: String,
    pub srv: Resource,
    pub ratelimit: Resource,
    pub scope: &'static str,
    pub tls: TlsLabel,
}

impl EncodeLabelSet for RateLimitLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        let (s, r) = (&self.srv, &self.ratelimit);
        [
            ("target_addr", self.target_addr.as_str()),
            ("srv_group", &*s.group),
            ("srv_kind", &*s.kind),
            ("srv_name", &*s.name),
            ("ratelimit_group", &*r.group),
            ("ratelimit_kind", &*r.kind),
            ("ratelimit_name", &*r.name),
            ("ratelimit_scope", self.scope),
        ]
        .encode(encoder)?;
        self.tls.encode(encoder)
    }
}

/// The families [`super::enforce`] counts into.
#[derive(Clone, Default)]
pub struct AuthzMetrics {
    pub inbound_http_authz_allow_total: Family<AuthzLabels, Counter>,
    pub inbound_http_authz_deny_total: Family<AuthzLabels, Counter>,
    pub inbound_tcp_authz_allow_total: Family<AuthzLabels, Counter>,
    pub inbound_tcp_authz_deny_total: Family<AuthzLabels, Counter>,
    pub inbound_http_route_not_found_total: Family<AuthzLabels, Counter>,
    /// Opaque connections closed because a policy update no longer authorizes them.
    pub inbound_tcp_authz_revoked_total: Counter,
    /// Requests refused by the Server's rate limit.
    pub inbound_http_local_ratelimit_total: Family<RateLimitLabels, Counter>,
}
