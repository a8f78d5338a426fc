//! The gRPC face of inbound policy: `io.linkerd.proxy.inbound.InboundServerPolicies`
//! (`GetPort`, `WatchPort`) over the [`policy::Index`].
//!
//! What is filled in each `Server`, and why (proto: linkerd2-proxy-api 0.20 `inbound.proto`;
//! what a stock linkerd2-proxy refuses: its `server-policy` crate):
//! - `protocol`: always set ("If set, indicates how the proxy should proxy connections"; the
//!   proxy rejects a Server without one). `unknown` → `Detect` with `timeout` set (10 s,
//!   Linkerd's; the proxy rejects a Detect without a timeout), `HTTP/1`, `HTTP/2`, `gRPC`,
//!   `opaque`, `TLS` → the matching kind.
//! - `http_local_rate_limit` / `local_rate_limit` (Detect, Http1, Http2): the Server's
//!   HTTPLocalRateLimitPolicy, `metadata` the policy as a resource (group
//!   `policy.cnimesh.io`, kind `httplocalratelimitpolicy`), `total` and `identity` when set,
//!   one `Override` per override with its clients' identity names. The proto's `Grpc` has no
//!   rate limit field: a limited `gRPC` Server is served as `Http2` with no routes, which the
//!   proxy treats the same (gRPC is HTTP/2 to it, and gRPC servers get no routes here).
//! - Audit mode (a Server's `accessPolicy: audit`, or the `audit` default policy): one more
//!   authorization after the policies', every network, unauthenticated, with metadata
//!   `Default("audit")` as Linkerd's policy controller sends it; the proxy counts what it admits
//!   as would-be denials.
//! - HTTP routes (Detect, Http1, Http2): when the port has kubelet probe paths, a `probe` route
//!   (`GET` + exact path, its own authorization: every network, unauthenticated) and a `default`
//!   route (prefix `/`, no route authorizations, so the Server's apply), each with metadata and
//!   one rule. Otherwise no routes: the proto's consumers then use one default route carrying the
//!   Server's authorizations ("If no routes are specified … we use a default route"). gRPC
//!   servers get no routes (probes are HTTP/1). Routes exist for probes only until HTTPRoute is
//!   served.
//! - `server_ips`: empty. The proto says the proxy "may" drop connections to other addresses;
//!   the proxy ignores the field.
//! - `authorizations`: one `Authz` per authorization in force ("If unset, no connections are
//!   permitted": an empty list is how deny is said). Each has `networks` (never empty: "Must have
//!   at least one network, otherwise the authorization must be ignored"; `0.0.0.0/0` and `::/0`
//!   for every address), `authentication` ("Must be set"): `unauthenticated`, or `meshTLS` with
//!   `identities` (literal names) and `suffixes` (an empty suffix matches every identity),
//!   `metadata` (the AuthorizationPolicy as a resource, or the default policy's name) and, for
//!   older proxies, the same as `labels` (`group`, `kind`, `name`: "controllers should continue to
//!   set `labels` for compatibility"; a proxy without `metadata` needs `name`).
//! - `labels` of the Server: `group`, `kind`, `name`: the Server resource
//!   (`policy.cnimesh.io`/`server`/its name) or the default (`""`/`default`/policy name). The same
//!   keys in every answer, as the proto asks; a proxy refuses a Server whose labels lack `name`.
//!
//! `PortSpec.workload` is `<namespace>:<pod>` or Linkerd's JSON `{"ns": …, "pod": …}`, or for a
//! proxy running as an ExternalWorkload `{"ns": …, "kind": "external_workload", "name": …}`. An
//! unknown workload is NotFound; a stream whose workload goes away ends.
//!
//! Layer: gRPC.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use linkerd2_proxy_api::http_route::{HttpRouteMatch, PathMatch, path_match};
use linkerd2_proxy_api::inbound::inbound_server_policies_server::{InboundServerPolicies, InboundServerPoliciesServer};
use linkerd2_proxy_api::inbound::{self as api, authn, proxy_protocol};
use linkerd2_proxy_api::meta::{Metadata, Resource, metadata};
use tonic::{Request, Response, Status};

use cnimesh_model::external;
use cnimesh_model::meta::NsName;
use cnimesh_model::policy::crd::GROUP;
use cnimesh_model::policy::index::{
    Authentication, Authorization, AuthzMeta, InboundServer, InboundView, RateLimit, ServerMeta,
};
use cnimesh_model::policy::model::{Network, Protocol};
use cnimesh_model::policy::{DefaultPolicy, Index};

/// Linkerd's detect timeout: how long the proxy waits for a client's first bytes before treating
/// the connection as opaque.
pub const DETECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `GetPort` and `WatchPort` from a policy [`Index`]. Cheap to clone.
#[derive(Clone)]
pub struct InboundService {
    index: Index,
}

impl InboundService {
    pub fn new(index: Index) -> Self {
        Self { index }
    }

    pub fn into_server(self) -> InboundServerPoliciesServer<Self> {
        InboundServerPoliciesServer::new(self).max_decoding_message_size(crate::grpc::limits::MAX_REQUEST_LEN)
    }

    async fn watch(&self, spec: &api::PortSpec) -> Result<tokio::sync::watch::Receiver<InboundView>, Status> {
        let pod = parse_workload(&spec.workload)?;
        let port = u16::try_from(spec.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| Status::invalid_argument(format!("port {} is not a TCP port", spec.port)))?;
        self.index.ready().await;
        let rx = self.index.watch_inbound(&pod, port);
        if rx.borrow().is_none() {
            return Err(Status::not_found(format!("no pod {pod}")));
        }
        Ok(rx)
    }
}

/// `ns:pod` (older Linkerd injectors), `{"ns":"…","pod":"…"}` (newer ones), or
/// `{"ns":"…","kind":"external_workload","name":"…"}` for a proxy running as an ExternalWorkload
/// (Linkerd's form too), which the policy index keeps under [`external::policy_key`].
pub(crate) fn parse_workload(workload: &str) -> Result<NsName, Status> {
    #[derive(serde::Deserialize)]
    struct Workload {
        ns: String,
        #[serde(default)]
        pod: Option<String>,
        #[serde(default)]
        kind: Option<String>,
        #[serde(default)]
        name: Option<String>,
    }
    let parsed = if workload.trim_start().starts_with('{') {
        serde_json::from_str::<Workload>(workload).ok().and_then(|w| match (w.pod, w.kind.as_deref(), w.name) {
            (Some(pod), None, None) => Some(NsName::new(w.ns, pod)),
            (None, Some(external::WORKLOAD_KIND), Some(name)) if !name.is_empty() && !w.ns.is_empty() => {
                Some(external::policy_key(&w.ns, &name))
            }
            _ => None,
        })
    } else {
        workload.split_once(':').map(|(ns, pod)| NsName::new(ns, pod))
    };
    parsed.filter(|k| !k.namespace.is_empty() && !k.name.is_empty()).ok_or_else(|| {
        Status::invalid_argument(format!(
            "workload {workload:?}: expected <namespace>:<pod>, {{\"ns\":\"<namespace>\",\"pod\":\"<pod>\"}} or {{\"ns\":\"<namespace>\",\"kind\":\"{}\",\"name\":\"<name>\"}}",
            external::WORKLOAD_KIND
        ))
    })
}

#[tonic::async_trait]
impl InboundServerPolicies for InboundService {
    type WatchPortStream = BoxStream<'static, Result<api::Server, Status>>;

    async fn get_port(&self, request: Request<api::PortSpec>) -> Result<Response<api::Server>, Status> {
        let rx = self.watch(request.get_ref()).await?;
        let view = rx.borrow().clone();
        let server = view.ok_or_else(|| Status::not_found("pod went away"))?;
        Ok(Response::new(to_proto(&server)))
    }

    async fn watch_port(&self, request: Request<api::PortSpec>) -> Result<Response<Self::WatchPortStream>, Status> {
        let rx = self.watch(request.get_ref()).await?;
        let stream = super::destination::follow(rx, |view: &InboundView| {
            vec![view.as_ref().map(|s| to_proto(s)).ok_or_else(|| Status::not_found("pod went away"))]
        })
        // The pod going away ends the stream: the proxy asks again and learns NotFound.
        .map(|item| item.and_then(|r| r))
        .scan(false, |ended, item| {
            let out = if *ended { None } else { Some(item) };
            *ended = out.as_ref().is_some_and(Result::is_err);
            std::future::ready(out)
        })
        .boxed();
        Ok(Response::new(stream))
    }
}

/// The message for one answer. Public for tests that check the mapping without a server.
pub fn to_proto(server: &InboundServer) -> api::Server {
    let authorizations: Vec<api::Authz> = server.authorizations.iter().map(authz).collect();
    let routes = || http_routes(server);
    let limit = server.rate_limit.as_ref().map(rate_limit);
    let kind = match server.protocol {
        Protocol::Detect => proxy_protocol::Kind::Detect(proxy_protocol::Detect {
            timeout: Some(DETECT_TIMEOUT.try_into().expect("fits")),
            http_routes: routes(),
            http_local_rate_limit: limit,
        }),
        Protocol::Http1 => {
            proxy_protocol::Kind::Http1(proxy_protocol::Http1 { routes: routes(), local_rate_limit: limit })
        }
        Protocol::Http2 => {
            proxy_protocol::Kind::Http2(proxy_protocol::Http2 { routes: routes(), local_rate_limit: limit })
        }
        Protocol::Grpc if limit.is_some() => {
            proxy_protocol::Kind::Http2(proxy_protocol::Http2 { routes: Vec::new(), local_rate_limit: limit })
        }
        Protocol::Grpc => proxy_protocol::Kind::Grpc(proxy_protocol::Grpc { routes: Vec::new() }),
        Protocol::Opaque => proxy_protocol::Kind::Opaque(proxy_protocol::Opaque {}),
        Protocol::Tls => proxy_protocol::Kind::Tls(proxy_protocol::Tls {}),
    };
    let labels = match &server.meta {
        ServerMeta::Server(name) => labels(GROUP, "server", name),
        ServerMeta::Default(policy) => labels("", "default", policy.as_str()),
    };
    api::Server {
        protocol: Some(api::ProxyProtocol { kind: Some(kind) }),
        server_ips: Vec::new(),
        authorizations,
        labels,
    }
}

fn labels(group: &str, kind: &str, name: &str) -> HashMap<String, String> {
    HashMap::from([("group".into(), group.into()), ("kind".into(), kind.into()), ("name".into(), name.into())])
}

fn default_meta(name: &str) -> Metadata {
    Metadata { kind: Some(metadata::Kind::Default(name.to_string())) }
}

fn authz(a: &Authorization) -> api::Authz {
    let (metadata, labels) = match &a.meta {
        AuthzMeta::Default(policy) => (default_meta(policy.as_str()), labels("", "default", policy.as_str())),
        AuthzMeta::Policy(key) => (
            Metadata {
                kind: Some(metadata::Kind::Resource(Resource {
                    group: GROUP.into(),
                    kind: "authorizationpolicy".into(),
                    name: key.name.clone(),
                    namespace: key.namespace.clone(),
                    ..Resource::default()
                })),
            },
            labels(GROUP, "authorizationpolicy", &key.name),
        ),
    };
    let permit = match &a.authentication {
        Authentication::Unauthenticated => authn::Permit::Unauthenticated(authn::PermitUnauthenticated {}),
        Authentication::MeshTls(ids) => authn::Permit::MeshTls(authn::PermitMeshTls {
            clients: Some(authn::permit_mesh_tls::Clients::Identities(
                authn::permit_mesh_tls::PermitClientIdentities {
                    identities: ids.names.iter().map(|name| api::Identity { name: name.clone() }).collect(),
                    suffixes: ids.suffixes.iter().map(|parts| api::IdentitySuffix { parts: parts.clone() }).collect(),
                },
            )),
        }),
    };
    api::Authz {
        networks: a.networks.iter().map(network).collect(),
        authentication: Some(api::Authn { permit: Some(permit) }),
        labels,
        metadata: Some(metadata),
    }
}

fn rate_limit(r: &RateLimit) -> api::HttpLocalRateLimit {
    use api::http_local_rate_limit::{Limit, Override, r#override::ClientIdentities};
    let limit = |rps: u32| Limit { requests_per_second: rps };
    api::HttpLocalRateLimit {
        metadata: Some(Metadata {
            kind: Some(metadata::Kind::Resource(Resource {
                group: GROUP.into(),
                kind: "httplocalratelimitpolicy".into(),
                name: r.name.clone(),
                ..Resource::default()
            })),
        }),
        total: r.total.map(limit),
        identity: r.identity.map(limit),
        overrides: r
            .overrides
            .iter()
            .map(|(rps, names)| Override {
                limit: Some(limit(*rps)),
                clients: Some(ClientIdentities {
                    identities: names.iter().map(|name| api::Identity { name: name.clone() }).collect(),
                }),
            })
            .collect(),
    }
}

fn network(n: &Network) -> api::Network {
    api::Network { net: Some(n.net.into()), except: n.except.iter().map(|&e| e.into()).collect() }
}

/// Probe routes plus a catch-all, or nothing when the port has no probes (see the module docs).
fn http_routes(server: &InboundServer) -> Vec<api::HttpRoute> {
    if server.probe_paths.is_empty() {
        return Vec::new();
    }
    let probe_authz = Authorization {
        meta: AuthzMeta::Default(DefaultPolicy::AllUnauthenticated),
        networks: Network::all(),
        authentication: Authentication::Unauthenticated,
    };
    let mut probe_authz = authz(&probe_authz);
    probe_authz.metadata = Some(default_meta("probe"));
    probe_authz.labels = labels("", "default", "probe");
    let probe = api::HttpRoute {
        metadata: Some(default_meta("probe")),
        hosts: Vec::new(),
        authorizations: vec![probe_authz],
        rules: vec![api::http_route::Rule {
            matches: server
                .probe_paths
                .iter()
                .map(|path| HttpRouteMatch {
                    path: Some(PathMatch { kind: Some(path_match::Kind::Exact(path.clone())) }),
                    method: Some(http::Method::GET.into()),
                    ..HttpRouteMatch::default()
                })
                .collect(),
            filters: Vec::new(),
        }],
    };
    let default = api::HttpRoute {
        metadata: Some(default_meta("default")),
        hosts: Vec::new(),
        authorizations: Vec::new(),
        rules: vec![api::http_route::Rule {
            matches: vec![HttpRouteMatch {
                path: Some(PathMatch { kind: Some(path_match::Kind::Prefix("/".into())) }),
                ..HttpRouteMatch::default()
            }],
            filters: Vec::new(),
        }],
    };
    vec![probe, default]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_in_both_forms() {
        assert_eq!(parse_workload("shop:api-0").unwrap(), NsName::new("shop", "api-0"));
        assert_eq!(parse_workload(r#"{"ns":"shop","pod":"api-0"}"#).unwrap(), NsName::new("shop", "api-0"));
        assert_eq!(
            parse_workload(r#"{"ns":"shop","kind":"external_workload","name":"db-vm"}"#).unwrap(),
            external::policy_key("shop", "db-vm")
        );
        for bad in [
            "api-0",
            ":x",
            r#"{"pod":"x"}"#,
            r#"{"ns":"shop","kind":"deployment","name":"db"}"#,
            r#"{"ns":"shop","kind":"external_workload"}"#,
            r#"{"ns":"shop","pod":"a","kind":"external_workload","name":"b"}"#,
        ] {
            assert_eq!(parse_workload(bad).unwrap_err().code(), tonic::Code::InvalidArgument, "{bad}");
        }
    }
}
